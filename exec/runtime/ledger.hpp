// The executor's ledger of what it really sends: every collective and transfer of every process
// group, with its bytes, booked to the schedule action running at the time. The conformance test
// (`ctest -R Conformance`) compares it with the lowering of communication
// (schedules/communication.hpp) that the engines price; `ptdp train --comm-ledger FILE` writes it.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "exec/runtime/communicator.hpp"
#include "model/grid.hpp"
#include "schedules/communication.hpp"
#include "schedules/schedule.hpp"

namespace ptdp::exec {

struct LedgerEntry {
  std::optional<Action> action;  // none: outside the schedule (set-up, loss report)
  CommGroup group = CommGroup::Tensor;
  int group_size = 1;
  StepKind kind = StepKind::AllReduce;
  double bytes = 0;  // as CommStep::bytes counts them
  bool bucketed = false;  // started by overlap_grad_reduce's buckets (booked to REDUCE_GRAD)
};

class CommLedger {
 public:
  /// The action the next entries belong to (std::nullopt: none).
  void set_action(std::optional<Action> a) { current_ = a; }
  void set_enabled(bool on) { enabled_ = on; }
  /// Whether the next entries are overlap_grad_reduce's buckets.
  void set_bucketed(bool on) { bucketed_ = on; }
  void add(CommGroup g, int size, StepKind kind, double bytes);
  const std::vector<LedgerEntry>& entries() const { return entries_; }
  /// JSON: {"rank": …, "pipeline_rank": …, "entries": [{"action", "group", "size", "kind", "bytes"}]}.
  std::string to_json(int rank, int pipeline_rank) const;

 private:
  std::optional<Action> current_;
  bool enabled_ = true;
  bool bucketed_ = false;
  std::vector<LedgerEntry> entries_;
};

/// Parses CommLedger::to_json (throws ConfigError naming `source` when malformed).
std::vector<LedgerEntry> ledger_from_json(const std::string& text, const std::string& source);

/// Bytes per (action, group, group size, kind): what the lowering says one pipeline rank's
/// communication actions (SEND/RECV, REDUCE_GRAD, OPTIM, UNSHARD/RESHARD) move, or what a ledger
/// booked to them. Collectives split into pieces (buckets, ZeRO pieces) add up to one entry.
struct TrafficKey {
  std::string action;
  CommGroup group;
  int group_size;
  StepKind kind;
  auto operator<=>(const TrafficKey&) const = default;
};
using Traffic = std::map<TrafficKey, double>;
Traffic expected_traffic(const Schedule& s, const ParallelPlan& plan, const TransformerSpec& spec, int pipeline_rank);
/// What `booked` moved in the rank's communication actions, and the tensor and context groups'
/// traffic of its compute actions with stage 3's unit gathers (sharding and reshard groups). (The gradient buckets overlap_grad_reduce starts inside a
/// stage's last backward are booked to its REDUCE_GRAD by the executor: the overlap changes when,
/// not what.) The other traffic of compute actions (experts, sharding units) is left out.
Traffic booked_traffic(const std::vector<LedgerEntry>& booked);
/// The expert groups' traffic inside compute actions (the dispatchers' all-to-alls over the
/// expert group, gathers and reduce-scatters over the expert-tensor and expert-model groups):
/// how much one rank moves depends on the routing, what all ranks of a pipeline rank move
/// together does not (dropless, each routes its tokens' k copies), so compare sums over them.
/// The routing metadata's all-gathers (tokens per expert; the allgather dispatcher's choices and
/// weights) are booked as the lowering's moe.dispatch.*.allgather steps.
Traffic expected_routed_traffic(const Schedule& s, const ParallelPlan& plan, const TransformerSpec& spec, int pipeline_rank);
Traffic booked_routed_traffic(const std::vector<LedgerEntry>& booked);
/// The REDUCE_GRAD steps the lowering marks bucketable (CommStep::bucketable: launched in
/// overlap_grad_reduce's buckets during the last backward) where the executor runs buckets
/// (overlap_grad_reduce, stages 0–1, more than one gradient rank, the first pipeline rank), and what a ledger booked as
/// buckets: the same groups, kinds and bytes, or the engines overlap other traffic than the run.
Traffic expected_bucketed_traffic(const Schedule& s, const ParallelPlan& plan, const TransformerSpec& spec, int pipeline_rank);
Traffic booked_bucketed_traffic(const std::vector<LedgerEntry>& booked);
/// One line per difference ("0REDUCE_GRAD: all-reduce over gradient (2 ranks): 4096 bytes
/// expected, 8192 booked"); sums within `slack_bytes` (padding to equal parts), and at most a
/// quarter of the expected figure, are equal.
std::vector<std::string> traffic_mismatches(const Traffic& expected, const Traffic& booked, double slack_bytes);

/// `inner` with every call booked into `ledger` as group `g` (a group of one books nothing).
std::unique_ptr<Communicator> make_recording_communicator(std::unique_ptr<Communicator> inner, CommGroup g, CommLedger& ledger);

/// Wraps every communicator of `groups` (world excepted) so that `ledger` books its traffic.
void record_traffic(ProcessGroups& groups, CommLedger& ledger);

}  // namespace ptdp::exec
