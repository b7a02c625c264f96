#include "model/efficiency_fit.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "model/least_squares.hpp"

namespace ptdp {

GemmFit fit_gemm_efficiency(const std::vector<GemmSample>& samples, double peak_flops) {
  PTDP_ASSERT(!samples.empty() && peak_flops > 0, "GEMM samples and a positive peak are needed");
  auto predicted = [&](const std::vector<double>& x, const GemmSample& s) {
    GpuSpec p;
    p.peak_flops = peak_flops;
    p.gemm_max_efficiency = x[0];
    p.gemm_half_dim = x[1];
    p.gemm_half_k = x[2];
    p.gemm_thin_exponent = x[3];
    return peak_flops * gemm_efficiency(p, s.m, s.n, s.k);
  };
  auto residuals = [&](const std::vector<double>& x, std::vector<double>& r) {
    for (size_t i = 0; i < samples.size(); ++i) r[i] = std::log(predicted(x, samples[i]) / samples[i].flops_per_s);
  };
  // Fewer samples than parameters: pad with zero residuals (the fit is then underdetermined
  // but still lands on a model through the samples).
  const size_t count = std::max<size_t>(samples.size(), 4);
  const LeastSquaresResult lsq = least_squares(residuals, count, {0.9, 64.0, 16.0, 1.0},
                                               {{0.01, 1.0}, {0.0, 1e6}, {0.0, 1e6}, {0.2, 8.0}});
  const auto& x = lsq.x;
  GemmFit fit{x[0], x[1], x[2], x[3], std::sqrt(lsq.sum_of_squares / static_cast<double>(samples.size()))};
  return fit;
}

}  // namespace ptdp
