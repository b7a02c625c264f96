#include "scenarios/measured_runs.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/csv.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "model/flops.hpp"
#include "topologies/compute_profile.hpp"

namespace ptdp {
namespace {

namespace fs = std::filesystem;

using Cell = CsvCell;

// One record, or a ConfigError at `at` for an unclosed quote.
std::vector<Cell> split_record(const std::string& line, const SourceLocation& at) {
  std::vector<Cell> cells;
  if (!csv_split(line, cells)) throw ConfigError("", "unterminated quoted cell", at);
  return cells;
}

const std::vector<std::string> kColumns = {"scenario",        "set",           "iteration_time_s", "tflops_per_gpu",
                                           "layer_forward_s", "layer_backward_s", "tokens_per_s_per_gpu", "mfu", "label"};

// A measurement no run can produce, refused before it is fitted (the fit would push every
// parameter to its bound, or divide by a time of 1e-300): the throughput it means against the
// GPU's peak, and a floor of a microsecond on times (no kernel launch is faster).
void check_physical(const MeasuredRun& run, const std::string& csv_path, int column) {
  const SourceLocation at{csv_path, run.row, column};
  const std::string key = to_string(run.metric);
  if (run.metric != RunMetric::TflopsPerGpu && run.measured < 1e-6)
    throw ConfigError(key, "row " + std::to_string(run.row) + ": " + std::to_string(run.measured) +
                               " s is shorter than any kernel launch (a microsecond): not a measured time", at);
  const double peak = mfu_peak_flops(run.scenario.cluster, run.scenario.plan);
  if (!(peak > 0)) return;
  double tflops = run.measured;
  if (run.metric == RunMetric::IterationTime)
    tflops = reported_iteration_flops(run.scenario.model, run.scenario.plan) /
             (run.measured * static_cast<double>(run.scenario.plan.gpus())) / 1e12;
  if (run.metric != RunMetric::TflopsPerGpu && run.metric != RunMetric::IterationTime) return;
  if (!std::isfinite(tflops) || tflops > peak / 1e12) {
    char text[256];
    std::snprintf(text, sizeof text, "row %d: %.4g TFLOP/s per GPU%s exceeds the GPU's peak of %.4g TFLOP/s (%s): not a measured run",
                  run.row, tflops, run.metric == RunMetric::IterationTime ? " (this iteration time's throughput)" : "", peak / 1e12,
                  run.scenario.cluster.name.c_str());
    throw ConfigError(key, text, at);
  }
}

}  // namespace


std::vector<MeasuredRun> load_measured_runs(const std::string& csv_path, const std::string& topology) {
  // Through the common reader: a regular file within the size limit (a named pipe or a device
  // would block or never end).
  std::istringstream in(strip_utf8_bom(read_input_file(csv_path, "measured runs CSV")));
  std::string line;
  int row = 0;
  std::map<std::string, size_t> index;  // column name → cell index
  std::vector<Cell> header;
  while (std::getline(in, line)) {
    ++row;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    header = split_record(line, SourceLocation{csv_path, row, 1});
    break;
  }
  if (header.empty())
    throw ConfigError("", "empty file: expected a header 'scenario,set,iteration_time_s' and one row per measured run",
                      SourceLocation{csv_path, 1, 1});
  const int header_row = row;
  for (size_t i = 0; i < header.size(); ++i) {
    const std::string& name = header[i].text;
    bool known = false;
    for (const auto& k : kColumns) known = known || k == name;
    if (!known)
      throw ConfigError(name, "unknown column '" + name + "', expected scenario, set and a measurement: iteration_time_s, tflops_per_gpu, "
                                  "tokens_per_s_per_gpu, mfu, layer_forward_s or layer_backward_s (and label)" +
                                  did_you_mean(name, kColumns),
                        SourceLocation{csv_path, header_row, header[i].column});
    if (index.count(name)) throw ConfigError(name, "column given twice", SourceLocation{csv_path, header_row, header[i].column});
    index[name] = i;
  }
  if (!index.count("scenario")) throw ConfigError("scenario", "missing column 'scenario'", SourceLocation{csv_path, header_row, 1});
  bool any_metric = false;
  for (RunMetric m : kRunMetrics) any_metric = any_metric || index.count(to_string(m));
  if (!any_metric)
    throw ConfigError("", "missing the measurement: a column 'iteration_time_s', 'tflops_per_gpu', 'layer_forward_s' or "
                          "'layer_backward_s'", SourceLocation{csv_path, header_row, 1});

  const fs::path base = fs::path(csv_path).parent_path();
  std::vector<MeasuredRun> runs;
  while (std::getline(in, line)) {
    ++row;
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[line.find_first_not_of(" \t")] == '#') continue;
    const std::vector<Cell> cells = split_record(line, SourceLocation{csv_path, row, 1});
    if (cells.size() != header.size())
      throw ConfigError("", std::to_string(cells.size()) + " cells, the header has " + std::to_string(header.size()),
                        SourceLocation{csv_path, row, cells.back().column});
    auto cell = [&](const std::string& name) -> const Cell* {
      auto it = index.find(name);
      return it == index.end() ? nullptr : &cells[it->second];
    };
    MeasuredRun run;
    run.row = row;
    // The measurement: exactly one of the two columns holds a positive number.
    int given = 0;
    for (RunMetric m : kRunMetrics) {
      const Cell* c = cell(to_string(m));
      if (!c || c->text.empty()) continue;
      ++given;
      const SourceLocation at{csv_path, row, c->column};
      double v = 0;
      size_t used = 0;
      try {
        v = std::stod(c->text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != c->text.size() || !std::isfinite(v))
        throw ConfigError(to_string(m), "'" + c->text + "' is not a number", at);
      if (!(v > 0)) throw ConfigError(to_string(m), "must be positive (got " + c->text + ")", at);
      if (m == RunMetric::Mfu && v > 1) throw ConfigError(to_string(m), "is a fraction of peak, at most 1 (got " + c->text + "; 45 % is 0.45)", at);
      run.metric = m;
      run.measured = v;
    }
    if (given != 1) {
      const Cell* c = nullptr;
      std::string first;
      for (RunMetric m : kRunMetrics)
        if (!c && cell(to_string(m))) c = cell(to_string(m)), first = to_string(m);
      throw ConfigError(first, given ? "give one measurement per row (iteration_time_s, tflops_per_gpu, layer_forward_s "
                                       "or layer_backward_s), not several"
                                     : "no measurement in this row",
                        SourceLocation{csv_path, row, c->column});
    }
    // The overrides: the topology to fit first, then the row's own.
    const Cell* set = cell("set");
    std::vector<Override> sets = {{"cluster.topology", topology}};
    if (set) {
      std::istringstream parts(set->text);
      for (std::string part; std::getline(parts, part, ';');) {
        const auto b = part.find_first_not_of(" \t"), e = part.find_last_not_of(" \t");
        if (b == std::string::npos) continue;
        part = part.substr(b, e - b + 1);
        const auto eq = part.find('=');
        if (eq == std::string::npos || eq == 0)
          throw ConfigError("set", "expected key=value, e.g. training.micro_batch=4 (got '" + part + "')",
                            SourceLocation{csv_path, row, set->column});
        run.sets.push_back({part.substr(0, eq), part.substr(eq + 1)});
        sets.push_back(run.sets.back());
      }
    }
    const Cell* scen = cell("scenario");
    const SourceLocation scen_at{csv_path, row, scen->column};
    if (scen->text.empty()) throw ConfigError("scenario", "empty: expected a scenario file relative to the CSV", scen_at);
    fs::path path = scen->text;
    if (path.is_relative()) path = base / path;
    if (!path_exists(path.string())) throw ConfigError("scenario", "no such file '" + path.string() + "'", scen_at);
    try {
      run.scenario = load_scenario(path.string(), sets);
    } catch (const ConfigError& e) {
      // Name the row: which of its overrides (or the scenario itself) is wrong.
      const SourceLocation at{csv_path, row, set && e.where().file.rfind("--set", 0) == 0 ? set->column : scen->column};
      throw ConfigError(e.where().file.rfind("--set", 0) == 0 ? "set" : "scenario", e.what(), at);
    } catch (const std::exception& e) {  // the YAML library's text: the file is no scenario (a CSV, a binary)
      throw ConfigError("scenario", "'" + printable(path.string(), 120) + "' is not a scenario (" + printable(e.what(), 120) + ")", scen_at);
    }
    check_physical(run, csv_path, cell(to_string(run.metric))->column);
    const Cell* label = cell("label");
    run.label = label && !label->text.empty() ? label->text : scen->text + (set && !set->text.empty() ? "; " + set->text : "");
    runs.push_back(std::move(run));
  }
  return runs;
}

}  // namespace ptdp
