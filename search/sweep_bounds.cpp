// The sweep's lower bounds on a plan's iteration time (search/sweep.hpp: bound_costs,
// iteration_lower_bound_s, compute_twin): what lets the analytic pass skip plans that cannot enter
// the top K without simulating them. Split from sweep.cpp, which enumerates, prunes and refines.
#include <algorithm>
#include <cmath>
#include <vector>

#include "model/partition.hpp"
#include "search/sweep.hpp"
#include "sim/costing.hpp"

namespace ptdp {
namespace {

// OVERLAP_F_B pairs (DualPipe, DualPipeV) hide each action's TP-stream communication (TP, CP,
// expert all-to-alls) under its partner's compute (sim/costing.cpp action_duration_s): an action
// of duration D with TP time T takes D − (1 − κ) · min(T, the partner's compute) (κ: the
// contention), the partner being an action of a stage on the same rank; between UNSHARD and
// RESHARD (stage 3) it takes D less its sharding waits instead. So each action takes at least D
// less the larger of its sharding waits and (1 − κ) · min(T, the most compute of a partner on its
// rank). Backwards are whole Bs (in the pairs) or I + W (the cool-down): the cheaper counts.
void overlapped_pair_bounds(const PlanCosts& c, bool windows, BoundCosts& b) {
  // Without UNSHARD … RESHARD windows (schedules/generators.cpp add_unshard_windows) no action
  // runs gathered: each keeps its sharding waits.
  auto at = [](const std::vector<double>& v, size_t i) { return v.empty() ? 0.0 : v[i]; };
  auto waits = [&](const std::vector<double>& v, size_t i) { return windows ? at(v, i) : 0.0; };
  const size_t stages = c.forward_s.size();
  std::vector<double> f_compute(c.optim_s.size(), 0.0), b_compute(c.optim_s.size(), 0.0);  // per rank: F's; B's or I's
  for (size_t st = 0; st < stages; ++st) {
    const auto r = static_cast<size_t>(b.stage_to_rank[st]);
    const double whole_b_tp = c.backward_tp_s[st] - at(c.backward_hidden_tp_s, st);
    f_compute[r] = std::max(f_compute[r], c.forward_s[st] - c.forward_tp_s[st] - at(c.forward_shard_s, st));
    b_compute[r] = std::max({b_compute[r], c.backward_s[st] - whole_b_tp - at(c.backward_shard_s, st),
                             c.input_backward_s[st] - c.backward_tp_s[st] - at(c.input_shard_s, st)});
  }
  auto hidden = [&](double tp, double partner) {
    return c.overlaps_communication ? hidden_s(partner, tp, kCollectiveContention) : 0.0;
  };
  // Megatron's merged steps hide only the expert all-to-alls (action_duration_s); an I is never
  // one of their pairs.
  auto pair_comm = [&](double tp, const std::vector<double>& ep, size_t st) {
    return c.pairs_hide_tp_stream ? tp : std::min(tp, at(ep, st));
  };
  for (size_t st = 0; st < stages; ++st) {
    const auto r = static_cast<size_t>(b.stage_to_rank[st]);
    const double whole_b_tp = c.backward_tp_s[st] - at(c.backward_hidden_tp_s, st);
    b.forward_s[st] = c.forward_s[st] - std::max(waits(c.forward_shard_s, st), hidden(pair_comm(c.forward_tp_s[st], c.forward_ep_s, st), b_compute[r]));
    b.backward_s[st] = c.backward_s[st] - std::max(waits(c.backward_shard_s, st), hidden(pair_comm(whole_b_tp, c.backward_ep_s, st), f_compute[r]));
    const double input = c.input_backward_s[st] - std::max(waits(c.input_shard_s, st), hidden(c.pairs_hide_tp_stream ? c.backward_tp_s[st] : 0.0, f_compute[r]));
    b.split_backward_s[st] = std::min(input + c.weight_backward_s[st], b.backward_s[st]);
  }
}

// The bound's costs of a plan from its PlanCosts (priced with the plan's own placement).
BoundCosts bound_costs_of(const PlanCosts& c, const ParallelPlan& plan) {
  BoundCosts b;
  b.stage_to_rank = stage_placement(plan);
  b.forward_s = c.forward_s;
  b.backward_s = c.backward_s;
  // Without the program, which backward of a stage is its last (a B or a W) is not known.
  b.reduce_grad_s = c.reduce_grad_least_s;
  for (size_t st = 0; st < c.input_backward_s.size(); ++st) b.split_backward_s.push_back(c.input_backward_s[st] + c.weight_backward_s[st]);
  if (runs_overlapped_pairs(plan)) {
    overlapped_pair_bounds(c, stage_held_unsharded(plan), b);
  } else if (stage_held_unsharded(plan) && !c.forward_gathered_s.empty()) {
    // Between a stage's UNSHARD and RESHARD (torchtitan's FSDP with pipelines) F, B and I run on
    // parameters already gathered (action_duration_s): no unit gathers in them.
    for (size_t st = 0; st < c.forward_s.size(); ++st) {
      b.forward_s[st] = std::min(b.forward_s[st], c.forward_gathered_s[st]);
      b.backward_s[st] = std::min(b.backward_s[st], c.backward_gathered_s[st]);
      b.split_backward_s[st] = std::min(b.split_backward_s[st], c.input_gathered_s[st] + c.weight_backward_s[st]);
    }
  }
  b.optim_s = c.optim_s;
  // The hop stage → stage + 1 (and back): the wire time on the SEND → RECV edge and the RECV's
  // scatter/gather all-gather, when the two stages sit on different ranks (sim/analytic.cpp).
  for (size_t st = 0; st + 1 < c.send_forward_s.size(); ++st)
    b.hop_s.push_back(c.send_forward_s[st] +
                      (b.stage_to_rank[st] != b.stage_to_rank[st + 1] ? c.p2p_allgather_s : 0.0));
  return b;
}

}  // namespace

BoundCosts bound_costs(const SimulationInput& in) { return bound_costs(in.model, in.plan, in.cluster); }

BoundCosts bound_costs(const TransformerSpec& model, const ParallelPlan& plan, const ClusterSpec& cluster) {
  return bound_costs_of(plan_costs(model, plan, cluster, true), plan);  // the plan's placement
}

double iteration_lower_bound_s(const BoundCosts& c, const ParallelPlan& plan) {
  // The analytic engine runs each rank's actions one after another (F, B or I + W of its stages
  // for m microbatches, then each stage's REDUCE_GRAD, then OPTIM); OPTIM starts on every rank at
  // once, after the last rank is ready for it (unless post-validated). So, for each rank r:
  //  - nothing of r starts before microbatch 0's forward reached r's first stage (head: the
  //    forwards and hops of the stages before it, sim/analytic's RECV edges);
  //  - r then computes m forwards and backwards of each of its stages (B; the zero-bubble
  //    generators emit every backward as I and W instead) and reduces its stages' gradients;
  //  - schedules with whole backwards (GPipe, 1F1B, interleaved): after r's last backward (stage
  //    s ≥ r's first stage), the backwards of every stage below run in a chain down to stage 0 on
  //    rank 0, which then reduces its gradients (tail);
  // no bubble beyond that, no overlap assumed lost. The bound never exceeds the critical path.
  // With lanes (DualPipe) each stage runs the m / lanes microbatches of its lane, and the chains
  // start at its lane's first stage.
  const int p = static_cast<int>(plan.pipeline);
  const size_t stages = c.forward_s.size();
  const double m = static_cast<double>(plan.num_microbatches()) / static_cast<double>(plan.lanes());
  std::vector<double> head(stages, 0.0), tail(stages, 0.0);  // before stage s, forward and backward chains
  for (size_t st = 1; st < stages; ++st) {
    if (plan.is_first_stage(static_cast<int64_t>(st))) continue;
    head[st] = head[st - 1] + c.forward_s[st - 1] + c.hop_s[st - 1];
    tail[st] = tail[st - 1] + c.backward_s[st - 1] + c.hop_s[st - 1];
  }
  std::vector<double> work(static_cast<size_t>(p), 0.0), reduce(static_cast<size_t>(p), 0.0);
  std::vector<size_t> first_stage(static_cast<size_t>(p), stages);
  std::vector<double> start(static_cast<size_t>(p), std::numeric_limits<double>::infinity());  // earliest head of r's stages
  const bool whole_backwards = !is_zero_bubble(plan.schedule);
  for (size_t st = 0; st < stages; ++st) {
    const size_t r = static_cast<size_t>(c.stage_to_rank[st]);
    first_stage[r] = std::min(first_stage[r], st);
    start[r] = std::min(start[r], head[st]);
    work[r] += m * (c.forward_s[st] + (whole_backwards ? c.backward_s[st] : c.split_backward_s[st]));
    reduce[r] += c.reduce_grad_s[st];
  }
  std::vector<double> ready(static_cast<size_t>(p), 0.0);  // when rank r can start OPTIM, at the earliest
  double chain = 0;
  for (size_t r = 0; r < ready.size(); ++r) {
    const double done = start[r] + work[r];
    ready[r] = done + reduce[r];
    if (whole_backwards) chain = std::max(chain, done + tail[first_stage[r]]);
  }
  ready[static_cast<size_t>(c.stage_to_rank[0])] = std::max(ready[static_cast<size_t>(c.stage_to_rank[0])],
                                                           chain + reduce[static_cast<size_t>(c.stage_to_rank[0])]);
  double bound = 0;
  if (plan.optimizer_sync == OptimizerSync::PostValidate) {
    for (size_t r = 0; r < ready.size(); ++r) bound = std::max(bound, ready[r] + c.optim_s[r]);
  } else {
    bound = *std::max_element(ready.begin(), ready.end()) + *std::max_element(c.optim_s.begin(), c.optim_s.end());
  }
  return bound;
}

double iteration_lower_bound_s(const SimulationInput& in) { return iteration_lower_bound_s(bound_costs(in), in.plan); }

ParallelPlan compute_twin(const ParallelPlan& plan) {
  ParallelPlan twin = plan;
  twin.zero_stage = 0;
  twin.sharding_group = ShardingGroup::Data;
  twin.offload = Offload::None;
  twin.overlap_grad_reduce = twin.overlap_param_gather = false;
  return twin;
}

BoundCosts compute_bound_costs(const TransformerSpec& model, const ParallelPlan& plan, const ClusterSpec& cluster) {
  // The twin's costs without its gradient reductions and optimizer step (zeros): not priced.
  const ParallelPlan twin = compute_twin(plan);
  return bound_costs_of(plan_compute_costs(model, twin, cluster), twin);
}

}  // namespace ptdp
