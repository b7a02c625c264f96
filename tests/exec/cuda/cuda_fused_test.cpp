// The cuda device's calls beyond the Device interface (built only with CUDA; label `gpu`):
// fused bias + GELU against the CPU's separate bias and GELU passes.
#include "exec/runtime/cuda/cuda_device.hpp"
#include "tests/exec/cuda/gpu_vs_cpu.hpp"

namespace ptdp::exec::test {
namespace {

using FusedKernels = GpuVsCpu;

TEST_F(FusedKernels, BiasGeluForwardAndBackwardMatchTheSeparatePasses) {
  cuda::CudaDevice* dev = cuda::as_cuda_device(gpu());
  ASSERT_NE(dev, nullptr);
  const int rows = 200, cols = 96;
  const size_t n = static_cast<size_t>(rows) * cols;
  Mirrored x(gpu(), cpu(), n, 91, 2.0f), bias(gpu(), cpu(), cols, 92), pre(gpu(), cpu(), n, 93), y(gpu(), cpu(), n, 94);
  dev->bias_gelu_forward(rows, cols, x.gpu.data(), bias.gpu.data(), pre.gpu.data(), y.gpu.data());
  cpu().copy(x.cpu.data(), pre.cpu.data(), n);
  cpu().add_bias(rows, cols, bias.cpu.data(), pre.cpu.data());
  cpu().gelu_forward(n, pre.cpu.data(), y.cpu.data());
  compare(pre, 0, 0, "bias_gelu_forward pre-activation");
  compare(y, 1e-5, 1e-6, "bias_gelu_forward");

  Mirrored dy(gpu(), cpu(), n, 95), dbias(gpu(), cpu(), cols, 96);
  dev->bias_gelu_backward(rows, cols, pre.gpu.data(), dy.gpu.data(), dy.gpu.data(), dbias.gpu.data());
  cpu().gelu_backward(n, pre.cpu.data(), dy.cpu.data(), dy.cpu.data());
  cpu().add_bias_grad(rows, cols, dy.cpu.data(), dbias.cpu.data());
  compare(dy, 1e-5, 1e-6, "bias_gelu_backward dx");
  compare(dbias, 1e-5, 1e-4, "bias_gelu_backward dbias");
}

}  // namespace
}  // namespace ptdp::exec::test
