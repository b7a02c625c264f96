// Analytic fidelity: the cost-weighted critical path of the lowered schedule, no SimGrid.
#include <algorithm>
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

SimulationResult simulate_analytic(const SimulationInput& in, const Schedule& s, bool keep_timeline,
                                   const PlanCosts* given) {
  PTDP_ASSERT(s.lowered, "the simulator runs lowered schedules");
  SimulationResult res;  // the schedule is simulate()'s to add (moved there when it can be)
  const PlanCosts c = given ? *given : plan_costs(in.model, in.plan, in.cluster, true, &s);

  // Durations as the IR defines the actions (sim/costing); a RECV lasts its scatter/gather
  // all-gather once the data is there, the wire time sits on the SEND → RECV edge.
  // The critical path asks for each rank's actions in program order, so the UNSHARD … RESHARD
  // windows (stage 3: parameters already gathered, no unit gathers inside) are tracked as it goes,
  // and again as the events below walk each rank's program: no pass over all actions for them.
  // The parts of a compute action depend on its kind, stage and window only (action_duration_s
  // reads the rank for OPTIM and the microbatch for an OVERLAP_F_B partner alone, which are not
  // cached): priced once per (kind, stage, window), not once per microbatch. Exact: the same
  // function of the same arguments.
  struct Parts {
    double duration_s = -1, tp_s = 0, shard_s = 0, recompute_s = 0;
  };
  std::vector<Parts> priced(static_cast<size_t>(4 * 2 * s.num_stages()));
  auto parts_of = [&](int rank, const Action& a, bool in_window) -> Parts {
    const bool cached = is_compute(a.kind) && a.overlap == 0 && a.stage >= 0 && a.stage < s.num_stages();
    Parts* slot = cached ? &priced[(static_cast<size_t>(a.kind) * 2 + (in_window ? 1 : 0)) * s.num_stages() + a.stage] : nullptr;
    if (slot && slot->duration_s >= 0) return *slot;
    Parts x;
    x.duration_s = action_duration_s(c, rank, a, &x.tp_s, &x.shard_s, in_window);
    x.recompute_s = recompute_part_s(c, a);
    if (slot) *slot = x;
    return x;
  };
  std::vector<size_t> next(static_cast<size_t>(s.p), 0);
  GatheredWindows windows(s);
  std::vector<std::pair<int, size_t>> optims;  // (rank, index) of each OPTIM, noted as the critical path passes it
  ActionCosts costs;
  costs.duration = [&](int rank, const Action& a) -> double {
    const bool in_window = windows.inside(rank, a);
    const size_t index = next[rank]++;
    if (a.kind == ActionKind::OPTIM) optims.emplace_back(rank, index);
    if (a.kind == ActionKind::RECV_F || a.kind == ActionKind::RECV_B) return recv_completion_s(c, s, a);
    if ((a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B) && a.overlap == 0) return send_wait_s(c, a);
    return parts_of(rank, a, in_window).duration_s;
  };
  costs.transfer = [&](int, const Action& a) -> double { return transfer_s(c, a) - send_wait_s(c, a); };
  CriticalPath cp = critical_path(s, costs);

  // OPTIM starts with the gradient-norm all-reduce over the whole pipeline: a synchronisation
  // point. Nothing depends on OPTIM (each rank's last action), so it is placed afterwards.
  // Post-validated (schedules/schedule.hpp), each rank steps right after its own last action.
  // The steps are moved as each rank's events are made below (which read only their own action's
  // times), and the makespan is taken there: one pass over the actions, not three.
  const bool post_validate = in.plan.optimizer_sync == OptimizerSync::PostValidate;
  double sync = 0;
  for (const auto& [rank, i] : optims) sync = std::max(sync, cp.times[rank][i].start);
  double makespan = 0;

  // The timeline every engine records (report/timeline.hpp), for the breakdown and (when
  // asked for) the trace.
  Timeline& tl = res.timeline;
  std::vector<int> representative(s.p);
  for (int rank = 0; rank < s.p; ++rank) representative[rank] = rank;
  RankBreakdownBuilder breakdown(representative);
  breakdown.reserve(s.num_actions() / 2);  // 1F1B: 2 of every 5 actions are transfers
  auto emit = [&](const TimelineEvent& e) {
    breakdown.add(e);
    if (keep_timeline) tl.events.push_back(e);
  };
  if (keep_timeline) tl.events.reserve(2 * s.num_actions());
  // The labelled parts of an action, labelled once here (not once per action: 200 000 actions).
  TimelineEvent tp_part, recompute_part, shard_part, gather_part, blocking_send;
  tp_part.stream = Stream::TP, tp_part.label = "tp collectives";
  blocking_send.stream = Stream::PP, blocking_send.label = kBlockingSend;
  recompute_part.label = kRecompute;
  shard_part.stream = Stream::DP, shard_part.label = kShardWait;
  gather_part.stream = Stream::PP, gather_part.label = kPipelineAllGather;
  auto part_of = [](TimelineEvent& part, const TimelineEvent& ev, double start_s, double end_s) -> const TimelineEvent& {
    part.device = ev.device, part.pipeline_rank = ev.pipeline_rank, part.action = ev.action, part.peer = ev.peer;
    part.start_s = start_s, part.end_s = end_s;
    return part;
  };
  TimelineEvent ev;  // one event object refilled per action (its label empty: a blocking SEND's is blocking_send)
  GatheredWindows event_windows(s);
  for (int rank = 0; rank < s.p; ++rank) {
    if (keep_timeline) tl.device_names[rank] = "pipeline rank " + std::to_string(rank) + " (analytic)";
    const auto& acts = s.programs[rank].actions;
    double prev_end = 0;
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      ScheduledAction& t = cp.times[rank][i];
      if (a.kind == ActionKind::OPTIM && !post_validate) {
        const double dur = t.end - t.start;
        t.start = sync;
        t.end = sync + dur;
      }
      makespan = std::max(makespan, t.end);
      const bool in_window = event_windows.inside(rank, a);
      ev.device = rank;
      ev.pipeline_rank = rank;
      ev.action = a;
      ev.stream = Stream::Compute;
      ev.start_s = t.start;
      ev.end_s = t.end;
      ev.peer = -1;
      if (is_compute(a.kind) || a.kind == ActionKind::OPTIM) {
        const Parts x = parts_of(rank, a, in_window);
        const double tp = x.tp_s, shard = x.shard_s;
        emit(ev);
        if (tp > 0) emit(part_of(tp_part, ev, t.end - tp, ev.end_s));
        if (const double rc = x.recompute_s; rc > 0)  // the backward starts by recomputing,
          emit(part_of(recompute_part, ev, t.start + shard, t.start + shard + rc));  // after the sharding waits
        if (shard > 0) emit(part_of(shard_part, ev, ev.start_s, t.start + shard));  // waits not hidden, shown at the start
      } else if (a.kind == ActionKind::REDUCE_GRAD || (a.kind == ActionKind::UNSHARD && t.end > t.start)) {
        ev.stream = Stream::DP;
        emit(ev);
      } else if (a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B) {
        ev.stream = Stream::PP;
        ev.end_s = t.end + transfer_s(c, a) - send_wait_s(c, a);  // a blocking SEND's end is its delivery
        ev.peer = s.stage_to_rank[a.kind == ActionKind::SEND_F ? a.stage + 1 : a.stage - 1];
        if (t.end > t.start) {
          emit(part_of(blocking_send, ev, ev.start_s, ev.end_s));
        } else {
          emit(ev);
        }
      } else if (a.kind == ActionKind::RECV_F || a.kind == ActionKind::RECV_B) {
        ev.stream = Stream::PP;
        ev.peer = s.stage_to_rank[a.kind == ActionKind::RECV_F ? a.stage - 1 : a.stage + 1];
        ev.start_s = std::min(prev_end, t.start);  // the wait: from the previous action to the data
        ev.end_s = t.start;
        emit(ev);
        if (t.end > t.start) emit(part_of(gather_part, ev, t.start, t.end));
      }
      prev_end = std::max(prev_end, t.end);
    }
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

SimulationResult simulate(const SimulationInput& in, Schedule&& s, Fidelity fidelity, bool keep_timeline,
                          const PlanCosts* costs) {
  SimulationResult res = simulate_engine(in, s, fidelity, keep_timeline, costs);
  if (fidelity == Fidelity::Analytic) res.schedule = std::move(s);
  return res;
}

}  // namespace ptdp
