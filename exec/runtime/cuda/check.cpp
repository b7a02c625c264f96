#include "exec/runtime/cuda/check.hpp"

#include <cublas_api.h>
#include <nccl.h>

#include <cstdlib>
#include <initializer_list>

#include "core/error.hpp"
#include "exec/runtime/communicator.hpp"

namespace ptdp::exec::cuda {
namespace {

std::string where(const char* call, const char* file, int line) {
  return std::string(call) + " failed at " + file + ":" + std::to_string(line);
}

}  // namespace

void throw_cuda_error(cudaError_t rc, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so that the next call does not report it again
  throw EnvironmentError("CUDA call " + where(call, file, line) + ": " + cudaGetErrorName(rc) + ": " +
                         cudaGetErrorString(rc));
}

void throw_cublas_error(int status, const char* call, const char* file, int line) {
  const auto s = static_cast<cublasStatus_t>(status);
  throw EnvironmentError("cuBLAS call " + where(call, file, line) + ": " + cublasGetStatusName(s) + ": " +
                         cublasGetStatusString(s));
}

void throw_nccl_error(int result, const char* call, const char* file, int line) {
  const auto r = static_cast<ncclResult_t>(result);
  std::string msg = "NCCL call " + where(call, file, line) + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') msg += " (" + std::string(last) + ")";
  throw CommunicationError(msg);
}

void check_launch(const char* kernel_name, const char* file, int line) {
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) throw_cuda_error(rc, ("<<<" + std::string(kernel_name) + ">>>").c_str(), file, line);
}

namespace {

std::optional<int> first_integer(std::initializer_list<const char*> vars) {
  for (const char* var : vars)
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::atoi(v);
  return std::nullopt;
}

}  // namespace

std::optional<int> world_rank_from_environment() {
  return first_integer({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"});
}

std::optional<int> local_rank_from_environment() {
  return first_integer(
      {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"});
}

std::string describe_gpu(int ordinal) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) {
    cudaGetLastError();
    return "GPU " + std::to_string(ordinal);
  }
  return std::string(prop.name) + " (GPU " + std::to_string(ordinal) + ")";
}

}  // namespace ptdp::exec::cuda
