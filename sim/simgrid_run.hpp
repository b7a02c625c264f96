// The SimGrid engine's entry points inside sim/ (callers use simulate() in sim/simulate.hpp).
#pragma once

#include "sim/simulate.hpp"

namespace ptdp {

struct PlanCosts;
struct PlatformShape;

/// Creates SimGrid's engine in this process, configured as every run's, and builds the hosts and
/// links of a platform of `shape` (build_hosts_and_links), for the run_simgrid_here that follows
/// in this process or in a child forked from it (SimulationPool's server): a run whose cluster
/// and GPU count have this shape takes them instead of building its own; a run of another shape
/// is a bug (one engine per process). At most once per process, before any run.
void prepare_simgrid_platform(const PlatformShape& shape);

/// Runs the SimGrid simulation in this process. SimGrid allows one engine per process: only a
/// process that never ran one (the child of start_simulation_job) may call it, once. The result's
/// `schedule` is left empty (the caller holds it).
SimulationResult run_simgrid_here(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                                  const PlanCosts* costs);

/// run_simgrid_here in a forked child; the result arrives through SimulationJob.
SimulationJob start_simulation_job(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                                   const PlanCosts* costs);

/// start_simulation_job(…).finish().
SimulationResult simulate_simgrid(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                                  const PlanCosts* costs);

}  // namespace ptdp
