#include "sim/scenario_input.hpp"

namespace ptdp {

SimulationInput simulation_input(const Scenario& sc) {
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
