// FLOP counts of the paper (Narayanan et al. SC'21, Eq. 3) and per-layer forward FLOPs.
#pragma once

#include <cstdint>

#include "model/plan.hpp"
#include "model/transformer.hpp"

namespace ptdp {

/// Forward FLOPs of one transformer layer for `tokens_batch` sequences: 24Bsh² + 4Bs²h
/// (generalised to ffn != 4h: 8Bsh² + 4Bsh·ffn + 4Bs²h).
double layer_forward_flops(const TransformerSpec& spec, int64_t batch);
/// Logit-layer FLOPs (forward + backward) for `batch` sequences: 6·B·s·h·V.
double logits_flops(const TransformerSpec& spec, int64_t batch);

/// FLOPs of one iteration of global batch B, counting recomputation as the paper does when
/// `with_recompute` (Eq. 3: 96Bslh²(1 + s/6h + V/16lh)); without it 72Bslh²(1 + s/6h + V/12lh).
double iteration_flops(const TransformerSpec& spec, int64_t global_batch, bool with_recompute);

/// FLOPs the paper's TFLOP/s figure counts for this plan: Eq. 3 when recompute is full, the
/// no-recompute count otherwise (selective recompute's extra work is not credited).
double reported_iteration_flops(const TransformerSpec& spec, const ParallelPlan& plan);

}  // namespace ptdp
