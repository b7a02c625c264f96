#include "model/efficiency_fit.hpp"
#include "model/least_squares.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace ptdp {

TEST(EfficiencyFit, RecoversTheModelThatGeneratedTheSamples) {
  GpuSpec truth;
  truth.peak_flops = 100e9;
  truth.gemm_max_efficiency = 0.7;
  truth.gemm_half_dim = 40;
  truth.gemm_half_k = 24;
  truth.gemm_thin_exponent = 1.5;
  std::vector<GemmSample> samples;
  for (int64_t m : {16, 64, 256, 1024})
    for (int64_t n : {16, 128, 1024})
      for (int64_t k : {8, 32, 512}) samples.push_back({m, n, k, truth.peak_flops * gemm_efficiency(truth, m, n, k)});
  const GemmFit fit = fit_gemm_efficiency(samples, truth.peak_flops);
  EXPECT_LT(fit.rms_log_error, 0.02);
  GpuSpec fitted = truth;
  fitted.gemm_max_efficiency = fit.max_efficiency;
  fitted.gemm_half_dim = fit.half_dim;
  fitted.gemm_half_k = fit.half_k;
  fitted.gemm_thin_exponent = fit.thin_exponent;
  for (const auto& s : samples)
    EXPECT_NEAR(gemm_efficiency(fitted, s.m, s.n, s.k) * truth.peak_flops / s.flops_per_s, 1.0, 0.06)
        << s.m << "×" << s.n << "×" << s.k;
}

TEST(LeastSquares, FindsTheMinimumOfAQuadraticInsideItsBounds) {
  // r = (x0 − 3, √2 (x1 + 1)): minimum at (3, −1); with x0 ≤ 2 the bounded minimum is at x0 → 2.
  const ResidualFunction f = [](const std::vector<double>& v, std::vector<double>& r) {
    r[0] = v[0] - 3;
    r[1] = std::sqrt(2.0) * (v[1] + 1);
  };
  const LeastSquaresResult free = least_squares(f, 2, {0, 0});
  EXPECT_NEAR(free.x[0], 3, 1e-6);
  EXPECT_NEAR(free.x[1], -1, 1e-6);
  EXPECT_NEAR(free.sum_of_squares, 0, 1e-10);
  const LeastSquaresResult bounded = least_squares(f, 2, {1, 0}, {{0, 2}, {-5, 5}});
  EXPECT_NEAR(bounded.x[0], 2, 1e-3);
  EXPECT_LT(bounded.x[0], 2);
  EXPECT_NEAR(bounded.x[1], -1, 1e-4);
}

TEST(LeastSquares, FitsAnExponentialDecay) {
  // y = 2.5·exp(−0.7 t) sampled exactly: a classic nonlinear least-squares problem.
  std::vector<double> t, y;
  for (int i = 0; i < 12; ++i) {
    t.push_back(0.5 * i);
    y.push_back(2.5 * std::exp(-0.7 * t.back()));
  }
  const LeastSquaresResult fit = least_squares(
      [&](const std::vector<double>& v, std::vector<double>& r) {
        for (size_t i = 0; i < t.size(); ++i) r[i] = v[0] * std::exp(-v[1] * t[i]) - y[i];
      },
      t.size(), {1.0, 0.1}, {{0, 100}, {0, 10}});
  EXPECT_NEAR(fit.x[0], 2.5, 1e-5);
  EXPECT_NEAR(fit.x[1], 0.7, 1e-5);
  EXPECT_GT(fit.evaluations, 2);
}

}  // namespace ptdp
