// What the CUDA build can use right now: devices, driver, NCCL (for `ptdp backends`).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "exec/runtime/cuda/backend.hpp"
#include "exec/runtime/cuda/cuda.hpp"

#ifndef PTDP_CUDA_ARCHITECTURES
#define PTDP_CUDA_ARCHITECTURES "unknown"
#endif

namespace ptdp::exec::cuda {
namespace {

std::string version_text(int v) {  // 12040 → "12.4"
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// "sm_80, sm_90" from CMake's architectures, "80,90" (entries may carry -real / -virtual).
std::string architectures() {
  std::string in = PTDP_CUDA_ARCHITECTURES, out;  // "80,90"
  size_t start = 0;
  while (start <= in.size()) {
    const size_t end = std::min(in.find(',', start), in.size());
    std::string a = in.substr(start, end - start);
    if (const size_t dash = a.find('-'); dash != std::string::npos) a.resize(dash);
    if (!a.empty()) out += (out.empty() ? "" : ", ") + std::string("sm_") + a;
    start = end + 1;
  }
  return out;
}

std::string build_text() {
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  int nccl = 0;
  ncclGetVersion(&nccl);  // 22809 → 2.28.9
  return "compiled for " + architectures() + " (CUDA runtime " + version_text(runtime) + ", NCCL " +
         std::to_string(nccl / 10000) + "." + std::to_string((nccl / 100) % 100) + "." + std::to_string(nccl % 100) + ")";
}

// The runtime's error text, and what the driver says about itself.
std::string driver_problem(cudaError_t rc) {
  std::string s = cudaGetErrorString(rc);
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  if (driver == 0) return s + "; no NVIDIA driver is loaded";
  if (rc == cudaErrorInsufficientDriver)
    return s + "; the driver supports CUDA " + version_text(driver) + ", this ptdp was built with CUDA " + version_text(runtime);
  return s;
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_status() {
  std::string out = "cuda: " + build_text() + ", ";
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    return out + "no device (CUDA driver: " + driver_problem(rc) + ")";
  }
  if (n == 0) return out + "no device (no CUDA device is visible)";
  std::map<std::string, int> kinds;  // "NVIDIA A100-SXM4-80GB, 80 GB" → count
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      cudaGetLastError();
      ++kinds["unknown GPU"];
      continue;
    }
    ++kinds[std::string(p.name) + ", " + std::to_string((p.totalGlobalMem + (1u << 29)) >> 30) + " GiB, sm_" +
            std::to_string(p.major) + std::to_string(p.minor)];
  }
  std::string names;
  for (const auto& [name, count] : kinds)
    names += (names.empty() ? "" : "; ") + (kinds.size() > 1 ? std::to_string(count) + "× " : "") + name;
  int driver = 0;
  cudaDriverGetVersion(&driver);
  return out + std::to_string(n) + (n == 1 ? " device (" : " devices (") + names + "), CUDA driver " + version_text(driver);
}

namespace detail {

std::string unavailable_reason() {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    return "--backend cuda: no usable GPU (CUDA driver: " + driver_problem(rc) +
           "); run on a machine with an NVIDIA GPU and driver, or use --backend cpu";
  }
  if (n == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    return std::string("--backend cuda: no CUDA device is visible") +
           (visible ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : std::string()) +
           "; use --backend cpu";
  }
  return "";
}

}  // namespace detail
}  // namespace ptdp::exec::cuda
