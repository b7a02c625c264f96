// Fitting a topology's compute-efficiency and overhead parameters to measured runs (`ptdp
// calibrate --measured`): Levenberg–Marquardt (model/least_squares.hpp) on the relative error
// of the analytic prediction of each run, then leave-one-out cross-validation (refit without
// each row, predict it). The parameters are the topology's own (no per-row factors).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "model/metrics.hpp"
#include "sim/simulate.hpp"

namespace ptdp {

/// One measured run: the simulation input (on the topology being fitted) and what was measured.
struct RunToFit {
  std::string label;
  SimulationInput input;
  RunMetric metric = RunMetric::IterationTime;  // what `measured` is (model/metrics.hpp)
  double measured = 0;
  Schedule schedule;        // make_schedule(input.plan); fit_runs builds it when empty
};

/// The fittable parameters, by their key under cluster.topology.gpu: gemm_max_efficiency,
/// gemm_half_dim, gemm_half_k, gemm_thin_exponent, elementwise_efficiency, iteration_overhead
/// (seconds), kernel_launch (seconds), the FP8 and attention ceilings; and the links
/// nvlink_bandwidth and nic_bandwidth (bytes/s).
const std::vector<std::string>& fit_parameter_names();
/// The default set: every name above except kernel_launch.
std::vector<std::string> default_fit_parameters();

struct RunFitResult {
  std::vector<std::string> parameters;  // those fitted (the named ones less `dropped`)
  std::vector<std::string> dropped;     // named but undetermined by the runs: kept at their values
  std::vector<std::string> warnings;    // why each was dropped; values that reached a bound
  bool exactly_determined = false;      // as many runs as fitted parameters: rms 0 says nothing
  std::vector<double> values;           // fitted, in the order of `parameters`
  ClusterSpec topology;                 // the first run's cluster with the fitted values
  std::vector<double> predicted;        // per run, in its metric
  std::vector<double> error;            // (predicted − measured) / measured
  std::vector<double> loo_predicted;    // each run predicted by the fit without it (empty when
  std::vector<double> loo_error;        // rows − 1 < parameters)
  double rms_error = 0, loo_rms_error = 0, loo_max_error = 0;
  int evaluations = 0;
  std::string status;
};

/// Fits `parameters` (names from fit_parameter_names()) to the runs, from the values of the
/// first run's topology. Parameters the runs barely depend on, and beyond as many as there are
/// runs the least influential ones, are not fitted (listed in `dropped`, said in `warnings`).
/// Throws ConfigError (key "parameters") for an unknown name or when no parameter is
/// determined. With `leave_one_out`, also cross-validates. `progress` (may be empty)
/// gets a line per leave-one-out fit.
RunFitResult fit_runs(const std::vector<RunToFit>& runs, const std::vector<std::string>& parameters, bool leave_one_out,
                      const std::function<void(const std::string&)>& progress = {});

/// The analytic prediction of one run in its metric, on `cluster`.
double predict_run(const RunToFit& run, const ClusterSpec& cluster);

}  // namespace ptdp
