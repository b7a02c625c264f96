// The simulator's input for a loaded scenario: what the CLI and the tests both simulate.
#pragma once

#include "scenarios/scenario.hpp"
#include "sim/simulate.hpp"

namespace ptdp {

/// The model, plan, cluster, token budget and prices of `sc`, as `ptdp simulate` runs them.
SimulationInput simulation_input(const Scenario& sc);

}  // namespace ptdp
