// Fitting the GEMM-efficiency model of model/cost.hpp to measured GEMM timings (used by
// `ptdp calibrate` for every back end).
#pragma once

#include <cstdint>
#include <vector>

#include "model/cost.hpp"

namespace ptdp {

struct GemmSample {
  int64_t m = 0, n = 0, k = 0;
  double flops_per_s = 0;  // measured
};

struct GemmFit {
  double max_efficiency = 0, half_dim = 0, half_k = 0, thin_exponent = 1;
  double rms_log_error = 0;  // root-mean-square of log(predicted / measured)
};

/// Least-squares fit (in log space, Levenberg–Marquardt of model/least_squares.hpp) of gemm_max_efficiency, gemm_half_dim,
/// gemm_half_k and gemm_thin_exponent so that peak · eff(m, n, k) matches the samples.
GemmFit fit_gemm_efficiency(const std::vector<GemmSample>& samples, double peak_flops);

}  // namespace ptdp
