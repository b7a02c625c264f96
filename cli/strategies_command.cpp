// `ptdp compare-strategies`: for one model and cluster, the best Megatron PTD-P plan, the best
// ZeRO-3 / FSDP plan and the best hybrid side by side (search/sweep.hpp Strategy), from an --auto
// sweep of every plan, optionally re-simulated at a SimGrid fidelity.
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/units.hpp"
#include "scenarios/scenario.hpp"
#include "sim/costing.hpp"
#include "sim/scenario_input.hpp"
#include "search/sweep.hpp"

namespace ptdp::cli {

std::vector<Override> overrides_of(const ScenarioArgs& args);

namespace {

struct Column {
  std::string title;
  std::optional<SweepOutcome> best;  // the winner (ok), if any
  Report report;                     // its report at the chosen fidelity
  double smallest_oom_bytes = 0;     // no plan fits: the least memory any needs
};

void print_columns(const Scenario& base, const std::vector<Column>& cols, size_t evaluated, Fidelity fidelity) {
  std::printf("ptdp compare-strategies: %s on %lld × %s (%s): best of %zu plans per family (ranked analytically, shown %s)\n\n",
              base.model.name.c_str(), static_cast<long long>(base.gpus), base.cluster.gpu.name.c_str(),
              base.cluster.name.c_str(), evaluated, to_string(fidelity).c_str());
  constexpr int kW = 30;
  auto row = [&](const std::string& name, auto cell) {
    std::printf("  %-22s", name.c_str());
    for (const Column& c : cols) std::printf(" %-*s", kW, c.best ? cell(c).c_str() : "");
    std::printf("\n");
  };
  std::printf("  %-22s", "");
  for (const Column& c : cols) std::printf(" %-*s", kW, c.title.c_str());
  std::printf("\n  %-22s", "plan");
  for (const Column& c : cols) {
    std::string text = c.best ? plan_label(c.best->plan) : "none fits";
    if (!c.best && c.smallest_oom_bytes > 0) text += " (least needs " + format_bytes(c.smallest_oom_bytes) + ")";
    if (!c.best && c.smallest_oom_bytes == 0) text = "no valid plan";
    std::printf(" %-*s", kW, text.c_str());
  }
  std::printf("\n");
  char buf[96];
  row("iteration time", [](const Column& c) { return format_time(c.report.iteration_time_s); });
  row("TFLOP/s per GPU", [&](const Column& c) {
    std::snprintf(buf, sizeof buf, "%.1f (MFU %.1f%%)", c.report.tflops_per_gpu, 100 * c.report.mfu);
    return std::string(buf);
  });
  row("tokens/s", [&](const Column& c) {
    std::snprintf(buf, sizeof buf, "%.0f", c.report.tokens_per_s);
    return std::string(buf);
  });
  row("pipeline bubble", [&](const Column& c) {
    std::snprintf(buf, sizeof buf, "%.1f%%", 100 * c.report.bubble_fraction);
    return std::string(buf);
  });
  for (const char* cls : {"tp", "pp", "dp", "shard"})
    row(std::string("exposed ") + cls, [&](const Column& c) {
      const auto it = c.report.exposed_comm_s.find(cls);
      return format_time(it == c.report.exposed_comm_s.end() ? 0.0 : it->second);
    });
  auto peak = [](const Column& c) { return c.report.memory.empty() ? MemoryBreakdown{} : peak_memory(c.report.memory); };
  row("memory per GPU", [&](const Column& c) {
    return format_bytes(c.report.peak_memory_bytes) + " of " + format_bytes(c.report.gpu_memory_bytes);
  });
  row("  weights", [&](const Column& c) { return format_bytes(peak(c).weights_bytes); });
  row("  gradients", [&](const Column& c) { return format_bytes(peak(c).gradients_bytes); });
  row("  optimizer", [&](const Column& c) { return format_bytes(peak(c).optimizer_bytes); });
  row("  activations", [&](const Column& c) { return format_bytes(peak(c).activations_bytes); });
  row("  buffers", [&](const Column& c) { return format_bytes(peak(c).buffers_bytes); });
  row("  runtime + allocator", [&](const Column& c) { return format_bytes(peak(c).runtime_bytes + peak(c).allocator_bytes); });
  row("  host (offloaded)", [&](const Column& c) { return format_bytes(peak(c).host_bytes); });
  row("bottleneck", [](const Column& c) { return c.report.bottleneck; });
}

}  // namespace

void add_compare_strategies(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("compare-strategies",
                                 "best Megatron PTD-P, ZeRO-3/FSDP and hybrid plan for a model and cluster, side by side");
  static ScenarioArgs args;
  static std::string fidelity = "analytic", json_path;
  static int jobs = 0;
  add_scenario_args(cmd, args, true);
  cmd->add_option("--fidelity", fidelity, "re-simulate the three winners: analytic (no re-run), reduced or full")
      ->capture_default_str();
  cmd->add_option("--jobs", jobs, "threads for the analytic sweep (default: number of cores)")->check(CLI::Range(0, 1024));
  cmd->add_option("--json", json_path, "write the three reports (keys: megatron, fsdp, hybrid)")->type_name("FILE");
  cmd->callback([&run] {
    run = [] {
      const Fidelity refine = parse_fidelity(fidelity);
      const auto base_sets = overrides_of(args);
      const Scenario base = load_scenario(args.path, base_sets);
      SkipReasons invalid;
      const auto cands = auto_candidates(
          simulation_input(base),
          [&](const ParallelPlan& plan, const Overrides& sets) {
            Scenario sc = base;
            sc.plan = plan;
            std::vector<Override> o;
            for (const auto& [k, v] : sets) o.push_back({k, v});
            return scenario_config_json(sc, o);
          },
          invalid, jobs);
      if (cands.empty()) throw ConfigError("", "no valid plan for this model, GPU count and global batch");
      SweepOptions options;
      options.top = 0;
      options.refine = Fidelity::Analytic;
      options.prune = false;  // the best of every family is needed, not only the overall top K
      options.jobs = jobs;
      options.progress = true;
      const SweepResult res = run_sweep(cands, options);
      const auto best = best_by_strategy(res);

      std::vector<Column> cols;
      for (Strategy s : kStrategies) {
        Column c;
        c.title = to_string(s);
        if (auto it = best.find(s); it != best.end()) {
          c.best = res.outcomes[it->second];
          c.report = c.best->analytic;
          if (refine != Fidelity::Analytic) {
            std::vector<Override> all = base_sets;
            for (const auto& [k, v] : c.best->sets) all.push_back({k, v});
            const SimulationInput in = simulation_input(load_scenario(args.path, all));
            std::fprintf(stderr, "ptdp: re-simulating the best %s plan (%s)\n", c.title.c_str(), to_string(refine).c_str());
            c.report = simulate(in, make_costed_schedule(in.model, in.plan, in.cluster), refine, false).report;
          }
          check_report(c.report);
        } else {
          for (const auto& o : res.outcomes)
            if (o.status == "oom" && strategy_of(o.plan) == s &&
                (c.smallest_oom_bytes == 0 || o.analytic.peak_memory_bytes < c.smallest_oom_bytes))
              c.smallest_oom_bytes = o.analytic.peak_memory_bytes;
        }
        cols.push_back(std::move(c));
      }
      print_columns(base, cols, cands.size(), refine);
      if (!json_path.empty()) {
        nlohmann::json j;
        const char* keys[] = {"megatron", "fsdp", "hybrid"};
        for (size_t i = 0; i < cols.size(); ++i)
          j[keys[i]] = cols[i].best ? nlohmann::json::parse(report_to_json(cols[i].report)) : nlohmann::json(nullptr);
        std::ofstream out(json_path);
        if (!out) throw EnvironmentError("cannot write '" + json_path + "'");
        out << j.dump(2) << "\n";
      }
      return 0;
    };
  });
}

}  // namespace ptdp::cli
