// Lowering of communication: what each action of a lowered schedule sends, to whom, how much —
// the content schedules/schedule.hpp defines, as typed steps. One function of (schedule, plan,
// layer description, process grid) decides it; the analytic engine prices these steps, SimGrid
// turns them into flows, and the executor performs them (its ledger of what it really sent is
// compared with them by the conformance test, `ctest -R Conformance`).
//
// Covered: SEND/RECV, REDUCE_GRAD, OPTIM, UNSHARD/RESHARD, and the in-layer collectives of
// F/B/I/W, read from the layer description's op lists (model/cost.hpp) — the list pricing times.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/grid.hpp"
#include "model/plan.hpp"
#include "model/transformer.hpp"
#include "model/units.hpp"
#include "schedules/schedule.hpp"

namespace ptdp {

enum class StepKind : uint8_t {
  AllReduce,      // sum of a buffer of `bytes` over the group
  ReduceScatter,  // sum of each member's `bytes`, 1/size of it kept by each
  AllGather,      // each member's 1/size of `bytes` to all: `bytes` out
  Send,           // `bytes` on this device's link to the peer stage's rank
  Recv,           // `bytes` from the peer stage's rank
  Wait,           // completion of communication started by an earlier action (no new bytes)
  AllToAll,       // each member's `bytes` spread over the group (MoE dispatch/combine: routing decides the split)
};
std::string_view to_string(StepKind k);

struct CommStep {
  StepKind kind = StepKind::AllReduce;
  CommGroup group = CommGroup::Gradient;
  double bytes = 0;
  /// Send/Recv: the stage at the other end; Pair: the stage whose rank is the other member.
  int peer_stage = -1;
  /// What moves ("dense gradients", "gradient norm", …), for reports and mismatch messages.
  std::string what;
  /// Part of the data-parallel reduction that overlap_grad_reduce may launch in buckets during the
  /// stage's last backward (the when changes, not the what).
  bool bucketable = false;
};

/// "all-reduce 1.5MB over gradient (dense gradients)".
std::string describe(const CommStep& step);

/// One plan's lowering of communication: what every engine and the executor do for each action
/// of the lowered schedule `s` for `plan` and `spec`. Built once per plan (it derives the plan's
/// process grid and its stages' parameter counts); `s`, `plan` and `spec` must outlive it.
class Lowering {
 public:
  Lowering(const Schedule& s, const ParallelPlan& plan, const TransformerSpec& spec);

  /// The communication of action `a` on pipeline rank `rank`. Compute actions (F, B, I, W) hold
  /// the collectives of the layer description's op lists (model/cost.hpp) for the stage's units
  /// in that pass, and under stage 3 the units' parameter all-gathers (sharding group in F,
  /// reshard group in B and I). The groups are the ProcessGrid's (model/grid.hpp) of the device's own
  /// coordinates; sizes of 1 give no step.
  std::vector<CommStep> steps(int rank, const Action& a) const;

  const ProcessGrid& grid() const { return grid_; }
  /// stage_parameters_all(spec, plan, s.stage_to_rank): each stage's parameters and units.
  const std::vector<StageParameters>& stages() const { return stages_; }

 private:
  const Schedule& s_;
  const ParallelPlan& plan_;
  const TransformerSpec& spec_;
  ProcessGrid grid_;
  std::vector<StageParameters> stages_;
};

/// Lowering(s, plan, spec).steps(rank, a), for a caller lowering one action of a plan.
std::vector<CommStep> communication_steps(const Schedule& s, const ParallelPlan& plan, const TransformerSpec& spec, int rank,
                                          const Action& a);

}  // namespace ptdp
