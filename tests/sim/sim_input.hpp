// The simulator's input for a loaded scenario, as the CLI builds it (cli/simulate_command.cpp's
// simulation_input; sim does not depend on scenarios, so tests carry their own copy of the few
// fields).
#pragma once

#include "scenarios/scenario.hpp"
#include "sim/simulate.hpp"

namespace ptdp {

inline SimulationInput input_of(const Scenario& sc) {
  SimulationInput in;
  in.model = sc.model;
  in.plan = sc.plan;
  in.cluster = sc.cluster;
  in.train_tokens = sc.train_tokens;
  in.config_json = sc.config_json;
  in.gpu_hour_usd = sc.gpu_hour_usd;
  in.energy_usd_per_kwh = sc.energy_usd_per_kwh;
  return in;
}

}  // namespace ptdp
