// Launchers of the CUDA kernels (internal to exec/cuda; defined in kernels.cu, the only file
// nvcc compiles). Every launcher enqueues on `stream` and checks the launch; none waits.
// Matrices are row-major; `workspace` arguments are device scratch of the stated size.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "exec/runtime/elementwise_math.hpp"

namespace ptdp::exec::cuda::kernels {

void fill(cudaStream_t stream, float* dst, size_t n, float value);
void axpy(cudaStream_t stream, size_t n, float alpha, const float* x, float* y);
void scale(cudaStream_t stream, size_t n, float alpha, float* x);

/// Floats of workspace sum_squares needs (partial sums in double, counted in floats).
size_t sum_squares_workspace(size_t n);
/// *result_device = Σ x² in double, in a fixed order (deterministic).
void sum_squares(cudaStream_t stream, size_t n, const float* x, float* workspace, double* result_device);

void add_bias(cudaStream_t stream, int rows, int cols, const float* bias, float* y);
/// Floats of workspace the column reductions (bias, LayerNorm parameter gradients) need.
size_t column_sum_workspace(int rows, int cols);
/// dbias += Σ_r dy[r, :], deterministic (fixed chunks of rows, summed in order).
void add_bias_grad(cudaStream_t stream, int rows, int cols, const float* dy, float* dbias, float* workspace);

void layer_norm_forward(cudaStream_t stream, int rows, int cols, float eps, const float* x, const float* gamma,
                        const float* beta, float* y, float* mean, float* rstd);
/// dx overwritten; dgamma, dbeta accumulated when not null. workspace: 2·column_sum_workspace.
void layer_norm_backward(cudaStream_t stream, int rows, int cols, const float* dy, const float* x, const float* gamma,
                         const float* mean, const float* rstd, float* dx, float* dgamma, float* dbeta,
                         float* workspace);

void rms_norm_forward(cudaStream_t stream, int rows, int cols, float eps, const float* x, const float* gamma, float* y,
                      float* rstd);
/// dx overwritten; dgamma accumulated when not null. workspace: column_sum_workspace.
void rms_norm_backward(cudaStream_t stream, int rows, int cols, const float* dy, const float* x, const float* gamma,
                       const float* rstd, float* dx, float* dgamma, float* workspace);
/// y = silu(gate)·up.
void swiglu_forward(cudaStream_t stream, size_t n, const float* gate, const float* up, float* y);
/// dgate, dup from dy (dup may alias dy).
void swiglu_backward(cudaStream_t stream, size_t n, const float* gate, const float* up, const float* dy, float* dgate,
                     float* dup);

void gelu_forward(cudaStream_t stream, size_t n, const float* x, float* y);
/// dx may alias dy.
void gelu_backward(cudaStream_t stream, size_t n, const float* x, const float* dy, float* dx);
/// Fused bias + GELU: pre = x + bias (kept for backward), y = gelu(pre). pre may alias x.
void bias_gelu_forward(cudaStream_t stream, int rows, int cols, const float* x, const float* bias, float* pre,
                       float* y);
/// dx = dy·gelu'(pre) (may alias dy); dbias += Σ_r dx[r, :].
void bias_gelu_backward(cudaStream_t stream, int rows, int cols, const float* pre, const float* dy, float* dx,
                        float* dbias, float* workspace);

/// In place over `matrices` seq×seq score matrices: row i ← softmax(row i[0..i]), 0 above the
/// diagonal (the scale 1/√d is applied by the GEMM that produced the scores).
void causal_softmax_forward(cudaStream_t stream, int matrices, int seq, float* scores);
/// In place: dprobs ← probs ⊙ (dprobs − Σ_j dprobs·probs)·scale on and below the diagonal, 0 above.
void causal_softmax_backward(cudaStream_t stream, int matrices, int seq, float scale, const float* probs,
                             float* dprobs);

/// out[i, :] = table[tokens[i] − first_row, :] inside the shard, else 0.
void embedding_forward(cudaStream_t stream, int count, const int32_t* tokens, int64_t first_row, int rows, int cols,
                       const float* table, float* out);
/// For each shard row u listed in `groups` (rows_u, offsets, positions: see cuda_device.cpp),
/// dtable[row_u, :] += dout[p, :] for its positions p in increasing order (the CPU's order).
void embedding_backward(cudaStream_t stream, int unique_rows, const int32_t* groups, int cols, const float* dout,
                        float* dtable);

void logits_row_max(cudaStream_t stream, int rows, int cols, int valid_cols, const float* logits, float* row_max);
void softmax_numerators(cudaStream_t stream, int rows, int cols, int valid_cols, const float* row_max,
                        const int32_t* targets, int64_t first_col, float* logits, float* stats);
void cross_entropy_finish(cudaStream_t stream, int rows, int cols, const float* stats, float* probs, float* loss);
void cross_entropy_backward(cudaStream_t stream, int rows, int cols, const int32_t* targets, int64_t first_col,
                            float scale, const float* probs, float* dlogits);

void adam_update(cudaStream_t stream, size_t n, const math::AdamConstants& c, float* param, const float* grad, float* m,
                 float* v);

/// *flag_device |= 1 when any element is ±inf or NaN (flag not cleared here).
void find_inf_or_nan(cudaStream_t stream, size_t n, const float* x, int* flag_device);

// --- calibration ----------------------------------------------------------------------------
/// bf16 values in [−1, 1) from a hash of the index (2 bytes per element).
void fill_bf16_pattern(cudaStream_t stream, void* dst, size_t n, uint32_t seed);
/// An empty kernel (launch overhead).
void empty(cudaStream_t stream);
/// y = 2·x over n floats (an element-wise pass: reads and writes HBM).
void stream_scale(cudaStream_t stream, size_t n, const float* x, float* y);

/// Flash (fused, tiled) causal attention over one qkv buffer in Megatron's grouped layout (see
/// exec/runtime/device.hpp AttentionShape): one thread per (sequence, head, query row) walks the keys up
/// to the diagonal with an online softmax; ctx [batch·seq, heads·head_dim], lse [batch, heads, seq].
/// `q_col`/`k_col` are computed from heads, groups and head_dim as AttentionShape does.
void flash_attention_forward(cudaStream_t stream, int batch, int seq, int heads, int groups, int head_dim, const float* qkv,
                             float* ctx, float* lse);
/// Its backward: dqkv (zeroed first, then accumulated with atomics for the keys and values a
/// group's heads share) from dctx, recomputing the probabilities from qkv and lse.
void flash_attention_backward(cudaStream_t stream, int batch, int seq, int heads, int groups, int head_dim, const float* qkv,
                              const float* ctx, const float* lse, const float* dctx, float* dqkv);

}  // namespace ptdp::exec::cuda::kernels
