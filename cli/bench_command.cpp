// `ptdp bench`: timed figures for docs/BENCHMARKS.md (benchmarks, not tests).
#include <chrono>
#include <cstdio>
#include <iostream>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "scenarios/scenario.hpp"
#include "schedules/schedule.hpp"
#include "sim/simulate.hpp"

namespace ptdp::cli {
namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double best_of(int repeats, F&& f) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

int bench_analytic(const std::string& scenario, const std::vector<Override>& overrides, int repeats) {
  const Scenario sc = load_scenario(scenario, overrides);
  SimulationInput in{sc.model, sc.plan, sc.cluster, sc.train_tokens, sc.config_json};
  size_t actions = 0;
  double iteration = 0;
  const double wall = best_of(repeats, [&] {
    const auto res = simulate(in, Fidelity::Analytic, false);
    actions = res.schedule.num_actions();
    iteration = res.report.iteration_time_s;
  });
  std::printf("analytic  %-28s  %8zu actions  best of %d: %8.1f ms wall  (predicted iteration %.3f s)\n",
              sc.model.name.c_str(), actions, repeats, wall * 1e3, iteration);
  return 0;
}

int bench_lowering(int p, int v, int m, int repeats) {
  size_t actions = 0;
  const double wall = best_of(repeats, [&] {
    Schedule s = make_interleaved(p, v, m);
    lower(s);
    actions = s.num_actions();
  });
  std::printf("lowering  interleaved p %d v %d m %d  %8zu actions  best of %d: %8.1f ms wall (generate + lower + deadlock check)\n",
              p, v, m, actions, repeats, wall * 1e3);
  return 0;
}

}  // namespace

std::vector<Override> overrides_of(const ScenarioArgs& args);

void add_bench(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("bench", "benchmarks of ptdp itself (figures for docs/BENCHMARKS.md)");
  static std::string which = "all";
  static int repeats = 5;
  cmd->add_option("WHICH", which, "analytic | lowering | all")->capture_default_str();
  cmd->add_option("--repeat", repeats, "repetitions (the best is reported)")->capture_default_str()->check(CLI::Range(1, 1000));
  cmd->callback([&run] {
    run = [] {
      if (which != "all" && which != "analytic" && which != "lowering")
        throw ConfigError("WHICH", "unknown benchmark '" + which + "', expected analytic, lowering or all");
      if (which == "all" || which == "analytic") {
        bench_analytic(data_dir() + "/scenarios/gpt-1t.yaml", {}, repeats);
        bench_analytic("", {}, repeats);
      }
      if (which == "all" || which == "lowering") bench_lowering(64, 4, 512, repeats);
      return 0;
    };
  });
}

}  // namespace ptdp::cli
