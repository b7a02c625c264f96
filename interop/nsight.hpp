// Measured GPU traces from Nsight Systems: the SQLite file `nsys export --type sqlite` (or
// `nsys stats`) writes from a .nsys-rep, read as the kernels of one GPU for `ptdp compare` and
// `ptdp plot timeline`, classified as for a Kineto trace (interop/kineto.hpp):
//   - CUPTI_ACTIVITY_KIND_KERNEL: the kernels (names through StringIds), of the GPU with the most
//     kernels when the export holds several (deviceId becomes the trace's rank);
//   - CUPTI_ACTIVITY_KIND_RUNTIME: each kernel's launch (thread and time, by correlationId);
//   - NVTX_EVENTS: ranges whose text holds "Backward"/"backward" mark backward launches on their
//     thread (PyTorch's emit_nvtx, Megatron's ranges); "ProfilerStep#N", "iteration" or "step"
//     ranges give the iteration; NCCL kernels are classed by kind (SendRecv → pp);
//   - ThreadNames: PyTorch's autograd threads ("pt_autograd_…") launch backward kernels.
#pragma once

#include <string>

#include "interop/kineto.hpp"

namespace ptdp {

/// True when `bytes` start as an SQLite database file does.
bool is_sqlite_file(const std::string& bytes);

/// Reads an Nsight Systems SQLite export at `path` (read-only, never modified); ConfigError
/// naming `path` when it is not one or holds no CUDA kernels ("profiled with --trace=cuda?").
KernelTrace read_nsight_sqlite(const std::string& path);

/// A measured trace of either kind (`bytes` = the file's content): Kineto JSON or Nsight SQLite;
/// ConfigError saying what was expected when it is neither.
KernelTrace read_measured_trace(const std::string& bytes, const std::string& path);

/// True when `bytes` look like a trace read_measured_trace would try (Kineto or SQLite).
bool looks_like_trace(const std::string& bytes);

}  // namespace ptdp
