// ptdp: plan, predict and run PTD-P training of large language models.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <iostream>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "schedules/schedule.hpp"

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
  ptdp::cli::add_compare(app, run);
  ptdp::cli::add_plot(app, run);
  ptdp::cli::add_train(app, run);
  ptdp::cli::add_calibrate(app, run);
  ptdp::cli::add_validate(app, run);
  ptdp::cli::add_backends(app, run);
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
