// `ptdp plot`: the charts of scripts/ (Python + matplotlib), for files ptdp wrote.
#include "cli/commands.hpp"
#include "core/error.hpp"

namespace ptdp::cli {

int run_plot_script(const std::string& script, const std::vector<std::string>& args);

void add_plot(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("plot", "draw a chart (PNG) from traces or CSV files ptdp wrote");
  cmd->require_subcommand(1);
  static std::string out, predicted, measured, csv, title;

  auto* tl = cmd->add_subcommand("timeline", "pipeline timeline: predicted trace above measured trace, one row per rank");
  tl->add_option("OUT.png", out, "output PNG")->required();
  tl->add_option("PREDICTED", predicted, "trace of ptdp simulate --trace")->required()->check(CLI::ExistingFile);
  tl->add_option("MEASURED", measured, "trace of ptdp train --trace")->check(CLI::ExistingFile);
  tl->callback([&run] {
    run = [] {
      std::vector<std::string> a = {out, predicted};
      if (!measured.empty()) a.push_back(measured);
      if (run_plot_script("plot_timeline.py", a) != 0) throw EnvironmentError("plot_timeline.py failed");
      return 0;
    };
  });

  auto* sw = cmd->add_subcommand("sweep", "throughput by (t, p) per micro batch from a ptdp sweep CSV");
  sw->add_option("CSV", csv, "CSV of ptdp sweep --csv")->required()->check(CLI::ExistingFile);
  sw->add_option("OUT.png", out, "output PNG")->required();
  sw->add_option("--title", title, "chart title");
  sw->callback([&run] {
    run = [] {
      std::vector<std::string> a = {csv, out};
      if (!title.empty()) a.push_back(title);
      if (run_plot_script("plot_sweep.py", a) != 0) throw EnvironmentError("plot_sweep.py failed");
      return 0;
    };
  });

  auto* va = cmd->add_subcommand("validation", "predicted vs measured throughput from a ptdp validate CSV");
  va->add_option("CSV", csv, "CSV of ptdp validate --suite … --csv")->required()->check(CLI::ExistingFile);
  va->add_option("OUT.png", out, "output PNG")->required();
  va->add_option("--title", title, "chart title");
  va->callback([&run] {
    run = [] {
      std::vector<std::string> a = {csv, out};
      if (!title.empty()) a.push_back(title);
      if (run_plot_script("plot_validation.py", a) != 0) throw EnvironmentError("plot_validation.py failed");
      return 0;
    };
  });
}

}  // namespace ptdp::cli
