// CPU time of the calling thread (a rank's interpreter thread), and the part of it spent waiting
// for communication: what a rank computed, whatever else runs on the machine. Wall time under load is not a property of the
// plan (other processes take the cores); the CPU seconds a kernel needs are. `validate` compares
// the cost model's computation with these (cli/validate_command.cpp).
#pragma once

#include <vector>

namespace ptdp::exec {

/// The median of timings (the mean of the two middle ones for an even count; 0 for none): a spell
/// of another process's load slows a round, not the figure.
double median(std::vector<double> v);

/// CPU seconds the calling thread has used so far (CLOCK_THREAD_CPUTIME_ID). A rank computes on
/// one thread (Eigen without OpenMP, MPI_THREAD_FUNNELED); the MPI library's own helper threads
/// (PMIx, the event loop) are neither the rank's computation nor its communication calls.
double thread_cpu_s();
/// Involuntary context switches of the calling thread so far (getrusage RUSAGE_THREAD): each
/// is the scheduler taking the core away for another runnable process, after which the thread's
/// working set is refilled into the core's caches.
long thread_involuntary_switches();
/// CPU seconds this thread has spent so far inside communication waits (the MPI
/// communicator's polling of its requests), cumulative.
double comm_wait_cpu_s();
/// Adds to comm_wait_cpu_s (the communicator, at the end of each wait).
void add_comm_wait_cpu_s(double s);
/// CPU seconds of computation so far: thread_cpu_s() − comm_wait_cpu_s().
inline double compute_cpu_s() { return thread_cpu_s() - comm_wait_cpu_s(); }

/// The CPU seconds of its lifetime count as communication (add_comm_wait_cpu_s): the
/// communicator opens one around every call into MPI — posting an operation, testing it, waiting
/// for it — so the transport's own copies and progress never count as a compute action's time.
/// Nested scopes count once.
class CommCpuScope {
 public:
  CommCpuScope();
  ~CommCpuScope();
  CommCpuScope(const CommCpuScope&) = delete;
  CommCpuScope& operator=(const CommCpuScope&) = delete;

 private:
  double cpu0_ = 0;
  bool outermost_ = false;
};

}  // namespace ptdp::exec
