#include "model/transformer.hpp"

#include "core/enum_names.hpp"
#include "core/error.hpp"
#include "model/tensors.hpp"

#include <algorithm>

namespace ptdp {

namespace {

// Each enum's names, spelled once (core/enum_names.hpp).
constexpr EnumName kMlpNames[] = {{static_cast<int>(MlpKind::Gelu), "gelu"}, {static_cast<int>(MlpKind::SwiGLU), "swiglu"}};
constexpr EnumName kNormNames[] = {{static_cast<int>(NormKind::LayerNorm), "layernorm"}, {static_cast<int>(NormKind::RMSNorm), "rmsnorm"}};
constexpr EnumName kAttentionNames[] = {{static_cast<int>(AttentionKind::Flash), "flash"}, {static_cast<int>(AttentionKind::Unfused), "unfused"}};
constexpr EnumName kPositionNames[] = {{static_cast<int>(PositionKind::Learned), "learned"},
                                       {static_cast<int>(PositionKind::Rope), "rope"},
                                       {static_cast<int>(PositionKind::None), "none"}};

}  // namespace

std::string to_string(MlpKind k) { return enum_name(kMlpNames, static_cast<int>(k)); }
std::string to_string(NormKind k) { return enum_name(kNormNames, static_cast<int>(k)); }
std::string to_string(AttentionKind k) { return enum_name(kAttentionNames, static_cast<int>(k)); }
std::string to_string(PositionKind k) { return enum_name(kPositionNames, static_cast<int>(k)); }
MlpKind parse_mlp_kind(const std::string& text) { return parse_enum_as<MlpKind>(kMlpNames, text, "mlp"); }
NormKind parse_norm_kind(const std::string& text) { return parse_enum_as<NormKind>(kNormNames, text, "normalization"); }
AttentionKind parse_attention_kind(const std::string& text) { return parse_enum_as<AttentionKind>(kAttentionNames, text, "attention"); }
PositionKind parse_position_kind(const std::string& text) {
  return parse_enum_as<PositionKind>(kPositionNames, text, "position embedding");
}

int64_t TransformerSpec::padded_vocab(int64_t tensor) const {
  if (padded_vocab_size > 0) return padded_vocab_size;
  const int64_t multiple = std::max<int64_t>(1, vocab_divisible_by) * (tensor > 0 ? tensor : 1);
  return (vocab_size + multiple - 1) / multiple * multiple;
}

bool TransformerSpec::paper_architecture() const {
  return mlp == MlpKind::Gelu && normalization == NormKind::LayerNorm && tie_embeddings &&
         query_groups() == num_attention_heads && ffn() == 4 * hidden_size && has_bias() && q_width() == hidden_size;
}

double norm_parameter_count(const TransformerSpec& spec) {
  const double h = static_cast<double>(spec.hidden_size);
  return spec.normalization == NormKind::RMSNorm ? h : 2 * h;
}

bool TransformerSpec::is_moe_layer(int64_t i) const {
  const int64_t every = moe.layer_frequency > 0 ? moe.layer_frequency : 1;
  return has_moe() && i >= moe.first_dense_layers && i < num_layers && (i - moe.first_dense_layers) % every == 0;
}

int64_t TransformerSpec::moe_layer_count() const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_layers; ++i) n += is_moe_layer(i) ? 1 : 0;
  return n;
}

namespace {
// Per-layer sums of the declared tensors (model/tensors.hpp), for a dense and an MoE layer.
struct LayerTotals {
  TensorTotals dense, moe;
  double expert = 0;  // one routed expert's parameters
  double layers = 0, moe_layers = 0;
  // The mean over the model's layers of a dense layer's `d` and an MoE layer's `m`.
  double mean(double d, double m) const { return ((layers - moe_layers) * d + moe_layers * m) / layers; }
};
LayerTotals layer_totals(const TransformerSpec& spec) {
  LayerTotals t;
  t.dense = tensor_totals(layer_kind_tensors(spec, false));
  t.layers = static_cast<double>(spec.num_layers);
  if (spec.has_moe()) {
    t.moe = tensor_totals(layer_kind_tensors(spec, true));
    t.expert = tensor_totals(expert_tensors(spec)).all;
    t.moe_layers = static_cast<double>(spec.moe_layer_count());
  }
  return t;
}
}  // namespace

double layer_split_parameter_count(const TransformerSpec& spec) {
  const LayerTotals t = layer_totals(spec);
  const double experts = static_cast<double>(spec.moe.num_experts) * t.expert;
  return t.mean(t.dense.split, t.moe.split + experts);
}

double layer_expert_parameter_count(const TransformerSpec& spec) {
  const LayerTotals t = layer_totals(spec);
  return t.mean(0, static_cast<double>(spec.moe.num_experts) * t.expert);
}

double active_parameter_count(const TransformerSpec& spec) {
  if (!spec.has_moe()) return parameter_count(spec);
  const double idle = static_cast<double>(spec.moe.num_experts - std::min(spec.moe.top_k, spec.moe.num_experts));
  const double moe_layers = static_cast<double>(spec.moe_layer_count() + (spec.mtp_moe() ? spec.mtp_layers : 0));
  return parameter_count(spec) - moe_layers * idle * tensor_totals(expert_tensors(spec)).all;
}

double mtp_parameter_count(const TransformerSpec& spec) {
  if (spec.mtp_layers <= 0) return 0;
  const double experts = spec.mtp_moe() ? static_cast<double>(spec.moe.num_experts) * tensor_totals(expert_tensors(spec)).all : 0.0;
  return static_cast<double>(spec.mtp_layers) * (tensor_totals(mtp_tensors(spec)).all + experts);
}

double layer_replicated_parameter_count(const TransformerSpec& spec) {
  const LayerTotals t = layer_totals(spec);
  return t.mean(t.dense.replicated, t.moe.replicated);
}

double layer_parameter_count(const TransformerSpec& spec) {
  return layer_split_parameter_count(spec) + layer_replicated_parameter_count(spec);
}

double parameter_count(const TransformerSpec& spec) {
  // Eq. 2 counts the vocabulary unpadded.
  const double embedding = tensor_totals(embedding_tensors(spec, spec.vocab_size)).all;
  const double head = tensor_totals(head_tensors(spec, spec.vocab_size)).all;
  return static_cast<double>(spec.num_layers) * layer_parameter_count(spec) + embedding + head + mtp_parameter_count(spec);
}

}  // namespace ptdp
