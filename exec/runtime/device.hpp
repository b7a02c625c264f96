// Device: the math back end of the executor. The GPT model code (exec/model/layers.hpp) is written once
// against this interface; `cpu` implements it with Eigen in fp32, a CUDA device (exec/runtime/cuda/) with
// cuBLAS and kernels. Matrices are row-major float arrays in device memory; token ids are host
// int32 arrays (a device copies them itself when it needs them elsewhere).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>
#include <utility>

#include "exec/runtime/fp8.hpp"

namespace ptdp::exec {

/// The input precision of the GEMMs (accumulation is fp32 in every case, as on tensor cores).
enum class GemmOperands { FP32, BF16, FP16 };

enum class Trans : uint8_t { No, Yes };

/// Sizes of one causal self-attention call over `batch` sequences of `seq` tokens, with
/// `heads` query heads sharing `kv_heads` key/value heads (grouped-query attention; r =
/// heads / kv_heads query heads per group; kv_heads = heads is multi-head attention). Queries and
/// keys are head_dim wide (the softmax scale is 1/√head_dim); values v_dim() wide (multi-head
/// latent attention: v_head_dim; else head_dim).
/// Layout (Megatron's): qkv is [batch·seq, heads·head_dim + kv_heads·(head_dim + v_dim)]; group g
/// occupies columns [g·w, (g+1)·w) with w = r·head_dim + head_dim + v_dim: its r query heads,
/// then k, then v. Query head j = g·r + i uses group g = j / r. ctx is [batch·seq, heads·v_dim]
/// with head j at columns [j·v_dim, (j+1)·v_dim); probs is [batch, heads, seq, seq].
struct AttentionShape {
  int batch = 1;
  int seq = 1;
  int heads = 1;
  int head_dim = 1;
  int kv_heads = 0;  // 0 = heads
  int value_dim = 0;  // 0 = head_dim

  int groups() const { return kv_heads > 0 ? kv_heads : heads; }
  int heads_per_group() const { return heads / groups(); }
  int v_dim() const { return value_dim > 0 ? value_dim : head_dim; }
  int group_cols() const { return (heads_per_group() + 1) * head_dim + v_dim(); }
  int qkv_cols() const { return groups() * group_cols(); }
  int ctx_cols() const { return heads * v_dim(); }
  /// Column of query head j, and of the key and value of its group, within a qkv row.
  size_t q_col(int j) const { return static_cast<size_t>(j / heads_per_group()) * group_cols() + static_cast<size_t>(j % heads_per_group()) * head_dim; }
  size_t k_col(int j) const { return static_cast<size_t>(j / heads_per_group()) * group_cols() + static_cast<size_t>(heads_per_group()) * head_dim; }
  size_t v_col(int j) const { return k_col(j) + static_cast<size_t>(head_dim); }
  size_t probs_count() const { return static_cast<size_t>(batch) * heads * seq * seq; }
};

/// One Adam(W) update: p ← p·(1 − lr·wd); m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
/// p ← p − lr·(m/bc1)/(√(v/bc2) + eps), with g = grad·grad_scale (gradient clipping).
struct AdamStep {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0;
  float bias_correction1 = 1;  // 1 − β1^step
  float bias_correction2 = 1;  // 1 − β2^step
  float grad_scale = 1;
};

/// The kernels the model needs. All pointers are device memory unless named `_host`.
/// Accumulating outputs (named d… "accumulated") add to what is there; others overwrite.
class Device {
 public:
  virtual ~Device() = default;
  virtual std::string_view name() const = 0;

  // --- memory -------------------------------------------------------------------------------
  /// Uninitialised storage for `count` floats; throws EnvironmentError when out of memory.
  virtual float* allocate(size_t count) = 0;
  virtual void release(float* ptr, size_t count) noexcept = 0;
  /// Bytes currently allocated through allocate() and the high-water mark since construction.
  virtual size_t bytes_in_use() const = 0;
  virtual size_t peak_bytes() const = 0;
  virtual void upload(const float* host, float* dst, size_t count) = 0;
  virtual void download(const float* src, float* host, size_t count) = 0;
  virtual void copy(const float* src, float* dst, size_t count) = 0;
  virtual void fill(float* dst, size_t count, float value) = 0;
  /// dst[r, 0 … cols) = src[r, 0 … cols) for r < rows, rows `src_ld` and `dst_ld` floats apart
  /// (a column block of one row-major tensor into another's). The default copies row by row.
  virtual void copy_2d(int rows, int cols, const float* src, int src_ld, float* dst, int dst_ld);
  /// Waits until queued work finished (a no-op on the CPU); the executor calls it before timing.
  virtual void synchronize() = 0;

  // --- dense algebra ------------------------------------------------------------------------
  /// C = alpha·op(A)·op(B) + beta·C, row-major; op(A) is m×k, op(B) k×n, C m×n; ld = row stride.
  virtual void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                    int ldb, float beta, float* c, int ldc) = 0;
  /// The precision the GEMMs round their operands to (the CPU device's emulation of bf16/fp16
  /// tensor cores); FP8 emulation switches it to FP32 around the GEMMs of operands it has already
  /// quantised. Devices whose precision is fixed report FP32 and ignore the setting.
  virtual GemmOperands gemm_operands() const { return GemmOperands::FP32; }
  virtual void set_gemm_operands(GemmOperands) {}
  /// FP8 emulation: dst = the cast's quantise-dequantise of src (exec/runtime/fp8.hpp), returning
  /// src's amax. The default computes on the host between a download and an upload.
  virtual float fp8_cast(const Fp8Cast& cast, const float* src, float* dst);
  /// Dropout in place: x[r, c] ← x[r, c]/(1 − rate) where the element's draw u(row_keys_host[r], c)
  /// (math::dropout_keep, exec/runtime/elementwise_math.hpp) is kept, else 0.
  /// The same call on a gradient is the backward. The default computes on the host.
  virtual void dropout(int rows, int cols, const uint64_t* row_keys_host, float rate, float* x);
  /// y += alpha·x.
  virtual void axpy(size_t n, float alpha, const float* x, float* y) = 0;
  virtual void scale(size_t n, float alpha, float* x) = 0;
  /// Σ x², accumulated in double.
  virtual double sum_squares(size_t n, const float* x) = 0;

  // --- layers -------------------------------------------------------------------------------
  /// y[r, :] += bias.
  /// A null `bias` (a model without biases, model.bias false) does nothing, in every device.
  virtual void add_bias(int rows, int cols, const float* bias, float* y) = 0;
  /// dbias += Σ_r dy[r, :] (accumulated); nothing for a null `dbias`.
  virtual void add_bias_grad(int rows, int cols, const float* dy, float* dbias) = 0;
  /// y = (x − mean)·rstd·gamma + beta per row; mean and rstd ([rows]) are saved for backward.
  virtual void layer_norm_forward(int rows, int cols, float eps, const float* x, const float* gamma, const float* beta,
                                  float* y, float* mean, float* rstd) = 0;
  /// dx (overwritten); dgamma, dbeta accumulated (skipped when null).
  virtual void layer_norm_backward(int rows, int cols, const float* dy, const float* x, const float* gamma,
                                   const float* mean, const float* rstd, float* dx, float* dgamma, float* dbeta) = 0;
  /// RMSNorm: y = x·rstd·gamma per row, rstd = 1/√(mean(x²) + eps) saved ([rows]) for backward.
  virtual void rms_norm_forward(int rows, int cols, float eps, const float* x, const float* gamma, float* y,
                                float* rstd) = 0;
  /// dx (overwritten); dgamma accumulated (skipped when null).
  virtual void rms_norm_backward(int rows, int cols, const float* dy, const float* x, const float* gamma,
                                 const float* rstd, float* dx, float* dgamma) = 0;
  /// SwiGLU: y = silu(gate)·up = gate·σ(gate)·up, element-wise.
  virtual void swiglu_forward(size_t n, const float* gate, const float* up, float* y) = 0;
  /// dgate, dup (overwritten; may alias dy only if the other does not) from dy.
  virtual void swiglu_backward(size_t n, const float* gate, const float* up, const float* dy, float* dgate,
                               float* dup) = 0;
  /// GELU, tanh approximation (as GPT-2 / Megatron's openai_gelu).
  virtual void gelu_forward(size_t n, const float* x, float* y) = 0;
  virtual void gelu_backward(size_t n, const float* x, const float* dy, float* dx) = 0;
  /// Causal softmax attention with scale 1/√head_dim. `probs` receives the attention
  /// probabilities for backward, or is null when they are not kept (selective recompute).
  virtual void attention_forward(const AttentionShape& shape, const float* qkv, float* probs, float* ctx) = 0;
  /// dqkv (overwritten) from dctx; recomputes the probabilities when `probs` is null. With
  /// grouped-query attention the key and value gradients sum over the group's query heads.
  virtual void attention_backward(const AttentionShape& shape, const float* qkv, const float* probs, const float* dctx,
                                  float* dqkv) = 0;
  /// Fused (flash) causal attention: the same result as attention_forward, computed tile by tile
  /// with an online softmax, so no s×s tensor exists; it writes ctx and the log-sum-exp of each
  /// query row's scaled scores, `lse` [batch, heads, seq], which is all its backward needs.
  virtual void flash_attention_forward(const AttentionShape& shape, const float* qkv, float* ctx, float* lse) = 0;
  /// dqkv (overwritten) from dctx, recomputing the probabilities blockwise from qkv and lse
  /// (FlashAttention-2's backward: D = rowsum(dctx ∘ ctx), dS = P ∘ (dP − D)).
  virtual void flash_attention_backward(const AttentionShape& shape, const float* qkv, const float* ctx, const float* lse,
                                        const float* dctx, float* dqkv) = 0;
  /// Context parallelism (ring attention), one block of keys and values: the queries of `qkv`
  /// (shape.seq rows per sequence, at the sequence positions q_pos_host[0 … seq)) attend to the
  /// keys and values of `kv`, another rank's qkv rows in the same layout (its positions
  /// k_pos_host[0 … seq)), causally by position (a query sees keys at positions ≤ its own). The
  /// block is merged into the running output: ctx (normalised over the blocks so far) and lse
  /// [batch, heads, seq] (−∞ before the first block that a row sees). The CPU back end implements
  /// it; others throw EnvironmentError.
  virtual void attention_block_forward(const AttentionShape& shape, const float* qkv, const int32_t* q_pos_host,
                                       const float* kv, const int32_t* k_pos_host, float* ctx, float* lse);
  /// Backward of one block given the final ctx and lse of every block: the query gradients are
  /// accumulated into the query columns of dqkv, the key and value gradients into the key and
  /// value columns of dkv (the block owner's rows).
  virtual void attention_block_backward(const AttentionShape& shape, const float* qkv, const int32_t* q_pos_host,
                                        const float* kv, const int32_t* k_pos_host, const float* ctx, const float* lse,
                                        const float* dctx, float* dqkv, float* dkv);
  /// Rotary position embedding (Megatron's rope, non-interleaved), in place on every query and
  /// key head of qkv [batch·seq, qkv_cols]: channels i and i + rot_dim/2 (i < rot_dim/2) of a head
  /// become x_i·cos θ − x_{i+rot_dim/2}·sin θ and x_{i+rot_dim/2}·cos θ + x_i·sin θ with
  /// θ = pos_host[r]·base^(−2i/rot_dim) (fp32, as Megatron computes its frequencies), for row r
  /// of each sequence at position pos_host[r] (pos_host [seq]); channels ≥ rot_dim and the values
  /// pass. `inverse` rotates by −θ: the backward (the rotation's transpose) of a gradient.
  /// The default implementation computes on the host between a download and an upload.
  virtual void rotary(const AttentionShape& shape, int rot_dim, double base, const int32_t* pos_host, bool inverse, float* qkv);
  /// The same rotation of the heads starting at columns `head_cols` of x [batch·seq, cols] (each
  /// head's first rot_dim channels). `interleaved` pairs channels (2i, 2i + 1) instead of
  /// (i, i + rot_dim/2): Megatron's multi-latent-attention rope, which de-interleaves the rotary
  /// channels of the queries and the key alike before rotating them (the scores are the same in
  /// either channel order, so they stay in place here).
  virtual void rotary_heads(int batch, int seq, int cols, const std::vector<size_t>& head_cols, int rot_dim, double base,
                            const int32_t* pos_host, bool inverse, bool interleaved, float* x);
  /// out[i, :] = table[tokens[i] − first_row, :] when that row is in this shard [first_row, first_row + rows),
  /// else 0 (vocab-parallel embedding: the tensor-parallel all-reduce completes the lookup).
  virtual void embedding_forward(int count, const int32_t* tokens_host, int64_t first_row, int rows, int cols,
                                 const float* table, float* out) = 0;
  /// dtable[tokens[i] − first_row, :] += dout[i, :] for the tokens of this shard (accumulated).
  virtual void embedding_backward(int count, const int32_t* tokens_host, int64_t first_row, int rows, int cols,
                                  const float* dout, float* dtable) = 0;

  // --- vocab-parallel cross entropy (Megatron): logits [rows, cols] are this rank's vocabulary
  // columns [first_col, first_col + cols); only the first `valid_cols` are real (the rest is padding).
  /// row_max[r] = max over the valid columns (−inf when none).
  virtual void logits_row_max(int rows, int cols, int valid_cols, const float* logits, float* row_max) = 0;
  /// With the global row max: logits ← exp(logits − max) (0 on padding), stats[r] = Σ of them,
  /// stats[rows + r] = logit[target] − max when the target is in this shard, else 0.
  virtual void softmax_numerators(int rows, int cols, int valid_cols, const float* row_max, const int32_t* targets_host,
                                  int64_t first_col, float* logits, float* stats) = 0;
  /// With the globally summed stats: probs ← numerators / sum, loss[r] = log(sum) − (logit[target] − max).
  virtual void cross_entropy_finish(int rows, int cols, const float* stats, float* probs, float* loss) = 0;
  /// dlogits = (probs − onehot(target)) · scale (may alias probs).
  virtual void cross_entropy_backward(int rows, int cols, const int32_t* targets_host, int64_t first_col, float scale,
                                      const float* probs, float* dlogits) = 0;

  // --- optimizer ----------------------------------------------------------------------------
  virtual void adam_update(size_t n, const AdamStep& step, float* param, const float* grad, float* m, float* v) = 0;
};

/// The CPU device (Eigen, one thread). Everything is fp32 but the GEMMs' operands, which are
/// rounded to `operands` first (bf16 / fp16: the tensor cores' inputs; products exact, fp32 sums).
std::unique_ptr<Device> make_cpu_device(GemmOperands operands = GemmOperands::FP32);

/// The device for `backend`: "cpu", or "cuda" (exec/runtime/cuda/). Throws ConfigError (key "backend")
/// for an unknown back end and EnvironmentError when CUDA is not compiled in or has no device.
std::unique_ptr<Device> make_device(const std::string& backend);

/// A row-major float matrix owned on a Device (move-only). rows·cols floats, uninitialised
/// unless created with zeros() or copy_of().
class Tensor {
 public:
  Tensor() = default;
  Tensor(Device& dev, int64_t rows, int64_t cols);
  static Tensor zeros(Device& dev, int64_t rows, int64_t cols);
  /// A new tensor holding rows·cols floats copied from `src` (on the device).
  static Tensor copy_of(Device& dev, const float* src, int64_t rows, int64_t cols);
  ~Tensor() { reset(); }
  Tensor(Tensor&& o) noexcept { *this = std::move(o); }
  Tensor& operator=(Tensor&& o) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  size_t size() const { return static_cast<size_t>(rows_) * static_cast<size_t>(cols_); }
  bool empty() const { return data_ == nullptr; }
  void reset();

 private:
  Device* dev_ = nullptr;
  float* data_ = nullptr;
  int64_t rows_ = 0, cols_ = 0;
};

}  // namespace ptdp::exec
