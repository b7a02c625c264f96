// The speed probe's moments: calibrate's kernel figures set to the speed of its first probe sample.
#include "exec/speed_probe.hpp"

#include <gtest/gtest.h>

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
