// The process grid: which global rank holds which coordinates, and which ranks form each
// communication group. The one place that knows the rank order (Megatron-Core's RankGenerator:
// tensor fastest, then context, then data, then pipeline; the experts' own order over the same
// t·cp·d ranks of a pipeline stage: expert-tensor fastest, then expert, then expert-data).
// The cost model, pricing, both engines and the executor's communicator splits ask it.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "model/plan.hpp"

namespace ptdp {

/// The ranks a communication runs over. The first six are the groups inside a layer (model/cost.hpp
/// Op::group); the others are the groups of the schedule's REDUCE_GRAD, OPTIM, UNSHARD and
/// transfers (schedules/communication.hpp).
enum class CommGroup {
  Tensor,         // t ranks, adjacent
  Context,        // cp ranks, t apart
  Expert,         // ep ranks, etp apart
  ExpertTensor,   // etp ranks, adjacent
  ExpertModel,    // etp·ep ranks, adjacent
  Pipeline,       // p ranks, t·cp·d apart
  Gradient,       // the d·cp ranks holding the same dense weights (Megatron's data-parallel group with context), t apart
  Sharding,       // the N of them sharing one copy of the sharded states (ZeRO / FSDP), t apart
  ShardReplicas,  // the ranks holding the same shard in the other sharding groups (hybrid), t·N apart
  Reshard,        // reshard_after_forward N: N consecutive members of the sharding group, t apart
  ExpertData,     // the ranks holding the same routed experts: t·cp·d / (etp·ep), etp·ep apart
  Model,          // the t·p ranks of one replica (gradient norm): tensor × pipeline
  Pair,           // this rank and one other pipeline rank: the tied embedding's two copies, DualPipe's mirror
};
std::string_view to_string(CommGroup g);

/// Coordinates of one rank. `cp` and `dp` are the context and data ranks (the executor's data
/// group index is cp + cp·dp); `ep`, `etp`, `edp` the rank's place among the experts.
struct GridCoord {
  int64_t tp = 0, cp = 0, dp = 0, pp = 0;
  int64_t etp = 0, ep = 0, edp = 0;
};

class ProcessGrid {
 public:
  explicit ProcessGrid(const ParallelPlan& plan);
  /// From the degrees themselves: tensor, context, data, pipeline, expert, expert-tensor (0 = t),
  /// sharding group size N (1 = not sharded), the reshard group's size (plan.hpp reshard_group;
  /// 0 = N).
  ProcessGrid(int64_t t, int64_t cp, int64_t d, int64_t p, int64_t ep = 1, int64_t etp = 0, int64_t n_shard = 1,
              int64_t n_reshard = 0);

  int64_t world() const { return t_ * cp_ * d_ * p_; }
  GridCoord coord(int64_t rank) const;
  int64_t rank(int64_t tp, int64_t cp, int64_t dp, int64_t pp) const;
  /// The rank at tensor rank `tp`, pipeline rank `pp` and index `gradient_index` in its Gradient
  /// group (cp + cp·dp: the engines' and the executor's replica index over data × context).
  int64_t rank_at(int64_t tp, int64_t gradient_index, int64_t pp) const { return rank(tp, gradient_index % cp_, gradient_index / cp_, pp); }
  /// Size of a group (Pair: 2, Model: t·p).
  int64_t size(CommGroup g) const;
  /// Global-rank distance between consecutive members of a group with evenly spaced members
  /// (every group but Model and Pair, whose stride is 0 here).
  int64_t stride(CommGroup g) const;
  /// The members of `rank`'s group, in group-rank order. Pair: `rank` and the rank with the same
  /// tensor, context and data coordinates on pipeline rank `pair_pipeline_rank`, lower first.
  std::vector<int64_t> members(CommGroup g, int64_t rank, int64_t pair_pipeline_rank = -1) const;
  /// This rank's index in its group (the communicator rank).
  int64_t index_in(CommGroup g, int64_t rank) const;
  /// A value equal for exactly the ranks of one group (an MPI split color). Pair is not coloured
  /// (pairs overlap): -1.
  int64_t color(CommGroup g, int64_t rank) const;

 private:
  int64_t t_, cp_, d_, p_, ep_, etp_, n_shard_, n_reshard_;
};

}  // namespace ptdp
