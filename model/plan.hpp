// How a model is trained in parallel: tensor (t), pipeline (p), data (d) parallel sizes,
// virtual stages, microbatching, schedule and activation recomputation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptdp {

/// Pipeline schedules: the paper's three, and the zero-bubble ones (Qi et al., ICLR 2024), which
/// split the backward into I (input gradient) and W (weight gradient): zb-h1 (1F1B's peak
/// memory), zb-h2 (about twice that, bubble ~0), zb-v (two chunks per rank in a V, 1F1B's
/// memory), zb-auto (W placed from the costed F/I/W times under the GPUs' free memory).
enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubbleH1, ZeroBubbleH2, ZeroBubbleV, ZeroBubbleAuto };
/// Every schedule kind, in the order `--auto` sweeps them.
inline constexpr ScheduleKind kScheduleKinds[] = {ScheduleKind::GPipe,        ScheduleKind::OneFOneB,
                                                   ScheduleKind::Interleaved,  ScheduleKind::ZeroBubbleH1,
                                                   ScheduleKind::ZeroBubbleH2, ScheduleKind::ZeroBubbleV,
                                                   ScheduleKind::ZeroBubbleAuto};
/// True for the schedules whose backward is split into I and W.
bool is_zero_bubble(ScheduleKind k);
enum class Recompute { None, Selective, Full };
enum class Precision { FP16, BF16, FP32 };
/// How layers are placed on pipeline stages when no explicit list is given: uniform (l / (p·v)
/// each, Megatron's rule) or balanced (costed stage times as equal as possible, embedding on the
/// first and output layer + loss on the last stage included).
enum class Partition { Uniform, Balanced };

std::string to_string(ScheduleKind k);
std::string to_string(Recompute r);
std::string to_string(Precision p);
/// Parse "gpipe" | "1f1b" | "interleaved" | "zb-h1" | "zb-h2" | "zb-v" | "zb-auto"; throws
/// ConfigError naming the choices.
ScheduleKind parse_schedule_kind(const std::string& text);
Recompute parse_recompute(const std::string& text);
Precision parse_precision(const std::string& text);
std::string to_string(Partition p);
Partition parse_partition(const std::string& text);
/// Bytes of one element of activations/weights in this precision.
int bytes_per_element(Precision p);
/// Bytes of one gradient element as Megatron keeps and reduces it: fp16 with fp16 training,
/// fp32 with bf16 (accumulated in fp32) and with fp32.
int gradient_bytes(Precision p);

struct ParallelPlan {
  int64_t tensor = 1;          // t
  int64_t pipeline = 1;        // p
  int64_t data = 1;            // d
  int64_t virtual_stages = 1;  // v, model chunks per pipeline rank (interleaved only)
  int64_t micro_batch = 1;     // b
  int64_t global_batch = 1;    // B
  int64_t microbatch_group = 0;  // interleaved group size G; 0 = p
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  Recompute recompute = Recompute::None;
  bool scatter_gather = true;
  bool overlap_p2p = false;  // overlapped p2p: lets interleaving run with pipeline 2
  /// Sequence parallelism (Korthikanti et al. 2022): LayerNorm, dropout and residual regions
  /// split along the sequence over the t ranks; each TP all-reduce becomes a reduce-scatter +
  /// all-gather. Needs t > 1 and the sequence length divisible by t.
  bool sequence_parallel = false;
  Precision precision = Precision::BF16;
  /// Layers of each stage, p·v entries in stage order (stage s on pipeline rank s mod p);
  /// empty = from first/last_stage_layers or the partition.
  std::vector<int64_t> layers_per_stage;
  /// Megatron-LM's --decoder-first/last-pipeline-num-layers; 0 = not set. The other stages
  /// share the remaining layers evenly.
  int64_t first_stage_layers = 0;
  int64_t last_stage_layers = 0;
  Partition partition = Partition::Uniform;
  /// The balanced partition's result for the cluster's GPU (resolve_partition in
  /// model/partition.hpp; the scenario loader does it). Empty otherwise.
  std::vector<int64_t> balanced_layers;

  int64_t gpus() const { return tensor * pipeline * data; }
  /// m = B / (b·d): microbatches per pipeline per iteration.
  int64_t num_microbatches() const { return global_batch / (micro_batch * data); }
  int64_t num_stages() const { return pipeline * virtual_stages; }
  int64_t group_size() const { return microbatch_group > 0 ? microbatch_group : pipeline; }
};

struct TransformerSpec;

/// Largest sizes ptdp accepts; beyond them a value is treated as a mistake rather than simulated.
inline constexpr int64_t kMaxMicrobatches = 1'000'000;
inline constexpr int64_t kMaxGpus = 10'000'000;
/// Largest m·v·p (each cell becomes ~6 actions in memory, ~100 bytes each with the graph).
inline constexpr int64_t kMaxScheduleCells = 4'000'000;

/// Checks every Megatron-LM rule (ptdp-facts.md) for this plan on `gpus` GPUs.
/// Throws ConfigError whose key path names the offending scenario key (e.g. "parallel.tensor").
void validate_plan(const TransformerSpec& spec, const ParallelPlan& plan, int64_t gpus);

/// Checks the model sizes alone (positive, hidden divisible by heads, sane magnitudes).
void validate_model(const TransformerSpec& spec);

}  // namespace ptdp
