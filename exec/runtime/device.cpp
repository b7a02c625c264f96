#include "exec/runtime/device.hpp"

#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "exec/runtime/cuda/cuda.hpp"
#include "exec/runtime/elementwise_math.hpp"

namespace ptdp::exec {

Tensor::Tensor(Device& dev, int64_t rows, int64_t cols) : dev_(&dev), rows_(rows), cols_(cols) {
  PTDP_ASSERT(rows >= 0 && cols >= 0, "negative tensor shape");
  if (size() > 0) data_ = dev.allocate(size());
}

Tensor Tensor::zeros(Device& dev, int64_t rows, int64_t cols) {
  Tensor t(dev, rows, cols);
  if (t.size() > 0) dev.fill(t.data(), t.size(), 0.0f);
  return t;
}

Tensor Tensor::copy_of(Device& dev, const float* src, int64_t rows, int64_t cols) {
  Tensor t(dev, rows, cols);
  if (t.size() > 0) dev.copy(src, t.data(), t.size());
  return t;
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    reset();
    dev_ = o.dev_;
    data_ = o.data_;
    rows_ = o.rows_;
    cols_ = o.cols_;
    o.data_ = nullptr;
    o.rows_ = o.cols_ = 0;
  }
  return *this;
}

void Tensor::reset() {
  if (data_ != nullptr) dev_->release(data_, size());
  data_ = nullptr;
  rows_ = cols_ = 0;
}

void Device::attention_block_forward(const AttentionShape&, const float*, const int32_t*, const float*, const int32_t*,
                                     float*, float*) {
  throw EnvironmentError("context parallelism's ring attention runs on the cpu back end only (device " + std::string(name()) + ")");
}

void Device::attention_block_backward(const AttentionShape&, const float*, const int32_t*, const float*, const int32_t*,
                                      const float*, const float*, const float*, float*, float*) {
  throw EnvironmentError("context parallelism's ring attention runs on the cpu back end only (device " + std::string(name()) + ")");
}

void Device::dropout(int rows, int cols, const uint64_t* row_keys_host, float rate, float* x) {
  std::vector<float> host(static_cast<size_t>(rows) * static_cast<size_t>(cols));
  download(x, host.data(), host.size());
  const float keep_scale = 1.0f / (1.0f - rate);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      float& v = host[static_cast<size_t>(r) * cols + c];
      v = math::dropout_keep(row_keys_host[r], c, rate) ? v * keep_scale : 0.0f;
    }
  upload(host.data(), x, host.size());
}

float Device::fp8_cast(const Fp8Cast& cast, const float* src, float* dst) {
  std::vector<float> host(static_cast<size_t>(cast.rows) * static_cast<size_t>(cast.cols));
  download(src, host.data(), host.size());
  const float amax = fp8_cast_host(cast, host.data(), host.data());
  upload(host.data(), dst, host.size());
  return amax;
}

void Device::copy_2d(int rows, int cols, const float* src, int src_ld, float* dst, int dst_ld) {
  for (int r = 0; r < rows; ++r) copy(src + static_cast<size_t>(r) * src_ld, dst + static_cast<size_t>(r) * dst_ld, static_cast<size_t>(cols));
}

void Device::rotary(const AttentionShape& shape, int rot_dim, double base, const int32_t* pos_host, bool inverse, float* qkv) {
  PTDP_ASSERT(rot_dim <= shape.head_dim, "rotary channels must be within a head");
  // The query heads and each group's key: every head column block but the values.
  std::vector<size_t> heads;
  for (int j = 0; j < shape.heads; ++j) heads.push_back(shape.q_col(j));
  for (int g = 0; g < shape.groups(); ++g) heads.push_back(shape.k_col(g * shape.heads_per_group()));
  rotary_heads(shape.batch, shape.seq, shape.qkv_cols(), heads, rot_dim, base, pos_host, inverse, false, qkv);
}

void Device::rotary_heads(int batch, int seq, int cols, const std::vector<size_t>& head_cols, int rot_dim, double base,
                          const int32_t* pos_host, bool inverse, bool interleaved, float* x) {
  PTDP_ASSERT(rot_dim >= 2 && rot_dim % 2 == 0, "rotary channels must be even");
  const int half = rot_dim / 2;
  // cos and sin of each (position, pair): Megatron's inv_freq = 1 / base^(2i/d) and
  // freqs = position · inv_freq in fp32, their cosine and sine rounded to fp32.
  std::vector<float> cos_t(static_cast<size_t>(seq) * half), sin_t(cos_t.size());
  for (int r = 0; r < seq; ++r)
    for (int i = 0; i < half; ++i) {
      const float inv_freq = 1.0f / std::pow(static_cast<float>(base), static_cast<float>(2 * i) / static_cast<float>(rot_dim));
      const float angle = static_cast<float>(pos_host[r]) * inv_freq;
      cos_t[static_cast<size_t>(r) * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin_t[static_cast<size_t>(r) * half + i] = static_cast<float>((inverse ? -1.0 : 1.0) * std::sin(static_cast<double>(angle)));
    }
  const size_t n = static_cast<size_t>(batch) * seq * cols;
  std::vector<float> host(n);
  download(x, host.data(), n);
  const int first_step = interleaved ? 2 : 1, second = interleaved ? 1 : half;
  for (int b = 0; b < batch; ++b)
    for (int r = 0; r < seq; ++r) {
      float* row = host.data() + (static_cast<size_t>(b) * seq + r) * cols;
      const float* c = cos_t.data() + static_cast<size_t>(r) * half;
      const float* s = sin_t.data() + static_cast<size_t>(r) * half;
      for (size_t col : head_cols)
        for (int i = 0; i < half; ++i) {
          float& a1 = row[col + static_cast<size_t>(i * first_step)];
          float& a2 = row[col + static_cast<size_t>(i * first_step + second)];
          const float x1 = a1, x2 = a2;
          a1 = x1 * c[i] - x2 * s[i];
          a2 = x2 * c[i] + x1 * s[i];
        }
    }
  upload(host.data(), x, n);
}

std::unique_ptr<Device> make_device(const std::string& backend) {
  if (backend == "cpu") return make_cpu_device();
  if (backend == "cuda") return cuda::make_cuda_device();
  throw ConfigError("backend", "unknown back end '" + backend + "', expected cpu or cuda" +
                                   did_you_mean(backend, {"cpu", "cuda"}));
}

}  // namespace ptdp::exec
