// The weight-bearing tensors of the model, declared once: name, global shape, how tensor
// parallelism splits each, how it is initialised and which gradient reductions it takes. The
// parameter counts (model/transformer.hpp), a stage's units (model/units.hpp) and memory read
// their sizes from here, and the executor lays out its parameters from the same declarations
// (exec/model/gpt.cpp), so the four cannot drift apart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/transformer.hpp"

namespace ptdp {

/// How tensor parallelism (the expert-tensor group for routed experts) splits a tensor of global
/// shape [rows, cols]: rank r holds rows (or columns) [r·n/t, (r+1)·n/t), or the whole tensor.
enum class TensorSplit {
  Replicated,  // every rank holds it whole (norms, row-parallel biases, positions, the router)
  Rows,        // row-parallel weights (projection, FC2: their input dimension) and the vocabulary
  Cols,        // column-parallel weights and biases (QKV, FC1, gate: their output dimension)
};

/// The initial values (Megatron's defaults): N(0, σ²) with σ = 0.02, the output projections of
/// each block (attention projection, FC2) scaled by 1/√(2l); norms' scales one; biases and
/// norms' shifts zero.
enum class TensorInit { Normal, NormalScaled, Ones, Zeros };

/// Which MLP of a layer a tensor belongs to.
enum class TensorOwner {
  Embedding,     // word and position embeddings
  Layer,         // a layer's norms, attention, dense MLP or router
  SharedExpert,  // the always-on shared experts of an MoE layer (one MLP of shared·ffn inner size)
  RoutedExpert,  // one routed expert of an MoE layer
  Head,          // the final norm and the untied output layer
};

/// One declared parameter tensor. `suffix` is its name within its owner: the full name is
/// tensor_name(). Sizes are global (the serial model's).
struct ParamTensor {
  const char* suffix = "";
  TensorOwner owner = TensorOwner::Layer;
  int64_t rows = 0, cols = 0;
  TensorSplit split = TensorSplit::Replicated;
  TensorInit init = TensorInit::Normal;
  bool weight_decay = true;  // weights decay; biases and norms do not
  /// A replicated tensor whose gradient sequence parallelism leaves partial per tensor rank (it
  /// sees that rank's part of the sequence), the router's too (each tensor rank routes its part).
  bool sequence_partial = true;
  double count() const { return static_cast<double>(rows) * static_cast<double>(cols); }
  /// Elements one of `split_ranks` ranks holds.
  double local_count(int64_t split_ranks) const {
    return split == TensorSplit::Replicated ? count() : count() / static_cast<double>(split_ranks);
  }
};

/// The embedding: word embedding [V, h] over the vocabulary (`padded_vocab`, split by rows), the
/// learned position table [s, h] when the model has one.
std::vector<ParamTensor> embedding_tensors(const TransformerSpec& spec, int64_t padded_vocab);
/// Layer `layer`'s tensors outside its routed experts: norms, attention, the dense MLP or (MoE
/// layers) the router and the shared experts.
std::vector<ParamTensor> layer_tensors(const TransformerSpec& spec, int64_t layer);
/// The same for a dense (moe = false) or a mixture-of-experts layer of the model.
std::vector<ParamTensor> layer_kind_tensors(const TransformerSpec& spec, bool moe);
/// One routed expert's MLP (every expert of every MoE layer alike).
std::vector<ParamTensor> expert_tensors(const TransformerSpec& spec);
/// The final norm, and the output layer [V, h] when the embeddings are untied.
std::vector<ParamTensor> head_tensors(const TransformerSpec& spec, int64_t padded_vocab);
/// One multi-token-prediction module's tensors (model.mtp_layers; none without): its two norms,
/// the 2h → h projection, its layer's tensors outside the routed experts (an MoE layer's experts
/// are expert_tensors, num_experts of them) and its final norm. The embedding and the output
/// layer are the model's.
std::vector<ParamTensor> mtp_tensors(const TransformerSpec& spec);

/// Full name: "embedding.word_embeddings.weight", "layers.3.attention.qkv.weight",
/// "layers.3.mlp.experts.5.fc1.weight", "layers.3.mlp.shared_experts.fc1.weight",
/// "final_layernorm.weight", "output_layer.weight". `layer` and `expert` where the owner has them.
std::string tensor_name(const ParamTensor& t, int64_t layer = -1, int64_t expert = -1);

/// Full name of a tensor of multi-token-prediction module `module` (0-based; mtp_tensors, or an
/// expert_tensors entry with `expert`), as Megatron-Core's MTP block names them:
/// "mtp.layers.0.enorm.weight", "mtp.layers.0.eh_proj.weight",
/// "mtp.layers.0.transformer_layer.attention.qkv.weight",
/// "mtp.layers.0.transformer_layer.mlp.experts.5.fc1.weight", "mtp.layers.0.final_layernorm.weight".
std::string mtp_tensor_name(const ParamTensor& t, int64_t module, int64_t expert = -1);

/// Sums of a list's elements: all, the split ones, the replicated ones.
struct TensorTotals {
  double all = 0, split = 0, replicated = 0;
};
TensorTotals tensor_totals(const std::vector<ParamTensor>& tensors);

}  // namespace ptdp
