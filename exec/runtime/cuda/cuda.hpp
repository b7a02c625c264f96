// The CUDA back end of the executor: Device = cuda (cuBLAS GEMMs on tensor cores, CUDA kernels)
// and the NCCL process groups. This header is plain C++ (no CUDA header): the rest of ptdp
// includes it whether or not CUDA was compiled. Without CUDA (-DPTDP_ENABLE_CUDA=OFF) every
// entry point that needs a GPU throws EnvironmentError("ptdp was built without CUDA …").
//
// Typical use on every MPI rank (one rank per GPU):
//
//   auto dev = ptdp::exec::cuda::make_cuda_device({.precision = plan.precision, .plan_memory_bytes = estimate});
//   ptdp::exec::ProcessGroups groups =
//       ptdp::exec::cuda::make_nccl_groups(*dev, ptdp::exec::make_mpi_groups(layout, timeout_s), timeout_s);
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "exec/runtime/communicator.hpp"
#include "exec/runtime/device.hpp"
#include "model/plan.hpp"

namespace ptdp::exec::cuda {

/// Whether this build contains the CUDA back end (a compile-time fact; whether a GPU is usable
/// now is cuda_device_count() / cuda_status()).
#if !defined(PTDP_CUDA_COMPILED)
#error "exec/runtime/cuda/cuda.hpp needs PTDP_CUDA_COMPILED: link the target with ptdp::exec_cuda (or ptdp::exec)"
#endif
inline constexpr bool kCudaCompiled = PTDP_CUDA_COMPILED != 0;

/// One line for `ptdp backends`, e.g.
///   "cuda: compiled, 8 devices (NVIDIA A100-SXM4-80GB), driver 12.4, NCCL 2.28.9"
///   "cuda: compiled, no device (CUDA driver: CUDA driver version is insufficient for CUDA runtime version)"
///   "cuda: not compiled (built with PTDP_ENABLE_CUDA=OFF)"
/// Never throws.
std::string cuda_status();

/// Number of CUDA devices this process can use; 0 without a driver, without devices or without
/// CUDA in the build. Never throws.
int cuda_device_count();

struct CudaDeviceOptions {
  /// GPU ordinal; −1 picks this process's node-local rank (OMPI_COMM_WORLD_LOCAL_RANK,
  /// MPI_LOCALRANKID, MV2_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or LOCAL_RANK; else the world rank
  /// modulo the device count). CUDA_VISIBLE_DEVICES applies as usual.
  int ordinal = -1;
  /// Input precision of the tensor-core GEMMs (accumulation is always fp32): BF16, FP16 or FP32
  /// (no down-conversion). Unset: $PTDP_CUDA_PRECISION (bf16 | fp16 | fp32), else BF16.
  std::optional<Precision> precision;
  /// The plan's memory estimate per GPU in bytes, quoted when an allocation fails (0 = unknown).
  double plan_memory_bytes = 0;
};

/// A CUDA device for this process: selects the GPU, creates the compute stream, the cuBLAS
/// handle and the stream-ordered memory pool. Throws EnvironmentError with one clear line when
/// the build has no CUDA, there is no driver or device, or the ordinal is out of range.
std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& options = {});

/// The NCCL process groups of this rank, built over the MPI groups of the same layout (pass
/// make_mpi_groups(layout)): the ncclUniqueId is broadcast over the MPI world, every group
/// becomes an ncclCommSplit of the NCCL world communicator with the same members and order.
/// Device buffers travel through NCCL on the groups' own streams (all-reduce, all-gather,
/// broadcast; pipeline send/recv as grouped ncclSend/ncclRecv on one NCCL channel per ordered pair
/// of neighbouring pipeline ranks, so that transfers in the two directions never queue behind
/// each other); host buffers (the executor's scalars, bytes and barriers) keep using MPI.
/// Every blocking call gives up with CommunicationError after `timeout_s` without progress
/// (aborting the NCCL communicator so that its kernels end). Collective over the MPI world.
/// `device` must be the cuda device of this rank.
ProcessGroups make_nccl_groups(Device& device, ProcessGroups mpi_groups, double timeout_s);

/// Names what the allocations made while it lives are for, in out-of-memory messages
/// ("stage 3 activations"). Scoped and per thread; nests (the innermost label wins).
class MemoryLabel {
 public:
  explicit MemoryLabel(std::string what);
  ~MemoryLabel();
  MemoryLabel(const MemoryLabel&) = delete;
  MemoryLabel& operator=(const MemoryLabel&) = delete;
  /// The innermost label of this thread, "" when none.
  static const std::string& current();

 private:
  std::string previous_;
};

/// Timestamps taken in device order, for timing actions without synchronising after each one.
/// Proposed for exec/runtime/device.hpp (the interpreter would mark() after each action and resolve()
/// once per iteration); lives here until it moves there.
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  /// Starts a new series: waits for the device, then ties the device clock to `host_now_s`
  /// (exec::now_s() at that moment). Forgets earlier marks.
  virtual void begin(double host_now_s) = 0;
  /// A timestamp after all work queued on the device so far; returns its index. Does not wait.
  virtual int mark() = 0;
  /// Host-clock seconds of every mark since begin(), in order; waits for the last one.
  virtual std::vector<double> resolve() = 0;
};

/// CUDA events on the compute stream for a cuda device; for any other device, synchronize() and
/// the host clock at mark().
std::unique_ptr<DeviceTimer> make_device_timer(Device& device);

/// True when any element of the buffers (device memory of `device`) is ±inf or NaN: the
/// overflow check of dynamic loss scaling. One device round trip for all buffers.
bool any_inf_or_nan(Device& device, const std::vector<std::pair<const float*, size_t>>& buffers);

}  // namespace ptdp::exec::cuda
