// The GPT model being trained: sizes only, no parallelism.
#pragma once

#include <cstdint>
#include <string>

namespace ptdp {

/// A decoder-only transformer (GPT). All sizes are counts.
struct TransformerSpec {
  std::string name = "gpt";
  int64_t num_layers = 0;           // l
  int64_t hidden_size = 0;          // h
  int64_t num_attention_heads = 0;  // a
  int64_t ffn_hidden_size = 0;      // 0 = 4h
  int64_t seq_length = 0;           // s
  int64_t vocab_size = 0;           // V (before padding)

  int64_t ffn() const { return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  /// Vocabulary padded to a multiple of 128·t, as Megatron-LM does.
  int64_t padded_vocab(int64_t tensor) const;
};

/// Parameter count, paper Eq. 2 generalised to ffn != 4h: per layer 4h² + 2h·ffn weights,
/// 9h + ffn biases and LayerNorm; plus embeddings (V + s)·h and the final LayerNorm.
/// With ffn = 4h this is exactly P = 12lh²(1 + 13/(12h) + (V+s)/(12lh)).
double parameter_count(const TransformerSpec& spec);

/// Parameters of one transformer layer.
double layer_parameter_count(const TransformerSpec& spec);

}  // namespace ptdp
