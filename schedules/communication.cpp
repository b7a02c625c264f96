#include "schedules/communication.hpp"

#include <cstdio>

#include "core/error.hpp"
#include "model/cost.hpp"
#include "model/memory.hpp"
#include "model/partition.hpp"
#include "model/units.hpp"

namespace ptdp {

std::string_view to_string(StepKind k) {
  switch (k) {
    case StepKind::AllReduce: return "all-reduce";
    case StepKind::ReduceScatter: return "reduce-scatter";
    case StepKind::AllGather: return "all-gather";
    case StepKind::Send: return "send";
    case StepKind::Recv: return "recv";
    case StepKind::Wait: return "wait";
    case StepKind::AllToAll: return "all-to-all";
  }
  return "?";
}

std::string describe(const CommStep& step) {
  char bytes[64];
  std::snprintf(bytes, sizeof bytes, "%.0f bytes", step.bytes);
  std::string out = std::string(to_string(step.kind)) + " " + bytes + " over " + std::string(to_string(step.group));
  if (step.peer_stage >= 0) out += " (stage " + std::to_string(step.peer_stage) + ")";
  if (!step.what.empty()) out += " (" + step.what + ")";
  return out;
}

namespace {

struct Builder {
  const ProcessGrid& grid;
  const std::vector<StageParameters>& stages;  // stage_parameters_all for the schedule's placement
  std::vector<CommStep> steps;
  const StageParameters& stage(int st) const { return stages[static_cast<size_t>(st)]; }

  // A collective over a group of one moves nothing and gets no step.
  void collective(StepKind kind, CommGroup g, double bytes, std::string what, int peer_stage = -1, bool bucketable = false) {
    if (g != CommGroup::Pair && grid.size(g) <= 1) return;
    if (bytes <= 0 && kind != StepKind::Wait) return;
    steps.push_back(CommStep{kind, g, bytes, peer_stage, std::move(what), bucketable});
  }
};

// REDUCE_GRAD s (schedule.hpp): the data-parallel reduction of the stage's gradients, its expert
// gradients over their own replicas, the lane copy's sum, the hybrid shard all-reduce, the
// sequence-parallel replicated gradients over the TP group, the tied embedding's two copies.
// Routed experts have their own replicas (the expert-data group: their gradients reduce, their
// states shard and their updated weights gather there) unless those are exactly the dense ones;
// folded, at an expert-tensor size other than t, they always have (Megatron keeps their gradients
// in buffers of their own, reduced over the expert-data group).
bool experts_apart(const ProcessGrid& grid, const ParallelPlan& plan) {
  return grid.size(CommGroup::ExpertData) != grid.size(CommGroup::Gradient) ||
         grid.stride(CommGroup::ExpertData) != grid.stride(CommGroup::Gradient) || plan.expert_tensor_size() != plan.tensor;
}

void reduce_grad_steps(Builder& b, const Schedule& s, const ParallelPlan& plan, int stage) {
  const ProcessGrid& grid = b.grid;
  const StageParameters& sp = b.stage(stage);
  const double grad_b = gradient_bytes(plan.precision);
  const int64_t replicas = grid.size(CommGroup::Gradient), n_shard = grid.size(CommGroup::Sharding);
  const bool own_experts = sp.expert > 0 && experts_apart(grid, plan);
  const double expert = own_experts ? sp.expert * grad_b : 0.0;
  const double dense = sp.total * grad_b - expert;
  const bool lanes = s.lanes > 1;
  const int mirror = lanes ? (stage + s.lane_stages()) % s.num_stages() : -1;
  const int z = plan.zero_stage;
  if (z == 0) {
    if (lanes) {
      // DualPipe: the copy in the other lane (on the mirror rank) adds its gradients, folded into
      // the data-parallel reduction: reduce-scatter over the replicas, the pair sums its part,
      // all-gather. The expert part is summed whole with the copy, then over its replicas.
      if (expert > 0) b.collective(StepKind::AllReduce, CommGroup::Pair, expert, "expert gradients with the lane copy", mirror);
      if (replicas == 1) {
        b.collective(StepKind::AllReduce, CommGroup::Pair, dense, "gradients with the lane copy", mirror);
      } else {
        b.collective(StepKind::ReduceScatter, CommGroup::Gradient, dense, "dense gradients");
        b.collective(StepKind::AllReduce, CommGroup::Pair, dense / static_cast<double>(replicas), "gradient part with the lane copy",
                     mirror);
        b.collective(StepKind::AllGather, CommGroup::Gradient, dense, "dense gradients");
      }
    } else {
      b.collective(StepKind::AllReduce, CommGroup::Gradient, dense, "dense gradients", -1, true);
    }
    // The routed experts' buffer reduces over its own group in buckets of its own, launched in
    // the backward as the dense ones are (Megatron's expert-parallel bucket groups; the executor's
    // overlapped reduction cuts the experts' region apart).
    if (expert > 0) b.collective(StepKind::AllReduce, CommGroup::ExpertData, expert, "expert gradients", -1, !lanes);
  } else {
    if (z == 1 || gradients_reduced_once_per_step(plan)) {
      // Stage 1, and torchtitan's FSDP with pipelines (plan.hpp): the gradients accumulated over
      // the step, reduce-scattered once.
      b.collective(StepKind::ReduceScatter, CommGroup::Sharding, dense, "gradients", -1, z == 1);
      if (expert > 0) b.collective(StepKind::ReduceScatter, CommGroup::ExpertData, expert, "expert gradients", -1, z == 1);
    } else if (n_shard > 1) {
      // Stages 2 and 3 reduce-scatter each unit's gradients in its backward; the last unit's is
      // still on the wire.
      b.steps.push_back(CommStep{StepKind::Wait, CommGroup::Sharding, 0, -1, "last unit's gradient reduce-scatter", false});
    }
    const double shard = sp.total * grad_b / static_cast<double>(n_shard);
    if (replicas > n_shard) b.collective(StepKind::AllReduce, CommGroup::ShardReplicas, shard, "gradient shard", -1, true);
    if (lanes) b.collective(StepKind::AllReduce, CommGroup::Pair, shard, "gradient shard with the lane copy", mirror);
  }
  if (plan.sequence_parallel && plan.tensor > 1)
    b.collective(StepKind::AllReduce, CommGroup::Tensor, sp.replicated * grad_b, "sequence-parallel replicated gradients");
  if (sp.tied_with_stage >= 0) {
    // What the rank holds after the reduction above: the whole embedding gradient, or (sharded
    // states, z ≥ 1) its shard.
    const double held = z >= 1 ? static_cast<double>(n_shard) : 1.0;
    b.collective(StepKind::AllReduce, CommGroup::Pair, sp.tied_embedding * grad_b / held, "tied embedding", sp.tied_with_stage);
  }
}

// Stage 3 (schedule.hpp): each unit's parameters all-gathered over the sharding group in its
// forward, and in a backward (B, I) again over the reshard group (plan.hpp reshard_group: the
// whole sharding group, N consecutive members of it, or none where the forward kept the unit
// whole — every unit with reshard_after_forward false, torchtitan's head unit by default). Not
// inside an UNSHARD … RESHARD window (the plan's, or an imported schedule's), whose UNSHARD
// gathers the stage once.
void unit_gather_steps(Builder& b, const Schedule& s, const ParallelPlan& plan, const Action& a) {
  if (plan.zero_stage < 3 || a.kind == ActionKind::W || stage_held_unsharded(plan)) return;
  for (const RankProgram& program : s.programs)
    for (const Action& other : program.actions)
      if (other.kind == ActionKind::UNSHARD && other.stage == a.stage) return;
  const StageParameters& sp = b.stage(a.stage);
  const bool forward = a.kind == ActionKind::F;
  const int64_t regather = reshard_group(plan);
  if (!forward && regather == 1) return;
  const CommGroup group = forward || regather == b.grid.size(CommGroup::Sharding) ? CommGroup::Sharding : CommGroup::Reshard;
  const size_t head = sp.has_head ? sp.units.size() - (sp.has_vocab_share ? 2 : 1) : sp.units.size();
  const double weight_b = bytes_per_element(plan.precision);
  for (size_t u = 0; u < sp.units.size(); ++u)
    if (forward || u != head || !last_unit_kept_whole(plan))
      b.collective(StepKind::AllGather, group, sp.units[u] * weight_b, "unit parameters");
}

// OPTIM (schedule.hpp): the gradient norm's sums (experts over the expert group, shards over the
// sharding group, then the model-parallel all-reduce that synchronises the pipeline), and with
// stages 1–2 the all-gather of the updated parameters.
// The collectives inside a compute action: those of the layer description's op lists
// (model/cost.hpp) for the units the stage holds — the embedding, each layer (dense or MoE), the
// final norm with the output layer and loss, vocabulary parallelism's share — in the action's
// pass. B and I re-run the recomputed forward's collectives first; W holds weight gradients only.
void compute_steps(Builder& b, const Schedule& s, const ParallelPlan& plan, const TransformerSpec& spec, const Action& a) {
  const StageParameters& sp = b.stage(a.stage);
  auto add = [&](const std::vector<Op>& ops) {
    for (const Op& op : ops) {
      switch (op.kind) {
        case OpKind::AllReduce: b.collective(StepKind::AllReduce, op.group, op.bytes, op.name); break;
        case OpKind::ReduceScatter: b.collective(StepKind::ReduceScatter, op.group, op.bytes, op.name); break;
        case OpKind::AllGather: b.collective(StepKind::AllGather, op.group, op.bytes, op.name); break;
        case OpKind::AllToAll: b.collective(StepKind::AllToAll, op.group, op.bytes, op.name); break;
        case OpKind::RingExchange:  // ring_steps transfers to the next context rank, as many from the previous
          for (int64_t i = 0; i < op.ring_steps; ++i) {
            b.collective(StepKind::Send, op.group, op.bytes, op.name);
            b.collective(StepKind::Recv, op.group, op.bytes, op.name);
          }
          break;
        default: break;
      }
    }
  };
  auto of_pass = [&](auto&& ops_of) {
    if (a.kind == ActionKind::F) return add(ops_of(Pass::Forward));
    if (a.kind == ActionKind::B || a.kind == ActionKind::I) add(ops_of(Pass::Recompute));
    const std::vector<Op> backward = ops_of(Pass::Backward);
    if (a.kind == ActionKind::B) add(backward);
    if (a.kind == ActionKind::I) add(input_gradient_ops(backward));
    if (a.kind == ActionKind::W) add(weight_gradient_ops(backward));
  };
  if (sp.has_embedding) of_pass([&](Pass p) { return embedding_ops(spec, plan, p); });
  // The stage's layers by their global index (a lane holds the whole model: stage k·L + j has
  // the layers of stage j).
  const std::vector<int64_t> layers = stage_layers(spec, plan);
  const int lane_start = a.stage - a.stage % s.lane_stages();
  int64_t first = 0;
  for (int st = lane_start; st < a.stage; ++st) first += layers[static_cast<size_t>(st)];
  for (int64_t i = first; i < first + layers[static_cast<size_t>(a.stage)]; ++i) {
    const bool moe = spec.is_moe_layer(i);
    of_pass([&](Pass p) { return layer_ops(spec, plan, p, moe); });
  }
  if (sp.has_mtp) of_pass([&](Pass p) { return mtp_ops(spec, plan, p); });
  if (sp.has_head) of_pass([&](Pass p) { return head_ops(spec, plan, p); });
  if (sp.has_vocab_share) of_pass([&](Pass p) { return vocab_ops(spec, plan, p); });
  unit_gather_steps(b, s, plan, a);
}

void optim_steps(Builder& b, const Schedule& s, const ParallelPlan& plan, const TransformerSpec& spec, int rank) {
  constexpr double kNormBytes = 8;  // one double
  double params = 0, experts = 0;
  for (int st = 0; st < s.num_stages(); ++st)
    if (s.stage_to_rank[st] == rank) params += b.stage(st).total, experts += b.stage(st).expert;
  if (!experts_apart(b.grid, plan)) experts = 0;  // sharded and gathered with the dense weights
  // Sharded states: the experts' shards (over their expert-data group) are summed first, then the
  // dense shards' over the sharding group. Folded experts (expert-tensor size ≠ t): the
  // expert-model group's members hold different shards of the experts (their sum joins the norm
  // once per stage); else the expert group's members hold different experts.
  if (plan.zero_stage > 0 && experts > 0)
    b.collective(StepKind::AllReduce, CommGroup::ExpertData, kNormBytes, "expert gradient norm of the shards");
  if (plan.zero_stage > 0) b.collective(StepKind::AllReduce, CommGroup::Sharding, kNormBytes, "gradient norm of the shards");
  const bool folded = plan.expert_tensor_size() != plan.tensor;
  if (spec.has_moe())
    b.collective(StepKind::AllReduce, folded ? CommGroup::ExpertModel : CommGroup::Expert, kNormBytes, "expert gradient norm");
  b.collective(StepKind::AllReduce, CommGroup::Model, kNormBytes, "gradient norm");
  if (plan.zero_stage == 1 || plan.zero_stage == 2) {
    // --fp8-param-gather: the linear layers' weights (the experts' among them) are gathered in
    // FP8 (1 byte). The experts' updated weights gather over their expert-data group.
    const double weight_b = bytes_per_element(plan.precision);
    const double linear = plan.fp8_param_gather ? rank_linear_parameter_count(spec, plan, rank) - experts : 0.0;
    b.collective(StepKind::AllGather, CommGroup::Sharding, (params - experts) * weight_b - linear * (weight_b - 1),
                 "updated parameters");
    if (experts > 0)
      b.collective(StepKind::AllGather, CommGroup::ExpertData, experts * (plan.fp8_param_gather ? 1.0 : weight_b),
                   "updated expert parameters");
  }
}

}  // namespace

Lowering::Lowering(const Schedule& s, const ParallelPlan& plan, const TransformerSpec& spec)
    : s_(s), plan_(plan), spec_(spec), grid_(plan), stages_(stage_parameters_all(spec, plan, s.stage_to_rank)) {}

std::vector<CommStep> communication_steps(const Schedule& s, const ParallelPlan& plan, const TransformerSpec& spec, int rank,
                                          const Action& a) {
  return Lowering(s, plan, spec).steps(rank, a);
}

std::vector<CommStep> Lowering::steps(int rank, const Action& a) const {
  const Schedule& s = s_;
  const ParallelPlan& plan = plan_;
  const TransformerSpec& spec = spec_;
  Builder b{grid_, stages_, {}};
  switch (a.kind) {
    case ActionKind::SEND_F:
    case ActionKind::SEND_B:
    case ActionKind::RECV_F:
    case ActionKind::RECV_B: {
      const bool send = a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B;
      const bool forward = a.kind == ActionKind::SEND_F || a.kind == ActionKind::RECV_F;
      // The SEND names the sender's stage, the RECV the receiver's.
      const int peer = send ? (forward ? a.stage + 1 : a.stage - 1) : (forward ? a.stage - 1 : a.stage + 1);
      PTDP_ASSERT(peer >= 0 && peer < s.num_stages(), "a transfer's peer stage exists");
      if (s.stage_to_rank[peer] == s.stage_to_rank[a.stage]) break;  // same rank: handed over in memory
      const double tensor = pipeline_boundary_bytes(spec, plan);
      // Sequence parallelism keeps the tensor in sequence shards; scatter/gather sends 1/t per
      // TP rank and all-gathers it on arrival.
      const bool sequence_parallel = plan.sequence_parallel && plan.tensor > 1;
      const bool scatter_gather = scatter_gather_applies(spec, plan);
      const double wire = scatter_gather || sequence_parallel ? tensor / static_cast<double>(plan.tensor) : tensor;
      b.steps.push_back(CommStep{send ? StepKind::Send : StepKind::Recv, CommGroup::Pipeline, wire, peer,
                                 forward ? "activation" : "activation gradient", false});
      if (!send && scatter_gather) b.collective(StepKind::AllGather, CommGroup::Tensor, tensor, "scatter/gather");
      break;
    }
    case ActionKind::REDUCE_GRAD: reduce_grad_steps(b, s, plan, a.stage); break;
    case ActionKind::OPTIM: optim_steps(b, s, plan, spec, rank); break;
    case ActionKind::UNSHARD:
      if (plan.zero_stage >= 3)
        b.collective(StepKind::AllGather, CommGroup::Sharding,
                     b.stage(a.stage).total * bytes_per_element(plan.precision),
                     "stage parameters");
      break;
    case ActionKind::F:
    case ActionKind::B:
    case ActionKind::I:
    case ActionKind::W: compute_steps(b, s, plan, spec, a); break;
    default: break;  // RESHARD frees memory only
  }
  return std::move(b.steps);
}

}  // namespace ptdp
