#include "model/plan.hpp"

#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/partition.hpp"
#include "model/transformer.hpp"

namespace ptdp {

std::string to_string(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved: return "interleaved";
    case ScheduleKind::ZeroBubbleH1: return "zb-h1";
    case ScheduleKind::ZeroBubbleH2: return "zb-h2";
    case ScheduleKind::ZeroBubbleV: return "zb-v";
    case ScheduleKind::ZeroBubbleAuto: return "zb-auto";
  }
  return "?";
}
bool is_zero_bubble(ScheduleKind k) {
  return k == ScheduleKind::ZeroBubbleH1 || k == ScheduleKind::ZeroBubbleH2 || k == ScheduleKind::ZeroBubbleV ||
         k == ScheduleKind::ZeroBubbleAuto;
}
std::string to_string(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}
std::string to_string(Precision p) {
  switch (p) {
    case Precision::FP16: return "fp16";
    case Precision::BF16: return "bf16";
    case Precision::FP32: return "fp32";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(const std::string& text) {
  if (text == "gpipe") return ScheduleKind::GPipe;
  if (text == "1f1b") return ScheduleKind::OneFOneB;
  std::vector<std::string> names;
  for (ScheduleKind k : kScheduleKinds) {
    if (text == to_string(k)) return k;
    names.push_back(to_string(k));
  }
  throw ConfigError("", "unknown schedule '" + text + "', expected gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v or zb-auto" +
                            did_you_mean(text, names));
}
Recompute parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::None;
  if (text == "selective") return Recompute::Selective;
  if (text == "full") return Recompute::Full;
  throw ConfigError("", "unknown recompute '" + text + "', expected none, selective or full" +
                            did_you_mean(text, {"none", "selective", "full"}));
}
Precision parse_precision(const std::string& text) {
  if (text == "fp16") return Precision::FP16;
  if (text == "bf16") return Precision::BF16;
  if (text == "fp32") return Precision::FP32;
  throw ConfigError("", "unknown precision '" + text + "', expected fp16, bf16 or fp32" +
                            did_you_mean(text, {"fp16", "bf16", "fp32"}));
}
std::string to_string(Partition p) { return p == Partition::Balanced ? "balanced" : "uniform"; }
Partition parse_partition(const std::string& text) {
  if (text == "uniform") return Partition::Uniform;
  if (text == "balanced") return Partition::Balanced;
  throw ConfigError("", "unknown partition '" + text + "', expected uniform or balanced" +
                            did_you_mean(text, {"uniform", "balanced"}));
}
int bytes_per_element(Precision p) { return p == Precision::FP32 ? 4 : 2; }
int gradient_bytes(Precision p) { return p == Precision::FP16 ? 2 : 4; }

namespace {
std::string num(int64_t v) { return std::to_string(v); }
void require_positive(const char* key, int64_t v) {
  if (v <= 0) throw ConfigError::rule(key, "must be a positive integer (got " + num(v) + ")");
}
void require_at_most(const char* key, int64_t v, int64_t limit, const char* what) {
  if (v > limit) throw ConfigError::rule(key, std::string("is too large for ") + what + ", at most " + num(limit) + " (got " + num(v) + ")");
}
}  // namespace

void validate_model(const TransformerSpec& spec) {
  require_positive("model.num_layers", spec.num_layers);
  require_positive("model.hidden_size", spec.hidden_size);
  require_positive("model.num_attention_heads", spec.num_attention_heads);
  require_positive("model.seq_length", spec.seq_length);
  require_positive("model.vocab_size", spec.vocab_size);
  if (spec.ffn_hidden_size < 0)
    throw ConfigError::rule("model.ffn_hidden_size", "must be positive, or 0 for 4·hidden_size (got " + num(spec.ffn_hidden_size) + ")");
  require_at_most("model.num_layers", spec.num_layers, 100'000, "a model");
  require_at_most("model.hidden_size", spec.hidden_size, 1'000'000, "a model");
  require_at_most("model.ffn_hidden_size", spec.ffn_hidden_size, 10'000'000, "a model");
  require_at_most("model.seq_length", spec.seq_length, 10'000'000, "a model");
  require_at_most("model.vocab_size", spec.vocab_size, 100'000'000, "a model");
  require_at_most("model.num_attention_heads", spec.num_attention_heads, spec.hidden_size, "hidden_size");
  if (spec.num_query_groups < 0)
    throw ConfigError::rule("model.num_query_groups", "must be positive, or 0 for num_attention_heads (got " + num(spec.num_query_groups) + ")");
  if (spec.num_attention_heads % spec.query_groups() != 0)
    throw ConfigError::rule("model.num_query_groups", num(spec.query_groups()) + " does not divide num_attention_heads (" +
                                                        num(spec.num_attention_heads) + ")");
  if (spec.hidden_size % spec.num_attention_heads != 0)
    throw ConfigError::rule("model.hidden_size", "must be divisible by num_attention_heads (" + num(spec.num_attention_heads) +
                                               ") (got " + num(spec.hidden_size) + ")");
}

void validate_plan(const TransformerSpec& spec, const ParallelPlan& plan, int64_t gpus) {
  validate_model(spec);
  require_positive("parallel.tensor", plan.tensor);
  require_positive("parallel.pipeline", plan.pipeline);
  require_positive("parallel.data", plan.data);
  require_positive("parallel.virtual_stages", plan.virtual_stages);
  require_positive("training.micro_batch", plan.micro_batch);
  require_positive("training.global_batch", plan.global_batch);
  if (plan.microbatch_group < 0)
    throw ConfigError::rule("parallel.microbatch_group", "must be a positive integer, or absent for the default (got " +
                                                             num(plan.microbatch_group) + ")");
  require_positive("cluster.gpus", gpus);
  require_at_most("cluster.gpus", gpus, kMaxGpus, "a cluster");
  require_at_most("training.global_batch", plan.global_batch, 1'000'000'000, "a batch");

  // Bound each factor before multiplying them, so products cannot overflow.
  require_at_most("parallel.tensor", plan.tensor, gpus, "cluster.gpus");
  require_at_most("parallel.pipeline", plan.pipeline, gpus, "cluster.gpus");
  require_at_most("parallel.data", plan.data, gpus, "cluster.gpus");
  require_at_most("training.micro_batch", plan.micro_batch, plan.global_batch, "training.global_batch");
  if (gpus % (plan.tensor * plan.pipeline) != 0)
    throw ConfigError::rule("parallel.tensor", "tensor × pipeline (" + num(plan.tensor) + " × " + num(plan.pipeline) + " = " +
                                             num(plan.tensor * plan.pipeline) + ") must divide cluster.gpus (" + num(gpus) + ")");
  if (plan.gpus() != gpus)
    throw ConfigError::rule("parallel.data", "tensor × pipeline × data must equal cluster.gpus (" + num(gpus) + "); expected data " +
                                           num(gpus / (plan.tensor * plan.pipeline)) + " (got " + num(plan.data) + ")");
  if (spec.num_attention_heads % plan.tensor != 0)
    throw ConfigError::rule("parallel.tensor", num(plan.tensor) + " does not divide num_attention_heads (" +
                                             num(spec.num_attention_heads) + ")");
  if (spec.query_groups() % plan.tensor != 0)
    throw ConfigError::rule("parallel.tensor", num(plan.tensor) + " does not divide model.num_query_groups (" +
                                             num(spec.query_groups()) + "): each tensor-parallel rank needs whole key/value groups");
  if (spec.ffn() % plan.tensor != 0)
    throw ConfigError::rule("parallel.tensor", num(plan.tensor) + " does not divide ffn_hidden_size (" + num(spec.ffn()) + ")");
  if (plan.global_batch % (plan.micro_batch * plan.data) != 0)
    throw ConfigError::rule("training.global_batch", "must be divisible by micro_batch × data (" + num(plan.micro_batch) + " × " +
                                                   num(plan.data) + " = " + num(plan.micro_batch * plan.data) + ") (got " +
                                                   num(plan.global_batch) + ")");
  if (plan.sequence_parallel && plan.tensor < 2)
    throw ConfigError::rule("parallel.sequence_parallel", "needs parallel.tensor > 1: the sequence is split over the "
                                                          "tensor-parallel ranks (got tensor " + num(plan.tensor) + ")");
  if (plan.sequence_parallel && spec.seq_length % plan.tensor != 0)
    throw ConfigError::rule("parallel.sequence_parallel", "model.seq_length (" + num(spec.seq_length) +
                                                              ") must be divisible by parallel.tensor (" + num(plan.tensor) + ")");
  const int64_t m = plan.num_microbatches();
  require_at_most("training.global_batch", m, kMaxMicrobatches, "the number of microbatches per pipeline");

  if (plan.schedule == ScheduleKind::Interleaved) {
    if (plan.virtual_stages < 2)
      throw ConfigError::rule("parallel.virtual_stages", "the interleaved schedule needs at least 2 virtual stages (got " +
                                                       num(plan.virtual_stages) + ")");
    if (plan.pipeline < 2)
      throw ConfigError::rule("parallel.schedule", "interleaved needs pipeline > 1 (got pipeline " + num(plan.pipeline) + ")");
    if (plan.pipeline == 2 && !plan.overlap_p2p)
      throw ConfigError::rule("parallel.pipeline", "interleaving needs pipeline > 2 (pipeline 2 only with parallel.overlap_p2p: true)");
    const int64_t g = plan.group_size();
    if (g < plan.pipeline || g > m)
      throw ConfigError::rule(plan.microbatch_group > 0 ? "parallel.microbatch_group" : "training.global_batch",
                        "interleaving needs pipeline (" + num(plan.pipeline) + ") ≤ microbatch group (" + num(g) +
                            ") ≤ microbatches per pipeline (" + num(m) + ")");
    if (m % g != 0 && m % g < plan.pipeline)
      throw ConfigError::rule("training.global_batch", "microbatches per pipeline (" + num(m) + ") mod microbatch group (" + num(g) +
                                                     ") must be 0 or at least pipeline (" + num(plan.pipeline) + ")");
    require_at_most("parallel.virtual_stages", plan.virtual_stages, spec.num_layers, "num_layers");
  } else if (plan.schedule == ScheduleKind::ZeroBubbleV) {
    // ZB-V: stage s on rank s for s < p and on rank 2p − 1 − s after that — two chunks per rank.
    if (plan.virtual_stages != 2)
      throw ConfigError::rule("parallel.virtual_stages", "zb-v places two chunks per pipeline rank in a V shape: "
                                                       "virtual_stages must be 2 (got " + num(plan.virtual_stages) + ")");
    if (spec.num_layers % (2 * plan.pipeline) != 0)
      throw ConfigError::rule("parallel.pipeline", "zb-v needs 2 × pipeline (" + num(2 * plan.pipeline) +
                                                 ") to divide num_layers (" + num(spec.num_layers) + ")");
  } else if (plan.virtual_stages != 1) {
    throw ConfigError::rule("parallel.virtual_stages", "virtual stages need schedule: interleaved or zb-v (got " + num(plan.virtual_stages) +
                                                     " with schedule " + to_string(plan.schedule) + ")");
  }
  validate_partition(spec, plan);
  // Schedules hold m·v actions per rank; refuse sizes that could not be generated in memory.
  require_at_most("training.global_batch", m * plan.virtual_stages * plan.pipeline, kMaxScheduleCells,
                  "the schedule (microbatches × virtual stages × pipeline)");
}

}  // namespace ptdp
