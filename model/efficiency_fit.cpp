#include "model/efficiency_fit.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace ptdp {

std::vector<double> nelder_mead(const std::function<double(const std::vector<double>&)>& f, std::vector<double> x0,
                                const std::vector<double>& steps, int iterations) {
  const size_t n = x0.size();
  std::vector<std::vector<double>> pts(n + 1, x0);
  for (size_t i = 0; i < n; ++i) pts[i + 1][i] += steps[i];
  std::vector<double> vals(n + 1);
  for (size_t i = 0; i <= n; ++i) vals[i] = f(pts[i]);
  std::vector<size_t> order(n + 1);
  for (int it = 0; it < iterations; ++it) {
    for (size_t i = 0; i <= n; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return vals[a] < vals[b]; });
    const size_t best = order[0], worst = order[n], second = order[n - 1];
    std::vector<double> c(n, 0.0);
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j <= n; ++j)
        if (j != worst) c[i] += pts[j][i] / static_cast<double>(n);
    auto along = [&](double t) {
      std::vector<double> x(n);
      for (size_t i = 0; i < n; ++i) x[i] = c[i] + t * (pts[worst][i] - c[i]);
      return x;
    };
    const auto xr = along(-1.0);
    const double fr = f(xr);
    if (fr < vals[best]) {
      const auto xe = along(-2.0);
      const double fe = f(xe);
      if (fe < fr) {
        pts[worst] = xe;
        vals[worst] = fe;
      } else {
        pts[worst] = xr;
        vals[worst] = fr;
      }
    } else if (fr < vals[second]) {
      pts[worst] = xr;
      vals[worst] = fr;
    } else {
      const auto xc = along(0.5);
      const double fc = f(xc);
      if (fc < vals[worst]) {
        pts[worst] = xc;
        vals[worst] = fc;
      } else {
        for (size_t j = 0; j <= n; ++j) {
          if (j == best) continue;
          for (size_t i = 0; i < n; ++i) pts[j][i] = pts[best][i] + 0.5 * (pts[j][i] - pts[best][i]);
          vals[j] = f(pts[j]);
        }
      }
    }
  }
  const size_t best = static_cast<size_t>(std::min_element(vals.begin(), vals.end()) - vals.begin());
  return pts[best];
}

GemmFit fit_gemm_efficiency(const std::vector<GemmSample>& samples, double peak_flops) {
  PTDP_ASSERT(!samples.empty() && peak_flops > 0, "GEMM samples and a positive peak are needed");
  auto predicted = [&](const std::vector<double>& x, const GemmSample& s) {
    ComputeProfile p;
    p.peak_flops = peak_flops;
    p.gemm_max_efficiency = x[0];
    p.gemm_half_dim = x[1];
    p.gemm_half_k = x[2];
    p.gemm_thin_exponent = x[3];
    return peak_flops * gemm_efficiency(p, s.m, s.n, s.k);
  };
  auto loss = [&](const std::vector<double>& x) {
    if (!(x[0] > 0.01 && x[0] <= 1.0 && x[1] >= 0 && x[2] >= 0 && x[3] >= 0.2 && x[3] <= 8)) return 1e30;
    double sum = 0;
    for (const auto& s : samples) {
      const double e = std::log(predicted(x, s) / s.flops_per_s);
      sum += e * e;
    }
    return sum;
  };
  const auto x = nelder_mead(loss, {0.9, 64.0, 16.0, 1.0}, {0.05, 32.0, 8.0, 0.3}, 600);
  GemmFit fit{x[0], x[1], x[2], x[3], std::sqrt(loss(x) / static_cast<double>(samples.size()))};
  return fit;
}

}  // namespace ptdp
