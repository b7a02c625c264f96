// Multi-token prediction (model.mtp_layers; DeepSeek-V3 §2.2, Megatron-Core's
// MultiTokenPredictionLayer), on the last pipeline stage: module k (1-based) predicts the token
// k + 1 places ahead. It takes the previous depth's hidden states h^{k−1} (h^0: the main model's
// last layer output, before the final norm) and the embedding of the input tokens shifted left
// by k (the shared word embedding; Megatron rolls input_ids by −1 per depth, across the context
// group under context parallelism, where a rank holds two chunks of each sequence), normalises both,
// projects their concatenation [norm(emb); norm(h)] 2h → h (eh_proj, column-parallel, its output
// gathered over the tensor group), runs one transformer layer, a final norm and the shared output
// layer, and takes the cross entropy against the labels shifted by k; the last k positions of
// each sequence, whose labels rolled past its end, are left out. Its layer output is h^k.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/model/layers.hpp"

namespace ptdp::exec {

/// One module's parameters (or gradients) on this rank: the two input norms (no beta with
/// RMSNorm), eh_proj's columns [2h, h/t] (rows 0…h−1 read the embedding, h…2h−1 the hidden
/// state), its layer and its final norm.
struct MtpWeights {
  float* enorm_gamma = nullptr;
  float* enorm_beta = nullptr;
  float* hnorm_gamma = nullptr;
  float* hnorm_beta = nullptr;
  float* eh_proj = nullptr;
  LayerWeights layer;
  float* final_gamma = nullptr;
  float* final_beta = nullptr;
};

/// What one module keeps from forward for backward.
struct MtpActivations {
  std::vector<int32_t> tokens, targets;  // the shifted inputs and labels (host, b·s each)
  Tensor ne, ne_mean, ne_rstd, nh, nh_mean, nh_rstd;  // the input norms' outputs (sequence shards under SP)
  Tensor emb;                             // the embedding before its norm
  Tensor layer_in;                        // eh_proj's output: the layer's input
  float eh_input_scale = 1;               // FP8 tensorwise: the scale eh_proj's input was cast with
  LayerActivations layer;                 // empty under full recompute
  Tensor layer_out;                       // h^k: the final norm's input
  HeadActivations head;
};

/// What a module runs with: its depth k (1-based), the shared embedding it reads (the word
/// embedding shard; no positions) and the shared output layer with the module's final norm.
struct MtpModule {
  int depth = 1;
  int layer_index = 0;  // the dropout masks' layer (distinct from the model's layers)
  EmbeddingWeights embedding;
  HeadWeights head;
};

/// Forward of one module from h_prev [local_tokens, h] and the previous depth's tokens and
/// targets [tokens] (the model's for depth 1; the previous module's MtpActivations::tokens and
/// targets after), which it rolls one place further (across the context group under context
/// parallelism): returns its mean loss over the counted positions; h^k in acts.layer_out. `full_recompute` keeps only the layer's input,
/// `keep_probs` false recomputes the attention probabilities (selective recompute).
double mtp_forward(LayerContext& ctx, const LayerShape& sh, const MtpWeights& w, const MtpModule& m, const float* h_prev,
                   const int32_t* tokens, const int32_t* targets, bool full_recompute, bool keep_probs, MtpActivations& a);

/// Backward of one module: d_h_prev [local_tokens, h] (overwritten) from its loss scaled by
/// `loss_scale` (d loss_scale·Σ counted token losses) and `d_out` (the gradient of h^k from the
/// next module; null for the last). `h_prev` is the forward's. Weight gradients accumulate into
/// `g`, the embedding's into `embedding_grads.word` and the output layer's into `output_grad`
/// (queued in `defer` when not null). Consumes `a` but its shifted tokens (a deferred embedding
/// gradient reads them: keep `a` until the W).
void mtp_backward(LayerContext& ctx, const LayerShape& sh, const MtpWeights& w, const MtpWeights& g, const MtpModule& m,
                  const EmbeddingWeights& embedding_grads, float* output_grad, float loss_scale, bool full_recompute,
                  const float* h_prev, MtpActivations& a, const float* d_out, float* d_h_prev, DeferredWeightGrads* defer);

/// The layers' norms and tensor-parallel collectives (exec/model/layers.cpp), shared with the
/// multi-token-prediction modules.
namespace layer_ops {
/// LayerNorm or RMSNorm of x [rows, h] into y; the statistics kept for backward (mean: LayerNorm only).
void norm_forward(Device& dev, const LayerShape& sh, int rows, const float* x, const float* gamma, const float* beta,
                  Tensor& y, Tensor& mean, Tensor& rstd);
void norm_backward(Device& dev, const LayerShape& sh, int rows, const float* dy, const float* x, const float* gamma,
                   const Tensor& mean, const Tensor& rstd, float* dx, float* dgamma, float* dbeta);
/// The whole sequence of a sequence-parallel shard; empty without sequence parallelism.
Tensor gathered(LayerContext& ctx, const LayerShape& sh, const Tensor& part);
/// A column-parallel layer's input gradient `full` [tokens, h] all-reduced, or reduce-scattered
/// into this rank's sequence shard; `under` runs while the collective is on the wire.
Tensor column_parallel_input_grad(LayerContext& ctx, const LayerShape& sh, Tensor full, DeferredWeightGrads* under);
}  // namespace layer_ops

}  // namespace ptdp::exec
