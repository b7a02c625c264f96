// `ptdp bench`: timed figures for docs/BENCHMARKS.md (benchmarks, not tests).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "scenarios/scenario.hpp"
#include "schedules/schedule.hpp"
#include "sim/costing.hpp"
#include "sim/scenario_input.hpp"
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

// CPU time (user + sys) of this process and of its waited-for children (the SimGrid runs), s.
double cpu_s_with_children() {
  double total = 0;
  for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    rusage ru{};
    getrusage(who, &ru);
    total += static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  }
  return total;
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
  double iteration = 0, activities = 0, sim_wall = 0, cpu = 1e30;
  const double wall = best_of(repeats, [&] {
    const double cpu0 = cpu_s_with_children();
    // As `ptdp simulate` does: the analytic critical path finds cycles itself (no separate check).
    const auto res = simulate(in, make_costed_schedule(in.model, in.plan, in.cluster, /*check_deadlocks=*/f != Fidelity::Analytic), f, false);
    actions = res.schedule.num_actions();
    iteration = res.report.iteration_time_s;
    if (res.report.extra.count("activities")) {
      activities = res.report.extra.at("activities");
      sim_wall = res.report.extra.at("wall_s");
    }
    cpu = std::min(cpu, cpu_s_with_children() - cpu0);
  });
  std::printf("%-9s %-10s %5lld GPUs %8zu actions  best of %d: %9.1f ms wall, %9.1f ms CPU  (predicted iteration %.3f s)",
              to_string(f).c_str(), sc.model.name.c_str(), static_cast<long long>(sc.gpus), actions, repeats, wall * 1e3,
              cpu * 1e3, iteration);
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
struct SweepRun {
  int status = -1;
  double wall_s = 0, cpu_s = 0;  // cpu: user + sys of the sweep and of its SimGrid children
  double peak_rss_mb = 0;        // the sweep process's (or a SimGrid child's, if larger) peak RSS
  std::string output;            // stdout
};

// `ptdp sweep ARGS…` as a user runs it (this binary, its own process, stdout to a file).
pid_t spawn_sweep(const std::vector<std::string>& args, const std::string& out) {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw EnvironmentError("bench: cannot find this program's path (/proc/self/exe)");
  const pid_t pid = ::fork();
  if (pid < 0) throw EnvironmentError("bench: fork failed");
  if (pid == 0) {
    std::vector<std::string> argv_s = {self, "sweep"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (std::freopen(out.c_str(), "w", stdout) == nullptr || std::freopen("/dev/null", "w", stderr) == nullptr) ::_exit(127);
    ::execv(self, argv.data());
    ::_exit(127);
  }
  return pid;
}

SweepRun finish_sweep(pid_t pid, const std::string& out, Clock::time_point t0) {
  SweepRun r;
  int status = 0;
  rusage ru{};
  // wait4 gives the child's own time and that of its waited-for children (the SimGrid runs).
  if (::wait4(pid, &status, 0, &ru) < 0) throw EnvironmentError("bench: wait4 failed");
  r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  r.cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  r.peak_rss_mb = static_cast<double>(ru.ru_maxrss) / 1024.0;  // KB on Linux
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (FILE* f = std::fopen(out.c_str(), "r")) {
    char buf[4096];
    while (std::fgets(buf, sizeof buf, f)) r.output += buf;
    std::fclose(f);
  }
  std::remove(out.c_str());
  return r;
}

// `ptdp sweep SCENARIO --auto` (top 10 re-simulated at reduced fidelity, the default budget):
// CPU time (user + sys, the SimGrid children included) and wall time, alone or while a second
// identical sweep runs (`concurrent`); the table's analytic line, how many of the top ten were
// re-simulated and the rank stability line are echoed.
void bench_sweep(const std::string& scenario, double target_cpu_s, bool concurrent) {
  const std::string tag = "/tmp/ptdp-bench-sweep-" + std::to_string(::getpid());
  const std::vector<std::string> args = {scenario, "--auto"};
  const auto t0 = Clock::now();
  pid_t other = -1;
  if (concurrent) other = spawn_sweep(args, tag + "-other.txt");
  const SweepRun r = finish_sweep(spawn_sweep(args, tag + ".txt"), tag + ".txt", t0);
  if (other > 0) finish_sweep(other, tag + "-other.txt", t0);
  if (r.status != 0) throw EnvironmentError("bench: `ptdp sweep " + scenario + " --auto` failed (exit " + std::to_string(r.status) + ")");
  std::string analytic, stability, header;
  size_t rows = 0, unrefined = 0;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("ptdp sweep:", 0) == 0) header = line;
    if (line.rfind("  analytic:", 0) == 0) analytic = line;
    if (line.rfind("  rank stability:", 0) == 0) stability = line;
    // Ranked rows ("     3   t4 p4 …"); a top row left unrefined is followed by a line saying why.
    int rank = 0;
    char first = 0;
    if (std::sscanf(line.c_str(), " %d %c", &rank, &first) == 2 && first == 't' && rank >= 1 && rank <= 10) ++rows;
    if (line.rfind("        not re-simulated", 0) == 0 || line.rfind("        reduced failed", 0) == 0) ++unrefined;
  }
  const size_t refined = rows - std::min(rows, unrefined);
  const double limit = concurrent ? 2 * target_cpu_s : target_cpu_s;
  std::printf("sweep --auto %-44s %s %6.1f s CPU (user+sys), %6.1f s wall, %5.0f MB peak RSS; target ≤ %.0f s CPU: %s; top %zu rows, %zu re-simulated\n",
              scenario.substr(scenario.rfind("/scenarios/") == std::string::npos ? 0 : scenario.rfind("/scenarios/") + 1).c_str(),
              concurrent ? "beside a 2nd" : "alone       ", r.cpu_s, r.wall_s, r.peak_rss_mb, limit, r.cpu_s <= limit ? "met" : "NOT met", rows, refined);
  std::printf("  %s\n%s\n%s\n", header.c_str(), analytic.c_str(), stability.c_str());
  std::fflush(stdout);
}
// One `BINARY bench WHICH --repeat R` as a child process: its in-process figure for the 1T plan
// (the "best of R: X ms wall" and "predicted iteration" of its gpt-1t line, the same format in
// every version since the command exists) and the whole process's CPU and wall (wait4: the
// SimGrid child included). Each binary finds its scenario in its own checkout (data_dir), so an
// older binary reads the 1T plan as it was written then.
struct BenchChild {
  double in_process_ms = -1, in_process_cpu_ms = -1, iteration_s = -1;  // CPU: -1 when the binary does not print it
  SweepRun run;
};

BenchChild bench_child(const std::string& binary, const std::string& which, int repeats) {
  const std::string out = "/tmp/ptdp-bench-child-" + std::to_string(::getpid()) + ".txt";
  std::fflush(stdout);  // else the child's copy of the buffer is printed twice
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) throw EnvironmentError("bench: fork failed");
  if (pid == 0) {
    std::vector<std::string> argv_s = {binary, "bench", which, "--repeat", std::to_string(repeats)};
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (std::freopen(out.c_str(), "w", stdout) == nullptr || std::freopen("/dev/null", "w", stderr) == nullptr) ::_exit(127);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  BenchChild c;
  c.run = finish_sweep(pid, out, t0);
  if (c.run.status != 0)
    throw EnvironmentError("bench: `" + binary + " bench " + which + "` failed (exit " + std::to_string(c.run.status) + ")");
  std::istringstream lines(c.run.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" 3072 GPUs") == std::string::npos) continue;  // the 1T plan's line, not GPT-3's
    const size_t best = line.find("best of "), pred = line.find("predicted iteration ");
    if (best == std::string::npos || pred == std::string::npos) continue;
    c.in_process_ms = std::atof(line.c_str() + line.find(": ", best) + 2);
    if (const size_t cpu = line.find(" ms wall, ", best); cpu != std::string::npos && cpu < pred)
      c.in_process_cpu_ms = std::atof(line.c_str() + cpu + std::string(" ms wall, ").size());
    c.iteration_s = std::atof(line.c_str() + pred + std::string("predicted iteration ").size());
    break;
  }
  if (c.in_process_ms < 0) throw EnvironmentError("bench: `" + binary + " bench " + which + "` printed no 1T line:\n" + c.run.output);
  return c;
}

// `ptdp bench full --baseline OLD`: this binary and an older one (e.g. built from commit 0e9ab99)
// on the 1T plan at the three fidelities, alternating so both see the same load, the best of
// `rounds` each; the targets of issue 35 item 5 beside this binary's figures.
void bench_against(const std::string& baseline, int rounds) {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw EnvironmentError("bench: cannot find this program's path (/proc/self/exe)");
  if (::access(baseline.c_str(), X_OK) != 0) throw ConfigError("--baseline", "no executable ptdp at '" + baseline + "'");
  struct Row {
    const char* which;
    int repeats;
    double target_s;
  };
  const Row rows[] = {{"analytic", 5, 0.010}, {"reduced", 3, 0.3}, {"full", 1, 20}};
  std::printf("%-8s %-9s %14s %14s %12s %12s %14s  %s\n", "binary", "fidelity", "in-proc. wall", "in-proc. CPU", "process CPU",
              "process wall", "iteration", "target (in-process, wall / CPU)");
  for (const Row& row : rows) {
    BenchChild best[2];
    for (int round = 0; round < rounds; ++round)
      for (int b = 0; b < 2; ++b) {
        const BenchChild c = bench_child(b == 0 ? baseline : std::string(self), row.which, row.repeats);
        if (round == 0 || c.in_process_ms < best[b].in_process_ms) best[b] = c;
      }
    for (int b = 0; b < 2; ++b) {
      const BenchChild& c = best[b];
      char cpu[32] = "-";
      if (c.in_process_cpu_ms >= 0) std::snprintf(cpu, sizeof cpu, "%.1f ms", c.in_process_cpu_ms);
      std::printf("%-8s %-9s %11.1f ms %14s %10.2f s %10.2f s %12.3f s", b == 0 ? "baseline" : "this", row.which, c.in_process_ms,
                  cpu, c.run.cpu_s, c.run.wall_s, c.iteration_s);
      if (c.in_process_cpu_ms >= 0)
        std::printf("  ≤ %g s: %s / %s", row.target_s, c.in_process_ms * 1e-3 <= row.target_s ? "met" : "NOT met",
                    c.in_process_cpu_ms * 1e-3 <= row.target_s ? "met" : "NOT met");
      std::printf("\n");
    }
    std::fflush(stdout);
  }
}
}  // namespace

void add_bench(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("bench", "benchmarks of ptdp itself (figures for docs/BENCHMARKS.md)");
  static std::string which = "all";
  static int repeats = 5;
  cmd->add_option("WHICH", which, "analytic | lowering | reduced | full | sweep | all (all = analytic, lowering, reduced)")
      ->capture_default_str();
  static CLI::Option* repeat_option = nullptr;
  repeat_option = cmd->add_option("--repeat", repeats, "repetitions (the best is reported; with --baseline: rounds of both binaries, default 1)")
          ->capture_default_str()
          ->check(CLI::Range(1, 1000));
  static bool concurrent = false;
  cmd->add_flag("--concurrent", concurrent, "sweep: run a second identical sweep beside each measured one");
  static std::string baseline;
  cmd->add_option("--baseline", baseline,
                  "full: compare with an older ptdp binary (e.g. built from commit 0e9ab99) on the 1T plan at the three fidelities, "
                  "alternating the two binaries; the best of --repeat rounds")
      ->type_name("PATH");
  cmd->callback([&run] {
    run = [] {
      const std::vector<std::string> known = {"all", "analytic", "lowering", "reduced", "full", "sweep"};
      if (std::find(known.begin(), known.end(), which) == known.end())
        throw ConfigError("WHICH", "unknown benchmark '" + which + "', expected analytic, lowering, reduced, full, sweep or all" +
                                       did_you_mean(which, known));
      if (!baseline.empty() && which != "full") throw ConfigError("--baseline", "compares with `bench full` only (got WHICH " + which + ")");
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
        // Issue 35's presets and target: each --auto sweep with its top ten re-simulated in ≤ 5 s of
        // ptdp's CPU time, ≤ 2× that beside a second sweep (--concurrent).
        for (const char* preset : {"gpt3-175b.yaml", "llama3-70b.yaml", "llama3-405b.yaml", "moe/mixtral-8x22b.yaml",
                                   "moe/deepseek-v3.yaml", "long-context/llama2-7b-128k.yaml"})
          bench_sweep(data_dir() + "/scenarios/" + preset, 5, concurrent);
      }
      if (which == "full" && !baseline.empty()) {
        bench_against(baseline, repeat_option->count() > 0 ? repeats : 1);
      } else if (which == "full") {
        std::fprintf(stderr, "full fidelity of the 1T model on 3072 GPUs takes several seconds (minutes on a busy machine)…\n");
        bench_simulation(one_t, Fidelity::Full, 1);
      }
      return 0;
    };
  });
}

}  // namespace ptdp::cli
