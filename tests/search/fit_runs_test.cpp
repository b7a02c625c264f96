// Fitting topology parameters to measured runs: the fit recovers the parameters that produced
// the measurements, and leave-one-out predicts each run from the others.
#include "search/fit_runs.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.hpp"
#include "scenarios/scenario.hpp"
#include "tests/sim/sim_input.hpp"

namespace ptdp {
namespace {

const std::string kRoot = PTDP_SOURCE_DIR;

// Figure 7's single-GPU runs at micro batch 1–16, "measured" on a GPU with known parameters.
std::vector<RunToFit> synthetic_runs(const GpuSpec& truth) {
  std::vector<RunToFit> runs;
  for (int b : {1, 2, 4, 8, 16}) {
    const Scenario sc = load_scenario(kRoot + "/scenarios/paper/gpt-1b-single-gpu.yaml",
                                      {{"training.micro_batch", std::to_string(b)}, {"training.global_batch", std::to_string(b)}});
    RunToFit run{"b=" + std::to_string(b), input_of(sc), RunMetric::TflopsPerGpu, 0, {}};
    ClusterSpec real = sc.cluster;
    real.gpu = truth;
    run.measured = predict_run(run, real);
    runs.push_back(run);
  }
  return runs;
}

TEST(FitRuns, RecoversTheParametersThatProducedTheMeasurements) {
  GpuSpec truth = load_topology("dgx-a100").gpu;
  truth.gemm_max_efficiency = 0.7;
  truth.elementwise_efficiency = 0.5;
  truth.iteration_overhead_s = 0.08;
  const auto runs = synthetic_runs(truth);  // the runs' own topology starts from the preset's values
  const RunFitResult fit = fit_runs(runs, {"gemm_max_efficiency", "elementwise_efficiency", "iteration_overhead"}, true);
  EXPECT_NEAR(fit.values[0], 0.7, 0.01);
  EXPECT_NEAR(fit.values[1], 0.5, 0.02);
  EXPECT_NEAR(fit.values[2], 0.08, 0.005);
  EXPECT_LT(fit.rms_error, 1e-3);
  ASSERT_EQ(fit.loo_error.size(), runs.size());
  for (double e : fit.loo_error) EXPECT_LT(std::fabs(e), 0.01);
  EXPECT_DOUBLE_EQ(fit.topology.gpu.gemm_max_efficiency, fit.values[0]);
}

TEST(FitRuns, TwoRunsFitTheParameterTheyDependOnMostAndSayWhichWereLeft) {
  // Two runs fit one parameter, leaving one degree of freedom to measure their scatter.
  const auto runs = synthetic_runs(load_topology("dgx-a100").gpu);
  const std::vector<RunToFit> two(runs.begin(), runs.begin() + 2);
  const RunFitResult fit = fit_runs(two, default_fit_parameters(), false);
  EXPECT_EQ(fit.parameters.size(), 1u);
  EXPECT_EQ(fit.parameters.size() + fit.dropped.size(), default_fit_parameters().size());
  EXPECT_FALSE(fit.exactly_determined);
  // One run fits one parameter, exactly.
  const RunFitResult one = fit_runs({runs.front()}, default_fit_parameters(), false);
  EXPECT_EQ(one.parameters.size(), 1u);
  EXPECT_TRUE(one.exactly_determined);
  EXPECT_GE(fit.warnings.size(), fit.dropped.size());  // each dropped one said (and any bound reached)
  EXPECT_THROW(fit_runs(runs, {"gemm_max_eficiency"}, false), ConfigError);
}

TEST(FitRuns, AParameterTheRunsDoNotDependOnIsUndeterminedAndLeftOut) {
  // Single-GPU runs move no byte over NVLink: its bandwidth is undetermined.
  const auto runs = synthetic_runs(load_topology("dgx-a100").gpu);
  const RunFitResult fit = fit_runs(runs, {"gemm_max_efficiency", "nvlink_bandwidth"}, false);
  ASSERT_EQ(fit.dropped.size(), 1u);
  EXPECT_EQ(fit.dropped[0], "nvlink_bandwidth");
  EXPECT_NE(fit.warnings[0].find("undetermined"), std::string::npos) << fit.warnings[0];
  EXPECT_EQ(fit.parameters, std::vector<std::string>{"gemm_max_efficiency"});
  EXPECT_THROW(fit_runs(runs, {"nvlink_bandwidth"}, false), ConfigError);  // nothing left to fit
}

TEST(FitRuns, AValueDrivenToItsBoundIsSaid) {
  // Runs 3× faster than the GPU's peak allows: the GEMM ceiling runs into 1.
  auto runs = synthetic_runs(load_topology("dgx-a100").gpu);
  for (auto& run : runs) run.measured *= 3;
  const RunFitResult fit = fit_runs(runs, {"gemm_max_efficiency"}, false);
  ASSERT_FALSE(fit.warnings.empty());
  EXPECT_NE(fit.warnings.back().find("reached its bound"), std::string::npos) << fit.warnings.back();
}

TEST(FitRuns, RunsThatDisagreeMoveTheParametersOnlyAsFarAsTheyAgree) {
  // Two runs of the preset's own GPU, one of them 15 % faster than it should be (a figure read
  // off a plot, a lucky run): the unregularised fit would follow the pair's mean and carry that
  // to every other run; their scatter weighs the preset's pull, so the fit stays closer to it.
  auto runs = synthetic_runs(load_topology("dgx-a100").gpu);
  std::vector<RunToFit> two(runs.begin(), runs.begin() + 2);
  two[0].measured *= 1.15;  // TFLOP/s: faster
  const RunFitResult fit = fit_runs(two, {"gemm_max_efficiency"}, false);
  const double preset = load_topology("dgx-a100").gpu.gemm_max_efficiency;
  ASSERT_EQ(fit.values.size(), 1u);
  const double mean_shift = 0.5 * (std::log(1.15) + 0);  // what the pair's mean asks for (TFLOP/s ∝ efficiency, roughly)
  EXPECT_GT(fit.values[0], preset);                          // it moves the way the runs agree on …
  EXPECT_LT(std::log(fit.values[0] / preset), 0.75 * mean_shift);  // … but less than their mean asks
  for (size_t i = 2; i < runs.size(); ++i)
    EXPECT_NEAR(predict_run(runs[i], fit.topology) / runs[i].measured, 1.0, 0.06) << runs[i].label;
}

TEST(FitRuns, FittedOnTwoRunsOfAFamilyItPredictsTheOthers) {
  // The user's way: the two smallest runs measured, the rest predicted by the fitted profile.
  GpuSpec truth = load_topology("dgx-a100").gpu;
  truth.gemm_max_efficiency = 0.62;
  const auto runs = synthetic_runs(truth);
  const std::vector<RunToFit> first_two(runs.begin(), runs.begin() + 2);
  const RunFitResult fit = fit_runs(first_two, {"gemm_max_efficiency", "elementwise_efficiency"}, false);
  for (size_t i = 2; i < runs.size(); ++i)
    EXPECT_NEAR(predict_run(runs[i], fit.topology) / runs[i].measured, 1.0, 0.01) << runs[i].label;
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

TEST(FitRuns, AValueNearButNotHeldByItsBoundIsNotSaid) {
  // The GEMM inner-dimension knee (35.3 of a [0, 10⁵] range) lies within 0.1 % of the range of
  // its lower bound; runs made with it fit a value there (anything below ≈ 50 predicts them
  // alike), an optimum the bound does not hold: no warning (there was one, at 0.1 % of the range).
  GpuSpec truth = load_topology("dgx-a100").gpu;
  const auto runs = synthetic_runs(truth);
  const RunFitResult fit = fit_runs(runs, {"gemm_half_k"}, false);
  ASSERT_EQ(fit.parameters, std::vector<std::string>{"gemm_half_k"});
  EXPECT_LT(fit.values[0], 100.0);
  EXPECT_LT(fit.rms_error, 1e-3);
  for (const auto& w : fit.warnings) EXPECT_EQ(w.find("reached its bound"), std::string::npos) << w;
  // Runs faster than any GEMM ceiling in the range allows hold it at its bound: said.
  auto fast = runs;
  for (auto& run : fast) run.measured *= 3;  // TFLOP/s 3× the peak allows
  const RunFitResult held = fit_runs(fast, {"gemm_max_efficiency"}, false);
  ASSERT_FALSE(held.warnings.empty());
  EXPECT_NE(held.warnings.back().find("reached its bound"), std::string::npos);
}

}  // namespace
}  // namespace ptdp
