// The executor's multi-head latent attention (DeepSeek-V2/V3; Megatron-Core's MLASelfAttention):
// the projections from a layer's first norm output to the attention kernel's queries, keys and
// values, and their backward, called by layer_forward / layer_backward (exec/model/layers.cpp).
//
// Per token: q = q_up(norm(q_down(x))) (or q_up(x) without a query latent), [c_kv, k_rope] =
// kv_down(x), [k_nope, v] of every head = kv_up(norm(c_kv)); the query of a head is
// [q_nope ; rope(q_rope)], its key [k_nope ; rope(k_rope)] (the one rotary key broadcast to every
// head), its value v: attention with QK width qk_head_dim + qk_pos_emb_head_dim (softmax scale
// 1/√ of it) and value width v_head_dim. Tensor parallelism as Megatron-Core runs it with
// Transformer Engine: the down projections and the latent norms are replicated and run on the
// rank's rows (its sequence part with sequence parallelism; their gradients are then partial,
// summed over the tensor group like the other norms'), the latents (with the rotary key, and
// without a query latent the norm output itself) are gathered over the sequence-parallel group
// in one all-gather, and the up projections are column-parallel by heads, their input gradients
// summed over the group (all-reduce, or reduce-scatter with sequence parallelism).
#pragma once

#include <memory>

#include "exec/model/layers.hpp"

namespace ptdp::exec {

/// What multi-head latent attention keeps from forward for backward (LayerActivations::mla).
struct MlaActivations {
  Tensor q_down, q_mean, q_rstd;    // the query latent before its norm, the norm's statistics
  Tensor kv_down, kv_mean, kv_rstd;  // the key/value latent before its norm, the statistics
  Tensor latent;  // the rank's rows of [queries' input | normed kv latent | rotary key] (re-gathered for the weight gradients)
  /// FP8 tensorwise scaling: the scales q_down's, kv_down's, q_up's and kv_up's inputs were cast with.
  float fp8_input_scale[4] = {1, 1, 1, 1};
};

/// From the first norm's output a.ln1 (the rank's local_tokens() rows): the attention input
/// a.qkv [tokens, qkv_cols] in the kernel's layout (rotary channels rotated), and a.mla.
void mla_forward(LayerContext& ctx, const LayerShape& sh, const LayerWeights& w, LayerActivations& a);

/// Backward of mla_forward from the attention input's gradient d_qkv [tokens, qkv_cols]: the
/// gradient of the norm output [local_tokens, h], summed over the tensor group; the weight
/// gradients accumulated into `g` (queued in `defer` under a split backward, which then keeps
/// a.ln1). Consumes a.mla.
Tensor mla_backward(LayerContext& ctx, const LayerShape& sh, const LayerWeights& w, const LayerWeights& g, LayerActivations& a,
                    Tensor&& d_qkv, DeferredWeightGrads* defer);

}  // namespace ptdp::exec
