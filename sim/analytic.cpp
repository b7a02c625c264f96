// Analytic fidelity: the cost-weighted critical path of the lowered schedule, no SimGrid.
#include <algorithm>

#include "core/error.hpp"
#include "core/units.hpp"
#include "model/memory.hpp"
#include "schedules/graph.hpp"
#include "sim/costing.hpp"
#include "sim/simulate.hpp"

namespace ptdp {

std::string to_string(Fidelity f) {
  switch (f) {
    case Fidelity::Analytic: return "analytic";
    case Fidelity::Reduced: return "reduced";
    case Fidelity::Full: return "full";
  }
  return "?";
}

Fidelity parse_fidelity(const std::string& text) {
  if (text == "analytic") return Fidelity::Analytic;
  if (text == "reduced") return Fidelity::Reduced;
  if (text == "full") return Fidelity::Full;
  throw ConfigError("--fidelity", "unknown fidelity '" + text + "', expected analytic, reduced or full" +
                                      did_you_mean(text, {"analytic", "reduced", "full"}));
}

void add_memory(Report& r, const SimulationInput& in, const Schedule& s, std::vector<std::string>& warnings) {
  const auto ranks = memory_per_rank(in.model, in.plan, peak_inflight_activations(s));
  const MemoryBreakdown peak = peak_memory(ranks);
  r.peak_memory_bytes = peak.total_bytes;
  r.gpu_memory_bytes = in.cluster.gpu.memory_bytes;
  r.fits_in_memory = peak.total_bytes <= in.cluster.gpu.memory_bytes;
  r.extra["peak_memory_weights_bytes"] = peak.weights_bytes;
  r.extra["peak_memory_gradients_bytes"] = peak.gradients_bytes;
  r.extra["peak_memory_optimizer_bytes"] = peak.optimizer_bytes;
  r.extra["peak_memory_activations_bytes"] = peak.activations_bytes;
  r.extra["peak_memory_pipeline_rank"] = peak.pipeline_rank;
  if (!r.fits_in_memory)
    warnings.push_back("the plan does not fit in GPU memory: pipeline rank " + std::to_string(peak.pipeline_rank) + " needs " +
                       format_bytes(peak.total_bytes) + " of " + format_bytes(in.cluster.gpu.memory_bytes) + " (over by " +
                       format_bytes(peak.total_bytes - in.cluster.gpu.memory_bytes) + ")");
}

namespace {

SimulationResult simulate_analytic(const SimulationInput& in, bool keep_timeline) {
  SimulationResult res;
  res.schedule = build_schedule(in.plan, /*check_deadlocks=*/false);  // critical_path finds cycles
  const Schedule& s = res.schedule;
  const PlanCosts c = plan_costs(in.model, in.plan, in.cluster);

  ActionCosts costs;
  costs.duration = [&](int rank, const Action& a) -> double {
    switch (a.kind) {
      case ActionKind::F: return c.forward_s[a.stage];
      case ActionKind::B: return c.backward_s[a.stage];
      case ActionKind::I: return 0.5 * c.backward_s[a.stage];
      case ActionKind::W: return 0.5 * c.backward_s[a.stage];
      case ActionKind::REDUCE_GRAD: return c.reduce_grad_s[a.stage];
      case ActionKind::OPTIM: return c.optim_s[rank];
      default: return 0.0;  // SEND is asynchronous, RECV waits (edge weights carry transfers)
    }
  };
  costs.transfer = [&](int, const Action& a) -> double {
    return a.kind == ActionKind::SEND_F ? c.send_forward_s[a.stage] : c.send_backward_s[a.stage];
  };
  const CriticalPath cp = critical_path(s, costs);

  Report& r = res.report;
  r.fidelity = "analytic";
  r.backend = "sim";
  r.iteration_time_s = cp.makespan;
  r.config_json = in.config_json;

  // Per-rank breakdown. A RECV's wait is pipeline communication for the part spent on the wire
  // after the send finished, and bubble for the part spent waiting for the peer to compute.
  std::vector<double> send_end;  // by (direction, sender stage, microbatch) → end of send action
  const int stages = s.num_stages();
  auto key = [&](int dir, int stage, int mb) { return (static_cast<size_t>(dir) * stages + stage) * s.m + mb; };
  send_end.assign(2 * static_cast<size_t>(stages) * s.m, 0.0);
  for (int rank = 0; rank < s.p; ++rank)
    for (size_t i = 0; i < s.programs[rank].actions.size(); ++i) {
      const Action& a = s.programs[rank].actions[i];
      if (a.kind == ActionKind::SEND_F) send_end[key(0, a.stage, a.microbatch)] = cp.times[rank][i].end;
      if (a.kind == ActionKind::SEND_B) send_end[key(1, a.stage, a.microbatch)] = cp.times[rank][i].end;
    }
  for (int rank = 0; rank < s.p; ++rank) {
    RankBreakdown rb;
    rb.pipeline_rank = rank;
    double prev_end = 0;
    const auto& acts = s.programs[rank].actions;
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      const ScheduledAction& t = cp.times[rank][i];
      const double dur = t.end - t.start;
      add_action_time(rb, a, is_p2p(a.kind) ? std::max(0.0, t.start - prev_end) : dur);
      if (a.kind == ActionKind::F) {
        rb.busy_s += dur - c.forward_tp_s[a.stage];
        rb.exposed_tp_s += c.forward_tp_s[a.stage];
      } else if (a.kind == ActionKind::B || a.kind == ActionKind::I || a.kind == ActionKind::W) {
        const double tp = (a.kind == ActionKind::B ? 1.0 : 0.5) * c.backward_tp_s[a.stage];
        rb.busy_s += dur - tp;
        rb.exposed_tp_s += tp;
      } else if (a.kind == ActionKind::OPTIM) {
        rb.busy_s += dur;
      } else if (a.kind == ActionKind::REDUCE_GRAD) {
        rb.exposed_dp_s += dur;
      } else if (a.kind == ActionKind::RECV_F || a.kind == ActionKind::RECV_B) {
        const bool fwd = a.kind == ActionKind::RECV_F;
        const double sent = send_end[key(fwd ? 0 : 1, fwd ? a.stage - 1 : a.stage + 1, a.microbatch)];
        rb.exposed_pp_s += std::max(0.0, t.start - std::max(prev_end, sent));
      }
      prev_end = std::max(prev_end, t.end);
    }
    rb.bubble_s = std::max(0.0, r.iteration_time_s - rb.busy_s - rb.exposed_tp_s - rb.exposed_pp_s - rb.exposed_dp_s);
    r.ranks.push_back(rb);
  }
  complete_report(r, in.model, in.plan, in.cluster.gpu.peak_flops, in.train_tokens);
  add_memory(r, in, s, res.warnings);

  if (keep_timeline) {
    for (int rank = 0; rank < s.p; ++rank) {
      res.timeline.device_names[rank] = "pipeline rank " + std::to_string(rank) + " (analytic)";
      const auto& acts = s.programs[rank].actions;
      for (size_t i = 0; i < acts.size(); ++i) {
        const Action& a = acts[i];
        const ScheduledAction& t = cp.times[rank][i];
        TimelineEvent ev;
        ev.device = rank;
        ev.pipeline_rank = rank;
        ev.action = a;
        ev.start_s = t.start;
        ev.end_s = t.end;
        if (is_compute(a.kind) || a.kind == ActionKind::OPTIM) {
          ev.stream = Stream::Compute;
        } else if (a.kind == ActionKind::REDUCE_GRAD) {
          ev.stream = Stream::DP;
        } else if (a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B) {
          ev.stream = Stream::PP;
          ev.end_s = t.end + costs.transfer(rank, a);
          const int to = a.kind == ActionKind::SEND_F ? a.stage + 1 : a.stage - 1;
          ev.peer = s.stage_to_rank[to];
        } else {
          ev.stream = Stream::PP;
          const int from = a.kind == ActionKind::RECV_F ? a.stage - 1 : a.stage + 1;
          ev.peer = s.stage_to_rank[from];
        }
        res.timeline.events.push_back(ev);
      }
    }
  }
  return res;
}

}  // namespace

SimulationResult simulate_simgrid(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                                  const PlanCosts* costs);

SimulationJob start_simulation_job(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                                   const PlanCosts* costs);

SimulationJob start_simulation(const SimulationInput& in, Fidelity fidelity, bool keep_timeline) {
  PTDP_ASSERT(fidelity != Fidelity::Analytic, "start_simulation runs SimGrid");
  return start_simulation_job(in, build_schedule(in.plan), fidelity, keep_timeline, nullptr);
}

SimulationResult simulate(const SimulationInput& in, Fidelity fidelity, bool keep_timeline) {
  if (fidelity == Fidelity::Analytic) return simulate_analytic(in, keep_timeline);
  return simulate_simgrid(in, build_schedule(in.plan), fidelity, keep_timeline, nullptr);
}

SimulationResult simulate_schedule(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                                   const PlanCosts* costs) {
  PTDP_ASSERT(fidelity != Fidelity::Analytic, "simulate_schedule runs SimGrid");
  return simulate_simgrid(in, s, fidelity, keep_timeline, costs);
}

}  // namespace ptdp
