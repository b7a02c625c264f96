// What the plain C++ parts of exec/cuda (common.cpp) ask of the CUDA build; stub.cpp answers
// them in a build without CUDA. Internal header, no CUDA types.
//
// With CUDA, the back end is a module loaded on first use (libptdp_cuda.so, module.cpp): the
// CUDA runtime, cuBLAS(Lt) and NCCL are loaded only by the commands that run on a GPU, not by
// every `ptdp simulate` (their start-up alone cost more than an analytic simulation). The module
// hands the loader (loader.cpp) a table of its entry points; its other symbols stay hidden.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "exec/runtime/cuda/calibrate.hpp"
#include "exec/runtime/cuda/cuda.hpp"

namespace ptdp::exec::cuda::detail {

/// An event timer when `dev` is a cuda device, else null.
std::unique_ptr<DeviceTimer> make_event_timer(Device& dev);
/// The overflow check on the GPU when `dev` is a cuda device, else nullopt.
std::optional<bool> device_any_inf_or_nan(Device& dev, const std::vector<std::pair<const float*, size_t>>& buffers);
/// The message for "no usable device" (stub: "ptdp was built without CUDA …").
std::string unavailable_reason();

/// The entry points of the CUDA module, as the module's own functions of the same names.
/// `abi` and `size` guard against a module from another build of ptdp.
struct ModuleEntryPoints {
  int abi = 0;
  size_t size = 0;
  std::string (*cuda_status)() = nullptr;
  int (*cuda_device_count)() = nullptr;
  std::unique_ptr<Device> (*make_cuda_device)(const CudaDeviceOptions&) = nullptr;
  ProcessGroups (*make_nccl_groups)(Device&, ProcessGroups, double) = nullptr;
  CalibrationResult (*calibrate_cuda)(Communicator&, const CalibrationOptions&) = nullptr;
  std::unique_ptr<DeviceTimer> (*make_event_timer)(Device&) = nullptr;
  std::optional<bool> (*device_any_inf_or_nan)(Device&, const std::vector<std::pair<const float*, size_t>>&) = nullptr;
  std::string (*unavailable_reason)() = nullptr;
};
/// Bumped whenever ModuleEntryPoints or the types it passes change.
inline constexpr int kModuleAbi = 1;
/// The module's one exported symbol: extern "C" const ModuleEntryPoints* ptdp_cuda_module_entry_points().
inline constexpr const char* kModuleEntrySymbol = "ptdp_cuda_module_entry_points";

}  // namespace ptdp::exec::cuda::detail
