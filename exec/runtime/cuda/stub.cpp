// exec/cuda in a build without CUDA (-DPTDP_ENABLE_CUDA=OFF): the same entry points, each saying
// clearly that this ptdp cannot use a GPU. Plain C++.
#include "core/error.hpp"
#include "exec/runtime/cuda/backend.hpp"
#include "exec/runtime/cuda/calibrate.hpp"
#include "exec/runtime/cuda/cuda.hpp"

namespace ptdp::exec::cuda {
namespace {

[[noreturn]] void not_compiled() { throw EnvironmentError(detail::unavailable_reason()); }

}  // namespace

std::string cuda_status() { return "cuda: not compiled (built with PTDP_ENABLE_CUDA=OFF)"; }
int cuda_device_count() { return 0; }

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions&) { not_compiled(); }
ProcessGroups make_nccl_groups(Device&, ProcessGroups, double) { not_compiled(); }
CalibrationResult calibrate_cuda(Communicator&, const CalibrationOptions&) { not_compiled(); }

namespace detail {

std::unique_ptr<DeviceTimer> make_event_timer(Device&) { return nullptr; }
std::optional<bool> device_any_inf_or_nan(Device&, const std::vector<std::pair<const float*, size_t>>&) {
  return std::nullopt;
}
std::string unavailable_reason() {
  return "ptdp was built without CUDA (PTDP_ENABLE_CUDA=OFF): --backend cuda needs a build with the CUDA toolkit "
         "and NCCL (cmake -DPTDP_ENABLE_CUDA=ON); use --backend cpu";
}

}  // namespace detail
}  // namespace ptdp::exec::cuda
