// Running other programs from the CLI (plot scripts, mpirun): fork + exec, wait, exit status.
#pragma once

#include <string>
#include <vector>

namespace ptdp::cli {

/// Runs argv[0] (looked up on PATH) with its arguments and waits for it. With `output_path`,
/// its stdout and stderr go to that file. Returns the exit status (128 + signal when killed).
/// Throws EnvironmentError when the program cannot be started; `install_hint` says how to get it.
int run_program(const std::vector<std::string>& argv, const std::string& output_path, const std::string& install_hint);

}  // namespace ptdp::cli
