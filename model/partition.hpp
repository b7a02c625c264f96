// How the layers of the model are placed on the p·v pipeline stages: uniform (Megatron-LM's
// l / (p·v) rule), an explicit list, Megatron's first/last-stage counts, or balanced by the cost
// model. Every consumer (costing, memory, schedule checks, the executor's stage construction)
// reads the counts from stage_layers(), so all of them agree on one partition.
#pragma once

#include <cstdint>
#include <vector>

#include "model/cost.hpp"
#include "model/plan.hpp"
#include "model/transformer.hpp"

namespace ptdp {

/// Checks the plan's partition keys against the model (the stages of one lane, ParallelPlan::
/// lanes: DualPipe's layers_per_stage has p entries): a layers_per_stage list of p·v positive
/// entries summing to num_layers; first/last_stage_layers leaving the other stages an equal,
/// non-zero share; uniform only when p·v divides num_layers (the message names the options);
/// balanced only with at least one layer per stage. Throws ConfigError naming the key.
void validate_partition(const TransformerSpec& spec, const ParallelPlan& plan);

/// Layers of each stage (p·v entries, stage order; DualPipe's second lane repeats the first's).
/// The plan must be valid; a balanced plan
/// must have been resolved (resolve_partition) — asserts otherwise.
std::vector<int64_t> stage_layers(const TransformerSpec& spec, const ParallelPlan& plan);

/// For partition balanced: computes plan.balanced_layers on `gpu` (see balanced_stage_layers);
/// does nothing for other plans. Call after validate_partition.
void resolve_partition(const TransformerSpec& spec, ParallelPlan& plan, const GpuSpec& gpu);

/// The balanced placement (of one lane's stages): at least one layer per stage, the largest costed stage time
/// (forward + backward + recompute of its layers, plus the embedding on stage 0 and the final
/// norm, output layer and loss on the last stage) as small as possible, the other stages as even as
/// the layers allow.
std::vector<int64_t> balanced_stage_layers(const TransformerSpec& spec, const ParallelPlan& plan, const GpuSpec& gpu);
/// What balancing reads of the plan: one layer's costed forward + backward + recompute (the mean
/// of the dense and MoE layers), and what the embedding adds to the first stage and the final
/// norm, output layer and loss to the last. Not the stage count, schedule or data degree: the
/// sweep's enumeration shares it between the stage counts of a layout.
struct StageCosts {
  double layer_s = 0, first_extra_s = 0, last_extra_s = 0;
  double mtp_extra_s = 0;  // a layout's MTP stage before the last (mtp_ops); 0 otherwise
};
StageCosts stage_costs(const TransformerSpec& spec, const ParallelPlan& plan, const GpuSpec& gpu);
/// balanced_stage_layers from the costs, over S stages and l layers.
std::vector<int64_t> balanced_stage_layers(const StageCosts& costs, int64_t S, int64_t l);

/// Costed compute time of each stage for one microbatch (forward + backward + recompute) on `gpu`
/// for the given layer counts: what balancing equalises, reported so users can see it.
std::vector<double> stage_compute_times_s(const TransformerSpec& spec, const ParallelPlan& plan, const GpuSpec& gpu,
                                          const std::vector<int64_t>& layers);

/// The pipeline rank of stage st: st mod p (Megatron), or the V's (is_v_shape: st for st < p,
/// 2p − 1 − st after; DualPipe's second lane is placed so).
int64_t stage_rank(const ParallelPlan& plan, int64_t st);
/// stage_rank of every stage, in stage order (what the generators place; schedules/schedule.hpp).
std::vector<int> stage_placement(const ParallelPlan& plan);
/// Whether pipeline rank r holds a first stage (the embedding) / a last stage (final norm,
/// output layer, loss) — of either lane with DualPipe.
bool rank_holds_first_stage(const ParallelPlan& plan, int64_t r);
bool rank_holds_last_stage(const ParallelPlan& plan, int64_t r);

/// Layers of each chunk held by pipeline rank r (its stages r, r + p, …).
std::vector<int64_t> rank_chunk_layers(const ParallelPlan& plan, const std::vector<int64_t>& layers, int pipeline_rank);

}  // namespace ptdp
