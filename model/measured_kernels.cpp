#include "model/measured_kernels.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "model/cost.hpp"

namespace ptdp {

double measured_gemm_efficiency(const GpuSpec& gpu, int64_t m, int64_t n, int64_t k, double curve) {
  if (gpu.gemm_rates.empty() || !(gpu.peak_flops > 0) || m <= 0 || n <= 0 || k <= 0) return curve;
  auto ln = [](int64_t x) { return std::log(static_cast<double>(std::max<int64_t>(x, 1))); };
  const double lm = ln(m), lnn = ln(n), lk = ln(k);
  // The four nearest measured shapes: (squared log distance, log of measured ÷ curve).
  constexpr size_t kNearest = 4;
  std::array<std::pair<double, double>, kNearest> near;
  near.fill({std::numeric_limits<double>::infinity(), 0.0});
  for (const auto& g : gpu.gemm_rates) {
    if (g.m <= 0 || g.n <= 0 || g.k <= 0 || !(g.flops_per_s > 0)) continue;
    const double dm = lm - ln(g.m), dn = lnn - ln(g.n), dk = lk - ln(g.k);
    const double d2 = dm * dm + dn * dn + dk * dk;
    const double measured = g.flops_per_s / gpu.peak_flops;
    if (d2 < 1e-18) return measured;
    if (d2 >= near.back().first) continue;
    const double at_sample = std::max(gemm_curve_efficiency(gpu, g.m, g.n, g.k), 1e-12);
    near.back() = {d2, std::log(measured / at_sample)};
    std::sort(near.begin(), near.end());
  }
  double wsum = 0, lsum = 0;
  for (const auto& [d2, lr] : near)
    if (std::isfinite(d2)) {
      wsum += 1 / d2;
      lsum += lr / d2;
    }
  if (!(wsum > 0)) return curve;
  // Fades with the nearest sample's distance: half the correction at a factor 2 in one side,
  // 1/16 at a factor 4.
  const double ln2 = std::log(2.0);
  const double fade = std::exp(-ln2 * near.front().first / (ln2 * ln2));
  return curve * std::exp(lsum / wsum * fade);
}

double host_kernel_time_s(const GpuSpec& gpu, HostKernel kernel) {
  switch (kernel) {
    case HostKernel::Swiglu: return gpu.swiglu_s;
    case HostKernel::SwigluBackward: return gpu.swiglu_backward_s;
    case HostKernel::Rotary: return gpu.rotary_s;
    case HostKernel::None: break;
  }
  return 0;
}

double elementwise_bandwidth(const GpuSpec& gpu, double bytes) {
  const auto& pts = gpu.elementwise_bandwidth;
  if (pts.empty()) return gpu.hbm_Bps * gpu.elementwise_efficiency;
  if (bytes <= pts.front().first) return pts.front().second;
  if (bytes >= pts.back().first) return pts.back().second;
  for (size_t i = 1; i < pts.size(); ++i)
    if (bytes <= pts[i].first) {
      const auto [x0, y0] = pts[i - 1];
      const auto [x1, y1] = pts[i];
      const double t = std::log(bytes / x0) / std::log(x1 / x0);
      return std::exp(std::log(y0) + t * (std::log(y1) - std::log(y0)));
    }
  return pts.back().second;
}

}  // namespace ptdp
