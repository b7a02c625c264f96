// The one exported symbol of libptdp_cuda.so (the CUDA back end, loaded by loader.cpp on first
// use): the table of its entry points. Everything else in the module is hidden, so that its
// calls to make_cuda_device & co. stay inside it (the executable's loader has the same names).
#include "exec/runtime/cuda/backend.hpp"

namespace ptdp::exec::cuda::detail {
namespace {

const ModuleEntryPoints kEntryPoints = {
    .abi = kModuleAbi,
    .size = sizeof(ModuleEntryPoints),
    .cuda_status = &cuda_status,
    .cuda_device_count = &cuda_device_count,
    .make_cuda_device = &make_cuda_device,
    .make_nccl_groups = &make_nccl_groups,
    .calibrate_cuda = &calibrate_cuda,
    .make_event_timer = &make_event_timer,
    .device_any_inf_or_nan = &device_any_inf_or_nan,
    .unavailable_reason = &unavailable_reason,
};

}  // namespace
}  // namespace ptdp::exec::cuda::detail

extern "C" __attribute__((visibility("default"))) const ptdp::exec::cuda::detail::ModuleEntryPoints* ptdp_cuda_module_entry_points() {
  return &ptdp::exec::cuda::detail::kEntryPoints;
}
