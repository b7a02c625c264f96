// Runs the Python/matplotlib plot scripts under scripts/ (Debian's python3-matplotlib).
#include <filesystem>
#include <string>
#include <vector>

#include "cli/process.hpp"
#include "core/error.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp::cli {

int run_plot_script(const std::string& script, const std::vector<std::string>& args) {
  const std::string path = (std::filesystem::path(data_dir()) / "scripts" / script).string();
  if (!std::filesystem::exists(path)) throw EnvironmentError("plot script not found: " + path);
  // Debian's interpreter has python3-matplotlib; a python3 earlier on PATH (pyenv, venv) may not.
  const std::string python = std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  std::vector<std::string> argv = {python, path};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv, "", "install Debian's python3-matplotlib (./scripts/setup.sh does)");
}

}  // namespace ptdp::cli
