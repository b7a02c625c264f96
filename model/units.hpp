// The parameters of a pipeline stage on one tensor-parallel rank, unit by unit: the one count
// that gradient reductions (schedules/communication.hpp), sharding units (ZeRO-3 gathers, ZeRO-2/3
// reduce-scatters), the optimizer and memory read.
#pragma once

#include <vector>

#include "model/plan.hpp"
#include "model/transformer.hpp"

namespace ptdp {

/// Local parameters of one stage (per TP rank). A unit is what an FSDP unit gathers at once: the
/// embedding (first stage of a lane), each transformer layer, a layout's MTP modules (their stage),
/// the final norm with the output layer (last stage), vocabulary parallelism's share of the output layer (every stage).
struct StageParameters {
  std::vector<double> units;  // in forward order
  double total = 0;           // sum of units
  double expert = 0;          // of total: the routed experts' (reduced over their expert-data ranks)
  /// Of total: the parameters every TP rank holds whole (norms, row-parallel biases, positions),
  /// whose gradients sequence parallelism leaves partial per TP rank.
  double replicated = 0;
  /// The word-embedding shard of a model with tied embeddings when the stage holds one of its two
  /// copies on a different pipeline rank from the other (first and last stage apart): the part
  /// summed with the other copy. 0 otherwise.
  double tied_embedding = 0;
  int tied_with_stage = -1;  // the stage holding the other copy (-1: none)
  bool has_embedding = false, has_head = false, has_vocab_share = false;
  /// The multi-token-prediction modules as a unit of their own, after the layers: a layout's MTP
  /// stage before the last (ParallelPlan::mtp_apart). Else they are in the head's unit.
  bool has_mtp = false;
};

/// One tensor rank's parameters of each kind of unit, from the declared tensors (they read the
/// model and t, ep, etp alone: ActivationBytesMemo keeps them per (t, ep, etp)). `partial`: the
/// replicated ones whose gradient sequence parallelism leaves partial.
struct UnitCounts {
  struct Local {
    double all = 0, expert = 0, partial = 0;
  };
  Local embedding, norm, dense, moe, mtp;
  double vocab_shard = 0;
};

/// `stage_to_rank`: the schedule's placement (empty: the plan's, model/partition.hpp).
StageParameters stage_parameters(const TransformerSpec& spec, const ParallelPlan& plan, int stage,
                                 const std::vector<int>& stage_to_rank = {});
/// stage_parameters of every stage, in stage order (what the stages share computed once).
std::vector<StageParameters> stage_parameters_all(const TransformerSpec& spec, const ParallelPlan& plan,
                                                  const std::vector<int>& stage_to_rank = {});

}  // namespace ptdp

namespace ptdp {

/// Bytes of the tensor crossing a pipeline boundary for one microbatch (per TP rank before any
/// scatter/gather): b · (s / cp) · h elements of the plan's precision — each context rank sends
/// its own part of the sequence.
double pipeline_boundary_bytes(const TransformerSpec& spec, const ParallelPlan& plan);

/// Whether a pipeline transfer is scattered over the tensor ranks (1/t each) and all-gathered on
/// arrival: asked by the plan, t > 1, no sequence parallelism (which keeps the tensor in
/// sequence shards already), and the boundary tensor's b·(s/cp)·h elements divide by t. The
/// engines, the lowering and the executor all ask this one rule.
bool scatter_gather_applies(const TransformerSpec& spec, const ParallelPlan& plan);

}  // namespace ptdp
