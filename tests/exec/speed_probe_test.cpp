// The speed probe's moments: calibrate's kernel figures set to the speed of its first probe sample.
#include "exec/speed_probe.hpp"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "exec/runtime/cpu_time.hpp"

namespace {
using ptdp::exec::ProbedMoments;

TEST(ProbedMoments, EachGroupIsSetToTheFirstSamplesSpeedByTheProbeAroundIt) {
  // The probe reads 300 us before the first group, 450 after it (the host slowed by half), 300
  // after the second.
  std::vector<double> readings = {450e-6, 300e-6};
  ProbedMoments m{[&] {
                    const double r = readings.front();
                    readings.erase(readings.begin());
                    return r;
                  },
                  {300e-6}};
  // Timed around 375 us (the mean of 300 and 450): 1.25x slower than at the first sample.
  double time_s = 2.5e-3, rate = 80e9;
  m.close({&time_s}, {&rate});
  EXPECT_NEAR(time_s, 2.0e-3, 1e-12);
  EXPECT_NEAR(rate, 100e9, 1e-3);
  // Timed around 375 us again (450 and 300): the same correction; a figure in neither list is kept.
  double time2_s = 5e-3, kept = 7.0;
  m.close({&time2_s}, {});
  EXPECT_NEAR(time2_s, 4e-3, 1e-12);
  EXPECT_EQ(kept, 7.0);
  EXPECT_EQ(m.samples, (std::vector<double>{300e-6, 450e-6, 300e-6}));
}

TEST(ProbedMoments, AProbeThatReadsNothingLeavesTheFiguresAsTimed) {
  ProbedMoments m{[] { return 0.0; }, {0.0}};
  double time_s = 1e-3, rate = 5e9;
  m.close({&time_s}, {&rate});
  EXPECT_EQ(time_s, 1e-3);
  EXPECT_EQ(rate, 5e9);
}

}  // namespace

// The rank's share of a core and how often it lost it (train's rank_cpu_share and
// rank_preemptions_per_cpu_s): a thread pinned to one core beside a spinning thread on the same
// core is switched out involuntarily and gets about half of the core's time.
TEST(CpuTime, AThreadSharingItsCoreWithASpinnerIsSwitchedOutInvoluntarily) {
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  int first = 0;  // the first CPU this process may run on (a container's cpuset may lack CPU 0)
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &before)) ++first;
  ASSERT_LT(first, CPU_SETSIZE);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);  // this thread, and the spinner it starts
  std::atomic<bool> stop{false};
  std::thread spinner([&] {
    while (!stop.load(std::memory_order_relaxed)) {
    }
  });
  const long switches0 = ptdp::exec::thread_involuntary_switches();
  const double cpu0 = ptdp::exec::thread_cpu_s();
  const auto t0 = std::chrono::steady_clock::now();
  volatile double x = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(300)) x = x + 1;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = ptdp::exec::thread_cpu_s() - cpu0;
  const long switches = ptdp::exec::thread_involuntary_switches() - switches0;
  stop = true;
  spinner.join();
  sched_setaffinity(0, sizeof before, &before);
  EXPECT_GT(switches, 0) << "cpu " << cpu << " s of " << wall << " s";
  EXPECT_LT(cpu / wall, 0.8) << "a core shared with a spinner";
  EXPECT_GT(cpu / wall, 0.05);
}
