// The CUDA kernels of the cuda device. The element-wise formulas come from
// exec/runtime/elementwise_math.hpp (shared with the CPU device). Reductions run in a fixed order
// (warp shuffles, then warps, then fixed chunks of rows), so results do not vary between runs.
#include "exec/runtime/cuda/kernels.hpp"

#include <cuda_bf16.h>

#include <algorithm>

#include "exec/runtime/cuda/check.hpp"

namespace ptdp::exec::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerChunk = 64;     // column reductions: rows summed per partial
constexpr int kSumSquaresBlocks = 1024;

unsigned grid_for(size_t n, int threads = kThreads) {
  const size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<size_t>(blocks, 1, size_t{1} << 20));  // grid-stride beyond
}

// Threads for one block per row: a multiple of 32, at most kThreads.
int row_threads(int cols) { return std::clamp((cols + 31) / 32 * 32, 32, kThreads); }

int chunks_for(int rows) { return std::max(1, (rows + kRowsPerChunk - 1) / kRowsPerChunk); }

struct Sum {
  template <class T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Reduction over the block (blockDim.x a multiple of 32); every thread gets the result.
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T identity) {
  __shared__ T shared[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // `shared` may still be read by the previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

__device__ size_t global_index() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ size_t grid_stride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

// --- element-wise -----------------------------------------------------------------------------

__global__ void fill_kernel(float* dst, size_t n, float value) {
  for (size_t i = global_index(); i < n; i += grid_stride()) dst[i] = value;
}
__global__ void axpy_kernel(size_t n, float alpha, const float* x, float* y) {
  for (size_t i = global_index(); i < n; i += grid_stride()) y[i] += alpha * x[i];
}
__global__ void scale_kernel(size_t n, float alpha, float* x) {
  for (size_t i = global_index(); i < n; i += grid_stride()) x[i] *= alpha;
}
__global__ void add_bias_kernel(size_t n, int cols, const float* bias, float* y) {
  for (size_t i = global_index(); i < n; i += grid_stride()) y[i] += bias[i % static_cast<size_t>(cols)];
}
__global__ void gelu_forward_kernel(size_t n, const float* x, float* y) {
  for (size_t i = global_index(); i < n; i += grid_stride()) y[i] = math::gelu(x[i]);
}
__global__ void gelu_backward_kernel(size_t n, const float* x, const float* dy, float* dx) {
  for (size_t i = global_index(); i < n; i += grid_stride()) dx[i] = dy[i] * math::gelu_grad(x[i]);
}
__global__ void bias_gelu_forward_kernel(size_t n, int cols, const float* x, const float* bias, float* pre, float* y) {
  for (size_t i = global_index(); i < n; i += grid_stride()) {
    const float v = x[i] + bias[i % static_cast<size_t>(cols)];
    pre[i] = v;
    y[i] = math::gelu(v);
  }
}
__global__ void adam_kernel(size_t n, math::AdamConstants c, float* param, const float* grad, float* m, float* v) {
  for (size_t i = global_index(); i < n; i += grid_stride()) {
    float p = param[i], mi = m[i], vi = v[i];
    math::adam_element(c, p, mi, vi, grad[i]);
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
  }
}
__global__ void find_inf_or_nan_kernel(size_t n, const float* x, int* flag) {
  for (size_t i = global_index(); i < n; i += grid_stride())
    if (!isfinite(x[i])) *flag = 1;  // every writer stores the same value
}

// --- reductions --------------------------------------------------------------------------------

__global__ void sum_squares_partial_kernel(size_t n, const float* x, double* partial) {
  double acc = 0;
  for (size_t i = global_index(); i < n; i += grid_stride()) {
    const float v = x[i];
    acc += static_cast<double>(v * v);
  }
  acc = block_reduce(acc, Sum{}, 0.0);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
__global__ void sum_partials_kernel(int count, const double* partial, double* result) {
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_reduce(acc, Sum{}, 0.0);
  if (threadIdx.x == 0) *result = acc;
}

// Column partial sums over chunks of kRowsPerChunk rows: part[chunk, col].
__global__ void column_partial_kernel(int rows, int cols, const float* a, float* part) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int r0 = blockIdx.y * kRowsPerChunk, r1 = min(rows, r0 + kRowsPerChunk);
  float s = 0;
  for (int r = r0; r < r1; ++r) s += a[static_cast<size_t>(r) * cols + col];
  part[static_cast<size_t>(blockIdx.y) * cols + col] = s;
}
// out[col] += Σ_chunk part[chunk, col], chunks in order.
__global__ void column_finish_kernel(int chunks, int cols, const float* part, float* out) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float s = 0;
  for (int c = 0; c < chunks; ++c) s += part[static_cast<size_t>(c) * cols + col];
  out[col] += s;
}
// Fused bias-GELU backward: dx = dy·gelu'(pre), and the column partial sums of dx.
__global__ void bias_gelu_backward_partial_kernel(int rows, int cols, const float* pre, const float* dy, float* dx,
                                                  float* part) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int r0 = blockIdx.y * kRowsPerChunk, r1 = min(rows, r0 + kRowsPerChunk);
  float s = 0;
  for (int r = r0; r < r1; ++r) {
    const size_t i = static_cast<size_t>(r) * cols + col;
    const float d = dy[i] * math::gelu_grad(pre[i]);
    dx[i] = d;
    s += d;
  }
  part[static_cast<size_t>(blockIdx.y) * cols + col] = s;
}

// --- LayerNorm ---------------------------------------------------------------------------------

__global__ void layer_norm_forward_kernel(int cols, float eps, const float* x, const float* gamma, const float* beta,
                                          float* y, float* mean, float* rstd) {
  const size_t off = static_cast<size_t>(blockIdx.x) * cols;
  const float* xr = x + off;
  float s = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) s += xr[c];
  const float mu = block_reduce(s, Sum{}, 0.0f) / static_cast<float>(cols);
  float q = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float d = xr[c] - mu;
    q += d * d;
  }
  const float rs = math::layer_norm_rstd(block_reduce(q, Sum{}, 0.0f) / static_cast<float>(cols), eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) y[off + c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = mu;
    rstd[blockIdx.x] = rs;
  }
}

__global__ void layer_norm_dx_kernel(int cols, const float* dy, const float* x, const float* gamma, const float* mean,
                                     const float* rstd, float* dx) {
  const size_t off = static_cast<size_t>(blockIdx.x) * cols;
  const float mu = mean[blockIdx.x], rs = rstd[blockIdx.x];
  float sg = 0, sgx = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = dy[off + c] * gamma[c];
    sg += g;
    sgx += g * (x[off + c] - mu) * rs;
  }
  const float mean_g = block_reduce(sg, Sum{}, 0.0f) / static_cast<float>(cols);
  const float mean_gx = block_reduce(sgx, Sum{}, 0.0f) / static_cast<float>(cols);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float g = dy[off + c] * gamma[c];
    dx[off + c] = math::layer_norm_dx(g, (x[off + c] - mu) * rs, mean_g, mean_gx, rs);
  }
}

// Column partial sums of dy·x̂ (gamma) and dy (beta).
__global__ void layer_norm_param_partial_kernel(int rows, int cols, const float* dy, const float* x, const float* mean,
                                                const float* rstd, float* part_gamma, float* part_beta) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int r0 = blockIdx.y * kRowsPerChunk, r1 = min(rows, r0 + kRowsPerChunk);
  float sg = 0, sb = 0;
  for (int r = r0; r < r1; ++r) {
    const size_t i = static_cast<size_t>(r) * cols + col;
    const float d = dy[i];
    sb += d;
    sg += d * (x[i] - mean[r]) * rstd[r];
  }
  const size_t o = static_cast<size_t>(blockIdx.y) * cols + col;
  part_gamma[o] = sg;
  part_beta[o] = sb;
}

// --- RMSNorm ------------------------------------------------------------------------------------

__global__ void rms_norm_forward_kernel(int cols, float eps, const float* x, const float* gamma, float* y, float* rstd) {
  const size_t off = static_cast<size_t>(blockIdx.x) * cols;
  const float* xr = x + off;
  float q = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) q += xr[c] * xr[c];
  const float rs = math::layer_norm_rstd(block_reduce(q, Sum{}, 0.0f) / static_cast<float>(cols), eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) y[off + c] = xr[c] * rs * gamma[c];
  if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
}

__global__ void rms_norm_dx_kernel(int cols, const float* dy, const float* x, const float* gamma, const float* rstd,
                                   float* dx) {
  const size_t off = static_cast<size_t>(blockIdx.x) * cols;
  const float rs = rstd[blockIdx.x];
  float sgx = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) sgx += dy[off + c] * gamma[c] * x[off + c] * rs;
  const float mean_gx = block_reduce(sgx, Sum{}, 0.0f) / static_cast<float>(cols);
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    dx[off + c] = math::layer_norm_dx(dy[off + c] * gamma[c], x[off + c] * rs, 0.0f, mean_gx, rs);
}

// Column partial sums of dy·x̂ (gamma).
__global__ void rms_norm_gamma_partial_kernel(int rows, int cols, const float* dy, const float* x, const float* rstd,
                                              float* part_gamma) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int r0 = blockIdx.y * kRowsPerChunk, r1 = min(rows, r0 + kRowsPerChunk);
  float sg = 0;
  for (int r = r0; r < r1; ++r) {
    const size_t i = static_cast<size_t>(r) * cols + col;
    sg += dy[i] * x[i] * rstd[r];
  }
  part_gamma[static_cast<size_t>(blockIdx.y) * cols + col] = sg;
}

// --- SwiGLU --------------------------------------------------------------------------------------

__global__ void swiglu_forward_kernel(size_t n, const float* gate, const float* up, float* y) {
  for (size_t i = global_index(); i < n; i += grid_stride()) y[i] = math::swiglu(gate[i], up[i]);
}
__global__ void swiglu_backward_kernel(size_t n, const float* gate, const float* up, const float* dy, float* dgate,
                                       float* dup) {
  for (size_t i = global_index(); i < n; i += grid_stride()) {
    const float g = gate[i], u = up[i], d = dy[i];
    dgate[i] = math::swiglu_dgate(g, u, d);
    dup[i] = math::swiglu_dup(g, d);
  }
}

// --- attention softmax -------------------------------------------------------------------------

__global__ void causal_softmax_forward_kernel(int seq, float* scores) {
  float* row = scores + static_cast<size_t>(blockIdx.x) * seq;
  const int n = static_cast<int>(blockIdx.x % static_cast<unsigned>(seq)) + 1;  // columns 0..i are visible
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, row[j]);
  mx = block_reduce(mx, Max{}, -INFINITY);
  float s = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = math::exp_shifted(row[j], mx);
    row[j] = e;
    s += e;
  }
  const float inv = 1.0f / block_reduce(s, Sum{}, 0.0f);
  for (int j = threadIdx.x; j < n; j += blockDim.x) row[j] *= inv;
  for (int j = n + threadIdx.x; j < seq; j += blockDim.x) row[j] = 0.0f;
}

__global__ void causal_softmax_backward_kernel(int seq, float scale, const float* probs, float* dprobs) {
  const size_t off = static_cast<size_t>(blockIdx.x) * seq;
  const float* p = probs + off;
  float* d = dprobs + off;
  const int n = static_cast<int>(blockIdx.x % static_cast<unsigned>(seq)) + 1;
  float dot = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) dot += d[j] * p[j];
  dot = block_reduce(dot, Sum{}, 0.0f);
  for (int j = threadIdx.x; j < n; j += blockDim.x) d[j] = p[j] * (d[j] - dot) * scale;
  for (int j = n + threadIdx.x; j < seq; j += blockDim.x) d[j] = 0.0f;
}

// --- embedding ---------------------------------------------------------------------------------

__global__ void embedding_forward_kernel(int cols, const int32_t* tokens, int64_t first_row, int rows,
                                         const float* table, float* out) {
  const int64_t r = static_cast<int64_t>(tokens[blockIdx.x]) - first_row;
  float* dst = out + static_cast<size_t>(blockIdx.x) * cols;
  const bool inside = r >= 0 && r < rows;
  const float* src = table + (inside ? static_cast<size_t>(r) * cols : 0);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = inside ? src[c] : 0.0f;
}

// groups = [row of each unique shard row (U)] [offsets (U + 1)] [positions]
__global__ void embedding_backward_kernel(int unique_rows, const int32_t* groups, int cols, const float* dout,
                                          float* dtable) {
  const int u = blockIdx.x;
  const int col = blockIdx.y * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  const int32_t row = groups[u];
  const int32_t* offsets = groups + unique_rows;
  const int32_t* positions = groups + 2 * unique_rows + 1;
  float* dst = dtable + static_cast<size_t>(row) * cols + col;
  float v = *dst;
  for (int32_t k = offsets[u]; k < offsets[u + 1]; ++k) v += dout[static_cast<size_t>(positions[k]) * cols + col];
  *dst = v;
}

// --- vocab-parallel cross entropy --------------------------------------------------------------

__global__ void logits_row_max_kernel(int cols, int valid_cols, const float* logits, float* row_max) {
  const float* row = logits + static_cast<size_t>(blockIdx.x) * cols;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < valid_cols; j += blockDim.x) mx = fmaxf(mx, row[j]);
  mx = block_reduce(mx, Max{}, -INFINITY);
  if (threadIdx.x == 0) row_max[blockIdx.x] = mx;
}

__global__ void softmax_numerators_kernel(int rows, int cols, int valid_cols, const float* row_max,
                                          const int32_t* targets, int64_t first_col, float* logits, float* stats) {
  const int r = blockIdx.x;
  float* row = logits + static_cast<size_t>(r) * cols;
  const float mx = row_max[r];
  if (threadIdx.x == 0) {  // read the target logit before the row is overwritten
    const int64_t t = static_cast<int64_t>(targets[r]) - first_col;
    stats[rows + r] = (t >= 0 && t < valid_cols) ? row[t] - mx : 0.0f;
  }
  __syncthreads();
  float s = 0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float e = j < valid_cols ? math::exp_shifted(row[j], mx) : 0.0f;
    row[j] = e;
    s += e;
  }
  s = block_reduce(s, Sum{}, 0.0f);
  if (threadIdx.x == 0) stats[r] = s;
}

__global__ void cross_entropy_finish_kernel(int rows, int cols, const float* stats, float* probs, float* loss) {
  const int r = blockIdx.x;
  const float inv = 1.0f / stats[r];
  float* row = probs + static_cast<size_t>(r) * cols;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) row[j] *= inv;
  if (threadIdx.x == 0) loss[r] = logf(stats[r]) - stats[rows + r];
}

__global__ void cross_entropy_backward_kernel(size_t n, int cols, const int32_t* targets, int64_t first_col,
                                              float scale, const float* probs, float* dlogits) {
  for (size_t i = global_index(); i < n; i += grid_stride()) {
    const size_t r = i / static_cast<size_t>(cols);
    const int64_t c = static_cast<int64_t>(i % static_cast<size_t>(cols));
    float v = probs[i] * scale;
    if (c == static_cast<int64_t>(targets[r]) - first_col) v -= scale;
    dlogits[i] = v;
  }
}

// --- calibration -------------------------------------------------------------------------------

__global__ void fill_bf16_pattern_kernel(__nv_bfloat16* dst, size_t n, uint32_t seed) {
  for (size_t i = global_index(); i < n; i += grid_stride()) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9e3779b1u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    dst[i] = __float2bfloat16(static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}
__global__ void empty_kernel() {}
__global__ void stream_scale_kernel(size_t n, const float* x, float* y) {
  for (size_t i = global_index(); i < n; i += grid_stride()) y[i] = 2.0f * x[i];
}

}  // namespace

void fill(cudaStream_t s, float* dst, size_t n, float value) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, n, value);
  PTDP_CUDA_CHECK_LAUNCH("fill");
}
void axpy(cudaStream_t s, size_t n, float alpha, const float* x, float* y) {
  if (n == 0) return;
  axpy_kernel<<<grid_for(n), kThreads, 0, s>>>(n, alpha, x, y);
  PTDP_CUDA_CHECK_LAUNCH("axpy");
}
void scale(cudaStream_t s, size_t n, float alpha, float* x) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, s>>>(n, alpha, x);
  PTDP_CUDA_CHECK_LAUNCH("scale");
}

size_t sum_squares_workspace(size_t) { return 2 * kSumSquaresBlocks; }  // doubles, counted in floats

void sum_squares(cudaStream_t s, size_t n, const float* x, float* workspace, double* result) {
  auto* partial = reinterpret_cast<double*>(workspace);
  const unsigned blocks = std::min<unsigned>(grid_for(n, kThreads * 8), kSumSquaresBlocks);
  sum_squares_partial_kernel<<<blocks, kThreads, 0, s>>>(n, x, partial);
  PTDP_CUDA_CHECK_LAUNCH("sum_squares_partial");
  sum_partials_kernel<<<1, 1024, 0, s>>>(static_cast<int>(blocks), partial, result);
  PTDP_CUDA_CHECK_LAUNCH("sum_partials");
}

void add_bias(cudaStream_t s, int rows, int cols, const float* bias, float* y) {
  const size_t n = static_cast<size_t>(rows) * cols;
  if (n == 0) return;
  add_bias_kernel<<<grid_for(n), kThreads, 0, s>>>(n, cols, bias, y);
  PTDP_CUDA_CHECK_LAUNCH("add_bias");
}

size_t column_sum_workspace(int rows, int cols) { return static_cast<size_t>(chunks_for(rows)) * cols; }

void add_bias_grad(cudaStream_t s, int rows, int cols, const float* dy, float* dbias, float* workspace) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid((cols + kThreads - 1) / kThreads, chunks_for(rows));
  column_partial_kernel<<<grid, kThreads, 0, s>>>(rows, cols, dy, workspace);
  PTDP_CUDA_CHECK_LAUNCH("column_partial");
  column_finish_kernel<<<grid.x, kThreads, 0, s>>>(static_cast<int>(grid.y), cols, workspace, dbias);
  PTDP_CUDA_CHECK_LAUNCH("column_finish");
}

void layer_norm_forward(cudaStream_t s, int rows, int cols, float eps, const float* x, const float* gamma,
                        const float* beta, float* y, float* mean, float* rstd) {
  if (rows <= 0) return;
  layer_norm_forward_kernel<<<rows, row_threads(cols), 0, s>>>(cols, eps, x, gamma, beta, y, mean, rstd);
  PTDP_CUDA_CHECK_LAUNCH("layer_norm_forward");
}

void rms_norm_forward(cudaStream_t s, int rows, int cols, float eps, const float* x, const float* gamma, float* y,
                      float* rstd) {
  if (rows <= 0) return;
  rms_norm_forward_kernel<<<rows, row_threads(cols), 0, s>>>(cols, eps, x, gamma, y, rstd);
  PTDP_CUDA_CHECK_LAUNCH("rms_norm_forward");
}

void rms_norm_backward(cudaStream_t s, int rows, int cols, const float* dy, const float* x, const float* gamma,
                       const float* rstd, float* dx, float* dgamma, float* workspace) {
  if (rows <= 0) return;
  rms_norm_dx_kernel<<<rows, row_threads(cols), 0, s>>>(cols, dy, x, gamma, rstd, dx);
  PTDP_CUDA_CHECK_LAUNCH("rms_norm_dx");
  if (dgamma == nullptr) return;
  const dim3 grid((cols + kThreads - 1) / kThreads, chunks_for(rows));
  rms_norm_gamma_partial_kernel<<<grid, kThreads, 0, s>>>(rows, cols, dy, x, rstd, workspace);
  PTDP_CUDA_CHECK_LAUNCH("rms_norm_gamma_partial");
  column_finish_kernel<<<grid.x, kThreads, 0, s>>>(static_cast<int>(grid.y), cols, workspace, dgamma);
  PTDP_CUDA_CHECK_LAUNCH("column_finish");
}

void swiglu_forward(cudaStream_t s, size_t n, const float* gate, const float* up, float* y) {
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(n, gate, up, y);
  PTDP_CUDA_CHECK_LAUNCH("swiglu_forward");
}

void swiglu_backward(cudaStream_t s, size_t n, const float* gate, const float* up, const float* dy, float* dgate,
                     float* dup) {
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(n, gate, up, dy, dgate, dup);
  PTDP_CUDA_CHECK_LAUNCH("swiglu_backward");
}

void layer_norm_backward(cudaStream_t s, int rows, int cols, const float* dy, const float* x, const float* gamma,
                         const float* mean, const float* rstd, float* dx, float* dgamma, float* dbeta,
                         float* workspace) {
  if (rows <= 0) return;
  layer_norm_dx_kernel<<<rows, row_threads(cols), 0, s>>>(cols, dy, x, gamma, mean, rstd, dx);
  PTDP_CUDA_CHECK_LAUNCH("layer_norm_dx");
  if (dgamma == nullptr && dbeta == nullptr) return;
  const dim3 grid((cols + kThreads - 1) / kThreads, chunks_for(rows));
  float* part_gamma = workspace;
  float* part_beta = workspace + column_sum_workspace(rows, cols);
  layer_norm_param_partial_kernel<<<grid, kThreads, 0, s>>>(rows, cols, dy, x, mean, rstd, part_gamma, part_beta);
  PTDP_CUDA_CHECK_LAUNCH("layer_norm_param_partial");
  if (dgamma != nullptr) {
    column_finish_kernel<<<grid.x, kThreads, 0, s>>>(static_cast<int>(grid.y), cols, part_gamma, dgamma);
    PTDP_CUDA_CHECK_LAUNCH("column_finish");
  }
  if (dbeta != nullptr) {
    column_finish_kernel<<<grid.x, kThreads, 0, s>>>(static_cast<int>(grid.y), cols, part_beta, dbeta);
    PTDP_CUDA_CHECK_LAUNCH("column_finish");
  }
}

void gelu_forward(cudaStream_t s, size_t n, const float* x, float* y) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(n, x, y);
  PTDP_CUDA_CHECK_LAUNCH("gelu_forward");
}
void gelu_backward(cudaStream_t s, size_t n, const float* x, const float* dy, float* dx) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(n, x, dy, dx);
  PTDP_CUDA_CHECK_LAUNCH("gelu_backward");
}
void bias_gelu_forward(cudaStream_t s, int rows, int cols, const float* x, const float* bias, float* pre, float* y) {
  const size_t n = static_cast<size_t>(rows) * cols;
  if (n == 0) return;
  bias_gelu_forward_kernel<<<grid_for(n), kThreads, 0, s>>>(n, cols, x, bias, pre, y);
  PTDP_CUDA_CHECK_LAUNCH("bias_gelu_forward");
}
void bias_gelu_backward(cudaStream_t s, int rows, int cols, const float* pre, const float* dy, float* dx,
                        float* dbias, float* workspace) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid((cols + kThreads - 1) / kThreads, chunks_for(rows));
  bias_gelu_backward_partial_kernel<<<grid, kThreads, 0, s>>>(rows, cols, pre, dy, dx, workspace);
  PTDP_CUDA_CHECK_LAUNCH("bias_gelu_backward_partial");
  column_finish_kernel<<<grid.x, kThreads, 0, s>>>(static_cast<int>(grid.y), cols, workspace, dbias);
  PTDP_CUDA_CHECK_LAUNCH("column_finish");
}

void causal_softmax_forward(cudaStream_t s, int matrices, int seq, float* scores) {
  const int64_t rows = static_cast<int64_t>(matrices) * seq;
  if (rows <= 0) return;
  causal_softmax_forward_kernel<<<static_cast<unsigned>(rows), row_threads(seq), 0, s>>>(seq, scores);
  PTDP_CUDA_CHECK_LAUNCH("causal_softmax_forward");
}
void causal_softmax_backward(cudaStream_t s, int matrices, int seq, float scale, const float* probs, float* dprobs) {
  const int64_t rows = static_cast<int64_t>(matrices) * seq;
  if (rows <= 0) return;
  causal_softmax_backward_kernel<<<static_cast<unsigned>(rows), row_threads(seq), 0, s>>>(seq, scale, probs, dprobs);
  PTDP_CUDA_CHECK_LAUNCH("causal_softmax_backward");
}

void embedding_forward(cudaStream_t s, int count, const int32_t* tokens, int64_t first_row, int rows, int cols,
                       const float* table, float* out) {
  if (count <= 0) return;
  embedding_forward_kernel<<<count, row_threads(cols), 0, s>>>(cols, tokens, first_row, rows, table, out);
  PTDP_CUDA_CHECK_LAUNCH("embedding_forward");
}
void embedding_backward(cudaStream_t s, int unique_rows, const int32_t* groups, int cols, const float* dout,
                        float* dtable) {
  if (unique_rows <= 0 || cols <= 0) return;
  const dim3 grid(unique_rows, (cols + kThreads - 1) / kThreads);
  embedding_backward_kernel<<<grid, kThreads, 0, s>>>(unique_rows, groups, cols, dout, dtable);
  PTDP_CUDA_CHECK_LAUNCH("embedding_backward");
}

void logits_row_max(cudaStream_t s, int rows, int cols, int valid_cols, const float* logits, float* row_max) {
  if (rows <= 0) return;
  logits_row_max_kernel<<<rows, row_threads(cols), 0, s>>>(cols, valid_cols, logits, row_max);
  PTDP_CUDA_CHECK_LAUNCH("logits_row_max");
}
void softmax_numerators(cudaStream_t s, int rows, int cols, int valid_cols, const float* row_max,
                        const int32_t* targets, int64_t first_col, float* logits, float* stats) {
  if (rows <= 0) return;
  softmax_numerators_kernel<<<rows, row_threads(cols), 0, s>>>(rows, cols, valid_cols, row_max, targets, first_col,
                                                               logits, stats);
  PTDP_CUDA_CHECK_LAUNCH("softmax_numerators");
}
void cross_entropy_finish(cudaStream_t s, int rows, int cols, const float* stats, float* probs, float* loss) {
  if (rows <= 0) return;
  cross_entropy_finish_kernel<<<rows, row_threads(cols), 0, s>>>(rows, cols, stats, probs, loss);
  PTDP_CUDA_CHECK_LAUNCH("cross_entropy_finish");
}
void cross_entropy_backward(cudaStream_t s, int rows, int cols, const int32_t* targets, int64_t first_col, float scale,
                            const float* probs, float* dlogits) {
  const size_t n = static_cast<size_t>(rows) * cols;
  if (n == 0) return;
  cross_entropy_backward_kernel<<<grid_for(n), kThreads, 0, s>>>(n, cols, targets, first_col, scale, probs, dlogits);
  PTDP_CUDA_CHECK_LAUNCH("cross_entropy_backward");
}

void adam_update(cudaStream_t s, size_t n, const math::AdamConstants& c, float* param, const float* grad, float* m,
                 float* v) {
  if (n == 0) return;
  adam_kernel<<<grid_for(n), kThreads, 0, s>>>(n, c, param, grad, m, v);
  PTDP_CUDA_CHECK_LAUNCH("adam_update");
}

void find_inf_or_nan(cudaStream_t s, size_t n, const float* x, int* flag) {
  if (n == 0) return;
  find_inf_or_nan_kernel<<<grid_for(n), kThreads, 0, s>>>(n, x, flag);
  PTDP_CUDA_CHECK_LAUNCH("find_inf_or_nan");
}

void fill_bf16_pattern(cudaStream_t s, void* dst, size_t n, uint32_t seed) {
  if (n == 0) return;
  fill_bf16_pattern_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(dst), n, seed);
  PTDP_CUDA_CHECK_LAUNCH("fill_bf16_pattern");
}
void empty(cudaStream_t s) {
  empty_kernel<<<1, 32, 0, s>>>();
  PTDP_CUDA_CHECK_LAUNCH("empty");
}
void stream_scale(cudaStream_t s, size_t n, const float* x, float* y) {
  if (n == 0) return;
  stream_scale_kernel<<<grid_for(n), kThreads, 0, s>>>(n, x, y);
  PTDP_CUDA_CHECK_LAUNCH("stream_scale");
}

// --- flash attention -------------------------------------------------------------------------

namespace {
constexpr int kFlashMaxHeadDim = 256;

__device__ size_t flash_q_col(int j, int r, int d) { return static_cast<size_t>(j / r) * (r + 2) * d + static_cast<size_t>(j % r) * d; }
__device__ size_t flash_k_col(int j, int r, int d) { return static_cast<size_t>(j / r) * (r + 2) * d + static_cast<size_t>(r) * d; }

__global__ void flash_forward_kernel(int batch, int seq, int heads, int groups, int d, const float* qkv, float* ctx, float* lse) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;  // (b, j, i) flattened
  if (row >= batch * heads * seq) return;
  const int i = row % seq, j = (row / seq) % heads, b = row / (seq * heads);
  const int r = heads / groups, ld = (heads + 2 * groups) * d, ld_ctx = heads * d;
  const float scale = rsqrtf(static_cast<float>(d));
  const float* base = qkv + static_cast<size_t>(b) * seq * ld;
  const float* q = base + static_cast<size_t>(i) * ld + flash_q_col(j, r, d);
  float acc[kFlashMaxHeadDim];
  for (int c = 0; c < d; ++c) acc[c] = 0;
  float m = -INFINITY, l = 0;
  for (int k = 0; k <= i; ++k) {
    const float* kr = base + static_cast<size_t>(k) * ld + flash_k_col(j, r, d);
    float dot = 0;
    for (int c = 0; c < d; ++c) dot += q[c] * kr[c];
    const float sc = dot * scale, m_new = fmaxf(m, sc), rescale = __expf(m - m_new), p = __expf(sc - m_new);
    const float* vr = kr + d;
    for (int c = 0; c < d; ++c) acc[c] = acc[c] * rescale + p * vr[c];
    l = l * rescale + p;
    m = m_new;
  }
  float* out = ctx + (static_cast<size_t>(b) * seq + i) * ld_ctx + static_cast<size_t>(j) * d;
  for (int c = 0; c < d; ++c) out[c] = acc[c] / l;
  lse[row] = m + __logf(l);
}

__global__ void flash_backward_kernel(int batch, int seq, int heads, int groups, int d, const float* qkv, const float* ctx,
                                      const float* lse, const float* dctx, float* dqkv) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= batch * heads * seq) return;
  const int i = row % seq, j = (row / seq) % heads, b = row / (seq * heads);
  const int r = heads / groups, ld = (heads + 2 * groups) * d, ld_ctx = heads * d;
  const float scale = rsqrtf(static_cast<float>(d));
  const size_t off = static_cast<size_t>(b) * seq * ld;
  const float* q = qkv + off + static_cast<size_t>(i) * ld + flash_q_col(j, r, d);
  const float* o = ctx + (static_cast<size_t>(b) * seq + i) * ld_ctx + static_cast<size_t>(j) * d;
  const float* dout = dctx + (static_cast<size_t>(b) * seq + i) * ld_ctx + static_cast<size_t>(j) * d;
  float D = 0;
  for (int c = 0; c < d; ++c) D += o[c] * dout[c];
  float dq[kFlashMaxHeadDim];
  for (int c = 0; c < d; ++c) dq[c] = 0;
  for (int k = 0; k <= i; ++k) {
    const float* kr = qkv + off + static_cast<size_t>(k) * ld + flash_k_col(j, r, d);
    const float* vr = kr + d;
    float dot = 0, dp = 0;
    for (int c = 0; c < d; ++c) dot += q[c] * kr[c], dp += dout[c] * vr[c];
    const float p = __expf(dot * scale - lse[row]);
    const float ds = p * (dp - D) * scale;
    float* dk = dqkv + off + static_cast<size_t>(k) * ld + flash_k_col(j, r, d);
    float* dv = dk + d;
    for (int c = 0; c < d; ++c) {
      dq[c] += ds * kr[c];
      atomicAdd(dk + c, ds * q[c]);
      atomicAdd(dv + c, p * dout[c]);
    }
  }
  float* dqr = dqkv + off + static_cast<size_t>(i) * ld + flash_q_col(j, r, d);
  for (int c = 0; c < d; ++c) dqr[c] = dq[c];
}
}  // namespace

void flash_attention_forward(cudaStream_t stream, int batch, int seq, int heads, int groups, int head_dim, const float* qkv,
                             float* ctx, float* lse) {
  const int rows = batch * heads * seq, threads = 128;
  flash_forward_kernel<<<(rows + threads - 1) / threads, threads, 0, stream>>>(batch, seq, heads, groups, head_dim, qkv, ctx, lse);
  PTDP_CUDA_CHECK_LAUNCH("flash_forward");
}

void flash_attention_backward(cudaStream_t stream, int batch, int seq, int heads, int groups, int head_dim, const float* qkv,
                              const float* ctx, const float* lse, const float* dctx, float* dqkv) {
  const size_t qkv_floats = static_cast<size_t>(batch) * seq * (heads + 2 * groups) * head_dim;
  PTDP_CUDA_CHECK(cudaMemsetAsync(dqkv, 0, qkv_floats * sizeof(float), stream));
  const int rows = batch * heads * seq, threads = 128;
  flash_backward_kernel<<<(rows + threads - 1) / threads, threads, 0, stream>>>(batch, seq, heads, groups, head_dim, qkv, ctx,
                                                                                 lse, dctx, dqkv);
  PTDP_CUDA_CHECK_LAUNCH("flash_backward");
}

}  // namespace ptdp::exec::cuda::kernels
