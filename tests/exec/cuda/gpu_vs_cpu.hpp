// Shared by the GPU kernel tests: a cuda and a cpu device side by side, random inputs put on
// both, results compared element by element with stated tolerances. Every test skips, with
// the reason, when this build or machine has no usable GPU.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "exec/runtime/cuda/cuda.hpp"
#include "exec/runtime/device.hpp"

namespace ptdp::exec::test {

/// Skips the current test unless a CUDA device is usable (call from SetUp()).
#define PTDP_REQUIRE_GPU()                                                                         \
  do {                                                                                             \
    if (!::ptdp::exec::cuda::kCudaCompiled || ::ptdp::exec::cuda::cuda_device_count() == 0)        \
      GTEST_SKIP() << "no usable GPU: " << ::ptdp::exec::cuda::cuda_status();                       \
  } while (0)

inline std::vector<float> random_values(size_t n, unsigned seed, float scale = 1.0f, float shift = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = shift + scale * d(rng);
  return v;
}

/// The same buffer on the GPU and on the CPU.
struct Mirrored {
  Tensor gpu, cpu;
  Mirrored(Device& g, Device& c, const std::vector<float>& values)
      : gpu(g, static_cast<int64_t>(values.size()), 1), cpu(c, static_cast<int64_t>(values.size()), 1) {
    g.upload(values.data(), gpu.data(), values.size());
    c.upload(values.data(), cpu.data(), values.size());
  }
  Mirrored(Device& g, Device& c, size_t n, unsigned seed, float scale = 1.0f, float shift = 0.0f)
      : Mirrored(g, c, random_values(n, seed, scale, shift)) {}
  std::vector<float> from_gpu(Device& g) const {
    std::vector<float> v(gpu.size());
    g.download(gpu.data(), v.data(), v.size());
    return v;
  }
  std::vector<float> from_cpu(Device& c) const {
    std::vector<float> v(cpu.size());
    c.download(cpu.data(), v.data(), v.size());
    return v;
  }
};

/// |got − want| ≤ abs + rel·|want| for every element; reports the worst one.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel, double abs,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double limit = abs + rel * std::fabs(static_cast<double>(want[i]));
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const bool nan_mismatch = std::isnan(got[i]) != std::isnan(want[i]);
    const double excess = nan_mismatch ? INFINITY : err - limit;
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  EXPECT_LE(worst_excess, 0.0) << what << ": element " << worst << " is " << got[worst] << ", the CPU gives "
                               << want[worst] << " (tolerance " << abs << " + " << rel << "·|x|)";
}

class GpuVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    PTDP_REQUIRE_GPU();
    cuda::CudaDeviceOptions o;
    o.precision = Precision::FP32;  // exact-ish comparisons; the bf16 tests make their own device
    gpu_ = cuda::make_cuda_device(o);
    cpu_ = make_cpu_device();
  }
  Device& gpu() { return *gpu_; }
  Device& cpu() { return *cpu_; }
  void compare(const Mirrored& m, double rel, double abs, const std::string& what) {
    expect_close(m.from_gpu(gpu()), m.from_cpu(cpu()), rel, abs, what);
  }

  std::unique_ptr<Device> gpu_, cpu_;
};

}  // namespace ptdp::exec::test
