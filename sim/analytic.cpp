// Analytic fidelity: the cost-weighted critical path of the lowered schedule, no SimGrid.
#include <algorithm>
#include <iterator>
#include <optional>
#include <utility>

#include "core/enum_names.hpp"
#include "core/error.hpp"
#include "core/units.hpp"
#include "model/memory.hpp"
#include "model/metrics.hpp"
#include "schedules/graph.hpp"
#include "sim/costing.hpp"
#include "sim/simgrid_run.hpp"
#include "sim/simulate.hpp"

namespace ptdp {

namespace {
constexpr EnumName kFidelityNames[] = {{static_cast<int>(Fidelity::Analytic), "analytic"},
                                       {static_cast<int>(Fidelity::Reduced), "reduced"},
                                       {static_cast<int>(Fidelity::Full), "full"}};
}  // namespace

std::string to_string(Fidelity f) { return enum_name(kFidelityNames, static_cast<int>(f)); }
Fidelity parse_fidelity(const std::string& text) { return parse_enum_as<Fidelity>(kFidelityNames, text, "fidelity", "--fidelity"); }

void add_memory(Report& r, const SimulationInput& in, const Schedule& s, std::vector<std::string>& warnings) {
  const auto ranks = memory_per_rank(in.model, in.plan, peak_inflight_activations(s));
  const MemoryBreakdown peak = peak_memory(ranks);
  r.peak_memory_bytes = peak.total_bytes;
  r.gpu_memory_bytes = in.cluster.gpu.memory_bytes;
  r.fits_in_memory = peak.total_bytes <= in.cluster.gpu.memory_bytes;
  r.memory = ranks;
  if (!r.fits_in_memory)
    warnings.push_back("the plan does not fit in GPU memory: pipeline rank " + std::to_string(peak.pipeline_rank) + " needs " +
                       format_bytes(peak.total_bytes) + " of " + format_bytes(in.cluster.gpu.memory_bytes) + " (over by " +
                       format_bytes(peak.total_bytes - in.cluster.gpu.memory_bytes) + ")");
  // A dropless MoE run sizes each expert for whatever the router sends it: in the worst case all
  // of a rank's tokens pick the same expert (imbalance E/k). Said when that would not fit.
  if (r.fits_in_memory && in.model.has_moe() && in.model.moe.capacity_factor <= 0) {
    SimulationInput worst = in;
    worst.model.moe.imbalance = static_cast<double>(in.model.moe.num_experts) / static_cast<double>(std::max<int64_t>(1, in.model.moe.top_k));
    const MemoryBreakdown w = peak_memory(memory_per_rank(worst.model, in.plan, peak_inflight_activations(s)));
    if (w.total_bytes > in.cluster.gpu.memory_bytes)
      warnings.push_back("dropless routing: if the router sent all of a rank's tokens to one expert (imbalance " +
                         format_count(worst.model.moe.imbalance) + "), pipeline rank " + std::to_string(w.pipeline_rank) + " would need " +
                         format_bytes(w.total_bytes) + " of " + format_bytes(in.cluster.gpu.memory_bytes) +
                         " and run out of memory; model.moe.capacity_factor bounds it (tokens beyond the capacity are dropped)");
  }
}

namespace {

// The parts of an action's time the breakdown reads (sim/costing's action_duration_s).
struct Parts {
  double duration_s = -1, tp_s = 0, shard_s = 0, recompute_s = 0;
};

// The analytic engine's timer for time_programs (schedules/graph.hpp): durations as the IR
// defines the actions (sim/costing) — a RECV lasts its scatter/gather all-gather once the data is
// there, the wire time sits on the SEND → RECV edge — and, as each action is timed, its events
// into the breakdown (and the timeline when kept). No table of all the actions' times is made:
// each rank's events read only their own action's times and the rank's previous end.
class AnalyticTimer {
 public:
  AnalyticTimer(const PlanCosts& c, const Schedule& s, bool post_validate, bool keep_timeline, RankBreakdownBuilder& breakdown)
      : c_(c),
        s_(s),
        post_validate_(post_validate),
        keep_timeline_(keep_timeline),
        breakdown_(breakdown),
        priced_(static_cast<size_t>(4 * 2 * s.num_stages())),
        windows_(s),
        prev_end_(static_cast<size_t>(s.p), 0.0),
        posted_(2 * static_cast<size_t>(s.num_stages()) * static_cast<size_t>(s.m), 0.0),
        held_(static_cast<size_t>(s.p), 0) {
    if (keep_timeline_) events_.resize(static_cast<size_t>(s.p));
  }

  double duration(int rank, const Action& a) {
    in_window_ = windows_.inside(rank, a);
    if (a.kind == ActionKind::RECV_F || a.kind == ActionKind::RECV_B) return recv_completion_s(c_, s_, a);
    if ((a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B) && a.overlap == 0) return send_wait_s(c_, a);
    parts_ = parts_of(rank, a, in_window_);
    return parts_.duration_s;
  }
  double transfer(int, const Action& a) const { return transfer_s(c_, a) - send_wait_s(c_, a); }

  void timed(int rank, size_t, const Action& a, double start, double end, int64_t transfer, bool) {
    if (a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B) posted_[static_cast<size_t>(transfer)] = start;
    // OPTIM starts with the gradient-norm all-reduce over the whole pipeline: a synchronisation
    // point, placed once every rank has reached it (post-validated, schedules/schedule.hpp, each
    // rank steps right after its own last action). It is each rank's last action; whatever might
    // follow it waits with it, so that each rank's events keep their order.
    if ((a.kind == ActionKind::OPTIM && !post_validate_) || held_[rank]) {
      if (a.kind == ActionKind::OPTIM) sync_ = std::max(sync_, start);
      held_[rank] = 1;
      held_actions_.push_back(Held{rank, a, start, end, transfer, parts_});
      return;
    }
    emit(rank, a, start, end, transfer, parts_);
  }

  /// The held actions (OPTIM and after) at their times; returns the makespan.
  double finish() {
    for (const Held& h : held_actions_) {
      double start = h.start, end = h.end;
      if (h.a.kind == ActionKind::OPTIM && !post_validate_) {
        const double dur = end - start;
        start = sync_;
        end = sync_ + dur;
      }
      emit(h.rank, h.a, start, end, h.transfer, h.parts);
    }
    return makespan_;
  }

  /// The timeline's events, each rank's in program order (keep_timeline).
  std::vector<TimelineEvent> events() {
    std::vector<TimelineEvent> all;
    size_t n = 0;
    for (const auto& e : events_) n += e.size();
    all.reserve(n);
    for (auto& e : events_) all.insert(all.end(), std::make_move_iterator(e.begin()), std::make_move_iterator(e.end()));
    return all;
  }

 private:
  struct Held {
    int rank;
    Action a;
    double start, end;
    int64_t transfer;
    Parts parts;
  };

  // The parts of a compute action depend on its kind, stage and window only (action_duration_s
  // reads the rank for OPTIM and the microbatch for an OVERLAP_F_B partner alone, which are not
  // cached): priced once per (kind, stage, window), not once per microbatch. Exact: the same
  // function of the same arguments.
  Parts parts_of(int rank, const Action& a, bool in_window) {
    const bool cached = is_compute(a.kind) && a.overlap == 0 && a.stage >= 0 && a.stage < s_.num_stages();
    Parts* slot = cached ? &priced_[(static_cast<size_t>(a.kind) * 2 + (in_window ? 1 : 0)) * s_.num_stages() + a.stage] : nullptr;
    if (slot && slot->duration_s >= 0) return *slot;
    Parts x;
    x.duration_s = action_duration_s(c_, rank, a, &x.tp_s, &x.shard_s, in_window);
    x.recompute_s = recompute_part_s(c_, a);
    if (slot) *slot = x;
    return x;
  }

  using Part = RankBreakdownBuilder::Part;
  // One event into the breakdown (and the timeline, labelled as report/timeline.hpp says).
  void event(int rank, int peer, const Action& a, Stream stream, Part part, double start, double end) {
    breakdown_.add(rank, peer, a, stream, part, start, end);
    if (keep_timeline_) record(rank, peer, a, stream, part, start, end);
  }
  void record(int rank, int peer, const Action& a, Stream stream, Part part, double start, double end) {
    TimelineEvent e;
    e.device = rank, e.pipeline_rank = rank, e.action = a, e.stream = stream, e.start_s = start, e.end_s = end, e.peer = peer;
    switch (part) {
      case Part::Whole: break;
      case Part::Recompute: e.label = kRecompute; break;
      case Part::Shard: e.label = kShardWait; break;
      case Part::PipelineAllGather: e.label = kPipelineAllGather; break;
      case Part::BlockingSend: e.label = kBlockingSend; break;
    }
    if (stream == Stream::TP) e.label = "tp collectives";
    events_[static_cast<size_t>(rank)].push_back(std::move(e));
  }

  void emit(int rank, const Action& a, double start, double end, int64_t transfer, const Parts& x) {
    makespan_ = std::max(makespan_, end);
    double& prev_end = prev_end_[static_cast<size_t>(rank)];
    if (is_compute(a.kind) || a.kind == ActionKind::OPTIM) {
      const double tp = x.tp_s, shard = x.shard_s;
      event(rank, -1, a, Stream::Compute, Part::Whole, start, end);
      if (tp > 0) event(rank, -1, a, Stream::TP, Part::Whole, end - tp, end);
      if (const double rc = x.recompute_s; rc > 0)  // the backward starts by recomputing, after the sharding waits
        event(rank, -1, a, Stream::Compute, Part::Recompute, start + shard, start + shard + rc);
      if (shard > 0) event(rank, -1, a, Stream::DP, Part::Shard, start, start + shard);  // waits not hidden, shown at the start
    } else if (a.kind == ActionKind::REDUCE_GRAD || (a.kind == ActionKind::UNSHARD && end > start)) {
      event(rank, -1, a, Stream::DP, Part::Whole, start, end);
    } else if (a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B) {
      // A blocking SEND's end is its delivery. Its RECV's wait is paired with it below (the
      // breakdown keeps nothing for it): counted only.
      const int peer = s_.stage_to_rank[a.kind == ActionKind::SEND_F ? a.stage + 1 : a.stage - 1];
      const double delivered = end + transfer_s(c_, a) - send_wait_s(c_, a);
      const Part part = end > start ? Part::BlockingSend : Part::Whole;
      breakdown_.add(rank, -1, a, Stream::PP, part, start, delivered);
      if (keep_timeline_) record(rank, peer, a, Stream::PP, part, start, delivered);
    } else if (a.kind == ActionKind::RECV_F || a.kind == ActionKind::RECV_B) {
      const int peer = s_.stage_to_rank[a.kind == ActionKind::RECV_F ? a.stage - 1 : a.stage + 1];
      const double wait_start = std::min(prev_end, start);  // the wait: from the previous action to the data
      breakdown_.add_paired_recv_wait(rank, a, wait_start, start, posted_[static_cast<size_t>(transfer)]);
      if (keep_timeline_) record(rank, peer, a, Stream::PP, Part::Whole, wait_start, start);
      if (end > start) event(rank, peer, a, Stream::PP, Part::PipelineAllGather, start, end);
    }
    prev_end = std::max(prev_end, end);
  }

  const PlanCosts& c_;
  const Schedule& s_;
  const bool post_validate_, keep_timeline_;
  RankBreakdownBuilder& breakdown_;
  std::vector<Parts> priced_;  // per (kind, window, stage)
  GatheredWindows windows_;    // the UNSHARD … RESHARD windows (stage 3), tracked as each rank's actions are met
  bool in_window_ = false;     // of the action whose duration was asked last
  Parts parts_;                // its parts (compute, OPTIM, REDUCE_GRAD, UNSHARD)
  std::vector<double> prev_end_;  // per rank: the latest end of its actions so far
  std::vector<double> posted_;    // per transfer: when its SEND was posted
  std::vector<char> held_;        // per rank: its OPTIM was met (its events wait for the sync)
  std::vector<Held> held_actions_;
  double sync_ = 0, makespan_ = 0;
  std::vector<std::vector<TimelineEvent>> events_;  // per rank (keep_timeline)
};

SimulationResult simulate_analytic(const SimulationInput& in, const Schedule& s, bool keep_timeline,
                                   const PlanCosts* given) {
  PTDP_ASSERT(s.lowered, "the simulator runs lowered schedules");
  SimulationResult res;  // the schedule is simulate()'s to add (moved there when it can be)
  const PlanCosts c = given ? *given : plan_costs(in.model, in.plan, in.cluster, true, &s);

  // The breakdown every engine makes (report/timeline.hpp), fed as the critical path times each
  // action, and (when asked for) the trace.
  const bool post_validate = in.plan.optimizer_sync == OptimizerSync::PostValidate;
  std::vector<int> representative(s.p);
  for (int rank = 0; rank < s.p; ++rank) representative[rank] = rank;
  RankBreakdownBuilder breakdown(representative);
  AnalyticTimer timer(c, s, post_validate, keep_timeline, breakdown);
  time_programs(s, timer);
  double makespan = timer.finish();
  Timeline& tl = res.timeline;
  if (keep_timeline) {
    tl.events = timer.events();
    for (int rank = 0; rank < s.p; ++rank) tl.device_names[rank] = "pipeline rank " + std::to_string(rank) + " (analytic)";
  }

  Report& r = res.report;
  r.fidelity = "analytic";
  r.backend = "sim";
  if (post_validate) makespan = breakdown.longest_rank_window_s();
  r.iteration_time_s = makespan;
  r.config_json = in.config_json;
  r.ranks = breakdown.finish(makespan);
  const EnergyAndPrice energy = energy_and_price(in.cluster, in.gpu_hour_usd, in.energy_usd_per_kwh);
  complete_report(r, run_metrics(in.model, in.plan, makespan, mfu_peak_flops(in.cluster, in.plan), in.train_tokens, &energy));
  add_memory(r, in, s, res.warnings);
  return res;
}

}  // namespace

SimulationJob start_simulation(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline) {
  PTDP_ASSERT(fidelity != Fidelity::Analytic, "start_simulation runs SimGrid");
  return start_simulation_job(in, s, fidelity, keep_timeline, nullptr);
}

namespace {
// simulate() without the analytic result's copy of the schedule (the callers below add it).
SimulationResult simulate_engine(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                                 const PlanCosts* costs) {
  // The cluster as the plan sees it, for every engine: SimGrid's links follow the curves too
  // (sim/platform.cpp).
  std::optional<SimulationInput> seen;
  if (auto cluster = cluster_for_plan(in.cluster, in.plan)) {
    seen = in;
    seen->cluster = std::move(*cluster);
  }
  const SimulationInput& input = seen ? *seen : in;
  SimulationResult res = fidelity == Fidelity::Analytic ? simulate_analytic(input, s, keep_timeline, costs)
                                                        : simulate_simgrid(input, s, fidelity, keep_timeline, costs);
  // Context- and expert-parallel collectives run inside F/B on the TP stream: their part of the
  // exposed "tp" time, by the layer's shares, is reported as "cp" and "ep".
  if (input.plan.context > 1 || input.model.has_moe()) {
    const auto shares = layer_comm_by_group(input.model, input.plan, input.cluster);
    double total = 0;
    for (const auto& [k, v] : shares) total += v;
    auto& ex = res.report.exposed_comm_s;
    auto part = [&](double tp, const char* k) { return total > 0 && shares.count(k) ? tp * shares.at(k) / total : 0.0; };
    if (ex.count("tp")) {
      const double tp = ex["tp"];
      if (input.plan.context > 1) ex["cp"] = part(tp, "cp");
      if (input.model.has_moe()) ex["ep"] = part(tp, "ep");
      if (total > 0) ex["tp"] = part(tp, "tp");
    }
    // Per rank the same split: the columns tp, cp and ep.
    if (total > 0)
      for (RankBreakdown& rb : res.report.ranks) {
        const double tp = rb.exposed_tp_s;
        rb.exposed_cp_s = part(tp, "cp"), rb.exposed_ep_s = part(tp, "ep"), rb.exposed_tp_s = part(tp, "tp");
      }
    // The bottleneck among the classes as split (an MoE run whose expert all-to-all dominates is
    // "ep", not "tp"), by the rule of report/timeline.cpp: the largest loss when it costs at
    // least a tenth of the iteration.
    Report& r = res.report;
    std::pair<double, std::string> worst{r.bubble_fraction * r.iteration_time_s, "bubble"};
    for (const auto& [k, v] : ex)
      if (v > worst.first) worst = {v, k};
    r.bottleneck = worst.first >= 0.1 * r.iteration_time_s ? worst.second : "compute";
  }
  return res;
}
}  // namespace

SimulationResult simulate(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                          const PlanCosts* costs) {
  SimulationResult res = simulate_engine(in, s, fidelity, keep_timeline, costs);
  if (fidelity == Fidelity::Analytic) res.schedule = s;
  return res;
}

Report simulate_report(const SimulationInput& in, const Schedule& s, Fidelity fidelity, const PlanCosts* costs) {
  return simulate_engine(in, s, fidelity, false, costs).report;
}

SimulationResult simulate(const SimulationInput& in, Schedule&& s, Fidelity fidelity, bool keep_timeline,
                          const PlanCosts* costs) {
  SimulationResult res = simulate_engine(in, s, fidelity, keep_timeline, costs);
  if (fidelity == Fidelity::Analytic) res.schedule = std::move(s);
  return res;
}

}  // namespace ptdp
