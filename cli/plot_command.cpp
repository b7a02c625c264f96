// `ptdp plot`: the charts of scripts/ (Python + matplotlib), for files ptdp wrote.
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "interop/nsight.hpp"

namespace ptdp::cli {

int run_plot_script(const std::string& script, const std::vector<std::string>& args);

namespace {
// The scripts exit 2 on bad input after saying why on stderr: pass that on; other failures are
// the environment's (Python, matplotlib).
int plot_exit_code(int rc, const std::string& script) {
  if (rc == 0 || rc == 2) return rc;
  throw EnvironmentError(script + " failed (exit " + std::to_string(rc) + ")");
}
}  // namespace

void add_plot(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("plot", "draw a chart (PNG) from traces or CSV files ptdp wrote");
  cmd->require_subcommand(1);
  static std::string out, predicted, measured, csv, title, from, to;

  auto* tl = cmd->add_subcommand("timeline", "pipeline timeline: predicted trace above measured trace on one time axis, one row per rank");
  tl->add_option("OUT.png", out, "output PNG")->required();
  tl->add_option("PREDICTED", predicted, "trace of ptdp simulate --trace")->required()->check(CLI::ExistingFile);
  tl->add_option("MEASURED", measured, "trace of ptdp train --trace, or a measured trace of one rank: PyTorch profiler (Kineto) JSON or Nsight Systems SQLite or JSON export")
      ->check(CLI::ExistingFile);
  tl->add_option("--from", from, "start of the window: a microbatch (12 or 12mb) or a time (1.5s, 300ms)")->type_name("MB|TIME");
  tl->add_option("--to", to, "end of the window: the last microbatch shown, or a time")->type_name("MB|TIME");
  tl->callback([&run] {
    run = [] {
      std::vector<std::string> a = {out, predicted};
      // A PyTorch profiler trace: its kernels by class, as a ptdp trace in a temporary file.
      // Removed however the command ends (the guard exists before the file does).
      struct Remove {
        std::string path;
        ~Remove() {
          std::error_code ec;
          if (!path.empty()) std::filesystem::remove(path, ec);
        }
      } remove;
      std::string converted;
      if (!measured.empty()) {
        const std::string text = read_input_file(measured, "measured trace");
        if (is_sqlite_file(text) || is_nsight_json(text) || is_kineto_trace(text)) {
          const std::string json = kernel_trace_json(read_measured_trace(text, measured), 0);
          converted = (std::filesystem::temp_directory_path() /
                       ("ptdp-kernels-" + std::to_string(::getpid()) + ".json")).string();
          remove.path = converted;
          std::ofstream f(converted);
          f << json;
          if (!f) throw EnvironmentError("cannot write the converted trace " + converted);
        }
      }
      if (!measured.empty()) a.push_back(converted.empty() ? measured : converted);
      if (!converted.empty()) a.insert(a.end(), {"--measured-name", measured + " (measured kernels by class)"});
      if (!from.empty()) a.insert(a.end(), {"--from", from});
      if (!to.empty()) a.insert(a.end(), {"--to", to});
      return plot_exit_code(run_plot_script("plot_timeline.py", a), "plot_timeline.py");
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
      return plot_exit_code(run_plot_script("plot_sweep.py", a), "plot_sweep.py");
    };
  });

  auto* va = cmd->add_subcommand("validation", "predicted vs measured iteration time from a ptdp validate CSV");
  va->add_option("CSV", csv, "CSV of ptdp validate --suite … --csv")->required()->check(CLI::ExistingFile);
  va->add_option("OUT.png", out, "output PNG")->required();
  va->add_option("--title", title, "chart title");
  va->callback([&run] {
    run = [] {
      std::vector<std::string> a = {csv, out};
      if (!title.empty()) a.push_back(title);
      return plot_exit_code(run_plot_script("plot_validation.py", a), "plot_validation.py");
    };
  });
}

}  // namespace ptdp::cli
