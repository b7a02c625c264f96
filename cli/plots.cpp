// Runs the Python/matplotlib plot scripts under scripts/ (Debian's python3-matplotlib).
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp::cli {

int run_plot_script(const std::string& script, const std::vector<std::string>& args) {
  const std::string path = (std::filesystem::path(data_dir()) / "scripts" / script).string();
  if (!std::filesystem::exists(path)) throw EnvironmentError("plot script not found: " + path);
  // Debian's interpreter has python3-matplotlib; a python3 earlier on PATH (pyenv, venv) may not.
  const std::string python = std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  std::vector<std::string> argv_s = {python, path};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw EnvironmentError(std::string("cannot start python3: ") + std::strerror(errno));
  if (pid == 0) {
    ::execvp(argv[0], argv.data());
    std::_Exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    throw EnvironmentError("python3 not found: install Debian's python3-matplotlib (./scripts/setup.sh does)");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace ptdp::cli
