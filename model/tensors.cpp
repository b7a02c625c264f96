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

}  // namespace

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
  out.push_back(weight("attention.qkv.weight", TensorOwner::Layer, h, qkv, TensorSplit::Cols));
  if (bias) out.push_back(vector("attention.qkv.bias", TensorOwner::Layer, qkv, TensorSplit::Cols, TensorInit::Zeros));
  // Row-parallel projection: the heads' outputs (q_width) back to the hidden size.
  out.push_back(weight("attention.proj.weight", TensorOwner::Layer, spec.q_width(), h, TensorSplit::Rows, TensorInit::NormalScaled));
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

TensorTotals tensor_totals(const std::vector<ParamTensor>& tensors) {
  TensorTotals s;
  for (const ParamTensor& t : tensors) {
    s.all += t.count();
    (t.split == TensorSplit::Replicated ? s.replicated : s.split) += t.count();
  }
  return s;
}

}  // namespace ptdp
