#include "model/units.hpp"

#include "core/error.hpp"
#include "model/memory.hpp"
#include "model/partition.hpp"
#include "model/tensors.hpp"

namespace ptdp {

namespace {
// One layer's parameters on one tensor rank, from its declared tensors (model/tensors.hpp): the
// split ones ÷ t, the routed experts' (E / ep of them) ÷ the expert tensor size, the replicated
// whole; `partial`: the replicated ones whose gradient sequence parallelism leaves partial.
using LayerLocal = UnitCounts::Local;
// The same sums over any list of declared tensors, split `t` ways.
LayerLocal local_of(const std::vector<ParamTensor>& tensors, int64_t t) {
  LayerLocal c;
  for (const ParamTensor& d : tensors) {
    c.all += d.local_count(t);
    if (d.split == TensorSplit::Replicated && d.sequence_partial) c.partial += d.count();
  }
  return c;
}
LayerLocal layer_local(const TransformerSpec& spec, const ParallelPlan& plan, bool moe) {
  LayerLocal c = local_of(layer_kind_tensors(spec, moe), plan.tensor);
  if (moe) {
    const double local_experts = static_cast<double>(spec.moe.num_experts / plan.expert);
    c.expert = local_experts * local_of(expert_tensors(spec), plan.expert_tensor_size()).all;
    c.all += c.expert;
  }
  return c;
}
}  // namespace

namespace {
// What every stage of a plan shares: the embedding, head and layer units on one tensor rank, the
// layer counts of the partition and which pipeline ranks hold a first stage. Built once per plan
// (stage_parameters_all) instead of once per stage.
struct PlanUnits : UnitCounts {
  std::vector<int64_t> layer_counts;
  std::vector<int64_t> first_layer;  // per stage: the layers of the earlier stages of its lane
  std::vector<char> holds_first;  // per pipeline rank
  bool vocab_parallel = false;
};

// The per-unit counts on one tensor rank, from the declared tensors.
void unit_counts(const TransformerSpec& spec, const ParallelPlan& plan, PlanUnits& u) {
  // The embedding (word table, learned positions where the model has them) and the head's norm,
  // from their declared tensors; the word table's shard is also the untied output layer's.
  const int64_t padded = spec.padded_vocab(plan.tensor);
  const std::vector<ParamTensor> embedding_list = embedding_tensors(spec, padded);
  u.embedding = local_of(embedding_list, plan.tensor);
  u.vocab_shard = embedding_list.front().local_count(plan.tensor);
  std::vector<ParamTensor> head_norm = head_tensors(spec, padded);
  if (!spec.tie_embeddings) head_norm.pop_back();  // the output layer, counted below as vocab_shard
  u.norm = local_of(head_norm, plan.tensor);
  u.dense = layer_local(spec, plan, false);
  u.moe = spec.has_moe() ? layer_local(spec, plan, true) : u.dense;
  if (spec.mtp_layers > 0) {
    // The multi-token-prediction modules (on the last stage with the head, or on a layout's MTP
    // stage): their tensors and, for an MoE layer, the rank's local experts.
    const LayerLocal& layer = spec.mtp_moe() ? u.moe : u.dense;
    const LayerLocal extra = local_of(mtp_tensors(spec), plan.tensor);
    const double n = static_cast<double>(spec.mtp_layers);
    u.mtp.all = n * (extra.all + layer.expert);
    u.mtp.expert = n * layer.expert;
    u.mtp.partial = n * extra.partial;
  }
}

PlanUnits plan_units(const TransformerSpec& spec, const ParallelPlan& plan, const std::vector<int>& stage_to_rank) {
  const int stages = static_cast<int>(plan.num_stages());
  PTDP_ASSERT(stage_to_rank.empty() || static_cast<int>(stage_to_rank.size()) == stages, "one placement per stage");
  PlanUnits u;
  // The units' counts read the model and t, ep, etp alone: kept per (t, ep, etp) under the
  // thread's ActivationBytesMemo (one model per memo).
  ActivationBytesMemo* memo = activation_bytes_memo();
  const ActivationBytesMemo::Key key = {plan.tensor, plan.expert, plan.expert_tensor_size()};
  UnitCounts& counts = u;
  if (const auto known = memo ? memo->unit_counts.find(key) : decltype(memo->unit_counts.end()){}; memo && known != memo->unit_counts.end()) {
    counts = known->second;
  } else {
    unit_counts(spec, plan, u);
    if (memo) memo->unit_counts.emplace(key, counts);
  }
  u.layer_counts = stage_layers(spec, plan);
  // The stage's layers: those of the earlier stages of its lane come first (DualPipe's second
  // lane holds the model again).
  u.first_layer.assign(u.layer_counts.size(), 0);
  const size_t lane = static_cast<size_t>(plan.lane_stages());
  for (size_t st = 0; st < u.layer_counts.size(); ++st)
    if (st % lane != 0) u.first_layer[st] = u.first_layer[st - 1] + u.layer_counts[st - 1];
  u.vocab_parallel = plan.vocab_parallel_pipeline && plan.pipeline > 1;
  u.holds_first.assign(static_cast<size_t>(plan.pipeline), 0);
  for (int st = 0; st < stages; ++st)
    if (plan.is_first_stage(st))
      u.holds_first[static_cast<size_t>(stage_to_rank.empty() ? stage_rank(plan, st) : int64_t{stage_to_rank[static_cast<size_t>(st)]})] = 1;
  return u;
}

StageParameters stage_of(const TransformerSpec& spec, const ParallelPlan& plan, int stage, const std::vector<int>& stage_to_rank,
                         const PlanUnits& u) {
  const int stages = static_cast<int>(plan.num_stages());
  PTDP_ASSERT(stage >= 0 && stage < stages, "stage inside the plan");
  auto rank_of = [&](int st) { return stage_to_rank.empty() ? stage_rank(plan, st) : int64_t{stage_to_rank[static_cast<size_t>(st)]}; };
  const int64_t first_layer = u.first_layer[static_cast<size_t>(stage)];
  const int64_t layers = u.layer_counts[static_cast<size_t>(stage)];

  StageParameters sp;
  sp.has_embedding = plan.is_first_stage(stage);
  sp.has_head = plan.is_last_stage(stage);
  sp.has_mtp = plan.mtp_apart() && stage % plan.lane_stages() == plan.mtp_stage();
  sp.has_vocab_share = u.vocab_parallel;
  sp.units.reserve(static_cast<size_t>(layers) + 3);
  if (sp.has_embedding) sp.units.push_back(u.embedding.all);
  double partial = 0;
  for (int64_t l = first_layer; l < first_layer + layers; ++l) {
    const LayerLocal& c = spec.is_moe_layer(l) ? u.moe : u.dense;
    sp.units.push_back(c.all);
    sp.expert += c.expert;
    partial += c.partial;
  }
  // The MTP modules: with the head, or a unit of their own on a layout's MTP stage.
  const bool mtp_here = plan.mtp_apart() ? sp.has_mtp : sp.has_head;
  sp.replicated = partial + (sp.has_embedding ? u.embedding.partial : 0.0) + (sp.has_head ? u.norm.partial : 0.0) +
                  (mtp_here ? u.mtp.partial : 0.0);
  if (mtp_here) sp.expert += u.mtp.expert;
  if (sp.has_mtp) sp.units.push_back(u.mtp.all);
  if (sp.has_head) {
    // The LM head: its own output layer when untied; tied, a copy of the embedding unless its rank
    // holds a first stage too (one stage; p = 1 interleaved; zb-v's V; DualPipe), whose embedding
    // it reads. Vocabulary parallelism moves the output layer into every stage's share.
    const bool shares_embedding = u.holds_first[static_cast<size_t>(rank_of(stage))] != 0;
    // With the multi-token-prediction modules here, untied: they read the word embedding, a copy
    // of it too (Megatron-Core's MTP stage keeps one, summed with the first stage's like a tied one).
    const bool mtp_copy = spec.mtp_layers > 0 && !plan.mtp_apart() && !spec.tie_embeddings && !shares_embedding;
    sp.units.push_back(u.norm.all + (plan.mtp_apart() ? 0.0 : u.mtp.all) +
                       (!u.vocab_parallel && (!spec.tie_embeddings || !shares_embedding) ? u.vocab_shard : 0.0) +
                       (mtp_copy ? u.vocab_shard : 0.0));
  }
  if (u.vocab_parallel) sp.units.push_back(u.vocab_shard / static_cast<double>(plan.pipeline));
  for (double v : sp.units) sp.total += v;
  // Tied embeddings (or the multi-token-prediction modules on the last stage) with one lane: the
  // first and the last stage hold the two copies when they sit on different pipeline ranks. (With
  // lanes the whole stage is summed with its copy, which includes them.)
  const bool head_reads_embedding = spec.tie_embeddings || (spec.mtp_layers > 0 && !plan.mtp_apart());
  if (plan.lanes() == 1 && head_reads_embedding && (sp.has_embedding || sp.has_head) &&
      rank_of(0) != rank_of(stages - 1)) {
    sp.tied_embedding = u.vocab_shard;
    sp.tied_with_stage = sp.has_embedding ? stages - 1 : 0;
  }
  return sp;
}
}  // namespace

StageParameters stage_parameters(const TransformerSpec& spec, const ParallelPlan& plan, int stage,
                                 const std::vector<int>& stage_to_rank) {
  return stage_of(spec, plan, stage, stage_to_rank, plan_units(spec, plan, stage_to_rank));
}

std::vector<StageParameters> stage_parameters_all(const TransformerSpec& spec, const ParallelPlan& plan,
                                                  const std::vector<int>& stage_to_rank) {
  const PlanUnits u = plan_units(spec, plan, stage_to_rank);
  std::vector<StageParameters> out;
  const int stages = static_cast<int>(plan.num_stages());
  out.reserve(static_cast<size_t>(stages));
  for (int st = 0; st < stages; ++st) out.push_back(stage_of(spec, plan, st, stage_to_rank, u));
  return out;
}

}  // namespace ptdp

namespace ptdp {

bool scatter_gather_applies(const TransformerSpec& spec, const ParallelPlan& plan) {
  if (!plan.scatter_gather || plan.tensor <= 1 || plan.sequence_parallel) return false;
  const int64_t elements = plan.micro_batch * (spec.seq_length / plan.context) * spec.hidden_size;
  return elements % plan.tensor == 0;
}

double pipeline_boundary_bytes(const TransformerSpec& spec, const ParallelPlan& plan) {
  return static_cast<double>(plan.micro_batch) * static_cast<double>(spec.seq_length / plan.context) *
         static_cast<double>(spec.hidden_size) * bytes_per_element(plan.precision);
}

}  // namespace ptdp
