#include "model/transformer.hpp"

namespace ptdp {

int64_t TransformerSpec::padded_vocab(int64_t tensor) const {
  const int64_t multiple = 128 * (tensor > 0 ? tensor : 1);
  return (vocab_size + multiple - 1) / multiple * multiple;
}

double layer_parameter_count(const TransformerSpec& spec) {
  const double h = static_cast<double>(spec.hidden_size);
  const double f = static_cast<double>(spec.ffn());
  // QKV 3h² + 3h, projection h² + h, FC1 h·f + f, FC2 f·h + h, two LayerNorms 4h.
  return 4 * h * h + 2 * h * f + 9 * h + f;
}

double parameter_count(const TransformerSpec& spec) {
  const double h = static_cast<double>(spec.hidden_size);
  const double l = static_cast<double>(spec.num_layers);
  const double embeddings = static_cast<double>(spec.vocab_size + spec.seq_length) * h;
  return l * layer_parameter_count(spec) + embeddings + 2 * h;  // + final LayerNorm
}

}  // namespace ptdp
