// Measured GPU traces of real training runs: a PyTorch profiler (Kineto) trace — the Chrome-trace
// JSON that `torch.profiler.profile(...).export_chrome_trace()` writes on each rank — read as the
// kernels of one rank, classified for `ptdp compare` and `ptdp plot timeline`:
//   - kernels whose name starts with "nccl" are communication, classed by the process group of
//     the collective that launched them (its "Process Group Description" / "Process Group Name",
//     e.g. Megatron's TENSOR_MODEL_PARALLEL_GROUP → tp), else by kind: SendRecv/Send/Recv → pp,
//     the others "nccl" (group unknown);
//   - every other kernel is compute: backward when the CPU operator that launched it (its
//     "correlation" to a cuda_runtime launch on a CPU thread) runs inside an autograd backward
//     function ("autograd::engine::evaluate_function: …", "…Backward…") or on an autograd thread
//     ("pt_autograd_…"), else forward.
// The iteration is the mean "ProfilerStep#N" annotation when the trace has them, else the span
// from the first kernel's start to the last one's end.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ptdp {

struct KernelEvent {
  double start_s = 0, dur_s = 0;  // from the trace's first kernel
  std::string klass;              // "F", "B" (compute) or a communication class ("tp", "pp", "dp", "cp", "ep", "nccl")
  std::string name;
};

struct KernelTrace {
  int rank = 0;        // distributedInfo.rank (0 when the trace has none)
  int world_size = 1;  // distributedInfo.world_size
  double span_s = 0;   // first kernel start → last kernel end
  double step_s = 0;   // mean ProfilerStep#N duration (0 when none)
  int steps = 0;
  double busy_s = 0;                     // union of the compute kernels' intervals
  double forward_s = 0, backward_s = 0;  // unions of the forward / backward compute kernels
  std::map<std::string, double> comm_s;  // NCCL kernel time (union) by class
  int64_t kernels = 0, nccl_kernels = 0;
  std::vector<KernelEvent> events;
  /// The iteration: the mean profiler step when annotated, else the kernel span.
  double iteration_s() const { return steps > 0 ? step_s : span_s; }
};

/// What a trace reader collects before classifying (shared by the Kineto and Nsight readers):
/// the kernels with the CPU thread and time of their launch, the CPU threads' names, the
/// intervals of backward operators per thread, the profiler steps.
struct RawKernelTrace {
  struct Kernel {
    double ts = 0, dur = 0;  // seconds
    std::string name;
    std::string launch_thread;  // "" when the launch is not in the trace
    double launch_ts = -1;
    std::string group_class;  // the NCCL collective's communication class when known ("tp", …), else ""
  };
  std::vector<Kernel> kernels;
  std::map<std::string, std::string> thread_name;
  std::map<std::string, std::vector<std::pair<double, double>>> backward_ranges;  // per thread
  std::vector<double> steps;  // durations of the profiler steps / iteration ranges
  int rank = 0, world_size = 1;
};

/// Classifies the kernels (NCCL by group, else by kind; compute by a backward range around its
/// launch or an autograd thread) and sums them: the KernelTrace of `raw` (kernels non-empty).
KernelTrace summarize_kernels(RawKernelTrace raw);

/// The communication class of a process group's description or name (Megatron's
/// TENSOR_MODEL_PARALLEL_GROUP → tp, …), "" when unknown.
std::string class_of_group(const std::string& text);

/// True when `text` parses as a Kineto trace (a JSON object with "traceEvents" holding GPU
/// kernel events, or the profiler's "schemaVersion"/"deviceProperties" keys).
bool is_kineto_trace(const std::string& text);

/// Reads a Kineto trace; ConfigError naming `source` (and the event) when it is not one, or
/// holds no GPU kernel events ("was the profiler run with ProfilerActivity.CUDA?").
KernelTrace read_kineto_trace(const std::string& text, const std::string& source);

/// The trace as ptdp's Chrome trace for `ptdp plot timeline` (one row: `pipeline_rank`), with
/// `"ptdp_iteration": {"seconds", "from"}`: the iteration as `ptdp compare` reports it.
std::string kernel_trace_json(const KernelTrace& k, int pipeline_rank);

}  // namespace ptdp
