// Checking macros for every CUDA runtime, cuBLAS and NCCL call of exec/cuda (internal header).
// A failure throws with the call's text, file:line and the library's own error string:
//   CUDA, cuBLAS → EnvironmentError;
//   NCCL → CommunicationError (peers may be blocked in the same collective: the caller must
//          abort the job, see exec/runtime/mpi_communicator.hpp).
// Unchecked calls are those whose failure is an answer (device count without a driver, pointer
// attributes of host memory, event queries that are not ready yet, version and status queries),
// and the ones in destructors.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>
#include <string>

namespace ptdp::exec::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t rc, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl_error(int result, const char* call, const char* file, int line);
void check_launch(const char* kernel_name, const char* file, int line);

/// "NVIDIA A100-SXM4-80GB (GPU 3)" for messages; "GPU 3" when the name is unavailable.
std::string describe_gpu(int ordinal);

/// This process's rank from the launcher's environment (Open MPI, MPICH/PMI, PMIx, Slurm).
std::optional<int> world_rank_from_environment();
/// Its node-local rank (Open MPI, MPICH, MVAPICH, Slurm, torchrun's LOCAL_RANK).
std::optional<int> local_rank_from_environment();

}  // namespace ptdp::exec::cuda

#define PTDP_CUDA_CHECK(call)                                                                    \
  do {                                                                                           \
    const cudaError_t ptdp_cuda_rc_ = (call);                                                    \
    if (ptdp_cuda_rc_ != cudaSuccess) ::ptdp::exec::cuda::throw_cuda_error(ptdp_cuda_rc_, #call, __FILE__, __LINE__); \
  } while (0)

/// After a kernel launch: the launch error (bad configuration, no kernel image for this GPU),
/// reported as the call "<<<kernel_name>>>".
#define PTDP_CUDA_CHECK_LAUNCH(kernel_name) ::ptdp::exec::cuda::check_launch(kernel_name, __FILE__, __LINE__)

// CUBLAS_STATUS_SUCCESS and ncclSuccess are 0.
#define PTDP_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                           \
    const int ptdp_cublas_rc_ = static_cast<int>(call);                                          \
    if (ptdp_cublas_rc_ != 0) ::ptdp::exec::cuda::throw_cublas_error(ptdp_cublas_rc_, #call, __FILE__, __LINE__); \
  } while (0)

/// ncclInProgress (7) is not an error: non-blocking communicators return it while the call
/// completes in the background (the caller polls ncclCommGetAsyncError).
#define PTDP_NCCL_CHECK(call)                                                                    \
  do {                                                                                           \
    const int ptdp_nccl_rc_ = static_cast<int>(call);                                            \
    if (ptdp_nccl_rc_ != 0 && ptdp_nccl_rc_ != 7)                                               \
      ::ptdp::exec::cuda::throw_nccl_error(ptdp_nccl_rc_, #call, __FILE__, __LINE__);            \
  } while (0)
