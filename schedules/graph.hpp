// The dependency graph of a lowered schedule (Boost.Graph): program order on each rank plus
// SEND → RECV edges. A cycle is a deadlock; the cost-weighted longest path is the iteration time
// when every action takes its cost and every rank runs one action at a time.
#pragma once

#include <cstdint>
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

/// Index of a transfer among the 2 · stages · m a schedule may hold, by direction, receiving
/// stage and microbatch; −1 when the stage or microbatch is out of range.
inline int64_t transfer_index(const Schedule& s, bool forward, int receiver_stage, int mb) {
  const int stages = s.num_stages();
  if (receiver_stage < 0 || receiver_stage >= stages || mb < 0 || mb >= s.m) return -1;
  const size_t cells = static_cast<size_t>(stages) * static_cast<size_t>(s.m);
  return static_cast<int64_t>((forward ? 0 : cells) + static_cast<size_t>(receiver_stage) * static_cast<size_t>(s.m) +
                              static_cast<size_t>(mb));
}

/// Throws the ScheduleError that names why a lowered schedule cannot run: check_deadlock_free's
/// message, else that its transfers do not pair up.
[[noreturn]] void throw_unrunnable(const Schedule& s);

/// The walk critical_path makes, for an engine that times the actions itself: every rank's
/// program runs in order, each rank as far as its receives allow, and every action starts when
/// its rank's previous action ended or, for a RECV, when its data arrived if that is later.
/// `timer` gives
///   double duration(int rank, const Action& a)           how long the action runs,
///   double transfer(int rank, const Action& send)        the time from a SEND's end to its
///                                                        data at the receiver,
/// and is told each action's times as soon as they are known (each rank's actions in program
/// order, the ranks interleaved; a SEND after its duration and transfer were asked):
///   void timed(int rank, size_t index, const Action& a, double start, double end,
///              int64_t transfer, bool started_by_data)
/// where `transfer` is the transfer_index of a SEND or RECV (−1 otherwise) and `started_by_data`
/// says a RECV started when its data arrived (not when its rank was free). No graph and no table
/// of all the actions' times is built. Throws as throw_unrunnable when a rank stays blocked or a
/// transfer is unmatched or doubled (after telling `timer` of the actions timed until then).
template <class Timer>
void time_programs(const Schedule& s, Timer& timer) {
  const size_t transfers = 2 * static_cast<size_t>(s.num_stages()) * static_cast<size_t>(s.m);
  std::vector<double> ready(transfers, -1.0);  // when a transfer's data is at the receiver
  std::vector<size_t> pc(static_cast<size_t>(s.p), 0);
  std::vector<double> clock(static_cast<size_t>(s.p), 0.0);
  size_t sends = 0, recvs = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.p; ++r) {
      const std::vector<Action>& acts = s.programs[r].actions;
      size_t i = pc[r];
      double now = clock[r];
      for (; i < acts.size(); ++i) {
        const Action& a = acts[i];
        double begin = now;
        int64_t k = -1;
        bool by_data = false;
        if (a.kind == ActionKind::RECV_F || a.kind == ActionKind::RECV_B) {
          k = transfer_index(s, a.kind == ActionKind::RECV_F, a.stage, a.microbatch);
          if (k < 0) throw_unrunnable(s);
          if (ready[k] < 0) break;  // blocked until the sender gets there
          if (ready[k] >= begin) begin = ready[k], by_data = true;
          ++recvs;
        }
        const double end = begin + timer.duration(r, a);
        now = end;
        if (a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B) {
          const bool fwd = a.kind == ActionKind::SEND_F;
          k = transfer_index(s, fwd, fwd ? a.stage + 1 : a.stage - 1, a.microbatch);
          if (k < 0 || ready[k] >= 0) throw_unrunnable(s);
          ready[k] = end + timer.transfer(r, a);
          ++sends;
        }
        timer.timed(r, i, a, begin, end, k, by_data);
      }
      if (i != pc[r]) progress = true;
      pc[r] = i;
      clock[r] = now;
    }
  }
  for (int r = 0; r < s.p; ++r)
    if (pc[r] < s.programs[r].actions.size()) throw_unrunnable(s);
  if (sends != recvs) throw_unrunnable(s);
}

}  // namespace ptdp
