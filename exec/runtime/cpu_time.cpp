#include "exec/runtime/cpu_time.hpp"

#include <algorithm>

#include <sys/resource.h>
#include <time.h>

namespace ptdp::exec {
namespace {
double g_comm_wait_cpu_s = 0;  // one interpreter thread per rank (MPI_THREAD_FUNNELED)
int g_comm_depth = 0;
}  // namespace

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

long thread_involuntary_switches() {
  rusage u{};
  if (getrusage(RUSAGE_THREAD, &u) != 0) return 0;
  return u.ru_nivcsw;
}

double comm_wait_cpu_s() { return g_comm_wait_cpu_s; }
void add_comm_wait_cpu_s(double s) { g_comm_wait_cpu_s += s; }

CommCpuScope::CommCpuScope() : outermost_(g_comm_depth++ == 0) {
  if (outermost_) cpu0_ = thread_cpu_s();
}
CommCpuScope::~CommCpuScope() {
  --g_comm_depth;
  if (outermost_) add_comm_wait_cpu_s(thread_cpu_s() - cpu0_);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t h = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(h), v.end());
  if (v.size() % 2) return v[h];
  return 0.5 * (v[h] + *std::max_element(v.begin(), v.begin() + static_cast<long>(h)));
}

}  // namespace ptdp::exec
