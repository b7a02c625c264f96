// The simulator front door: predict one iteration of a plan on a cluster at a chosen fidelity.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/plan.hpp"
#include "model/transformer.hpp"
#include "schedules/schedule.hpp"
#include "report/timeline.hpp"
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
  std::optional<double> gpu_hour_usd{};  // price of a GPU-hour (cost_usd in the report)
  double energy_usd_per_kwh = 0;       // electricity price added to it
};

struct SimulationResult {
  Report report;
  Timeline timeline;
  Schedule schedule;
  std::vector<std::string> warnings;  // e.g. does not fit in GPU memory
};

struct PlanCosts;
/// Simulates one training iteration of the lowered schedule `s` (make_schedule(in.plan), or one
/// from a CSV that adopt_schedule fitted to the plan). The plan must be valid (validate_plan).
/// Analytic fidelity is the cost-weighted critical path; reduced/full run SimGrid (in a child
/// process), without a separate deadlock check: a stuck run is reported by the simulator
/// itself (ScheduleError naming what each actor waits on). `costs`, when given, replaces the
/// cost model's durations (e.g. uniform costs in tests).
SimulationResult simulate(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline,
                          const PlanCosts* costs = nullptr);
/// The same with a schedule the result may take over (SimulationResult::schedule) instead of
/// copying it: 200 000 actions for the 1T plan.
SimulationResult simulate(const SimulationInput& in, Schedule&& s, Fidelity fidelity, bool keep_timeline,
                          const PlanCosts* costs = nullptr);

/// simulate()'s report alone: no timeline, and no copy of the schedule in a result (what a
/// sweep keeps of each plan it simulates).
Report simulate_report(const SimulationInput& in, const Schedule& s, Fidelity fidelity, const PlanCosts* costs = nullptr);

/// A SimGrid simulation running in a forked child process (SimGrid allows one engine per
/// process). Poll `fd` for readability, call read_some() until it returns false, then finish().
struct SimulationJob {
  int pid = -1;
  int fd = -1;
  std::string data;
  Schedule schedule;
  /// Reads what the child has written so far; false once the child closed the pipe.
  bool read_some();
  /// Waits for the child and returns its result, or rethrows its error (ConfigError,
  /// ScheduleError, EnvironmentError — also when the child died). Once: the result takes the
  /// job's schedule.
  SimulationResult finish();
};
/// Starts a reduced or full simulation of a lowered schedule without waiting for it.
SimulationJob start_simulation(const SimulationInput& in, const Schedule& s, Fidelity fidelity, bool keep_timeline);

/// Reduced or full simulations of several plans, each in a child process as start_simulation's,
/// where the children of plans with the same platform shape (platform.hpp: the cluster's links
/// and the GPU count) are forked from one server process that created SimGrid's engine and built
/// that platform's hosts and links once: a sweep's top ten on 16 384 GPUs build them once, not ten
/// times. The children are this process's own (a child-subreaper while the pool lives), so jobs
/// are polled, killed and finished as start_simulation's. A child runs the schedule given for its
/// plan, or makes the plan's own (make_costed_schedule) itself; the job's `schedule` stays empty.
class SimulationPool {
 public:
  /// `inputs` (the plans start() may run; null entries are skipped) must outlive the pool and not
  /// change: the server sees them as they were when it was forked here. The server is built for
  /// the shape of the first plan; the others with that shape use it. `schedules` (by input; empty,
  /// or null entries: none) are the plans' lowered schedules when the caller has them already
  /// (make_costed_schedule's, e.g. a sweep's analytic pass): the children run them instead of
  /// making them again. They must outlive the pool and not change, like the inputs.
  explicit SimulationPool(std::vector<const SimulationInput*> inputs, std::vector<const Schedule*> schedules = {});
  ~SimulationPool();
  SimulationPool(const SimulationPool&) = delete;
  SimulationPool& operator=(const SimulationPool&) = delete;
  /// Starts inputs[i]'s simulation: from the server when it has the plan's shape, else forked
  /// here (start_simulation). Throws EnvironmentError when no process could be made.
  SimulationJob start(size_t i, Fidelity fidelity);
  /// Whether inputs[i] would start from the server (its platform's shape).
  bool serves(size_t i) const { return i < served_.size() && served_[i] && socket_ >= 0; }

 private:
  std::vector<const SimulationInput*> inputs_;
  std::vector<const Schedule*> schedules_;  // by input (nullptr: the child makes it)
  std::vector<bool> served_;  // by input: the server has its shape
  int server_pid_ = -1;
  int socket_ = -1;
  int was_subreaper_ = 0;
};

/// Fills memory figures (peak per GPU, fits) into the report from the schedule's in-flight counts.
void add_memory(Report& r, const SimulationInput& in, const Schedule& s, std::vector<std::string>& warnings);

}  // namespace ptdp
