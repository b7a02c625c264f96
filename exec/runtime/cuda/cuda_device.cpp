// The cuda Device: cuBLAS GEMMs on tensor cores, the kernels of kernels.cu, a stream-ordered
// memory pool. See cuda_device.hpp.
//
// GEMM precision. The Device interface hands over fp32 buffers. The GEMMs run cublasGemmEx /
// cublasGemmStridedBatchedEx on those fp32 buffers with compute type CUBLAS_COMPUTE_32F_FAST_16BF
// (or _FAST_16F for fp16): cuBLAS rounds the operands to bf16 inside the kernel, multiplies on
// the tensor cores and accumulates in fp32. Converting the operands into a bf16 workspace first
// would read each fp32 operand once and write and re-read a bf16 copy — more memory traffic, an
// extra kernel and workspace per GEMM — for the same tensor-core math; the price of the in-kernel
// conversion is that operands are read as fp32 (twice the bytes of bf16), which only matters for
// memory-bound GEMMs. FP32 precision uses CUBLAS_COMPUTE_32F (no down-conversion).
#include "exec/runtime/cuda/cuda_device.hpp"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <vector>

#include "core/error.hpp"
#include "exec/runtime/cuda/backend.hpp"
#include "exec/runtime/cuda/check.hpp"
#include "exec/runtime/cuda/kernels.hpp"
#include "exec/runtime/elementwise_math.hpp"

namespace ptdp::exec::cuda {
namespace {

Precision precision_from(const CudaDeviceOptions& o) {
  if (o.precision) return *o.precision;
  if (const char* v = std::getenv("PTDP_CUDA_PRECISION"); v != nullptr && *v != '\0') {
    try {
      return parse_precision(v);
    } catch (const ConfigError& e) {
      throw ConfigError("PTDP_CUDA_PRECISION", e.message());
    }
  }
  return Precision::BF16;
}

cublasComputeType_t compute_type_for(Precision p) {
  switch (p) {
    case Precision::BF16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case Precision::FP16: return CUBLAS_COMPUTE_32F_FAST_16F;
    case Precision::FP32: return CUBLAS_COMPUTE_32F;
    case Precision::FP8: break;  // refused before a device is made (exec/train.cpp): FP8 is emulated on the cpu back end only
  }
  return CUBLAS_COMPUTE_32F_FAST_16BF;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  return buf;
}

}  // namespace

CudaDevice::CudaDevice(const CudaDeviceOptions& o) : precision_(precision_from(o)), plan_memory_bytes_(o.plan_memory_bytes) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw EnvironmentError(detail::unavailable_reason());
  }
  const char* why = "as asked";
  if (o.ordinal >= 0) {
    ordinal_ = o.ordinal;
  } else if (const auto local = local_rank_from_environment()) {
    ordinal_ = *local;
    why = "its node-local rank";
  } else {
    ordinal_ = world_rank_from_environment().value_or(0) % count;
    why = "its rank modulo the GPU count";
  }
  if (ordinal_ < 0 || ordinal_ >= count) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw EnvironmentError("cuda: this process needs GPU " + std::to_string(ordinal_) + " (" + why + ") but " +
                           std::to_string(count) + " GPU(s) are visible" +
                           (visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : std::string()) +
                           ": start at most one rank per GPU on each node");
  }
  compute_type_ = static_cast<int>(compute_type_for(precision_));
  try {
    PTDP_CUDA_CHECK(cudaSetDevice(ordinal_));
    PTDP_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    PTDP_CUDA_CHECK(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
    // Keep freed memory in the pool: the shapes of one microbatch repeat every microbatch.
    cudaMemPool_t pool = nullptr;
    PTDP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ordinal_));
    uint64_t keep = std::numeric_limits<uint64_t>::max();
    PTDP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    PTDP_CUBLAS_CHECK(cublasCreate(&cublas_));
    PTDP_CUBLAS_CHECK(cublasSetStream(cublas_, compute_));
  } catch (...) {
    teardown();
    throw;
  }
}

CudaDevice::~CudaDevice() { teardown(); }

void CudaDevice::teardown() noexcept {
  if (compute_ != nullptr) cudaStreamSynchronize(compute_);
  for (Scratch* s : {&reduce_ws_, &scores_, &dscores_, &tokens_, &groups_, &flag_, &result_})
    if (s->ptr != nullptr) {
      cudaFreeAsync(s->ptr, compute_);
      s->ptr = nullptr;
    }
  if (compute_ != nullptr) cudaStreamSynchronize(compute_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (compute_mark_ != nullptr) cudaEventDestroy(compute_mark_);
  if (compute_ != nullptr) cudaStreamDestroy(compute_);
  cublas_ = nullptr;
  compute_mark_ = nullptr;
  compute_ = nullptr;
}

// --- memory --------------------------------------------------------------------------------------

void CudaDevice::out_of_memory(size_t bytes, const std::string& what) {
  size_t free_bytes = 0, total_bytes = 0;
  const bool info = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  cudaGetLastError();
  std::string msg = "cuda: out of GPU memory on " + describe_gpu(ordinal_) + " allocating " +
                    (what.empty() ? std::string("a buffer") : what) + " of " + gib(static_cast<double>(bytes)) + " (" +
                    std::to_string(bytes / sizeof(float)) + " floats); ptdp holds " +
                    gib(static_cast<double>(in_use_)) + " (peak " + gib(static_cast<double>(peak_)) + ")";
  if (info) msg += ", the GPU has " + gib(static_cast<double>(free_bytes)) + " free of " + gib(static_cast<double>(total_bytes));
  if (plan_memory_bytes_ > 0) msg += "; the plan's memory estimate was " + gib(plan_memory_bytes_) + " per GPU";
  msg += " (reduce micro_batch, raise pipeline or tensor parallelism, or use recompute)";
  throw EnvironmentError(msg);
}

void* CudaDevice::raw_allocate(size_t bytes, const std::string& what) {
  void* p = nullptr;
  cudaError_t rc = cudaMallocAsync(&p, bytes, compute_);
  if (rc == cudaErrorMemoryAllocation) {
    // The pool may hold freed blocks of other sizes: return them to the driver and retry once.
    cudaGetLastError();
    cudaMemPool_t pool = nullptr;
    PTDP_CUDA_CHECK(cudaStreamSynchronize(compute_));
    PTDP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, ordinal_));
    PTDP_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
    rc = cudaMallocAsync(&p, bytes, compute_);
    if (rc == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      out_of_memory(bytes, what);
    }
  }
  if (rc != cudaSuccess) throw_cuda_error(rc, "cudaMallocAsync(&p, bytes, compute_)", __FILE__, __LINE__);
  return p;
}

float* CudaDevice::allocate(size_t count) {
  const size_t bytes = std::max<size_t>(count, 1) * sizeof(float);
  void* p = raw_allocate(bytes, MemoryLabel::current());
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  return static_cast<float*>(p);
}

void CudaDevice::release(float* ptr, size_t count) noexcept {
  if (ptr == nullptr) return;
  in_use_ -= std::max<size_t>(count, 1) * sizeof(float);
  cudaFreeAsync(ptr, compute_);  // ordered after the queued work that may still read it
}

void* CudaDevice::scratch(Scratch& s, size_t bytes, const char* what) {
  if (s.bytes >= bytes && s.ptr != nullptr) return s.ptr;
  if (s.ptr != nullptr) {
    cudaFreeAsync(s.ptr, compute_);
    in_use_ -= s.bytes;
    s.ptr = nullptr;
    s.bytes = 0;
  }
  const std::string label = MemoryLabel::current();
  s.ptr = raw_allocate(bytes, label.empty() ? std::string(what) : label + " (" + what + ")");
  s.bytes = bytes;
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  return s.ptr;
}

const int32_t* CudaDevice::stage_ints(Scratch& s, const int32_t* host, size_t count, const char* what) {
  auto* dst = static_cast<int32_t*>(scratch(s, std::max<size_t>(count, 1) * sizeof(int32_t), what));
  // From pageable memory the runtime copies into its staging buffer before returning, so the
  // caller may reuse `host` at once; the scratch is reused in stream order.
  if (count > 0)
    PTDP_CUDA_CHECK(cudaMemcpyAsync(dst, host, count * sizeof(int32_t), cudaMemcpyHostToDevice, compute_));
  return dst;
}

void CudaDevice::upload(const float* host, float* dst, size_t count) {
  if (count == 0) return;
  PTDP_CUDA_CHECK(cudaMemcpyAsync(dst, host, count * sizeof(float), cudaMemcpyHostToDevice, compute_));
}

void CudaDevice::download(const float* src, float* host, size_t count) {
  if (count == 0) return;
  PTDP_CUDA_CHECK(cudaMemcpyAsync(host, src, count * sizeof(float), cudaMemcpyDeviceToHost, compute_));
  PTDP_CUDA_CHECK(cudaStreamSynchronize(compute_));
}

void CudaDevice::copy(const float* src, float* dst, size_t count) {
  if (count == 0 || src == dst) return;
  const size_t bytes = count * sizeof(float);
  const bool overlap = src < dst + count && dst < src + count;
  if (!overlap) {
    PTDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_));
    return;
  }
  // memmove semantics (cudaMemcpy does not allow overlap): through a temporary.
  void* tmp = raw_allocate(bytes, "a temporary for an overlapping copy");
  PTDP_CUDA_CHECK(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, compute_));
  PTDP_CUDA_CHECK(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, compute_));
  PTDP_CUDA_CHECK(cudaFreeAsync(tmp, compute_));
}

void CudaDevice::fill(float* dst, size_t count, float value) { kernels::fill(compute_, dst, count, value); }

void CudaDevice::synchronize() { PTDP_CUDA_CHECK(cudaStreamSynchronize(compute_)); }

void CudaDevice::order_after_compute(cudaStream_t stream) {
  PTDP_CUDA_CHECK(cudaEventRecord(compute_mark_, compute_));
  PTDP_CUDA_CHECK(cudaStreamWaitEvent(stream, compute_mark_, 0));
}

// --- dense algebra -----------------------------------------------------------------------------

void CudaDevice::gemm_batched(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                              long long stride_a, const float* b, int ldb, long long stride_b, float beta, float* c,
                              int ldc, long long stride_c, int batch) {
  // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLAS gets B first.
  const cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const auto type = static_cast<cublasComputeType_t>(compute_type_);
  if (batch == 1) {
    PTDP_CUBLAS_CHECK(cublasGemmEx(cublas_, op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta,
                                   c, CUDA_R_32F, ldc, type, CUBLAS_GEMM_DEFAULT));
  } else {
    PTDP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas_, op_b, op_a, n, m, k, &alpha, b, CUDA_R_32F, ldb, stride_b, a,
                                                 CUDA_R_32F, lda, stride_a, &beta, c, CUDA_R_32F, ldc, stride_c, batch,
                                                 type, CUBLAS_GEMM_DEFAULT));
  }
}

void CudaDevice::gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                      int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // C = beta·C, row by row (ldc may exceed n)
    if (beta == 1.0f) return;
    for (int r = 0; r < m; ++r) {
      float* row = c + static_cast<size_t>(r) * ldc;
      if (beta == 0.0f) kernels::fill(compute_, row, static_cast<size_t>(n), 0.0f);
      else kernels::scale(compute_, static_cast<size_t>(n), beta, row);
    }
    return;
  }
  gemm_batched(ta == Trans::Yes, tb == Trans::Yes, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1);
}

void CudaDevice::axpy(size_t n, float alpha, const float* x, float* y) { kernels::axpy(compute_, n, alpha, x, y); }
void CudaDevice::scale(size_t n, float alpha, float* x) { kernels::scale(compute_, n, alpha, x); }

double CudaDevice::sum_squares(size_t n, const float* x) {
  if (n == 0) return 0.0;
  auto* ws = static_cast<float*>(scratch(reduce_ws_, kernels::sum_squares_workspace(n) * sizeof(float), "reduction workspace"));
  auto* result = static_cast<double*>(scratch(result_, sizeof(double), "reduction result"));
  kernels::sum_squares(compute_, n, x, ws, result);
  double host = 0;
  PTDP_CUDA_CHECK(cudaMemcpyAsync(&host, result, sizeof host, cudaMemcpyDeviceToHost, compute_));
  PTDP_CUDA_CHECK(cudaStreamSynchronize(compute_));
  return host;
}

// --- layers ------------------------------------------------------------------------------------

void CudaDevice::add_bias(int rows, int cols, const float* bias, float* y) {
  if (bias != nullptr) kernels::add_bias(compute_, rows, cols, bias, y);  // null: no biases (model.bias false)
}

void CudaDevice::add_bias_grad(int rows, int cols, const float* dy, float* dbias) {
  if (dbias == nullptr) return;
  auto* ws = static_cast<float*>(scratch(reduce_ws_, kernels::column_sum_workspace(rows, cols) * sizeof(float), "reduction workspace"));
  kernels::add_bias_grad(compute_, rows, cols, dy, dbias, ws);
}

void CudaDevice::layer_norm_forward(int rows, int cols, float eps, const float* x, const float* gamma, const float* beta,
                                    float* y, float* mean, float* rstd) {
  kernels::layer_norm_forward(compute_, rows, cols, eps, x, gamma, beta, y, mean, rstd);
}

void CudaDevice::layer_norm_backward(int rows, int cols, const float* dy, const float* x, const float* gamma,
                                     const float* mean, const float* rstd, float* dx, float* dgamma, float* dbeta) {
  auto* ws = static_cast<float*>(
      scratch(reduce_ws_, 2 * kernels::column_sum_workspace(rows, cols) * sizeof(float), "reduction workspace"));
  kernels::layer_norm_backward(compute_, rows, cols, dy, x, gamma, mean, rstd, dx, dgamma, dbeta, ws);
}

void CudaDevice::rms_norm_forward(int rows, int cols, float eps, const float* x, const float* gamma, float* y,
                                  float* rstd) {
  kernels::rms_norm_forward(compute_, rows, cols, eps, x, gamma, y, rstd);
}

void CudaDevice::rms_norm_backward(int rows, int cols, const float* dy, const float* x, const float* gamma,
                                   const float* rstd, float* dx, float* dgamma) {
  auto* ws = static_cast<float*>(
      scratch(reduce_ws_, kernels::column_sum_workspace(rows, cols) * sizeof(float), "reduction workspace"));
  kernels::rms_norm_backward(compute_, rows, cols, dy, x, gamma, rstd, dx, dgamma, ws);
}

void CudaDevice::swiglu_forward(size_t n, const float* gate, const float* up, float* y) {
  kernels::swiglu_forward(compute_, n, gate, up, y);
}

void CudaDevice::swiglu_backward(size_t n, const float* gate, const float* up, const float* dy, float* dgate, float* dup) {
  kernels::swiglu_backward(compute_, n, gate, up, dy, dgate, dup);
}

void CudaDevice::gelu_forward(size_t n, const float* x, float* y) { kernels::gelu_forward(compute_, n, x, y); }
void CudaDevice::gelu_backward(size_t n, const float* x, const float* dy, float* dx) {
  kernels::gelu_backward(compute_, n, x, dy, dx);
}

void CudaDevice::bias_gelu_forward(int rows, int cols, const float* x, const float* bias, float* pre, float* y) {
  kernels::bias_gelu_forward(compute_, rows, cols, x, bias, pre, y);
}
void CudaDevice::bias_gelu_backward(int rows, int cols, const float* pre, const float* dy, float* dx, float* dbias) {
  auto* ws = static_cast<float*>(scratch(reduce_ws_, kernels::column_sum_workspace(rows, cols) * sizeof(float), "reduction workspace"));
  kernels::bias_gelu_backward(compute_, rows, cols, pre, dy, dx, dbias, ws);
}

// Megatron's attention: batched cuBLAS GEMMs over the heads of one sequence for QKᵀ and P·V, and
// the fused scaled causal softmax kernel between them. The operands are strided views of qkv
// (row stride (heads + 2·groups)·d), so no copies are made.
// The CUDA kernels take values as wide as queries and keys; multi-head latent attention's
// narrower values run on the CPU back end.
static void require_square_heads(const AttentionShape& sh) {
  if (sh.v_dim() != sh.head_dim)
    throw EnvironmentError("cuda: attention with value heads of another width than the query heads (" + std::to_string(sh.v_dim()) +
                           " vs " + std::to_string(sh.head_dim) + ", multi-head latent attention) runs on --backend cpu only");
}

// Grouped-query attention: query head j = g·r + i of group g. For a fixed i the heads of all
// groups are equally spaced (Q, K, V of group g at g·(r+2)·d; scores at (g·r + i)·s²; context at
// (g·r + i)·d), so each i is one strided batched GEMM over the groups; r = 1 is multi-head
// attention in a single batched call per product. The key and value gradients of a group sum
// over its r query heads: i = 0 writes them, the others accumulate (beta = 1).
void CudaDevice::flash_attention_forward(const AttentionShape& sh, const float* qkv, float* ctx, float* lse) {
  require_square_heads(sh);
  if (sh.head_dim > 256) throw EnvironmentError("cuda: flash attention supports head dims up to 256 (got " + std::to_string(sh.head_dim) + ")");
  kernels::flash_attention_forward(compute_, sh.batch, sh.seq, sh.heads, sh.groups(), sh.head_dim, qkv, ctx, lse);
}

void CudaDevice::flash_attention_backward(const AttentionShape& sh, const float* qkv, const float* ctx, const float* lse,
                                          const float* dctx, float* dqkv) {
  require_square_heads(sh);
  if (sh.head_dim > 256) throw EnvironmentError("cuda: flash attention supports head dims up to 256 (got " + std::to_string(sh.head_dim) + ")");
  kernels::flash_attention_backward(compute_, sh.batch, sh.seq, sh.heads, sh.groups(), sh.head_dim, qkv, ctx, lse, dctx, dqkv);
}

void CudaDevice::attention_forward(const AttentionShape& sh, const float* qkv, float* probs, float* ctx) {
  require_square_heads(sh);
  const int s = sh.seq, hd = sh.head_dim, H = sh.heads, G = sh.groups(), r = sh.heads_per_group();
  const int ld_qkv = sh.qkv_cols(), ld_ctx = H * hd, group_stride = (r + 2) * hd;
  const long long ss = static_cast<long long>(s) * s;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* work = probs != nullptr ? nullptr
                                 : static_cast<float*>(scratch(scores_, static_cast<size_t>(H) * ss * sizeof(float),
                                                               "attention scores"));
  for (int b = 0; b < sh.batch; ++b) {
    const float* q = qkv + static_cast<size_t>(b) * s * ld_qkv;
    float* p = probs != nullptr ? probs + static_cast<size_t>(b) * H * ss : work;
    for (int i = 0; i < r; ++i)
      gemm_batched(false, true, s, s, hd, scale, q + i * hd, ld_qkv, group_stride, q + r * hd, ld_qkv, group_stride, 0.0f,
                   p + i * ss, s, r * ss, G);
    kernels::causal_softmax_forward(compute_, H, s, p);
    for (int i = 0; i < r; ++i)
      gemm_batched(false, false, s, hd, s, 1.0f, p + i * ss, s, r * ss, q + (r + 1) * hd, ld_qkv, group_stride, 0.0f,
                   ctx + static_cast<size_t>(b) * s * ld_ctx + i * hd, ld_ctx, r * hd, G);
  }
}

void CudaDevice::attention_backward(const AttentionShape& sh, const float* qkv, const float* probs, const float* dctx,
                                    float* dqkv) {
  require_square_heads(sh);
  const int s = sh.seq, hd = sh.head_dim, H = sh.heads, G = sh.groups(), r = sh.heads_per_group();
  const int ld_qkv = sh.qkv_cols(), ld_ctx = H * hd, group_stride = (r + 2) * hd;
  const long long ss = static_cast<long long>(s) * s;
  const size_t per_sequence = static_cast<size_t>(H) * ss * sizeof(float);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto* dp = static_cast<float*>(scratch(dscores_, per_sequence, "attention score gradients"));
  for (int b = 0; b < sh.batch; ++b) {
    const size_t off = static_cast<size_t>(b) * s * ld_qkv;
    const float* q = qkv + off;
    float* dq = dqkv + off;
    const float* dc = dctx + static_cast<size_t>(b) * s * ld_ctx;
    const float* p;
    if (probs != nullptr) {
      p = probs + static_cast<size_t>(b) * H * ss;
    } else {  // selective recompute: the probabilities were not kept
      auto* work = static_cast<float*>(scratch(scores_, per_sequence, "attention scores"));
      for (int i = 0; i < r; ++i)
        gemm_batched(false, true, s, s, hd, scale, q + i * hd, ld_qkv, group_stride, q + r * hd, ld_qkv, group_stride,
                     0.0f, work + i * ss, s, r * ss, G);
      kernels::causal_softmax_forward(compute_, H, s, work);
      p = work;
    }
    // dP = dC·Vᵀ; dV = Σ Pᵀ·dC; dS = softmax'(dP)·scale; dQ = dS·K; dK = Σ dSᵀ·Q.
    for (int i = 0; i < r; ++i) {
      const float beta = i == 0 ? 0.0f : 1.0f;
      gemm_batched(false, true, s, s, hd, 1.0f, dc + i * hd, ld_ctx, r * hd, q + (r + 1) * hd, ld_qkv, group_stride, 0.0f,
                   dp + i * ss, s, r * ss, G);
      gemm_batched(true, false, s, hd, s, 1.0f, p + i * ss, s, r * ss, dc + i * hd, ld_ctx, r * hd, beta,
                   dq + (r + 1) * hd, ld_qkv, group_stride, G);
    }
    kernels::causal_softmax_backward(compute_, H, s, scale, p, dp);
    for (int i = 0; i < r; ++i) {
      const float beta = i == 0 ? 0.0f : 1.0f;
      gemm_batched(false, false, s, hd, s, 1.0f, dp + i * ss, s, r * ss, q + r * hd, ld_qkv, group_stride, 0.0f,
                   dq + i * hd, ld_qkv, group_stride, G);
      gemm_batched(true, false, s, hd, s, 1.0f, dp + i * ss, s, r * ss, q + i * hd, ld_qkv, group_stride, beta,
                   dq + r * hd, ld_qkv, group_stride, G);
    }
  }
}

void CudaDevice::embedding_forward(int count, const int32_t* tokens_host, int64_t first_row, int rows, int cols,
                                   const float* table, float* out) {
  const int32_t* tokens = stage_ints(tokens_, tokens_host, static_cast<size_t>(std::max(count, 0)), "token ids");
  kernels::embedding_forward(compute_, count, tokens, first_row, rows, cols, table, out);
}

// The rows a batch touches are grouped on the host (the ids are host memory anyway): one thread
// per (row, column) adds that row's positions in order, without atomics — deterministic, and in
// the CPU's order of additions.
void CudaDevice::embedding_backward(int count, const int32_t* tokens_host, int64_t first_row, int rows, int cols,
                                    const float* dout, float* dtable) {
  std::vector<std::pair<int32_t, int32_t>> hits;  // (shard row, position)
  hits.reserve(static_cast<size_t>(std::max(count, 0)));
  for (int i = 0; i < count; ++i) {
    const int64_t r = static_cast<int64_t>(tokens_host[i]) - first_row;
    if (r >= 0 && r < rows) hits.emplace_back(static_cast<int32_t>(r), i);
  }
  if (hits.empty()) return;
  std::sort(hits.begin(), hits.end());
  std::vector<int32_t> unique_rows, offsets, positions;
  for (size_t i = 0; i < hits.size(); ++i) {
    if (i == 0 || hits[i].first != hits[i - 1].first) {
      unique_rows.push_back(hits[i].first);
      offsets.push_back(static_cast<int32_t>(i));
    }
    positions.push_back(hits[i].second);
  }
  offsets.push_back(static_cast<int32_t>(hits.size()));
  std::vector<int32_t> groups;
  groups.reserve(unique_rows.size() + offsets.size() + positions.size());
  groups.insert(groups.end(), unique_rows.begin(), unique_rows.end());
  groups.insert(groups.end(), offsets.begin(), offsets.end());
  groups.insert(groups.end(), positions.begin(), positions.end());
  const int32_t* dev_groups = stage_ints(groups_, groups.data(), groups.size(), "embedding gradient index");
  kernels::embedding_backward(compute_, static_cast<int>(unique_rows.size()), dev_groups, cols, dout, dtable);
}

void CudaDevice::logits_row_max(int rows, int cols, int valid_cols, const float* logits, float* row_max) {
  kernels::logits_row_max(compute_, rows, cols, valid_cols, logits, row_max);
}

void CudaDevice::softmax_numerators(int rows, int cols, int valid_cols, const float* row_max,
                                    const int32_t* targets_host, int64_t first_col, float* logits, float* stats) {
  const int32_t* targets = stage_ints(tokens_, targets_host, static_cast<size_t>(std::max(rows, 0)), "target ids");
  kernels::softmax_numerators(compute_, rows, cols, valid_cols, row_max, targets, first_col, logits, stats);
}

void CudaDevice::cross_entropy_finish(int rows, int cols, const float* stats, float* probs, float* loss) {
  kernels::cross_entropy_finish(compute_, rows, cols, stats, probs, loss);
}

void CudaDevice::cross_entropy_backward(int rows, int cols, const int32_t* targets_host, int64_t first_col, float scale,
                                        const float* probs, float* dlogits) {
  const int32_t* targets = stage_ints(tokens_, targets_host, static_cast<size_t>(std::max(rows, 0)), "target ids");
  kernels::cross_entropy_backward(compute_, rows, cols, targets, first_col, scale, probs, dlogits);
}

void CudaDevice::adam_update(size_t n, const AdamStep& step, float* param, const float* grad, float* m, float* v) {
  kernels::adam_update(compute_, n, math::adam_constants(step), param, grad, m, v);
}

bool CudaDevice::any_inf_or_nan(const std::vector<std::pair<const float*, size_t>>& buffers) {
  auto* flag = static_cast<int*>(scratch(flag_, sizeof(int), "overflow flag"));
  PTDP_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), compute_));
  for (const auto& [data, count] : buffers) kernels::find_inf_or_nan(compute_, count, data, flag);
  int host = 0;
  PTDP_CUDA_CHECK(cudaMemcpyAsync(&host, flag, sizeof host, cudaMemcpyDeviceToHost, compute_));
  PTDP_CUDA_CHECK(cudaStreamSynchronize(compute_));
  return host != 0;
}

CudaDevice* as_cuda_device(Device& dev) { return dynamic_cast<CudaDevice*>(&dev); }

// --- timing --------------------------------------------------------------------------------------

namespace {

// Events on the compute stream; the first one of a series is tied to the host clock.
class EventTimer final : public DeviceTimer {
 public:
  explicit EventTimer(CudaDevice& dev) : dev_(dev) {}
  ~EventTimer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void begin(double host_now_s) override {
    dev_.synchronize();
    used_ = 0;
    base_ = next_event();
    PTDP_CUDA_CHECK(cudaEventRecord(base_, dev_.compute_stream()));
    PTDP_CUDA_CHECK(cudaEventSynchronize(base_));
    base_host_s_ = host_now_s;
    marks_.clear();
  }
  int mark() override {
    PTDP_ASSERT(base_ != nullptr, "DeviceTimer::mark() before begin()");
    cudaEvent_t e = next_event();
    PTDP_CUDA_CHECK(cudaEventRecord(e, dev_.compute_stream()));
    marks_.push_back(e);
    return static_cast<int>(marks_.size()) - 1;
  }
  std::vector<double> resolve() override {
    std::vector<double> out;
    if (marks_.empty()) return out;
    PTDP_CUDA_CHECK(cudaEventSynchronize(marks_.back()));
    for (cudaEvent_t e : marks_) {
      float ms = 0;
      PTDP_CUDA_CHECK(cudaEventElapsedTime(&ms, base_, e));
      out.push_back(base_host_s_ + static_cast<double>(ms) * 1e-3);
    }
    return out;
  }

 private:
  cudaEvent_t next_event() {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      PTDP_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    return events_[used_++];
  }

  CudaDevice& dev_;
  std::vector<cudaEvent_t> events_;  // reused across series
  size_t used_ = 0;
  cudaEvent_t base_ = nullptr;
  double base_host_s_ = 0;
  std::vector<cudaEvent_t> marks_;
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options) {
  return std::make_unique<CudaDevice>(options);
}

namespace detail {

std::unique_ptr<DeviceTimer> make_event_timer(Device& dev) {
  CudaDevice* cuda = as_cuda_device(dev);
  if (cuda == nullptr) return nullptr;
  return std::make_unique<EventTimer>(*cuda);
}

std::optional<bool> device_any_inf_or_nan(Device& dev, const std::vector<std::pair<const float*, size_t>>& buffers) {
  CudaDevice* cuda = as_cuda_device(dev);
  if (cuda == nullptr) return std::nullopt;
  return cuda->any_inf_or_nan(buffers);
}

}  // namespace detail
}  // namespace ptdp::exec::cuda
