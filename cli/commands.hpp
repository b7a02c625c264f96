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
void add_compare(CLI::App& app, Runner& run);
void add_plot(CLI::App& app, Runner& run);
void add_train(CLI::App& app, Runner& run);
void add_calibrate(CLI::App& app, Runner& run);
void add_validate(CLI::App& app, Runner& run);
void add_backends(CLI::App& app, Runner& run);

/// Shared: the overrides given with --set.
struct ScenarioArgs {
  std::string path;
  std::vector<std::string> sets;
};
void add_scenario_args(CLI::App* cmd, ScenarioArgs& args, bool scenario_required);

}  // namespace ptdp::cli
