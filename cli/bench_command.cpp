// `ptdp bench`: timed figures for docs/BENCHMARKS.md (benchmarks, not tests).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "scenarios/scenario.hpp"
#include "schedules/schedule.hpp"
#include "sim/costing.hpp"
#include "sim/simulate.hpp"
#include "sim/costing.hpp"

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

long peak_rss_kb_of_children() {
  rusage ru{};
  getrusage(RUSAGE_CHILDREN, &ru);
  return ru.ru_maxrss;
}

int bench_simulation(const std::string& scenario, Fidelity f, int repeats) {
  const Scenario sc = load_scenario(scenario, {});
  SimulationInput in = simulation_input(sc);
  in.show_progress = f == Fidelity::Full;  // a minute: progress on stderr (the others take < 2 s per run)
  size_t actions = 0;
  double iteration = 0, activities = 0, sim_wall = 0;
  const double wall = best_of(repeats, [&] {
    // As `ptdp simulate` does: the analytic critical path finds cycles itself (no separate check).
    const auto res = simulate(in, make_costed_schedule(in.model, in.plan, in.cluster, /*check_deadlocks=*/f != Fidelity::Analytic), f, false);
    actions = res.schedule.num_actions();
    iteration = res.report.iteration_time_s;
    if (res.report.extra.count("activities")) {
      activities = res.report.extra.at("activities");
      sim_wall = res.report.extra.at("wall_s");
    }
  });
  std::printf("%-9s %-10s %5lld GPUs %8zu actions  best of %d: %9.1f ms wall  (predicted iteration %.3f s)",
              to_string(f).c_str(), sc.model.name.c_str(), static_cast<long long>(sc.gpus), actions, repeats, wall * 1e3,
              iteration);
  if (f != Fidelity::Analytic)
    std::printf("  %.0f activities, %.0f activities/s, peak RSS of the simulation process %.0f MB", activities,
                activities / sim_wall, peak_rss_kb_of_children() / 1024.0);
  std::printf("\n");
  std::fflush(stdout);
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

namespace {
// `ptdp sweep SCENARIO --auto` as a user runs it (this binary, its own process), wall time; the
// table's analytic line (configurations, rate, pruned) is echoed.
void bench_sweep(const std::string& scenario, double target_s) {
  const std::string out = "/tmp/ptdp-bench-sweep-" + std::to_string(::getpid()) + ".txt";
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw EnvironmentError("bench: cannot find this program's path (/proc/self/exe)");
  const std::string cmd = "'" + std::string(self, static_cast<size_t>(n)) + "' sweep '" + scenario + "' --auto > '" + out + "' 2>/dev/null";
  const auto t0 = Clock::now();
  const int rc = std::system(cmd.c_str());
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::string analytic_line;
  if (FILE* f = std::fopen(out.c_str(), "r")) {
    char buf[1024];
    while (std::fgets(buf, sizeof buf, f))
      if (std::string(buf).find("  analytic:") == 0) analytic_line = buf;
    std::fclose(f);
  }
  std::remove(out.c_str());
  if (rc != 0) throw EnvironmentError("bench: `" + cmd + "` failed (exit " + std::to_string(rc) + ")");
  std::printf("sweep --auto %-40s %7.1f s wall (target ≤ %.0f s: %s)\n%s", scenario.c_str(), wall, target_s,
              wall <= target_s ? "met" : "NOT met", analytic_line.c_str());
  std::fflush(stdout);
}
}  // namespace

void add_bench(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("bench", "benchmarks of ptdp itself (figures for docs/BENCHMARKS.md)");
  static std::string which = "all";
  static int repeats = 5;
  cmd->add_option("WHICH", which, "analytic | lowering | reduced | full | sweep | all (all = analytic, lowering, reduced)")
      ->capture_default_str();
  cmd->add_option("--repeat", repeats, "repetitions (the best is reported)")->capture_default_str()->check(CLI::Range(1, 1000));
  cmd->callback([&run] {
    run = [] {
      const std::vector<std::string> known = {"all", "analytic", "lowering", "reduced", "full", "sweep"};
      if (std::find(known.begin(), known.end(), which) == known.end())
        throw ConfigError("WHICH", "unknown benchmark '" + which + "', expected analytic, lowering, reduced, full, sweep or all" +
                                       did_you_mean(which, known));
      const std::string one_t = data_dir() + "/scenarios/gpt-1t.yaml";
      if (which == "all" || which == "analytic") {
        bench_simulation(one_t, Fidelity::Analytic, repeats);
        bench_simulation("", Fidelity::Analytic, repeats);
      }
      if (which == "all" || which == "lowering") bench_lowering(64, 4, 512, repeats);
      if (which == "all" || which == "reduced") {
        bench_simulation(one_t, Fidelity::Reduced, std::min(repeats, 3));
        bench_simulation("", Fidelity::Reduced, std::min(repeats, 3));
      }
      if (which == "sweep") {
        // Issue 22's targets: the README's GPT-3 175B sweep (1024 GPUs) and the 1T model (3072 GPUs).
        bench_sweep(data_dir() + "/scenarios/gpt3-175b.yaml", 5);
        bench_sweep(one_t, 30);
      }
      if (which == "full") {
        std::fprintf(stderr, "full fidelity of the 1T model on 3072 GPUs takes about a minute…\n");
        bench_simulation(one_t, Fidelity::Full, 1);
      }
      return 0;
    };
  });
}

}  // namespace ptdp::cli
