#include "model/least_squares.hpp"

#include <Eigen/Core>
#include <unsupported/Eigen/LevenbergMarquardt>

#include <cmath>

#include "core/error.hpp"

namespace ptdp {
namespace {

// x = lower + (upper − lower)·σ(u) with both bounds, lower + e^u with one, u with none.
double to_bounded(double u, const ParameterBounds& b) {
  const bool lo = std::isfinite(b.lower), hi = std::isfinite(b.upper);
  if (lo && hi) return b.lower + (b.upper - b.lower) / (1 + std::exp(-u));
  if (lo) return b.lower + std::exp(u);
  if (hi) return b.upper - std::exp(u);
  return u;
}
double to_free(double x, const ParameterBounds& b) {
  const bool lo = std::isfinite(b.lower), hi = std::isfinite(b.upper);
  if (lo && hi) {
    const double f = (x - b.lower) / (b.upper - b.lower);
    return std::log(f / (1 - f));
  }
  if (lo) return std::log(x - b.lower);
  if (hi) return std::log(b.upper - x);
  return x;
}

// The functor shape Eigen's NumericalDiff and LevenbergMarquardt expect.
struct Problem {
  using Scalar = double;
  using InputType = Eigen::VectorXd;
  using ValueType = Eigen::VectorXd;
  using JacobianType = Eigen::MatrixXd;
  using QRSolver = Eigen::ColPivHouseholderQR<JacobianType>;
  enum { InputsAtCompileTime = Eigen::Dynamic, ValuesAtCompileTime = Eigen::Dynamic };

  const ResidualFunction* f = nullptr;
  const std::vector<ParameterBounds>* bounds = nullptr;
  Eigen::Index n = 0, m = 0;
  mutable std::vector<double> x, r;
  int* calls = nullptr;  // shared: NumericalDiff holds a copy of the problem

  Eigen::Index inputs() const { return n; }
  Eigen::Index values() const { return m; }
  std::vector<double>& bounded(const Eigen::VectorXd& u) const {
    x.resize(static_cast<size_t>(n));
    for (Eigen::Index i = 0; i < n; ++i)
      x[i] = bounds->empty() ? u[i] : to_bounded(u[i], (*bounds)[static_cast<size_t>(i)]);
    return x;
  }
  int operator()(const Eigen::VectorXd& u, Eigen::VectorXd& out) const {
    ++*calls;
    r.assign(static_cast<size_t>(m), 0.0);
    (*f)(bounded(u), r);
    for (Eigen::Index i = 0; i < m; ++i) out[i] = std::isfinite(r[i]) ? r[i] : 1e10;
    return 0;
  }
};

std::string status_text(Eigen::LevenbergMarquardtSpace::Status s) {
  using namespace Eigen::LevenbergMarquardtSpace;
  switch (s) {
    case RelativeReductionTooSmall: return "relative reduction small";
    case RelativeErrorTooSmall: return "relative step small";
    case RelativeErrorAndReductionTooSmall: return "relative step and reduction small";
    case CosinusTooSmall: return "gradient orthogonal to residuals";
    case TooManyFunctionEvaluation: return "evaluation limit reached";
    case FtolTooSmall:
    case XtolTooSmall:
    case GtolTooSmall: return "no further improvement possible";
    case ImproperInputParameters: return "improper input";
    default: return "stopped";
  }
}

}  // namespace

LeastSquaresResult least_squares(const ResidualFunction& residuals, size_t residual_count, std::vector<double> x0,
                                 const std::vector<ParameterBounds>& bounds, int max_evaluations) {
  const size_t n = x0.size();
  PTDP_ASSERT(n > 0 && residual_count >= n, "least squares needs at least as many residuals as parameters");
  PTDP_ASSERT(bounds.empty() || bounds.size() == n, "one bound per parameter");
  int calls = 0;
  Problem problem;
  problem.calls = &calls;
  problem.f = &residuals;
  problem.bounds = &bounds;
  problem.n = static_cast<Eigen::Index>(n);
  problem.m = static_cast<Eigen::Index>(residual_count);
  Eigen::VectorXd u(problem.n);
  for (size_t i = 0; i < n; ++i) {
    if (!bounds.empty())
      PTDP_ASSERT(x0[i] > bounds[i].lower && x0[i] < bounds[i].upper, "start point inside the bounds");
    u[static_cast<Eigen::Index>(i)] = bounds.empty() ? x0[i] : to_free(x0[i], bounds[i]);
  }
  Eigen::NumericalDiff<Problem> diff(problem);
  Eigen::LevenbergMarquardt<Eigen::NumericalDiff<Problem>> lm(diff);
  lm.setMaxfev(max_evaluations);
  lm.setXtol(1e-10);
  lm.setFtol(1e-12);
  const auto status = lm.minimize(u);

  LeastSquaresResult result;
  result.x = problem.bounded(u);
  Eigen::VectorXd r(problem.m);
  problem(u, r);
  result.sum_of_squares = r.squaredNorm();
  result.evaluations = calls;
  result.status = status_text(status);
  return result;
}

}  // namespace ptdp
