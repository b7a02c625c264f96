#include "exec/device.hpp"

#include "core/error.hpp"
#include "exec/cuda/cuda.hpp"

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

std::unique_ptr<Device> make_device(const std::string& backend) {
  if (backend == "cpu") return make_cpu_device();
  if (backend == "cuda") return cuda::make_cuda_device();
  throw ConfigError("backend", "unknown back end '" + backend + "', expected cpu or cuda" +
                                   did_you_mean(backend, {"cpu", "cuda"}));
}

}  // namespace ptdp::exec
