// The cuda Device (internal to exec/cuda: includes CUDA headers). Public entry point:
// make_cuda_device() in exec/runtime/cuda/cuda.hpp.
//
// One compute stream per device; every kernel, GEMM and copy of the Device interface is queued
// on it, so the interface's calls are ordered without synchronising; download(), sum_squares()
// and synchronize() wait. Memory comes from the device's stream-ordered pool (cudaMallocAsync on
// the compute stream, kept cached), so release() is safe while queued kernels still read the
// buffer. Communication streams (exec/runtime/cuda/nccl_communicator.cpp) wait for the compute stream
// with an event before touching its buffers.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/runtime/cuda/cuda.hpp"
#include "exec/runtime/device.hpp"

namespace ptdp::exec::cuda {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const CudaDeviceOptions& options);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  std::string_view name() const override { return "cuda"; }

  float* allocate(size_t count) override;
  void release(float* ptr, size_t count) noexcept override;
  size_t bytes_in_use() const override { return in_use_; }
  size_t peak_bytes() const override { return peak_; }
  void upload(const float* host, float* dst, size_t count) override;
  void download(const float* src, float* host, size_t count) override;
  void copy(const float* src, float* dst, size_t count) override;
  void fill(float* dst, size_t count, float value) override;
  void synchronize() override;

  void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
            float beta, float* c, int ldc) override;
  void axpy(size_t n, float alpha, const float* x, float* y) override;
  void scale(size_t n, float alpha, float* x) override;
  double sum_squares(size_t n, const float* x) override;

  void add_bias(int rows, int cols, const float* bias, float* y) override;
  void add_bias_grad(int rows, int cols, const float* dy, float* dbias) override;
  void layer_norm_forward(int rows, int cols, float eps, const float* x, const float* gamma, const float* beta, float* y,
                          float* mean, float* rstd) override;
  void layer_norm_backward(int rows, int cols, const float* dy, const float* x, const float* gamma, const float* mean,
                           const float* rstd, float* dx, float* dgamma, float* dbeta) override;
  void rms_norm_forward(int rows, int cols, float eps, const float* x, const float* gamma, float* y,
                        float* rstd) override;
  void rms_norm_backward(int rows, int cols, const float* dy, const float* x, const float* gamma, const float* rstd,
                         float* dx, float* dgamma) override;
  void swiglu_forward(size_t n, const float* gate, const float* up, float* y) override;
  void swiglu_backward(size_t n, const float* gate, const float* up, const float* dy, float* dgate,
                       float* dup) override;
  void gelu_forward(size_t n, const float* x, float* y) override;
  void gelu_backward(size_t n, const float* x, const float* dy, float* dx) override;
  void attention_forward(const AttentionShape& shape, const float* qkv, float* probs, float* ctx) override;
  void attention_backward(const AttentionShape& shape, const float* qkv, const float* probs, const float* dctx,
                          float* dqkv) override;
  void flash_attention_forward(const AttentionShape& shape, const float* qkv, float* ctx, float* lse) override;
  void flash_attention_backward(const AttentionShape& shape, const float* qkv, const float* ctx, const float* lse,
                                const float* dctx, float* dqkv) override;
  void embedding_forward(int count, const int32_t* tokens_host, int64_t first_row, int rows, int cols,
                         const float* table, float* out) override;
  void embedding_backward(int count, const int32_t* tokens_host, int64_t first_row, int rows, int cols,
                          const float* dout, float* dtable) override;
  void logits_row_max(int rows, int cols, int valid_cols, const float* logits, float* row_max) override;
  void softmax_numerators(int rows, int cols, int valid_cols, const float* row_max, const int32_t* targets_host,
                          int64_t first_col, float* logits, float* stats) override;
  void cross_entropy_finish(int rows, int cols, const float* stats, float* probs, float* loss) override;
  void cross_entropy_backward(int rows, int cols, const int32_t* targets_host, int64_t first_col, float scale,
                              const float* probs, float* dlogits) override;
  void adam_update(size_t n, const AdamStep& step, float* param, const float* grad, float* m, float* v) override;

  // --- beyond the Device interface ------------------------------------------------------------
  /// Fused bias + GELU (proposed for Device): pre = x + bias[col] (kept for backward), y = gelu(pre).
  void bias_gelu_forward(int rows, int cols, const float* x, const float* bias, float* pre, float* y);
  /// dx = dy·gelu'(pre) (may alias dy); dbias += Σ_r dx[r, :].
  void bias_gelu_backward(int rows, int cols, const float* pre, const float* dy, float* dx, float* dbias);
  /// True when any element of the buffers is ±inf or NaN (one round trip).
  bool any_inf_or_nan(const std::vector<std::pair<const float*, size_t>>& buffers);

  int ordinal() const { return ordinal_; }
  cudaStream_t compute_stream() const { return compute_; }
  Precision precision() const { return precision_; }
  /// Makes `stream` wait for everything queued on the compute stream so far (no host wait).
  void order_after_compute(cudaStream_t stream);

 private:
  // A device buffer that grows on demand and is reused across calls (ordered on the compute stream).
  struct Scratch {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  void* scratch(Scratch& s, size_t bytes, const char* what);
  /// Host int32 values in device memory, valid for work queued on the compute stream until the
  /// next call that uses the same scratch slot.
  const int32_t* stage_ints(Scratch& s, const int32_t* host, size_t count, const char* what);
  void* raw_allocate(size_t bytes, const std::string& what);
  void teardown() noexcept;
  [[noreturn]] void out_of_memory(size_t bytes, const std::string& what);
  void gemm_batched(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, long long stride_a,
                    const float* b, int ldb, long long stride_b, float beta, float* c, int ldc, long long stride_c,
                    int batch);

  int ordinal_ = 0;
  Precision precision_ = Precision::BF16;
  int compute_type_ = 0;  // cublasComputeType_t for the precision
  double plan_memory_bytes_ = 0;
  cudaStream_t compute_ = nullptr;
  cudaEvent_t compute_mark_ = nullptr;  // recorded by order_after_compute()
  cublasHandle_t cublas_ = nullptr;
  size_t in_use_ = 0, peak_ = 0;
  Scratch reduce_ws_, scores_, dscores_, tokens_, groups_, flag_, result_;
};

/// The CudaDevice behind `dev`, or null when it is another device.
CudaDevice* as_cuda_device(Device& dev);

}  // namespace ptdp::exec::cuda
