// FLOP counts of the paper (Narayanan et al. SC'21, Eq. 3) and per-layer forward FLOPs.
#pragma once

#include <cstdint>
#include <string>

#include "model/plan.hpp"
#include "model/transformer.hpp"

namespace ptdp {

/// Forward FLOPs of one transformer layer for `batch` sequences: 24Bsh² + 4Bs²h for the paper's
/// architecture; in general QKV 2Bsh·(h + 2·kv), projection 2Bsh², attention 4Bs²h, MLP 4Bsh·ffn
/// (GELU) or 6Bsh·ffn (SwiGLU).
double layer_forward_flops(const TransformerSpec& spec, int64_t batch);
/// Logit-layer FLOPs (forward + backward) for `batch` sequences: 6·B·s·h·V, over the model's
/// vocabulary V, or over `vocab` rows when given (the padded vocabulary the GEMM really runs).
double logits_flops(const TransformerSpec& spec, int64_t batch, int64_t vocab = 0);

/// FLOPs of one iteration of global batch B, counting recomputation as the paper does when
/// `with_recompute` (Eq. 3: 96Bslh²(1 + s/6h + V/16lh)); without it 72Bslh²(1 + s/6h + V/12lh).
double iteration_flops(const TransformerSpec& spec, int64_t global_batch, bool with_recompute);

/// FLOPs the paper's TFLOP/s figure counts for this plan: Eq. 3 when recompute is full, the
/// no-recompute count otherwise (selective recompute's extra work is not credited). The logits
/// run over the padded vocabulary (Megatron counts `padded_vocab_size`; the paper's V = 51 200 is
/// GPT-2's 50 257 padded), so a model whose vocabulary does not divide gets its padding rows' work.
/// MFU (model/metrics.hpp) counts the model's own vocabulary instead: those rows are not the model's.
double reported_iteration_flops(const TransformerSpec& spec, const ParallelPlan& plan);

/// Which formula iteration_flops follows for this model, for reports: "Eq. 3" (the paper's
/// architecture) or the generalised per-layer count, naming what differs from the paper.
std::string flops_formula(const TransformerSpec& spec);

}  // namespace ptdp
