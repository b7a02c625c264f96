#include "model/flops.hpp"

namespace ptdp {

double layer_forward_flops(const TransformerSpec& spec, int64_t batch) {
  const double B = static_cast<double>(batch), s = static_cast<double>(spec.seq_length),
               h = static_cast<double>(spec.hidden_size), f = static_cast<double>(spec.ffn());
  // QKV 6Bsh², projection 2Bsh², MLP 4Bsh·ffn (= 16Bsh² at ffn = 4h), QKᵀ and attention·V 4Bs²h.
  return 8 * B * s * h * h + 4 * B * s * h * f + 4 * B * s * s * h;
}

double logits_flops(const TransformerSpec& spec, int64_t batch) {
  return 6.0 * static_cast<double>(batch) * static_cast<double>(spec.seq_length) *
         static_cast<double>(spec.hidden_size) * static_cast<double>(spec.vocab_size);
}

double iteration_flops(const TransformerSpec& spec, int64_t global_batch, bool with_recompute) {
  const double passes = with_recompute ? 4.0 : 3.0;  // forward + 2× backward (+ recomputed forward)
  return passes * static_cast<double>(spec.num_layers) * layer_forward_flops(spec, global_batch) +
         logits_flops(spec, global_batch);
}

double reported_iteration_flops(const TransformerSpec& spec, const ParallelPlan& plan) {
  return iteration_flops(spec, plan.global_batch, plan.recompute == Recompute::Full);
}

}  // namespace ptdp
