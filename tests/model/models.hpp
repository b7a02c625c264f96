// Model shapes the model tests share.
#pragma once

#include <cstdint>

#include "model/transformer.hpp"

namespace ptdp::test_models {

/// A GPT with l layers, hidden h, a heads (V = 51 200 and s = 2048 as in the paper by default),
/// with the paper's unfused attention (the formulas the model tests check are the paper's).
inline TransformerSpec gpt(int64_t l, int64_t h, int64_t a, int64_t s = 2048, int64_t V = 51200) {
  TransformerSpec m;
  m.attention = AttentionKind::Unfused;
  m.num_layers = l;
  m.hidden_size = h;
  m.num_attention_heads = a;
  m.seq_length = s;
  m.vocab_size = V;
  return m;
}

/// GPT-3 175B: 96 layers, h 12288, 96 heads.
inline TransformerSpec gpt3() { return gpt(96, 12288, 96); }

/// Llama 3 8B (scenarios/llama3-8b.yaml's model).
inline TransformerSpec llama3_8b() {
  TransformerSpec m;
  m.num_layers = 32;
  m.hidden_size = 4096;
  m.num_attention_heads = 32;
  m.num_query_groups = 8;
  m.ffn_hidden_size = 14336;
  m.seq_length = 8192;
  m.vocab_size = 128256;
  m.mlp = MlpKind::SwiGLU;
  m.normalization = NormKind::RMSNorm;
  m.tie_embeddings = false;
  return m;
}

}  // namespace ptdp::test_models
