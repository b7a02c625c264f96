#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "scenarios/scenario.hpp"
#include "schedules/schedule.hpp"
#include "sim/costing.hpp"

namespace ptdp::cli {

std::vector<Override> overrides_of(const ScenarioArgs& args);

namespace {

void print_summary(const Schedule& s) {
  std::cout << "schedule: p " << s.p << ", v " << s.v << ", m " << s.m << ", " << s.num_stages() << " stages"
            << (s.lanes == 2 ? " in 2 lanes (microbatches 0-" + std::to_string(s.m / 2 - 1) + " enter at rank " +
                                   std::to_string(s.stage_to_rank[0]) + ", " + std::to_string(s.m / 2) + "-" +
                                   std::to_string(s.m - 1) + " at rank " + std::to_string(s.stage_to_rank[s.lane_stages()]) + ")"
                             : std::string()) << ", "
            << s.num_actions() << " actions" << (s.lowered ? " (lowered)" : "") << "\n";
  const auto inflight = peak_inflight_activations(s);
  std::cout << "  rank  warm-up F  peak in-flight microbatch-chunks\n";
  for (int r = 0; r < s.p; ++r)
    std::printf("  %4d  %9d  %d\n", r, warmup_forwards(s, r), inflight[r]);
}

Schedule scenario_schedule(const ScenarioArgs& args) {
  const Scenario sc = load_scenario(args.path, overrides_of(args));
  return schedule_of(sc, "");
}

std::string read_schedule_file(const std::string& path) { return read_input_file(path, "schedule file"); }

}  // namespace

Schedule schedule_of(const Scenario& sc, const std::string& csv_path, bool check_deadlocks) {
  const ParallelPlan& plan = sc.plan;
  if (csv_path.empty()) {
    try {
      return make_costed_schedule(sc.model, plan, sc.cluster, check_deadlocks);
    } catch (const ScheduleError& e) {
      throw ConfigError("parallel.schedule", e.what());
    }
  }
  Schedule s = from_csv(read_schedule_file(csv_path), csv_path);
  try {
    return adopt_schedule(std::move(s), plan, csv_path);
  } catch (const ScheduleError& e) {
    throw ConfigError("--schedule", e.what(), SourceLocation{csv_path, 0, 0});
  }
}

void add_schedule(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("schedule", "show, export or import a pipeline schedule");
  cmd->require_subcommand(1);
  static ScenarioArgs show_args, export_args;
  static bool with_comm = false;
  static std::string csv_out, csv_in;

  auto* show = cmd->add_subcommand("show", "print each pipeline rank's actions as a text grid");
  add_scenario_args(show, show_args, true);
  show->add_flag("--comm", with_comm, "include send/recv, REDUCE_GRAD and OPTIM actions");
  show->callback([&run] {
    run = [] {
      Schedule s = scenario_schedule(show_args);
      print_summary(s);
      if (!with_comm)
        for (auto& prog : s.programs)
          std::erase_if(prog.actions, [](const Action& a) { return !is_compute(a.kind); });
      std::cout << "\n" << format_grid(s);
      return 0;
    };
  });

  auto* exp = cmd->add_subcommand("export", "write the schedule as CSV: --format pytorch (default) is current PyTorch's lowered "
                                              "form (WAIT_* actions, local hand-over between stages of one rank); lowered is ptdp's "
                                              "own (every send/recv, no waits, as PyTorch before 2.15 wrote it); compute is the "
                                              "compute actions only, what PyTorch's load_csv lowers itself");
  add_scenario_args(exp, export_args, true);
  exp->add_option("--csv", csv_out, "output CSV file (one row per pipeline rank)")->required()->type_name("FILE");
  static std::string format = "pytorch";
  exp->add_option("--format", format, "pytorch (default) | lowered | compute")
      ->check(CLI::IsMember({"pytorch", "lowered", "compute"}));
  exp->callback([&run] {
    run = [] {
      const Schedule s = scenario_schedule(export_args);
      // Refused before the file is opened: a DualPipe schedule has no PyTorch form.
      const std::string text = format == "pytorch" ? to_pytorch_csv(s) : to_csv(s, format == "compute");
      std::ofstream out(csv_out);
      if (!out) throw EnvironmentError("cannot write '" + csv_out + "'");
      out << text;
      if (!out) throw EnvironmentError("failed writing '" + csv_out + "'");
      const auto cells = std::count(text.begin(), text.end(), ',') + std::count(text.begin(), text.end(), '\n');
      std::cerr << "wrote " << s.p << " rows, " << cells << " actions to " << csv_out
                << (format == "compute" ? " (compute only)" : format == "lowered" ? " (ptdp's lowered form)" : " (PyTorch's lowered form)")
                << "\n";
      if (s.lanes != 1)
        std::cerr << "note: DualPipe's two lanes have no PyTorch equivalent: ptdp reads this file back, "
                     "torch.distributed.pipelining cannot run it\n";
      return 0;
    };
  });

  auto* imp = cmd->add_subcommand("import", "read a PyTorch-style schedule CSV, validate it (deadlocks too) and print it");
  imp->add_option("FILE", csv_in, "schedule CSV")->required();
  imp->callback([&run] {
    run = [] {
      const Schedule s = from_csv(read_schedule_file(csv_in), csv_in);
      print_summary(s);
      std::cout << "\n" << format_grid(s);
      return 0;
    };
  });
}

}  // namespace ptdp::cli
