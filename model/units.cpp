#include "model/units.hpp"

#include "core/error.hpp"
#include "model/memory.hpp"
#include "model/partition.hpp"

namespace ptdp {

StageParameters stage_parameters(const TransformerSpec& spec, const ParallelPlan& plan, int stage,
                                 const std::vector<int>& stage_to_rank) {
  const int stages = static_cast<int>(plan.num_stages());
  PTDP_ASSERT(stage >= 0 && stage < stages, "stage inside the plan");
  PTDP_ASSERT(stage_to_rank.empty() || static_cast<int>(stage_to_rank.size()) == stages, "one placement per stage");
  auto rank_of = [&](int st) { return stage_to_rank.empty() ? stage_rank(plan, st) : int64_t{stage_to_rank[st]}; };
  const double h = static_cast<double>(spec.hidden_size);
  const double vocab_shard = static_cast<double>(spec.padded_vocab(plan.tensor)) * h / static_cast<double>(plan.tensor);
  // Learned positions only: rotary (Llama's default) and none have no table.
  const double positions = spec.learned_positions() ? static_cast<double>(spec.seq_length) * h : 0.0;
  const double layers = static_cast<double>(stage_layers(spec, plan)[static_cast<size_t>(stage)]);
  const double layer = layer_local_parameter_count(spec, plan);
  const bool vocab_parallel = plan.vocab_parallel_pipeline && plan.pipeline > 1;

  StageParameters sp;
  sp.has_embedding = plan.is_first_stage(stage);
  sp.has_head = plan.is_last_stage(stage);
  sp.has_vocab_share = vocab_parallel;
  if (sp.has_embedding) sp.units.push_back(vocab_shard + positions);
  for (int64_t l = 0; l < static_cast<int64_t>(layers); ++l) sp.units.push_back(layer);
  sp.expert = layers * layer_local_expert_parameter_count(spec, plan);
  sp.replicated = layers * layer_replicated_parameter_count(spec) + (sp.has_embedding ? positions : 0.0) +
                  (sp.has_head ? norm_parameter_count(spec) : 0.0);
  if (sp.has_head) {
    // The LM head: its own output layer when untied; tied, a copy of the embedding unless its rank
    // holds a first stage too (one stage; p = 1 interleaved; zb-v's V; DualPipe), whose embedding
    // it reads. Vocabulary parallelism moves the output layer into every stage's share.
    bool shares_embedding = false;
    for (int st = 0; st < stages; ++st)
      if (plan.is_first_stage(st) && rank_of(st) == rank_of(stage)) shares_embedding = true;
    sp.units.push_back(norm_parameter_count(spec) +
                       (!vocab_parallel && (!spec.tie_embeddings || !shares_embedding) ? vocab_shard : 0.0));
  }
  if (vocab_parallel) sp.units.push_back(vocab_shard / static_cast<double>(plan.pipeline));
  for (double u : sp.units) sp.total += u;
  // Tied embeddings with one lane: the first and the last stage hold the two copies when they sit
  // on different pipeline ranks. (With lanes the whole stage is summed with its copy, which
  // includes them.)
  if (plan.lanes() == 1 && spec.tie_embeddings && (sp.has_embedding || sp.has_head) &&
      rank_of(0) != rank_of(stages - 1)) {
    sp.tied_embedding = vocab_shard;
    sp.tied_with_stage = sp.has_embedding ? stages - 1 : 0;
  }
  return sp;
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
