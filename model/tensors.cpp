#include "model/tensors.hpp"

#include "core/error.hpp"

namespace ptdp {

namespace {

ParamTensor weight(const char* suffix, TensorOwner owner, int64_t rows, int64_t cols, TensorSplit split,
                   TensorInit init = TensorInit::Normal) {
  ParamTensor t;
  t.suffix = suffix;
  t.owner = owner;
  t.rows = rows;
  t.cols = cols;
  t.split = split;
  t.init = init;
  return t;
}

// A bias or a norm's vector: [1, n], no weight decay.
ParamTensor vector(const char* suffix, TensorOwner owner, int64_t n, TensorSplit split, TensorInit init) {
  ParamTensor t = weight(suffix, owner, 1, n, split, init);
  t.weight_decay = false;
  return t;
}

void add_norm(std::vector<ParamTensor>& out, const TransformerSpec& spec, TensorOwner owner, const char* scale,
              const char* shift) {
  const int64_t h = spec.hidden_size;
  out.push_back(vector(scale, owner, h, TensorSplit::Replicated, TensorInit::Ones));
  if (spec.normalization == NormKind::LayerNorm) out.push_back(vector(shift, owner, h, TensorSplit::Replicated, TensorInit::Zeros));
}

// An MLP of inner size f: column-parallel FC1 (and SwiGLU's gate) with their biases, the
// row-parallel FC2 and its bias (replicated over the splitting group).
void add_mlp(std::vector<ParamTensor>& out, const TransformerSpec& spec, TensorOwner owner, int64_t f, const char* fc1,
             const char* fc1_bias, const char* gate, const char* gate_bias, const char* fc2, const char* fc2_bias) {
  const int64_t h = spec.hidden_size;
  const bool bias = spec.has_bias();
  out.push_back(weight(fc1, owner, h, f, TensorSplit::Cols));
  if (bias) out.push_back(vector(fc1_bias, owner, f, TensorSplit::Cols, TensorInit::Zeros));
  if (spec.mlp == MlpKind::SwiGLU) {
    out.push_back(weight(gate, owner, h, f, TensorSplit::Cols));
    if (bias) out.push_back(vector(gate_bias, owner, f, TensorSplit::Cols, TensorInit::Zeros));
  }
  out.push_back(weight(fc2, owner, f, h, TensorSplit::Rows, TensorInit::NormalScaled));
  if (bias) out.push_back(vector(fc2_bias, owner, h, TensorSplit::Replicated, TensorInit::Zeros));
}

// Multi-head latent attention's projections (Megatron-Core's MLASelfAttention, DeepSeek-V3's
// config): the down projections to the query latent and to the key/value latent with the shared
// rope key, replicated over the tensor group (Transformer Engine's duplicated linears), their
// latents' norms (the model's kind: RMSNorm scales, LayerNorm scales and shifts, as Megatron builds
// q_layernorm and kv_layernorm), and the column-parallel up projections — queries to every head's
// QK width ([non-rotary | rotary] per head), the latent to every head's non-rotary key and value
// ([k | v] per head). No biases but the output projection's (Megatron's bias=False).
void add_mla(std::vector<ParamTensor>& out, const TransformerSpec& spec) {
  const MlaSpec& m = spec.mla;
  const int64_t h = spec.hidden_size, a = spec.num_attention_heads;
  auto norm = [&](const char* scale, const char* shift, int64_t n) {
    out.push_back(vector(scale, TensorOwner::Layer, n, TensorSplit::Replicated, TensorInit::Ones));
    if (spec.normalization == NormKind::LayerNorm) out.push_back(vector(shift, TensorOwner::Layer, n, TensorSplit::Replicated, TensorInit::Zeros));
  };
  if (m.q_lora_rank > 0) {
    out.push_back(weight("attention.q_down.weight", TensorOwner::Layer, h, m.q_lora_rank, TensorSplit::Replicated));
    norm("attention.q_norm.weight", "attention.q_norm.bias", m.q_lora_rank);
  }
  const int64_t q_in = m.q_lora_rank > 0 ? m.q_lora_rank : h;
  out.push_back(weight("attention.q_up.weight", TensorOwner::Layer, q_in, a * spec.qk_dim(), TensorSplit::Cols));
  out.push_back(weight("attention.kv_down.weight", TensorOwner::Layer, h, m.kv_lora_rank + m.qk_pos_emb_head_dim, TensorSplit::Replicated));
  norm("attention.kv_norm.weight", "attention.kv_norm.bias", m.kv_lora_rank);
  out.push_back(weight("attention.kv_up.weight", TensorOwner::Layer, m.kv_lora_rank, a * (m.qk_head_dim + m.v_head_dim), TensorSplit::Cols));
}

}  // namespace

std::vector<ParamTensor> mtp_tensors(const TransformerSpec& spec) {
  std::vector<ParamTensor> out;
  if (spec.mtp_layers <= 0) return out;
  // The next token's embedding and the hidden state, each normed; their concatenation projected
  // 2h → h (column-parallel); one layer of the last layer's kind; its own final norm.
  add_norm(out, spec, TensorOwner::Head, "mtp.enorm.weight", "mtp.enorm.bias");
  add_norm(out, spec, TensorOwner::Head, "mtp.hnorm.weight", "mtp.hnorm.bias");
  out.push_back(weight("mtp.eh_proj.weight", TensorOwner::Head, 2 * spec.hidden_size, spec.hidden_size, TensorSplit::Cols));
  for (const ParamTensor& t : layer_kind_tensors(spec, spec.mtp_moe())) out.push_back(t);
  add_norm(out, spec, TensorOwner::Head, "mtp.final_layernorm.weight", "mtp.final_layernorm.bias");
  return out;
}

std::vector<ParamTensor> embedding_tensors(const TransformerSpec& spec, int64_t padded_vocab) {
  std::vector<ParamTensor> out;
  out.push_back(weight("word_embeddings.weight", TensorOwner::Embedding, padded_vocab, spec.hidden_size, TensorSplit::Rows));
  // Rotary and no positions have no table.
  if (spec.learned_positions())
    out.push_back(weight("position_embeddings.weight", TensorOwner::Embedding, spec.seq_length, spec.hidden_size,
                         TensorSplit::Replicated));
  return out;
}

std::vector<ParamTensor> layer_tensors(const TransformerSpec& spec, int64_t layer) {
  return layer_kind_tensors(spec, spec.is_moe_layer(layer));
}

std::vector<ParamTensor> layer_kind_tensors(const TransformerSpec& spec, bool moe) {
  const int64_t h = spec.hidden_size;
  const bool bias = spec.has_bias();
  // QKV columns: the query groups are contiguous (their query heads, key, value), so a tensor
  // rank's groups are one column range of the serial tensor.
  const int64_t qkv = spec.q_width() + 2 * spec.kv_width();
  std::vector<ParamTensor> out;
  out.reserve(16);
  add_norm(out, spec, TensorOwner::Layer, "ln1.weight", "ln1.bias");
  if (spec.has_mla()) {
    add_mla(out, spec);
  } else {
    out.push_back(weight("attention.qkv.weight", TensorOwner::Layer, h, qkv, TensorSplit::Cols));
    if (bias) out.push_back(vector("attention.qkv.bias", TensorOwner::Layer, qkv, TensorSplit::Cols, TensorInit::Zeros));
  }
  // Row-parallel projection: the heads' outputs (q_width; MLA heads · v_head_dim) back to the hidden size.
  const int64_t out_width = spec.has_mla() ? spec.num_attention_heads * spec.v_dim() : spec.q_width();
  out.push_back(weight("attention.proj.weight", TensorOwner::Layer, out_width, h, TensorSplit::Rows, TensorInit::NormalScaled));
  if (bias) out.push_back(vector("attention.proj.bias", TensorOwner::Layer, h, TensorSplit::Replicated, TensorInit::Zeros));
  add_norm(out, spec, TensorOwner::Layer, "ln2.weight", "ln2.bias");
  if (!moe) {
    add_mlp(out, spec, TensorOwner::Layer, spec.ffn(), "mlp.fc1.weight", "mlp.fc1.bias", "mlp.gate.weight", "mlp.gate.bias",
            "mlp.fc2.weight", "mlp.fc2.bias");
    return out;
  }
  // The router is replicated over the tensor group; with sequence parallelism each tensor rank
  // routes its own part of the sequence (Megatron-Core's router), so its gradient is partial.
  out.push_back(weight("mlp.router.weight", TensorOwner::Layer, h, spec.moe.num_experts, TensorSplit::Replicated));
  // Megatron's shared experts: one MLP of shared_experts · shared_ffn inner size, tensor-parallel
  // as the dense MLP is.
  if (spec.moe.shared_experts > 0)
    add_mlp(out, spec, TensorOwner::SharedExpert, spec.moe.shared_experts * spec.shared_expert_ffn(), "fc1.weight", "fc1.bias",
            "gate.weight", "gate.bias", "fc2.weight", "fc2.bias");
  return out;
}

std::vector<ParamTensor> expert_tensors(const TransformerSpec& spec) {
  std::vector<ParamTensor> out;
  if (!spec.has_moe()) return out;
  add_mlp(out, spec, TensorOwner::RoutedExpert, spec.expert_ffn(), "fc1.weight", "fc1.bias", "gate.weight", "gate.bias",
          "fc2.weight", "fc2.bias");
  // An expert computes on the tokens routed to it from every rank: no gradient is a sequence part.
  for (ParamTensor& t : out) t.sequence_partial = false;
  return out;
}

std::vector<ParamTensor> head_tensors(const TransformerSpec& spec, int64_t padded_vocab) {
  std::vector<ParamTensor> out;
  add_norm(out, spec, TensorOwner::Head, "final_layernorm.weight", "final_layernorm.bias");
  if (!spec.tie_embeddings) out.push_back(weight("output_layer.weight", TensorOwner::Head, padded_vocab, spec.hidden_size, TensorSplit::Rows));
  return out;
}

std::string tensor_name(const ParamTensor& t, int64_t layer, int64_t expert) {
  switch (t.owner) {
    case TensorOwner::Embedding:
      return std::string("embedding.") + t.suffix;
    case TensorOwner::Head:
      return t.suffix;
    case TensorOwner::Layer:
      PTDP_ASSERT(layer >= 0, "a layer tensor's name needs its layer");
      return "layers." + std::to_string(layer) + "." + t.suffix;
    case TensorOwner::SharedExpert:
      PTDP_ASSERT(layer >= 0, "a shared expert's name needs its layer");
      return "layers." + std::to_string(layer) + ".mlp.shared_experts." + t.suffix;
    case TensorOwner::RoutedExpert:
      PTDP_ASSERT(layer >= 0 && expert >= 0, "a routed expert's name needs its layer and expert");
      return "layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(expert) + "." + t.suffix;
  }
  return t.suffix;
}

std::string mtp_tensor_name(const ParamTensor& t, int64_t module, int64_t expert) {
  PTDP_ASSERT(module >= 0, "an MTP tensor's name needs its module");
  const std::string prefix = "mtp.layers." + std::to_string(module) + ".";
  if (t.owner == TensorOwner::Head) {  // declared "mtp.enorm.weight": the module's own tensors
    const std::string suffix = t.suffix;
    return prefix + (suffix.rfind("mtp.", 0) == 0 ? suffix.substr(4) : suffix);
  }
  // The module's transformer layer: a layer's names under "transformer_layer" instead of "layers.N".
  const std::string layer = tensor_name(t, 0, expert);
  return prefix + "transformer_layer" + layer.substr(std::string("layers.0").size());
}

TensorTotals tensor_totals(const std::vector<ParamTensor>& tensors) {
  TensorTotals s;
  for (const ParamTensor& t : tensors) {
    s.all += t.count();
    (t.split == TensorSplit::Replicated ? s.replicated : s.split) += t.count();
  }
  return s;
}

}  // namespace ptdp
