#include "search/fit_runs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <future>
#include <limits>

#include "core/error.hpp"
#include "model/least_squares.hpp"
#include "sim/costing.hpp"

namespace ptdp {
namespace {

struct Parameter {
  std::string name;
  std::function<double&(ClusterSpec&)> field;
  ParameterBounds bounds;
};

// The GPU's fittable fields (those with calibration bounds in model/gpu.hpp's table), then the
// links the collectives' measured curves are rescaled to (bytes/s per direction; collectives.hpp).
const std::vector<Parameter>& parameters_table() {
  static const std::vector<Parameter> table = [] {
    std::vector<Parameter> t;
    for (const auto& f : gpu_fields())
      if (f.number && f.fit_upper > f.fit_lower)
        t.push_back({f.key, [m = f.number](ClusterSpec& c) -> double& { return c.gpu.*m; }, {f.fit_lower, f.fit_upper}});
    t.push_back({"nvlink_bandwidth", [](ClusterSpec& c) -> double& { return c.nvlink.bw_Bps; }, {1e9, 1e13}});
    t.push_back({"nic_bandwidth", [](ClusterSpec& c) -> double& { return c.nic.bw_Bps; }, {1e8, 1e12}});
    return t;
  }();
  return table;
}

const Parameter& parameter(const std::string& name) {
  for (const auto& p : parameters_table())
    if (p.name == name) return p;
  throw ConfigError("parameters", "unknown parameter '" + name + "'" + did_you_mean(name, fit_parameter_names()));
}

// A start strictly inside the bounds (the optimiser works on a transformed, unbounded scale).
double inside(double v, const ParameterBounds& b) {
  const double span = b.upper - b.lower;
  return std::clamp(v, b.lower + 1e-6 * span, b.upper - 1e-6 * span);
}

ClusterSpec with_values(const ClusterSpec& base, const std::vector<const Parameter*>& ps, const std::vector<double>& x) {
  ClusterSpec c = base;
  for (size_t i = 0; i < ps.size(); ++i) ps[i]->field(c) = x[i];
  return c;
}

// How much the runs depend on a parameter: the largest relative change of any run's prediction
// when the parameter moves by 10 % of its value (by 1 % of its range from 0).
double sensitivity(const std::vector<RunToFit>& runs, const Parameter& p) {
  double most = 0;
  for (const auto& run : runs) {
    ClusterSpec c = run.input.cluster;
    const double base = predict_run(run, c);
    const double v = p.field(c);
    const double step = v != 0 ? 0.1 * v : 0.01 * (p.bounds.upper - p.bounds.lower);
    p.field(c) = std::clamp(v + step, p.bounds.lower, p.bounds.upper) == v ? v - step : std::clamp(v + step, p.bounds.lower, p.bounds.upper);
    if (base > 0) most = std::max(most, std::fabs(predict_run(run, c) / base - 1));
  }
  return most;
}

struct Fit {
  std::vector<double> x;
  int evaluations = 0;
  std::string status;
};

// The fit is a maximum a posteriori estimate, not an interpolation: the preset's values (fitted
// to the reference microbenchmarks) are the prior, each parameter known to about kPriorSpread
// (relative); each run is trusted as far as the runs agree with one another. One prior residual
// per parameter, σ / kPriorSpread · ln(x / preset), σ the runs' scatter about their best
// unregularised fit (rms over the degrees of freedom left; kRunSpread, the ±5 % of published
// figures read off plots, when the fit is exactly determined). Runs that a set of parameters
// reproduces exactly are fitted exactly (σ = 0: no pull); runs that disagree (one row 14 % off
// the trend of the others) move the parameters only as far as they agree on it, instead of
// chasing that row and extrapolating worse than the preset.
constexpr double kRunSpread = 0.05;
constexpr double kPriorSpread = 0.05;

double prior_residual(const Parameter& p, double x, double preset, double weight) {
  if (preset > 0 && x > 0) return weight * std::log(x / preset);
  // A preset at 0 (no overhead): the same weight per tenth of the parameter's range.
  return weight * (x - preset) / (0.1 * (p.bounds.upper - p.bounds.lower));
}

// The residuals of a fit at x: each run's relative error (rows: the runs' indices), then each
// parameter's prior residual.
void fit_residuals(const std::vector<RunToFit>& runs, const std::vector<size_t>& rows, const std::vector<const Parameter*>& ps,
                   const std::vector<double>& x, const std::vector<double>& prior, double weight, std::vector<double>& r) {
  // Two halves in parallel: each prediction is an independent analytic simulation.
  auto part = [&](size_t from, size_t to) {
    for (size_t j = from; j < to; ++j) {
      const RunToFit& run = runs[rows[j]];
      r[j] = predict_run(run, with_values(run.input.cluster, ps, x)) / run.measured - 1;
    }
  };
  const size_t mid = rows.size() / 2;
  auto other = std::async(std::launch::async, part, mid, rows.size());
  part(0, mid);
  other.get();
  for (size_t i = 0; i < ps.size(); ++i) r[rows.size() + i] = prior_residual(*ps[i], x[i], prior[i], weight);
}

// Fits on the runs whose index is not `skip`, pulled toward `prior` (the preset's values) with
// `weight` (0: no pull).
Fit fit(const std::vector<RunToFit>& runs, const std::vector<const Parameter*>& ps, std::vector<double> x0, size_t skip,
        const std::vector<double>& prior, double weight) {
  std::vector<size_t> rows;
  for (size_t i = 0; i < runs.size(); ++i)
    if (i != skip) rows.push_back(i);
  std::vector<ParameterBounds> bounds;
  for (size_t i = 0; i < ps.size(); ++i) {
    bounds.push_back(ps[i]->bounds);
    x0[i] = inside(x0[i], ps[i]->bounds);
  }
  auto residuals = [&](const std::vector<double>& x, std::vector<double>& r) { fit_residuals(runs, rows, ps, x, prior, weight, r); };
  const LeastSquaresResult r = least_squares(residuals, rows.size() + ps.size(), x0, bounds, 400);
  return Fit{r.x, r.evaluations, r.status};
}

// The fit's objective (sum of squared residuals, runs and prior) over all runs at x.
double objective(const std::vector<RunToFit>& runs, const std::vector<const Parameter*>& ps, const std::vector<double>& x,
                 const std::vector<double>& prior, double weight) {
  std::vector<size_t> rows(runs.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = i;
  std::vector<double> r(rows.size() + ps.size());
  fit_residuals(runs, rows, ps, x, prior, weight, r);
  double sum = 0;
  for (double v : r) sum += v * v;
  return sum;
}

// Whether the bound holds parameter i of a fit at x: it lies within `margin` of a bound, the
// objective is no worse at the bound itself, and it rises when the parameter steps back inside
// from there (by 10⁻⁵ of the range) — the unconstrained optimum lies at or beyond the bound. A
// value that merely sits near a bound (a fitted optimum 0.1 % of the range inside it, or a flat
// objective the bound happens to end) is not held by it.
bool held_by_bound(const std::vector<RunToFit>& runs, const std::vector<const Parameter*>& ps, const std::vector<double>& x, size_t i,
                   const std::vector<double>& prior, double weight, double margin) {
  const ParameterBounds& b = ps[i]->bounds;
  const bool lower = x[i] <= b.lower + margin, upper = x[i] >= b.upper - margin;
  if (!lower && !upper) return false;
  const double at_x = objective(runs, ps, x, prior, weight);
  std::vector<double> edge = x, inner = x;
  edge[i] = lower ? b.lower : b.upper;
  const double step = 1e-5 * (b.upper - b.lower);
  inner[i] = lower ? b.lower + step : b.upper - step;
  // A parameter that must stay positive (an efficiency, a bandwidth) is evaluated just inside a
  // lower bound of 0.
  if (lower && edge[i] <= 0) edge[i] = b.lower + 1e-7 * (b.upper - b.lower);
  const double at_edge = objective(runs, ps, edge, prior, weight);
  return at_edge <= at_x * (1 + 1e-9) + 1e-15 && objective(runs, ps, inner, prior, weight) > at_edge;
}

}  // namespace

const std::vector<std::string>& fit_parameter_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& p : parameters_table()) out.push_back(p.name);
    return out;
  }();
  return names;
}

std::vector<std::string> default_fit_parameters() {
  // The bf16 efficiency model and the overheads. Not by default: kernel_launch (measured by
  // calibrate --backend, rarely identifiable from runs) and the FP8 and attention parameters (fit
  // them with --fit when the runs use FP8 or flash attention).
  std::vector<std::string> out;
  for (const auto& name : fit_parameter_names()) {
    if (name == "kernel_launch" || name.rfind("fp8_", 0) == 0 || name.rfind("attention_", 0) == 0) continue;
    out.push_back(name);
  }
  return out;
}

double predict_run(const RunToFit& run, const ClusterSpec& cluster) {
  SimulationInput in = run.input;
  in.cluster = cluster;
  if (run.metric == RunMetric::LayerForward || run.metric == RunMetric::LayerBackward) {
    const PlanCosts c = plan_costs(in.model, in.plan, cluster);
    return run.metric == RunMetric::LayerForward ? c.layer_forward_s : c.layer_backward_s;
  }
  const Report r =
      simulate(in, run.schedule.programs.empty() ? make_costed_schedule(in.model, in.plan, in.cluster) : run.schedule, Fidelity::Analytic,
               false)
          .report;
  switch (run.metric) {
    case RunMetric::TflopsPerGpu: return r.tflops_per_gpu;
    case RunMetric::TokensPerSecondPerGpu: return r.tokens_per_s / static_cast<double>(in.plan.gpus());
    case RunMetric::Mfu: return r.mfu;
    default: return r.iteration_time_s;
  }
}

RunFitResult fit_runs(const std::vector<RunToFit>& runs_in, const std::vector<std::string>& names, bool leave_one_out,
                      const std::function<void(const std::string&)>& progress) {
  // The schedules are lowered once, the zero-bubble ones placed with the preset's costed times
  // (as `simulate` places them), not refitted as the parameters move.
  std::vector<RunToFit> runs = runs_in;
  for (auto& run : runs)
    if (run.schedule.programs.empty()) run.schedule = make_costed_schedule(run.input.model, run.input.plan, run.input.cluster);
  if (names.empty()) throw ConfigError("parameters", "nothing to fit: name at least one parameter");
  if (runs.empty()) throw ConfigError("parameters", "no measured run to fit");
  std::vector<const Parameter*> candidates;
  for (const auto& n : names) candidates.push_back(&parameter(n));
  RunFitResult out;
  // Sensitivity check: a parameter the runs barely depend on (< 0.1 % for a 10 % change) is
  // undetermined — said, and fitted without. With fewer runs than parameters only the ones the
  // runs depend on most are fitted (as many as there are runs); the others keep their values.
  std::vector<std::pair<double, const Parameter*>> ranked;
  for (const auto* p : candidates) {
    const double s = sensitivity(runs, *p);
    if (s < 1e-3) {
      out.dropped.push_back(p->name);
      char text[200];
      std::snprintf(text, sizeof text, "%s: the runs barely depend on it (%.3f %% for a 10 %% change): undetermined, kept at its value",
                    p->name.c_str(), 100 * s);
      out.warnings.push_back(text);
    } else {
      ranked.push_back({s, p});
    }
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  // n ≥ 2 runs fit at most n − 1 parameters: one degree of freedom is left to measure how far
  // the runs agree (their scatter weighs the preset's pull below); a single run fits one.
  const size_t most = runs.size() > 1 ? runs.size() - 1 : 1;
  while (ranked.size() > most) {
    out.dropped.push_back(ranked.back().second->name);
    out.warnings.push_back(ranked.back().second->name + ": " + std::to_string(runs.size()) + " run(s) determine at most " +
                           std::to_string(most) + " parameter(s) with their scatter measured; the runs depend on it least: kept at its value");
    ranked.pop_back();
  }
  if (ranked.empty())
    throw ConfigError("parameters", "the runs determine none of the parameters (" + std::to_string(candidates.size()) +
                                        " named, each changes the predictions by < 0.1 % for a 10 % change)");
  std::vector<const Parameter*> ps;
  for (const auto* p : candidates)
    for (const auto& r : ranked)
      if (r.second == p) ps.push_back(p);
  ClusterSpec start = runs.front().input.cluster;
  std::vector<double> x0;
  for (const auto* p : ps) x0.push_back(p->field(start));

  for (const auto* p : ps) out.parameters.push_back(p->name);
  out.exactly_determined = runs.size() == ps.size();
  // The runs' scatter about their best fit without the prior sets the prior's weight.
  const Fit free = fit(runs, ps, x0, runs.size(), x0, 0.0);
  double scatter = kRunSpread;
  if (runs.size() > ps.size()) {
    double sq_free = 0;
    for (const auto& run : runs) {
      const double e = predict_run(run, with_values(run.input.cluster, ps, free.x)) / run.measured - 1;
      sq_free += e * e;
    }
    scatter = std::sqrt(sq_free / static_cast<double>(runs.size() - ps.size()));
  }
  const double weight = scatter / kPriorSpread;
  const Fit all = fit(runs, ps, free.x, runs.size(), x0, weight);
  out.values = all.x;
  out.evaluations = free.evaluations + all.evaluations;
  out.status = all.status;
  out.topology = with_values(runs.front().input.cluster, ps, all.x);
  double sq = 0;
  for (const auto& run : runs) {
    out.predicted.push_back(predict_run(run, with_values(run.input.cluster, ps, all.x)));
    out.error.push_back(out.predicted.back() / run.measured - 1);
    sq += out.error.back() * out.error.back();
  }
  out.rms_error = std::sqrt(sq / static_cast<double>(runs.size()));
  // A value held by its bound: the runs want more than the parameter can give (another mechanism
  // is missing or mis-set); the profile then extrapolates poorly. (Either fit: the runs alone, or
  // pulled toward the preset.) A fitted optimum that merely lies near a bound is not said.
  for (size_t i = 0; i < ps.size(); ++i) {
    const ParameterBounds& b = ps[i]->bounds;
    const double margin = 1e-3 * (b.upper - b.lower);
    const bool held_all = held_by_bound(runs, ps, all.x, i, x0, weight, margin);
    if (held_all || held_by_bound(runs, ps, free.x, i, x0, 0.0, margin)) {
      char text[240];
      std::snprintf(text, sizeof text, "%s = %.4g reached its bound [%g, %g]: the runs ask for more than it can give; predictions "
                    "beyond these runs are doubtful", ps[i]->name.c_str(), held_all ? all.x[i] : free.x[i], b.lower, b.upper);
      out.warnings.push_back(text);
    }
  }
  if (!leave_one_out || runs.size() < ps.size() + 1) return out;
  sq = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const Fit without = fit(runs, ps, all.x, i, x0, weight);  // warm start from the full fit
    out.evaluations += without.evaluations;
    out.loo_predicted.push_back(predict_run(runs[i], with_values(runs[i].input.cluster, ps, without.x)));
    out.loo_error.push_back(out.loo_predicted.back() / runs[i].measured - 1);
    sq += out.loo_error.back() * out.loo_error.back();
    out.loo_max_error = std::max(out.loo_max_error, std::fabs(out.loo_error.back()));
    if (progress)
      progress("leave-one-out " + std::to_string(i + 1) + "/" + std::to_string(runs.size()) + ": " + runs[i].label);
  }
  out.loo_rms_error = std::sqrt(sq / static_cast<double>(runs.size()));
  return out;
}

}  // namespace ptdp
