// SimGrid fidelities (reduced, full). Filled in by the simulator issue.
#include "core/error.hpp"
#include "sim/simulate.hpp"

namespace ptdp {

SimulationResult simulate_simgrid(const SimulationInput&, Fidelity fidelity, bool) {
  throw ConfigError("--fidelity", "fidelity '" + to_string(fidelity) + "' is not available yet; use --fidelity analytic");
}

}  // namespace ptdp
