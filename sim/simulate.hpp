// The simulator front door: predict one iteration of a plan on a cluster at a chosen fidelity.
#pragma once

#include <optional>
#include <string>

#include "model/plan.hpp"
#include "model/transformer.hpp"
#include "schedules/schedule.hpp"
#include "schedules/timeline.hpp"
#include "topologies/cluster.hpp"

namespace ptdp {

enum class Fidelity { Analytic, Reduced, Full };
std::string to_string(Fidelity f);
/// "analytic" | "reduced" | "full"; throws ConfigError naming the choices.
Fidelity parse_fidelity(const std::string& text);

struct SimulationInput {
  TransformerSpec model;
  ParallelPlan plan;
  ClusterSpec cluster;
  std::optional<double> train_tokens;
  std::string config_json;  // copied into the report
  bool show_progress = false;  // SimGrid runs print progress on stderr every few seconds
};

struct SimulationResult {
  Report report;
  Timeline timeline;
  Schedule schedule;
  std::vector<std::string> warnings;  // e.g. does not fit in GPU memory
};

/// Simulates one training iteration. The plan must be valid (validate_plan). Analytic fidelity
/// is the cost-weighted critical path of the lowered schedule; reduced/full run SimGrid.
SimulationResult simulate(const SimulationInput& in, Fidelity fidelity, bool keep_timeline);

/// SimGrid run of a given lowered schedule (reduced or full), without the deadlock check, so a
/// stuck run is reported by the simulator itself (ScheduleError naming what each actor waits on).
/// `costs`, when given, replaces the cost model's durations (e.g. uniform costs in tests).
struct PlanCosts;
SimulationResult simulate_schedule(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                                   const PlanCosts* costs = nullptr);

/// Fills memory figures (peak per GPU, fits) into the report from the schedule's in-flight counts.
void add_memory(Report& r, const SimulationInput& in, const Schedule& s, std::vector<std::string>& warnings);

}  // namespace ptdp
