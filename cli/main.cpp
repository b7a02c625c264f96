// ptdp: plan, predict and run PTD-P training of large language models.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "schedules/schedule.hpp"

namespace {

// Help shows what a value is (FILE, DIR, the choices), never CLI11's bare "TEXT": positional
// arguments are named by themselves (SCENARIO, OUT.png); named options by this table.
void name_value_types(CLI::App& app) {
  static const std::map<std::string, std::string> kinds = {
      {"--data", "FILE|PREFIX"},      {"--checkpoint", "DIR"},    {"--out", "FILE"},      {"--csv", "FILE.csv"},
      {"--plot", "FILE.png"},         {"--out-dir", "DIR"},       {"--profile", "FILE"},  {"--measured", "RUNS.csv"},
      {"--base", "PRESET|FILE"},      {"--topology", "PRESET|FILE"}, {"--backend", "cpu|cuda"},
      {"--fidelity", "analytic|reduced|full"}, {"--rank-by", "time|cost|energy"}, {"--suite", "cpu"},
      {"--fit", "P1,P2,…"},           {"--json", "FILE"},         {"--trace", "FILE"},    {"--title", "TITLE"}};
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    if (type.rfind("TEXT", 0) != 0) continue;
    if (type.find(":FILE") != std::string::npos) {  // ExistingFile: the type name says FILE already
      try {
        opt->get_validator(0)->description("");
      } catch (const CLI::Error&) {
      }
    }
    if (opt->get_positional()) {
      opt->type_name("");
      continue;
    }
    const auto it = opt->get_lnames().empty() ? kinds.end() : kinds.find("--" + opt->get_lnames().front());
    opt->type_name(it != kinds.end() ? it->second : "VALUE");
  }
  for (CLI::App* sub : app.get_subcommands({})) name_value_types(*sub);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ptdp — plan, predict and run tensor/pipeline/data-parallel (PTD-P) LLM training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "ptdp 0.1.0");
  ptdp::cli::Runner run;
  ptdp::cli::add_simulate(app, run);
  ptdp::cli::add_schedule(app, run);
  ptdp::cli::add_bench(app, run);
  ptdp::cli::add_cost(app, run);
  ptdp::cli::add_sweep(app, run);
  ptdp::cli::add_compare_strategies(app, run);
  ptdp::cli::add_compare(app, run);
  ptdp::cli::add_plot(app, run);
  ptdp::cli::add_train(app, run);
  ptdp::cli::add_calibrate(app, run);
  ptdp::cli::add_validate(app, run);
  ptdp::cli::add_backends(app, run);
  ptdp::cli::add_checkpoint(app, run);
  ptdp::cli::add_import(app, run);
  ptdp::cli::add_export(app, run);
  ptdp::cli::add_keys(app, run);
  name_value_types(app);
  // An unknown command is named (CLI11 alone would only say that a subcommand is required).
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  if (argc > 1 && argv[1][0] != '-' && std::find(names.begin(), names.end(), argv[1]) == names.end()) {
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
    std::cerr << "ptdp: error: unknown command '" << argv[1] << "'" << ptdp::did_you_mean(argv[1], names)
              << "; commands: " << list << " (ptdp --help)\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    return run ? run() : 0;
  } catch (const ptdp::ConfigError& e) {
    std::cerr << "ptdp: error: " << e.what() << "\n";
    return 2;
  } catch (const ptdp::EnvironmentError& e) {
    std::cerr << "ptdp: error: " << e.what() << "\n";
    return 1;
  } catch (const ptdp::ScheduleError& e) {
    std::cerr << "ptdp: error: " << e.what() << "\n";
    return 2;
  } catch (const ptdp::InternalError& e) {
    std::cerr << "ptdp: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "ptdp: error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ptdp: error: " << e.what() << "\n";
    return 1;
  }
}
