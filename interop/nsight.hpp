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
// The same records from the JSON export (`nsys export --type json`): one JSON object per line
// (protobuf's JSON form of nsys' event stream: 64-bit integers written as strings), read as
//   - {"Type":…, "CudaEvent": {"startNs", "endNs", "deviceId", "correlationId",
//     "kernel": {"demangledName" | "shortName" | "mangledName"}}}: a kernel (names as string ids
//     or text); CudaEvents without "kernel" (memcpy, memset, sync) are skipped;
//   - {"GlobalTid", "TraceProcessEvent": {"startNs", "correlationId"}}: a runtime API call;
//   - {"NvtxEvent": {"Timestamp", "EndTimestamp", "Text" | "TextId", "GlobalTid"}}: a range;
//   - the string table: {"data": ["…", …]} (id = position) or {"id", "value"} lines;
//   - thread names: lines with "globalTid" and "nameId" (or "name").
// Keys are matched in either case of their first letter (GlobalTid / globalTid). Other lines
// are skipped. Bounded: the file's size (read_input_file), 20 M lines, nesting per line.
#pragma once

#include <string>

#include "interop/kineto.hpp"

namespace ptdp {

/// True when `bytes` start as an SQLite database file does.
bool is_sqlite_file(const std::string& bytes);

/// Reads an Nsight Systems SQLite export at `path` (read-only, never modified); ConfigError
/// naming `path` when it is not one or holds no CUDA kernels ("profiled with --trace=cuda?").
KernelTrace read_nsight_sqlite(const std::string& path);

/// True when `bytes` start as an Nsight Systems JSON export does: a first line that is a JSON
/// object holding one of nsys' record keys ("Type", "CudaEvent", "TraceProcessEvent",
/// "NvtxEvent", "data"), not a Kineto trace.
bool is_nsight_json(const std::string& bytes);

/// Reads an Nsight Systems JSON export (`bytes`, read from `path`); ConfigError naming PATH:LINE
/// when a line is not JSON or a kernel's time is not an integer of nanoseconds, or naming `path`
/// when the export holds no CUDA kernels ("profiled with --trace=cuda?").
KernelTrace read_nsight_json(const std::string& bytes, const std::string& path);

/// An NVTX or annotation range of `thread` from `start_s` to `end_s`: an iteration when its text
/// is "ProfilerStep#N", "iteration", "step", "iteration …" or "train_step…"; a backward region of
/// the thread when the text holds "backward" (any case). Shared by both Nsight readers.
void add_annotation_range(RawKernelTrace& raw, double start_s, double end_s, const std::string& text, const std::string& thread);

/// A measured trace of any kind (`bytes` = the file's content): Kineto JSON, Nsight SQLite or JSON;
/// ConfigError saying what was expected when it is neither.
KernelTrace read_measured_trace(const std::string& bytes, const std::string& path);

/// True when `bytes` look like a trace read_measured_trace would try (Kineto, SQLite, nsys JSON).
bool looks_like_trace(const std::string& bytes);

}  // namespace ptdp
