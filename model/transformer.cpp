#include "model/transformer.hpp"

#include "core/error.hpp"

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

int64_t TransformerSpec::padded_vocab(int64_t tensor) const {
  const int64_t multiple = 128 * (tensor > 0 ? tensor : 1);
  return (vocab_size + multiple - 1) / multiple * multiple;
}

bool TransformerSpec::paper_architecture() const {
  return mlp == MlpKind::Gelu && normalization == NormKind::LayerNorm && tie_embeddings &&
         query_groups() == num_attention_heads && ffn() == 4 * hidden_size && has_bias();
}

double norm_parameter_count(const TransformerSpec& spec) {
  const double h = static_cast<double>(spec.hidden_size);
  return spec.normalization == NormKind::RMSNorm ? h : 2 * h;
}

double layer_split_parameter_count(const TransformerSpec& spec) {
  const double h = static_cast<double>(spec.hidden_size), f = static_cast<double>(spec.ffn()),
               kv = static_cast<double>(spec.kv_width());
  // Column-parallel QKV (weights and bias), row-parallel projection weight.
  const double bias = spec.has_bias() ? 1 : 0;
  const double attention = h * (h + 2 * kv) + bias * (h + 2 * kv) + h * h;
  // Column-parallel FC1 (SwiGLU: gate and up) with biases, row-parallel FC2 weight.
  const double in = spec.mlp == MlpKind::SwiGLU ? 2 : 1;
  return attention + in * (h * f + bias * f) + f * h;
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
  const double embeddings = word + static_cast<double>(spec.seq_length) * h + (spec.tie_embeddings ? 0 : word);
  return l * layer_parameter_count(spec) + embeddings + norm_parameter_count(spec);  // + final norm
}

}  // namespace ptdp
