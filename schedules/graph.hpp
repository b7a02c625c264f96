// The dependency graph of a lowered schedule (Boost.Graph): program order on each rank plus
// SEND → RECV edges. A cycle is a deadlock; the cost-weighted longest path is the iteration time
// when every action takes its cost and every rank runs one action at a time.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "schedules/schedule.hpp"

namespace ptdp {

/// Throws ScheduleError naming the stuck actions when the lowered schedule can deadlock: a RECV
/// without its SEND, a SEND nobody receives, or a cycle of waits.
void check_deadlock_free(const Schedule& s);

/// Cost of an action on a pipeline rank (seconds or any unit), and of the transfer behind a
/// SEND → RECV edge.
struct ActionCosts {
  std::function<double(int rank, const Action&)> duration;
  std::function<double(int rank, const Action& send)> transfer;  // may be empty = 0
};

struct ScheduledAction {
  double start = 0;
  double end = 0;
};

struct CriticalPath {
  double makespan = 0;
  /// Per rank, per action index of the rank's program: when it ran.
  std::vector<std::vector<ScheduledAction>> times;
  /// The chain of (rank, action index) that determines the makespan, first to last.
  std::vector<std::pair<int, int>> path;
};

/// Longest path through the dependency graph with the given costs (the schedule must be
/// lowered and deadlock-free; throws ScheduleError otherwise).
CriticalPath critical_path(const Schedule& s, const ActionCosts& costs);

}  // namespace ptdp
