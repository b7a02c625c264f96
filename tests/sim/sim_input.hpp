// Tests simulate a loaded scenario as the CLI does (sim/scenario_input.hpp).
#pragma once

#include "sim/scenario_input.hpp"

namespace ptdp {

inline SimulationInput input_of(const Scenario& sc) { return simulation_input(sc); }

}  // namespace ptdp
