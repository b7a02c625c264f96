// Measured runs for `ptdp calibrate --measured RUNS.csv`: a CSV with a header and one row per
// run, columns `scenario` (path relative to the CSV), `set` (semicolon-separated key=value
// overrides, may be empty) and the measurement, `iteration_time_s`, `tflops_per_gpu`,
// `layer_forward_s` or `layer_backward_s` (any of these columns, one value per row). An
// optional `label` column names the row.
#pragma once

#include <string>
#include <vector>

#include "model/metrics.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp {


struct MeasuredRun {
  int row = 0;                  // line of the CSV (the header is line 1)
  std::string label;            // `label` column, else "scenario[; set]"
  std::vector<Override> sets;
  Scenario scenario;            // loaded with cluster.topology = the topology to fit, then `set`
  RunMetric metric = RunMetric::IterationTime;
  double measured = 0;
};

/// Reads and loads every row. Throws ConfigError located at RUNS.csv:ROW:COL naming the column
/// for: unknown or missing columns, a wrong number of cells, an unknown or invalid key in
/// `set` (the scenario loader's message), a missing scenario file, or a measurement that is not
/// a positive number.
std::vector<MeasuredRun> load_measured_runs(const std::string& csv_path, const std::string& topology);

}  // namespace ptdp
