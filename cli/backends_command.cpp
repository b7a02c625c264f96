// `ptdp backends`: which executor back ends were built and which can run on this machine.
#include <cstdio>

#include "cli/commands.hpp"
#include "exec/runtime/cuda/cuda.hpp"

namespace ptdp::cli {

void add_backends(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("backends", "list the executor back ends: compiled, and usable now");
  cmd->callback([&run] {
    run = [] {
      std::printf("cpu: compiled, usable (Eigen fp32 kernels, MPI communicator)\n");
      std::printf("%s\n", exec::cuda::cuda_status().c_str());
      return 0;
    };
  });
}

}  // namespace ptdp::cli
