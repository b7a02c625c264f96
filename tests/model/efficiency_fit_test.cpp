#include "model/efficiency_fit.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace ptdp {

TEST(EfficiencyFit, RecoversTheModelThatGeneratedTheSamples) {
  ComputeProfile truth;
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
  ComputeProfile fitted = truth;
  fitted.gemm_max_efficiency = fit.max_efficiency;
  fitted.gemm_half_dim = fit.half_dim;
  fitted.gemm_half_k = fit.half_k;
  fitted.gemm_thin_exponent = fit.thin_exponent;
  for (const auto& s : samples)
    EXPECT_NEAR(gemm_efficiency(fitted, s.m, s.n, s.k) * truth.peak_flops / s.flops_per_s, 1.0, 0.06)
        << s.m << "×" << s.n << "×" << s.k;
}

TEST(EfficiencyFit, NelderMeadFindsTheMinimumOfAQuadratic) {
  const auto x = nelder_mead([](const std::vector<double>& v) { return std::pow(v[0] - 3, 2) + 2 * std::pow(v[1] + 1, 2); },
                             {0, 0}, {1, 1}, 200);
  EXPECT_NEAR(x[0], 3, 1e-3);
  EXPECT_NEAR(x[1], -1, 1e-3);
}

}  // namespace ptdp
