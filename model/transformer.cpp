#include "model/transformer.hpp"

#include "core/error.hpp"

#include <algorithm>

namespace ptdp {

std::string to_string(MlpKind k) { return k == MlpKind::SwiGLU ? "swiglu" : "gelu"; }
std::string to_string(NormKind k) { return k == NormKind::RMSNorm ? "rmsnorm" : "layernorm"; }

MlpKind parse_mlp_kind(const std::string& text) {
  if (text == "gelu") return MlpKind::Gelu;
  if (text == "swiglu") return MlpKind::SwiGLU;
  throw ConfigError("", "unknown mlp '" + text + "', expected gelu or swiglu" + did_you_mean(text, {"gelu", "swiglu"}));
}

NormKind parse_norm_kind(const std::string& text) {
  if (text == "layernorm") return NormKind::LayerNorm;
  if (text == "rmsnorm") return NormKind::RMSNorm;
  throw ConfigError("", "unknown normalization '" + text + "', expected layernorm or rmsnorm" +
                            did_you_mean(text, {"layernorm", "rmsnorm"}));
}

std::string to_string(AttentionKind k) { return k == AttentionKind::Flash ? "flash" : "unfused"; }

AttentionKind parse_attention_kind(const std::string& text) {
  if (text == "flash") return AttentionKind::Flash;
  if (text == "unfused") return AttentionKind::Unfused;
  throw ConfigError("", "unknown attention '" + text + "', expected flash or unfused" + did_you_mean(text, {"flash", "unfused"}));
}

std::string to_string(PositionKind k) {
  switch (k) {
    case PositionKind::Learned: return "learned";
    case PositionKind::Rope: return "rope";
    case PositionKind::None: return "none";
  }
  return "learned";
}

PositionKind parse_position_kind(const std::string& text) {
  if (text == "learned") return PositionKind::Learned;
  if (text == "rope") return PositionKind::Rope;
  if (text == "none") return PositionKind::None;
  throw ConfigError("", "unknown position embedding '" + text + "', expected learned, rope or none" +
                            did_you_mean(text, {"learned", "rope", "none"}));
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
// The split (column/row-parallel) weights of an MLP of inner size f, without its output bias.
double mlp_split(const TransformerSpec& spec, double f) {
  const double h = static_cast<double>(spec.hidden_size), bias = spec.has_bias() ? 1 : 0;
  // Column-parallel FC1 (SwiGLU: gate and up) with biases, row-parallel FC2 weight.
  const double in = spec.mlp == MlpKind::SwiGLU ? 2 : 1;
  return in * (h * f + bias * f) + f * h;
}
// The MLP part of an MoE layer: router, routed and shared experts (expert tensor parallelism
// splits the experts over t as the dense MLP is; the router is replicated, counted here too).
double moe_mlp_split(const TransformerSpec& spec, double routed) {
  const double h = static_cast<double>(spec.hidden_size), bias = spec.has_bias() ? 1 : 0;
  return h * static_cast<double>(spec.moe.num_experts) +
         routed * (mlp_split(spec, static_cast<double>(spec.expert_ffn())) + bias * h) +
         static_cast<double>(spec.moe.shared_experts) * (mlp_split(spec, static_cast<double>(spec.shared_expert_ffn())) + bias * h);
}
double attention_split(const TransformerSpec& spec) {
  const double h = static_cast<double>(spec.hidden_size), kv = static_cast<double>(spec.kv_width());
  const double q = static_cast<double>(spec.q_width());
  const double bias = spec.has_bias() ? 1 : 0;
  // Column-parallel QKV (weights and bias), row-parallel projection weight (q·h: the heads'
  // outputs back to the hidden size).
  return h * (q + 2 * kv) + bias * (q + 2 * kv) + q * h;
}
}  // namespace

double mlp_parameter_count(const TransformerSpec& spec, int64_t ffn) {
  return mlp_split(spec, static_cast<double>(ffn)) + (spec.has_bias() ? static_cast<double>(spec.hidden_size) : 0);
}

double layer_split_parameter_count(const TransformerSpec& spec) {
  const double dense = attention_split(spec) + mlp_split(spec, static_cast<double>(spec.ffn()));
  if (!spec.has_moe()) return dense;
  // The mean over the layers: dense ones and MoE ones (all E experts stored).
  const double l = static_cast<double>(spec.num_layers), n_moe = static_cast<double>(spec.moe_layer_count());
  const double moe = attention_split(spec) + moe_mlp_split(spec, static_cast<double>(spec.moe.num_experts));
  return ((l - n_moe) * dense + n_moe * moe) / l;
}

double layer_expert_parameter_count(const TransformerSpec& spec) {
  if (!spec.has_moe()) return 0;
  const double h = static_cast<double>(spec.hidden_size), bias = spec.has_bias() ? 1 : 0;
  const double experts = static_cast<double>(spec.moe.num_experts) * (mlp_split(spec, static_cast<double>(spec.expert_ffn())) + bias * h);
  return experts * static_cast<double>(spec.moe_layer_count()) / static_cast<double>(spec.num_layers);
}

double active_parameter_count(const TransformerSpec& spec) {
  if (!spec.has_moe()) return parameter_count(spec);
  const double n_moe = static_cast<double>(spec.moe_layer_count());
  const double all = moe_mlp_split(spec, static_cast<double>(spec.moe.num_experts));
  const double active = moe_mlp_split(spec, static_cast<double>(std::min(spec.moe.top_k, spec.moe.num_experts)));
  return parameter_count(spec) - n_moe * (all - active);
}

double layer_replicated_parameter_count(const TransformerSpec& spec) {
  // Row-parallel biases of the projection and FC2, and the two norms.
  const double biases = spec.has_bias() ? 2 * static_cast<double>(spec.hidden_size) : 0;
  return biases + 2 * norm_parameter_count(spec);
}

double layer_parameter_count(const TransformerSpec& spec) {
  return layer_split_parameter_count(spec) + layer_replicated_parameter_count(spec);
}

double parameter_count(const TransformerSpec& spec) {
  const double h = static_cast<double>(spec.hidden_size);
  const double l = static_cast<double>(spec.num_layers);
  const double word = static_cast<double>(spec.vocab_size) * h;
  const double positions = spec.learned_positions() ? static_cast<double>(spec.seq_length) * h : 0;
  const double embeddings = word + positions + (spec.tie_embeddings ? 0 : word);
  return l * layer_parameter_count(spec) + embeddings + norm_parameter_count(spec);  // + final norm
}

}  // namespace ptdp
