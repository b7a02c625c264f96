#include "model/memory.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace ptdp {

double layer_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan) {
  const double s = static_cast<double>(spec.seq_length), b = static_cast<double>(plan.micro_batch),
               h = static_cast<double>(spec.hidden_size), a = static_cast<double>(spec.num_attention_heads),
               t = static_cast<double>(plan.tensor);
  // The Korthikanti coefficients count 2-byte activations; fp32 doubles them.
  const double scale = bytes_per_element(plan.precision) / 2.0;
  switch (plan.recompute) {
    case Recompute::None: return scale * s * b * h * (10 + 24 / t + 5 * a * s / (h * t));
    case Recompute::Selective: return scale * s * b * h * (10 + 24 / t);
    case Recompute::Full: return scale * 2 * s * b * h;
  }
  return 0;
}

double rank_parameter_count(const TransformerSpec& spec, const ParallelPlan& plan, int pipeline_rank) {
  const double h = static_cast<double>(spec.hidden_size), f = static_cast<double>(spec.ffn()),
               t = static_cast<double>(plan.tensor);
  // Column-parallel QKV and FC1 (weights and biases) and row-parallel proj and FC2 weights are
  // split over t; row-parallel biases and the LayerNorms are replicated.
  const double split = 3 * h * h + 3 * h + h * f + f + h * h + f * h;
  const double replicated = 2 * h + 4 * h;
  const double layers = static_cast<double>(spec.num_layers / plan.pipeline);
  double params = layers * (split / t + replicated);
  const double vocab_shard = static_cast<double>(spec.padded_vocab(plan.tensor)) * h / t;
  if (pipeline_rank == 0) params += vocab_shard + static_cast<double>(spec.seq_length) * h;
  if (pipeline_rank == plan.pipeline - 1) {
    params += 2 * h;                             // final LayerNorm
    if (plan.pipeline > 1) params += vocab_shard;  // tied LM head copy
  }
  return params;
}

std::vector<MemoryBreakdown> memory_per_rank(const TransformerSpec& spec, const ParallelPlan& plan,
                                             const std::vector<int>& inflight_chunks) {
  PTDP_ASSERT(static_cast<int64_t>(inflight_chunks.size()) == plan.pipeline, "one in-flight count per pipeline rank");
  const bool mixed = plan.precision != Precision::FP32;
  const double weight_b = mixed ? 2 : 4, grad_b = gradient_bytes(plan.precision), optim_b = mixed ? 12 : 8;
  const double layers_per_chunk = static_cast<double>(spec.num_layers / (plan.pipeline * plan.virtual_stages));
  const double per_layer = layer_activation_bytes(spec, plan);
  const double s = static_cast<double>(spec.seq_length), b = static_cast<double>(plan.micro_batch),
               t = static_cast<double>(plan.tensor);
  ParallelPlan no_recompute = plan;
  no_recompute.recompute = Recompute::None;
  const double full_layer = layer_activation_bytes(spec, no_recompute);

  std::vector<MemoryBreakdown> out;
  for (int r = 0; r < plan.pipeline; ++r) {
    MemoryBreakdown m;
    m.pipeline_rank = r;
    m.parameters = rank_parameter_count(spec, plan, r);
    m.weights_bytes = m.parameters * weight_b;
    m.gradients_bytes = m.parameters * grad_b;
    m.optimizer_bytes = m.parameters * optim_b;
    double act = inflight_chunks[r] * layers_per_chunk * per_layer;
    // Recomputing a layer materialises its full activations once more during its backward.
    if (plan.recompute != Recompute::None) act += full_layer - per_layer;
    // The last stage holds fp32 logits and their gradient for the microbatch in its backward.
    if (r == plan.pipeline - 1) act += 2 * 4 * s * b * static_cast<double>(spec.padded_vocab(plan.tensor)) / t;
    m.activations_bytes = act;
    m.total_bytes = m.weights_bytes + m.gradients_bytes + m.optimizer_bytes + m.activations_bytes;
    out.push_back(m);
  }
  return out;
}

MemoryBreakdown peak_memory(const std::vector<MemoryBreakdown>& ranks) {
  PTDP_ASSERT(!ranks.empty(), "no ranks");
  return *std::max_element(ranks.begin(), ranks.end(),
                           [](const MemoryBreakdown& a, const MemoryBreakdown& b) { return a.total_bytes < b.total_bytes; });
}

}  // namespace ptdp
