// Context parallelism's attention (LayerShape::cp > 1): each rank's queries attend to the whole
// sequence's keys and values, which travel around the context group's ring (Megatron's p2p
// cp_comm_type) or are all-gathered at once (LayerShape::cp_all_gather); or, Ulysses
// (LayerShape::cp_all_to_all), each rank attends with 1/cp of the heads over the whole sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/model/layers.hpp"

namespace ptdp::exec {

// The sequence positions of context rank `rank`'s local rows (two chunks per sequence, Megatron's
// load-balanced order).
std::vector<int32_t> positions_of(const LayerShape& sh, int rank);

// out [local rows, attention width] and the log-sum-exp `lse` of every query over all blocks.
// Ulysses (LayerShape::cp_all_to_all) computes in the head-shard layout, which it leaves in `a`
// (heads_qkv, heads_ctx; lse is in that layout too) for the backward.
void context_attention_forward(LayerContext& ctx, const LayerShape& sh, const Tensor& qkv, Tensor& out, Tensor& lse,
                               LayerActivations& a);

// d_qkv from d_out: the query gradients local, the key/value gradients summed back to their owners.
void context_attention_backward(LayerContext& ctx, const LayerShape& sh, const Tensor& qkv, const Tensor& out,
                                const Tensor& lse, const float* d_out, Tensor& d_qkv, const LayerActivations& a);

}  // namespace ptdp::exec
