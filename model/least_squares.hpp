// Nonlinear least squares for every fit in ptdp (GEMM efficiency from measured GEMMs, topology
// parameters from measured runs): Levenberg–Marquardt from Eigen's unsupported
// LevenbergMarquardt module (MINPACK's lmdif: forward-difference Jacobian), with box bounds
// handled by a smooth change of variables so that the optimiser never leaves the valid range.
#pragma once

#include <cstddef>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace ptdp {

/// Valid range of one parameter; bounds are exclusive (x0 must lie strictly inside).
struct ParameterBounds {
  double lower = -std::numeric_limits<double>::infinity();
  double upper = std::numeric_limits<double>::infinity();
};

struct LeastSquaresResult {
  std::vector<double> x;
  double sum_of_squares = 0;  // Σ r_i(x)²
  int evaluations = 0;        // calls of the residual function
  std::string status;         // Eigen's termination reason, e.g. "relative reduction small"
};

/// Residuals r(x) into `out` (already sized to the residual count).
using ResidualFunction = std::function<void(const std::vector<double>& x, std::vector<double>& out)>;

/// Minimises Σ r_i(x)² from x0 within `bounds` (empty: unbounded; else one per parameter).
/// Needs at least as many residuals as parameters (asserted). `max_evaluations` caps the
/// residual-function calls (one per Jacobian column per iteration plus one per step).
LeastSquaresResult least_squares(const ResidualFunction& residuals, size_t residual_count, std::vector<double> x0,
                                 const std::vector<ParameterBounds>& bounds = {}, int max_evaluations = 2000);

}  // namespace ptdp
