#include "model/flops.hpp"

#include "model/cost.hpp"

namespace ptdp {

double layer_forward_flops(const TransformerSpec& spec, int64_t batch) {
  // The layer's op list (model/cost.hpp) counts it: QKV 2Bsh(h + 2kv) (= 6Bsh² without GQA),
  // projection 2Bsh², MLP 4Bsh·ffn (= 16Bsh² at ffn = 4h; SwiGLU has a third GEMM: 6Bsh·ffn),
  // QKᵀ and attention·V 4Bs²h (every query head, causal or not, as Megatron's MFU counts).
  return layer_model_flops(spec, batch);
}

double logits_flops(const TransformerSpec& spec, int64_t batch, int64_t vocab) {
  return 6.0 * static_cast<double>(batch) * static_cast<double>(spec.seq_length) *
         static_cast<double>(spec.hidden_size) * static_cast<double>(vocab > 0 ? vocab : spec.vocab_size);
}

namespace {
double iteration_flops_over(const TransformerSpec& spec, int64_t global_batch, bool with_recompute, int64_t vocab) {
  const double passes = with_recompute ? 4.0 : 3.0;  // forward + 2× backward (+ recomputed forward)
  // Each multi-token-prediction module: its 2h → h projection, its layer, the logits again.
  const double tokens = static_cast<double>(global_batch) * static_cast<double>(spec.seq_length);
  const double h = static_cast<double>(spec.hidden_size);
  const double mtp = static_cast<double>(spec.mtp_layers) *
                     (passes * (layer_kind_model_flops(spec, global_batch, spec.mtp_moe()) + 2 * tokens * 2 * h * h) +
                      logits_flops(spec, global_batch, vocab));
  return passes * static_cast<double>(spec.num_layers) * layer_forward_flops(spec, global_batch) +
         logits_flops(spec, global_batch, vocab) + mtp;
}
}  // namespace

double iteration_flops(const TransformerSpec& spec, int64_t global_batch, bool with_recompute) {
  return iteration_flops_over(spec, global_batch, with_recompute, spec.vocab_size);
}

double reported_iteration_flops(const TransformerSpec& spec, const ParallelPlan& plan) {
  return iteration_flops_over(spec, plan.global_batch, plan.recompute == Recompute::Full, spec.padded_vocab(plan.tensor));
}

}  // namespace ptdp

namespace ptdp {

std::string flops_formula(const TransformerSpec& spec) {
  if (spec.paper_architecture()) return "Eq. 3 (Narayanan et al. SC'21)";
  std::string differs;
  auto add = [&](const std::string& what) { differs += (differs.empty() ? "" : ", ") + what; };
  if (spec.query_groups() != spec.num_attention_heads) add("GQA with " + std::to_string(spec.query_groups()) + " query groups");
  if (spec.mlp == MlpKind::SwiGLU) add("SwiGLU MLP (3 GEMMs)");
  // The dense MLP's width, where a layer has one (a model whose every layer routes to experts has
  // none: its widths are the experts').
  if (spec.ffn() != 4 * spec.hidden_size && spec.moe_layer_count() < spec.num_layers)
    add("ffn " + std::to_string(spec.ffn()) + " ≠ 4h");
  if (spec.has_moe() && spec.expert_ffn() != 4 * spec.hidden_size) add("expert ffn " + std::to_string(spec.expert_ffn()));
  if (spec.has_mla())
    add("MLA (latents " + std::to_string(spec.mla.q_lora_rank) + " / " + std::to_string(spec.mla.kv_lora_rank) + ", heads " +
        std::to_string(spec.qk_dim()) + " / " + std::to_string(spec.v_dim()) + " wide)");
  else if (spec.q_width() != spec.hidden_size) add("head dim " + std::to_string(spec.head_dim()) + ": attention " + std::to_string(spec.q_width()) + " wide");
  if (spec.mtp_layers > 0) add(std::to_string(spec.mtp_layers) + " multi-token-prediction module(s)");
  if (!spec.tie_embeddings) add("untied embeddings");
  if (spec.normalization == NormKind::RMSNorm) add("RMSNorm");
  if (!spec.has_bias()) add("no biases");
  if (spec.has_moe())
    add("MoE: " + std::to_string(spec.moe_layer_count()) + " layers route each token to " + std::to_string(spec.moe.top_k) + " of " +
        std::to_string(spec.moe.num_experts) + " experts" +
        (spec.moe.shared_experts > 0 ? " + " + std::to_string(spec.moe.shared_experts) + " shared" : std::string()) +
        ", FLOPs counted on the active experts");
  return "per-layer GEMM count (Eq. 3 generalised: " + differs + ")";
}

}  // namespace ptdp
