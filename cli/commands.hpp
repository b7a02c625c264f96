// The `ptdp` subcommands. Each registers itself on the CLI11 app and runs when selected.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace ptdp::cli {

/// A subcommand's action, run by main after parsing; returns the exit code.
using Runner = std::function<int()>;

void add_simulate(CLI::App& app, Runner& run);
void add_schedule(CLI::App& app, Runner& run);
void add_bench(CLI::App& app, Runner& run);
void add_cost(CLI::App& app, Runner& run);
void add_sweep(CLI::App& app, Runner& run);
void add_compare_strategies(CLI::App& app, Runner& run);
void add_compare(CLI::App& app, Runner& run);
void add_plot(CLI::App& app, Runner& run);
void add_train(CLI::App& app, Runner& run);
void add_calibrate(CLI::App& app, Runner& run);
void add_validate(CLI::App& app, Runner& run);
void add_backends(CLI::App& app, Runner& run);
void add_import(CLI::App& app, Runner& run);
void add_export(CLI::App& app, Runner& run);
void add_keys(CLI::App& app, Runner& run);
void add_checkpoint(CLI::App& app, Runner& run);

/// Shared: the overrides given with --set.
struct ScenarioArgs {
  std::string path;
  std::vector<std::string> sets;
  std::string gpu_hour_price;  // --gpu-hour-price: becomes the override cost.gpu_hour_price
};
void add_scenario_args(CLI::App* cmd, ScenarioArgs& args, bool scenario_required);
/// --gpu-hour-price USD (simulate, sweep): the report's cost_usd = GPU-hours × price.
void add_price_option(CLI::App* cmd, ScenarioArgs& args);

}  // namespace ptdp::cli

namespace ptdp {
struct Scenario;
struct SimulationInput;
}  // namespace ptdp

namespace ptdp::cli {

/// Writes `text` to `path` (EnvironmentError naming `what` and the path when it cannot).
void write_text_file(const std::string& path, const std::string& text, const char* what);

}  // namespace ptdp::cli

namespace ptdp {
struct Scenario;
struct Schedule;
}  // namespace ptdp

namespace ptdp::cli {

/// The schedule a command runs: the plan's (make_schedule; zb-auto with the scenario's costed
/// times and free memory, sim/costing zero_bubble_costs), or the `--schedule FILE.csv` one
/// (from_csv, then adopt_schedule against the plan's p, v and m). Bad input → ConfigError
/// naming the file, row and action. `check_deadlocks` = false skips the separate deadlock check
/// of a generated schedule (for the analytic critical path, which finds cycles itself).
Schedule schedule_of(const Scenario& sc, const std::string& csv_path, bool check_deadlocks = true);
/// Help text of the --schedule option.
inline constexpr const char* kScheduleHelp =
    "run this schedule (PyTorch-style CSV, e.g. from `ptdp schedule export`) instead of the plan's; it must have the "
    "scenario's pipeline ranks, chunks and microbatches";

}  // namespace ptdp::cli
