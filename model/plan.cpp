#include "model/plan.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "core/enum_names.hpp"
#include "core/error.hpp"
#include "model/partition.hpp"
#include "model/transformer.hpp"

namespace ptdp {

namespace {

// Each enum's names, spelled once (core/enum_names.hpp).
constexpr EnumName kScheduleNames[] = {
    {static_cast<int>(ScheduleKind::GPipe), "gpipe"},          {static_cast<int>(ScheduleKind::OneFOneB), "1f1b"},
    {static_cast<int>(ScheduleKind::Interleaved), "interleaved"}, {static_cast<int>(ScheduleKind::ZeroBubbleH1), "zb-h1"},
    {static_cast<int>(ScheduleKind::ZeroBubbleH2), "zb-h2"},    {static_cast<int>(ScheduleKind::ZeroBubbleV), "zb-v"},
    {static_cast<int>(ScheduleKind::ZeroBubbleAuto), "zb-auto"}, {static_cast<int>(ScheduleKind::DualPipeV), "dualpipev"},
    {static_cast<int>(ScheduleKind::DualPipe), "dualpipe"}};
constexpr EnumName kRecomputeNames[] = {
    {static_cast<int>(Recompute::None), "none"}, {static_cast<int>(Recompute::Selective), "selective"}, {static_cast<int>(Recompute::Full), "full"}};
constexpr EnumName kPrecisionNames[] = {{static_cast<int>(Precision::FP16), "fp16"}, {static_cast<int>(Precision::BF16), "bf16"},
                                        {static_cast<int>(Precision::FP32), "fp32"}, {static_cast<int>(Precision::FP8), "fp8"}};
constexpr EnumName kFp8FormatNames[] = {{static_cast<int>(Fp8Format::Hybrid), "hybrid"}, {static_cast<int>(Fp8Format::E4M3), "e4m3"}};
constexpr EnumName kOptimizerSyncNames[] = {{static_cast<int>(OptimizerSync::Barrier), "barrier"},
                                            {static_cast<int>(OptimizerSync::PostValidate), "post_validate"}};
constexpr EnumName kFp8RecipeNames[] = {{static_cast<int>(Fp8Recipe::Tensorwise), "tensorwise"}, {static_cast<int>(Fp8Recipe::Rowwise), "rowwise"},
                                        {static_cast<int>(Fp8Recipe::Blockwise), "blockwise"}, {static_cast<int>(Fp8Recipe::MXFP8), "mxfp8"}};
constexpr EnumName kFrameworkNames[] = {{static_cast<int>(Framework::Megatron), "megatron"},
                                        {static_cast<int>(Framework::Torchtitan), "torchtitan"},
                                        {static_cast<int>(Framework::TorchtitanCompiled), "torchtitan_compiled"},
                                        {static_cast<int>(Framework::DeepSpeed), "deepspeed"},
                                        {static_cast<int>(Framework::PytorchFsdp), "pytorch_fsdp"}};
constexpr EnumName kAttentionKernelNames[] = {{static_cast<int>(AttentionKernel::Auto), "auto"},
                                              {static_cast<int>(AttentionKernel::Flash), "flash"},
                                              {static_cast<int>(AttentionKernel::Flash2), "flash2"},
                                              {static_cast<int>(AttentionKernel::Cudnn), "cudnn"}};
constexpr EnumName kDispatcherNames[] = {{static_cast<int>(MoeDispatcher::AllToAll), "alltoall"},
                                         {static_cast<int>(MoeDispatcher::AllGather), "allgather"},
                                         {static_cast<int>(MoeDispatcher::Flex), "flex"}};
constexpr EnumName kContextCommNames[] = {{static_cast<int>(ContextComm::Ring), "ring"}, {static_cast<int>(ContextComm::AllGather), "allgather"},
                                      {static_cast<int>(ContextComm::AllToAll), "alltoall"}};
constexpr EnumName kPartitionNames[] = {{static_cast<int>(Partition::Uniform), "uniform"}, {static_cast<int>(Partition::Balanced), "balanced"}};
constexpr EnumName kShardingGroupNames[] = {{static_cast<int>(ShardingGroup::Data), "data"}, {static_cast<int>(ShardingGroup::Node), "node"}};
constexpr EnumName kOffloadNames[] = {{static_cast<int>(Offload::None), "none"},
                                      {static_cast<int>(Offload::Optimizer), "optimizer"},
                                      {static_cast<int>(Offload::OptimizerAndParams), "optimizer_and_params"}};

}  // namespace

std::string to_string(ScheduleKind k) { return enum_name(kScheduleNames, static_cast<int>(k)); }
bool is_zero_bubble(ScheduleKind k) {
  return k == ScheduleKind::ZeroBubbleH1 || k == ScheduleKind::ZeroBubbleH2 || k == ScheduleKind::ZeroBubbleV ||
         k == ScheduleKind::ZeroBubbleAuto || k == ScheduleKind::DualPipeV || k == ScheduleKind::DualPipe;
}
bool has_overlapped_pairs(ScheduleKind k) { return k == ScheduleKind::DualPipeV || k == ScheduleKind::DualPipe; }
bool expert_overlap_schedule(const ParallelPlan& plan) {
  return plan.schedule == ScheduleKind::Interleaved || has_overlapped_pairs(plan.schedule) ||
         (plan.pipeline == 1 && (plan.schedule == ScheduleKind::OneFOneB || plan.schedule == ScheduleKind::GPipe));
}
bool merges_expert_overlap(const ParallelPlan& plan) {
  return plan.moe_comm_overlap && !has_overlapped_pairs(plan.schedule) && expert_overlap_schedule(plan);
}
bool runs_overlapped_pairs(const ParallelPlan& plan) { return has_overlapped_pairs(plan.schedule) || merges_expert_overlap(plan); }
bool is_v_shape(ScheduleKind k) {
  return k == ScheduleKind::ZeroBubbleV || k == ScheduleKind::DualPipeV || k == ScheduleKind::DualPipe;
}
std::string to_string(Recompute r) { return enum_name(kRecomputeNames, static_cast<int>(r)); }
std::string to_string(Precision p) { return enum_name(kPrecisionNames, static_cast<int>(p)); }

ScheduleKind parse_schedule_kind(const std::string& text) { return parse_enum_as<ScheduleKind>(kScheduleNames, text, "schedule"); }
Recompute parse_recompute(const std::string& text) { return parse_enum_as<Recompute>(kRecomputeNames, text, "recompute"); }
unsigned parse_recompute_module(const std::string& text) {
  std::vector<std::string> names;
  for (const auto& [name, bit] : kRecomputeModuleNames) {
    if (text == name) return bit;
    names.emplace_back(name);
  }
  throw ConfigError("", "unknown recompute module '" + text + "', expected core_attn, layernorm, mlp, moe, moe_act, shared_experts or mla_up_proj" +
                            did_you_mean(text, names));
}
std::vector<std::string> recompute_module_list(unsigned modules) {
  std::vector<std::string> out;
  for (const auto& [name, bit] : kRecomputeModuleNames)
    if (modules & bit) out.emplace_back(name);
  return out;
}
std::string recompute_modules_string(unsigned modules) {
  std::string out;
  for (const std::string& name : recompute_module_list(modules)) out += (out.empty() ? "" : " ") + name;
  return out;
}
Precision parse_precision(const std::string& text) { return parse_enum_as<Precision>(kPrecisionNames, text, "precision"); }
std::string to_string(Fp8Format f) { return enum_name(kFp8FormatNames, static_cast<int>(f)); }
Fp8Format parse_fp8_format(const std::string& text) { return parse_enum_as<Fp8Format>(kFp8FormatNames, text, "fp8_format"); }
std::string to_string(OptimizerSync s) { return enum_name(kOptimizerSyncNames, static_cast<int>(s)); }
OptimizerSync parse_optimizer_sync(const std::string& text) {
  return parse_enum_as<OptimizerSync>(kOptimizerSyncNames, text, "optimizer_sync");
}
std::string to_string(Fp8Recipe r) { return enum_name(kFp8RecipeNames, static_cast<int>(r)); }
Fp8Recipe parse_fp8_recipe(const std::string& text) { return parse_enum_as<Fp8Recipe>(kFp8RecipeNames, text, "fp8_recipe"); }
std::string to_string(Framework f) { return enum_name(kFrameworkNames, static_cast<int>(f)); }
std::string to_string(AttentionKernel k) { return enum_name(kAttentionKernelNames, static_cast<int>(k)); }
AttentionKernel parse_attention_kernel(const std::string& text) {
  return parse_enum_as<AttentionKernel>(kAttentionKernelNames, text, "attention_kernel");
}
AttentionKernel resolved_attention_kernel(const ParallelPlan& plan) {
  if (plan.attention_kernel != AttentionKernel::Auto) return plan.attention_kernel;
  return plan.framework == Framework::Megatron ? AttentionKernel::Cudnn : AttentionKernel::Flash2;
}
Framework parse_framework(const std::string& text) {
  std::string t = text;
  std::replace(t.begin(), t.end(), '-', '_');
  if (t == "megatron_core") return Framework::Megatron;
  for (const EnumName& n : kFrameworkNames)  // megatron-core, torchtitan-compiled: '-' for '_'
    if (t == n.name) return static_cast<Framework>(n.value);
  return parse_enum_as<Framework>(kFrameworkNames, text, "framework");
}
int64_t reshard_group(const ParallelPlan& plan) {
  if (plan.zero_stage < 3) return 1;
  const int64_t n = plan.sharding_degree();
  switch (plan.reshard_after_forward) {
    case ParallelPlan::kReshardDefault: return is_torchtitan(plan.framework) && plan.pipeline > 1 ? 1 : n;
    case ParallelPlan::kReshardFull: return n;
    default: return std::min<int64_t>(plan.reshard_after_forward, n);
  }
}
bool gradients_reduced_once_per_step(const ParallelPlan& plan) {
  return plan.zero_stage >= 3 && plan.pipeline > 1 && is_torchtitan(plan.framework) && plan.sharding_degree() > 1;
}
bool sharded_parameter_is_master(const ParallelPlan& plan) {
  const bool fsdp = is_torchtitan(plan.framework) || plan.framework == Framework::PytorchFsdp;
  return fsdp && plan.zero_stage >= 3 && plan.precision != Precision::FP32;
}
bool stage_held_unsharded(const ParallelPlan& plan) { return gradients_reduced_once_per_step(plan) && reshard_group(plan) == 1; }
bool last_unit_kept_whole(const ParallelPlan& plan) {
  return plan.zero_stage >= 3 && is_torchtitan(plan.framework) && plan.reshard_after_forward == ParallelPlan::kReshardDefault &&
         reshard_group(plan) > 1;
}
bool is_torchtitan(Framework f) { return f == Framework::Torchtitan || f == Framework::TorchtitanCompiled; }
bool is_eager(Framework f) { return f == Framework::Torchtitan || f == Framework::DeepSpeed || f == Framework::PytorchFsdp; }
std::string to_string(MoeDispatcher d) { return enum_name(kDispatcherNames, static_cast<int>(d)); }
MoeDispatcher parse_moe_dispatcher(const std::string& text) {
  if (text == "deepep" || text == "hybridep")
    throw ConfigError("", "unknown MoE token dispatcher '" + text + "', expected " + enum_choices(kDispatcherNames) +
                              " (Megatron-Core runs DeepEP as its flex dispatcher: flex)");
  return parse_enum_as<MoeDispatcher>(kDispatcherNames, text, "MoE token dispatcher");
}
std::string to_string(ContextComm c) { return enum_name(kContextCommNames, static_cast<int>(c)); }
const char* context_comm_mark(ContextComm c) { return c == ContextComm::AllGather ? "-ag" : c == ContextComm::AllToAll ? "-a2a" : ""; }
ContextComm parse_context_comm(const std::string& text) { return parse_enum_as<ContextComm>(kContextCommNames, text, "context_comm"); }
std::string to_string(Partition p) { return enum_name(kPartitionNames, static_cast<int>(p)); }
Partition parse_partition(const std::string& text) { return parse_enum_as<Partition>(kPartitionNames, text, "partition"); }
std::string to_string(ShardingGroup g) { return enum_name(kShardingGroupNames, static_cast<int>(g)); }
// data: the whole data-parallel group; node: shard inside a node, replicate across nodes.
ShardingGroup parse_sharding_group(const std::string& text) {
  return parse_enum_as<ShardingGroup>(kShardingGroupNames, text, "sharding group");
}
std::string to_string(Offload o) { return enum_name(kOffloadNames, static_cast<int>(o)); }
Offload parse_offload(const std::string& text) { return parse_enum_as<Offload>(kOffloadNames, text, "offload"); }
void apply_fsdp_strategy(const std::string& text, ParallelPlan& plan) {
  if (text == "full_shard") {
    plan.zero_stage = 3;
    plan.sharding_group = ShardingGroup::Data;
  } else if (text == "shard_grad_op") {
    plan.zero_stage = 2;
    plan.sharding_group = ShardingGroup::Data;
  } else if (text == "hybrid_shard") {
    plan.zero_stage = 3;
    plan.sharding_group = ShardingGroup::Node;
  } else if (text == "no_shard") {
    plan.zero_stage = 0;
    plan.sharding_group = ShardingGroup::Data;
  } else {
    const std::vector<std::string> names = {"full_shard", "shard_grad_op", "hybrid_shard", "no_shard"};
    throw ConfigError("", "unknown FSDP sharding strategy '" + text + "', expected full_shard, shard_grad_op, hybrid_shard or no_shard" +
                              did_you_mean(text, names));
  }
}
std::string fsdp_strategy_name(const ParallelPlan& plan) {
  if (plan.zero_stage == 0) return "no_shard";
  if (plan.zero_stage == 2 && plan.sharding_group == ShardingGroup::Data) return "shard_grad_op";
  if (plan.zero_stage == 3) return plan.sharding_group == ShardingGroup::Node ? "hybrid_shard" : "full_shard";
  return "";
}
int bytes_per_element(Precision p) { return p == Precision::FP32 ? 4 : 2; }
int gradient_bytes(Precision p) { return p == Precision::FP16 ? 2 : 4; }
StateBytes state_bytes(Precision p) {
  const bool mixed = p != Precision::FP32;
  return StateBytes{bytes_per_element(p), gradient_bytes(p), mixed ? 12 : 8, mixed ? 30.0 : 32.0};
}

namespace {
std::string num(int64_t v) { return std::to_string(v); }
void require_positive(const char* key, int64_t v) {
  if (v <= 0) throw ConfigError::rule(key, "must be a positive integer (got " + num(v) + ")");
}
void require_at_most(const char* key, int64_t v, int64_t limit, const char* what) {
  if (v > limit) throw ConfigError::rule(key, std::string("is too large for ") + what + ", at most " + num(limit) + " (got " + num(v) + ")");
}
}  // namespace


namespace {
// Multi-head latent attention's widths: each latent and head width positive (the query latent
// may be 0), the rotary channels pairs, and the kernel's QK and V widths what flash kernels take.
void validate_mla(const TransformerSpec& spec) {
  const MlaSpec& m = spec.mla;
  auto range = [](const char* key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      throw ConfigError::rule(std::string("model.mla.") + key, "must be in [" + num(lo) + ", " + num(hi) + "] (got " + num(v) + ")");
  };
  range("kv_lora_rank", m.kv_lora_rank, 1, spec.hidden_size);
  range("q_lora_rank", m.q_lora_rank, 0, spec.hidden_size);
  range("qk_head_dim", m.qk_head_dim, 1, 1024);
  range("qk_pos_emb_head_dim", m.qk_pos_emb_head_dim, 0, 1024);
  range("v_head_dim", m.v_head_dim, 1, 1024);
  if (spec.position_kind() == PositionKind::Rope && (m.qk_pos_emb_head_dim < 2 || m.qk_pos_emb_head_dim % 2 != 0))
    throw ConfigError::rule("model.mla.qk_pos_emb_head_dim", "rotary embeddings rotate pairs of channels: it must be even and at least 2 "
                                                             "(got " + num(m.qk_pos_emb_head_dim) + ")");
  if (spec.attention != AttentionKind::Flash) return;
  for (const auto& [key, width] : {std::pair<const char*, int64_t>{"qk_head_dim", spec.qk_dim()}, {"v_head_dim", spec.v_dim()}})
    if (width % 8 != 0 || width > 256)
      throw ConfigError::rule(std::string("model.mla.") + key, "flash attention kernels take head widths that are multiples of 8 up to 256; "
                                                               "this model's " + std::string(key == std::string("qk_head_dim") ? "qk_head_dim + qk_pos_emb_head_dim" : "v_head_dim") +
                                                               " = " + num(width) + " (use attention: unfused)");
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
  if (spec.head_dim_size == 0 && spec.hidden_size % spec.num_attention_heads != 0)
    throw ConfigError::rule("model.hidden_size", "must be divisible by num_attention_heads (" + num(spec.num_attention_heads) +
                                               ") (got " + num(spec.hidden_size) + "), or give the heads' width as model.head_dim");
  if (!(spec.dropout < 0 || (spec.dropout >= 0 && spec.dropout < 1)))
    throw ConfigError::rule("model.dropout", "must be in [0, 1) (got " + std::to_string(spec.dropout) + ")");
  if (spec.position_kind() == PositionKind::Rope) {
    // An odd head width has no channel pairs to rotate: name the key that set it (MLA's rotary
    // width is checked with its keys).
    if (!spec.has_mla() && spec.head_dim() % 2 != 0)
      throw ConfigError::rule(spec.head_dim_size > 0 ? "model.head_dim" : "model.hidden_size",
                              "gives heads of odd width (" + std::string(spec.head_dim_size > 0 ? "model.head_dim" : "hidden_size / num_attention_heads") +
                                  " = " + num(spec.head_dim()) + "): rotary embeddings rotate pairs of channels; use an even head width");
    if (!(spec.rotary_percent > 0 && spec.rotary_percent <= 1))
      throw ConfigError::rule("model.rotary_percent", "must be in (0, 1] (got " + std::to_string(spec.rotary_percent) + ")");
    if (!(spec.rotary_base > 1))
      throw ConfigError::rule("model.rotary_base", "must be above 1 (got " + std::to_string(spec.rotary_base) + ")");
    // Megatron rotates channel pairs (i, i + d/2) of the first d = int(head_dim · percent). (An
    // MLA rotary width that is odd itself is named by validate_mla.)
    const bool mla_width_named = spec.has_mla() && (spec.mla.qk_pos_emb_head_dim < 2 || spec.mla.qk_pos_emb_head_dim % 2 != 0);
    if (!mla_width_named && (spec.rotary_dim() < 2 || spec.rotary_dim() % 2 != 0))
      throw ConfigError::rule("model.rotary_percent", "rotates int(" + std::string(spec.has_mla() ? "qk_pos_emb_head_dim" : "head_dim") +
                                                        " · rotary_percent) = " + num(spec.rotary_dim()) +
                                                        " channels of each head (" + std::string(spec.has_mla() ? "qk_pos_emb_head_dim " : "head_dim ") +
                                                        num(spec.rotary_head_dim()) +
                                                        "): it must be an even number of at least 2");
  }
  if (spec.mtp_layers < 0 || spec.mtp_layers > 16)
    throw ConfigError::rule("model.mtp_layers", "must be in [0, 16] (got " + num(spec.mtp_layers) + ")");
  if (!(spec.mtp_loss_scale >= 0 && spec.mtp_loss_scale <= 100))
    throw ConfigError::rule("model.mtp_loss_scale", "must be in [0, 100] (got " + std::to_string(spec.mtp_loss_scale) + ")");
  if (spec.has_mla()) {
    validate_mla(spec);
    return;
  }
  // FlashAttention-2/3 and cuDNN's fused attention take head dims that are multiples of 8 up to
  // 256 (FA3 / cuDNN on Hopper: up to 256; FA2: up to 256).
  const int64_t dh = spec.head_dim();
  if (spec.attention == AttentionKind::Flash && (dh % 8 != 0 || dh > 256))
    throw ConfigError::rule(spec.head_dim_size > 0 ? "model.head_dim" : "model.attention",
                            "flash attention kernels support head dims that are multiples of 8 up to 256; this model's is " +
                                std::string(spec.head_dim_size > 0 ? "model.head_dim" : "hidden_size / num_attention_heads") + " = " +
                                num(dh) + " (use attention: unfused)");
}

void validate_overlaps(const ParallelPlan& plan) {
  if (plan.tp_comm_overlap && !plan.sequence_parallel)
    throw ConfigError::rule("parallel.tp_comm_overlap", "needs parallel.sequence_parallel: true (Transformer Engine overlaps the "
                                                        "all-gathers and reduce-scatters of sequence parallelism with their GEMMs)");
  if (plan.overlap_param_gather && plan.zero_stage < 1)
    throw ConfigError::rule("parallel.overlap_param_gather", "needs the distributed optimizer (parallel.zero_stage ≥ 1): without it "
                                                             "there is no parameter all-gather to overlap");
  if (plan.overlap_param_gather && !plan.overlap_grad_reduce)
    throw ConfigError::rule("parallel.overlap_param_gather", "needs parallel.overlap_grad_reduce: true (as Megatron-LM requires)");
  if (plan.bucket_size < 0)
    throw ConfigError::rule("parallel.bucket_size", "must be positive, or 0 for max(40 M, 1 M × data) (got " + num(plan.bucket_size) + ")");
  if (plan.fp8_param_gather && plan.precision != Precision::FP8)
    throw ConfigError::rule("training.fp8_param_gather", "needs training.precision: fp8");
  if (plan.fp8_param_gather && plan.zero_stage < 1)
    throw ConfigError::rule("training.fp8_param_gather", "needs the distributed optimizer or FSDP (parallel.zero_stage ≥ 1), as "
                                                         "Megatron-LM's --fp8-param-gather does");
}

FrameworkMechanisms framework_mechanisms(Framework f) {
  FrameworkMechanisms m;
  const bool megatron = f == Framework::Megatron;
  m.moe_comm_overlap = m.flex_dispatcher = megatron;
  if (!megatron) m.schedules &= ~(1u << static_cast<unsigned>(ScheduleKind::DualPipe));
  if (f == Framework::DeepSpeed) m.schedules = 1u << static_cast<unsigned>(ScheduleKind::OneFOneB);  // its TrainSchedule
  m.tp_comm_overlap = megatron || f == Framework::TorchtitanCompiled;
  m.pipeline = f != Framework::PytorchFsdp;
  m.context = megatron || is_torchtitan(f);
  m.ulysses = megatron || f == Framework::DeepSpeed;
  if (f == Framework::DeepSpeed) m.max_zero_with_pipeline = 1;
  // torchtitan's FSDP with pipelines: stage 3, its gradients reduced once per step.
  if (is_torchtitan(f)) m.auto_zero_with_pipeline = 0b1001;
  if (is_torchtitan(f) || f == Framework::PytorchFsdp) m.auto_zero = 0b1101;
  return m;
}

// What each framework implements (training.framework, framework_mechanisms): a plan asking for a
// mechanism its framework lacks is refused, naming the key and the framework.
void validate_framework(const ParallelPlan& plan) {
  const Framework f = plan.framework;
  const FrameworkMechanisms has = framework_mechanisms(f);
  const std::string name = to_string(f);
  auto lacks = [&](const char* key, const std::string& why) { throw ConfigError::rule(key, "training.framework " + name + " " + why); };
  if (plan.tp_comm_overlap && !has.tp_comm_overlap)
    lacks("parallel.tp_comm_overlap", f == Framework::Torchtitan
                                          ? "runs async tensor parallelism only under torch.compile: use torchtitan_compiled"
                                          : "has no tensor-parallel communication overlap (Transformer Engine userbuffers, torchtitan's async TP)");
  if (plan.moe_comm_overlap && !has.moe_comm_overlap)
    lacks("parallel.moe_comm_overlap", "has no expert all-to-all overlap (Megatron-Core's --overlap-moe-expert-parallel-comm)");
  if (plan.moe_dispatcher == MoeDispatcher::Flex && !has.flex_dispatcher)
    lacks("parallel.moe_dispatcher", "has no flex dispatcher (Megatron-Core's DeepEP dispatch and combine): use alltoall");
  if (plan.pipeline > 1 && !has.runs(plan.schedule))
    lacks("parallel.schedule", plan.schedule == ScheduleKind::DualPipe && has.runs(ScheduleKind::DualPipeV)
                                   ? "has no bidirectional DualPipe (torchtitan ships DualPipeV only: use dualpipev)"
                                   : "runs its pipeline engine's 1F1B schedule (TrainSchedule) only, not " + to_string(plan.schedule) +
                                         ": use 1f1b");
  if (plan.pipeline > 1 && !has.pipeline)
    lacks("parallel.pipeline", "(FSDP without torch.distributed.pipelining) has no pipeline parallelism: use torchtitan");
  if (plan.context > 1 && plan.context_comm == ContextComm::AllToAll && !has.ulysses)
    lacks("parallel.context_comm", "has no all-to-all (Ulysses) context parallelism (Megatron-Core's a2a and DeepSpeed-Ulysses have "
                                   "it): use ring or allgather");
  else if (plan.context > 1 && plan.context_comm != ContextComm::AllToAll && !has.context)
    lacks("parallel.context", f == Framework::DeepSpeed ? "has context parallelism by all-to-alls only (DeepSpeed-Ulysses): set "
                                                          "parallel.context_comm: alltoall"
                                                        : "has no context parallelism (Megatron-Core or torchtitan have it)");
  // DeepSpeed's pipeline engine asserts ZeRO stage < 2 ("ZeRO-2 and ZeRO-3 are incompatible with
  // pipeline parallelism"): its schedule accumulates whole gradients over the micro-steps.
  if (plan.pipeline > 1 && plan.zero_stage > has.max_zero_with_pipeline)
    lacks("parallel.zero_stage", "runs pipeline parallelism (its PipelineEngine) with ZeRO stage 0 or 1 only: use zero_stage 1 "
                                 "with pipeline > 1, or pipeline 1 (got zero_stage " + num(plan.zero_stage) + ", pipeline " +
                                 num(plan.pipeline) + ")");
  if (plan.precision == Precision::FP8) {
    const Fp8Recipe r = plan.fp8_recipe;
    const std::string recipe = to_string(r);
    if (f == Framework::Megatron && r == Fp8Recipe::Rowwise)
      lacks("training.fp8_recipe", "(Transformer Engine) has no rowwise recipe: tensorwise (delayed or current scaling), blockwise or mxfp8");
    if ((f == Framework::DeepSpeed || f == Framework::PytorchFsdp) && r != Fp8Recipe::Tensorwise && r != Fp8Recipe::Rowwise)
      lacks("training.fp8_recipe", "trains FP8 through torchao's Float8Linear (tensorwise or rowwise), not " + recipe);
  }
}

// parallel.recompute_modules: Megatron's selective recompute, each module one the model has (a
// module the layers lack would change nothing).
void validate_recompute_modules(const TransformerSpec& spec, const ParallelPlan& plan) {
  const unsigned m = plan.recompute_modules;
  if (m == kRecomputeCoreAttn) return;  // the default
  const char* key = "parallel.recompute_modules";
  if (plan.recompute != Recompute::Selective)
    throw ConfigError::rule(key, "lists what selective recompute re-runs: it needs parallel.recompute: selective (got " +
                                     to_string(plan.recompute) + ")");
  if (plan.framework != Framework::Megatron)
    throw ConfigError::rule(key, "is Megatron-Core's --recompute-modules; training.framework " + to_string(plan.framework) +
                                     " has its own selective policy (torchtitan: op-level, every second matmul's output kept)");
  if (m == 0) throw ConfigError::rule(key, "is empty: name at least one module, or use parallel.recompute: none");
  const bool moe = spec.has_moe(), dense = !moe || spec.moe_layer_count() < spec.num_layers;
  if ((m & kRecomputeMlp) && !dense)
    throw ConfigError::rule(key, "mlp re-runs dense MLPs, and every layer of this model is a mixture of experts: use moe or moe_act");
  if ((m & (kRecomputeMoe | kRecomputeMoeAct)) && !moe)
    throw ConfigError::rule(key, std::string(m & kRecomputeMoe ? "moe" : "moe_act") + " needs mixture-of-experts layers (model.moe)");
  if ((m & kRecomputeSharedExperts) && !(moe && spec.moe.shared_experts > 0))
    throw ConfigError::rule(key, "shared_experts needs shared experts (model.moe.shared_experts > 0)");
  if ((m & kRecomputeMlaUpProj) && !spec.has_mla())
    throw ConfigError::rule(key, "mla_up_proj re-runs multi-head latent attention's up projections: it needs model.mla");
}

// The combinations the frameworks allow (sharding-sp-zb-facts.md): ZeRO-1 (Megatron's distributed
// optimizer, DeepSpeed) with pipeline parallelism, ZeRO-2 not under DeepSpeed's pipeline engine
// (validate_framework), ZeRO-3 / FSDP only without it but under torchtitan;
// offloading the optimizer needs sharded optimizer state, offloading parameters needs stage 3.
void validate_sharding(const ParallelPlan& plan) {
  if (plan.zero_stage < 0 || plan.zero_stage > 3)
    throw ConfigError::rule("parallel.zero_stage", "must be 0 (none), 1 (optimizer state), 2 (+ gradients) or 3 (+ parameters) (got " +
                                                     num(plan.zero_stage) + ")");
  if (plan.max_inflight_gathers < 1)
    throw ConfigError::rule("parallel.max_inflight_gathers", "must be a positive integer (got " + num(plan.max_inflight_gathers) + ")");
  // The states are sharded over the d·cp ranks holding the same weights (Megatron's distributed
  // optimizer over the data-parallel group with context, torchtitan's FSDP mesh dp_shard × cp):
  // data 1 with context 8 shards eight ways.
  if (plan.zero_stage > 0 && plan.data * plan.context < 2)
    throw ConfigError::rule("parallel.zero_stage", "sharding splits model states over data-parallel ranks: it needs data > 1 "
                                                     "(or context > 1: the d·cp ranks share the states) (got zero_stage " + num(plan.zero_stage) + " with data " +
                                                     num(plan.data) + ", context " + num(plan.context) + ")");
  if (plan.zero_stage == 3 && plan.pipeline > 1 && !is_torchtitan(plan.framework))
    throw ConfigError::rule("parallel.zero_stage", "stage 3 (FSDP full/hybrid shard) gathers every layer's parameters in each "
                                                     "microbatch's forward and backward; neither DeepSpeed nor Megatron-LM combine it "
                                                     "with pipeline parallelism (torchtitan does: training.framework: torchtitan): use "
                                                     "zero_stage 1 or 2 with pipeline > 1 (got pipeline " +
                                                     num(plan.pipeline) + ", framework " + to_string(plan.framework) + ")");
  if (plan.reshard_after_forward != ParallelPlan::kReshardDefault) {
    const int r = plan.reshard_after_forward;
    if (plan.zero_stage != 3)
      throw ConfigError::rule("parallel.reshard_after_forward", "decides what FSDP does with parameters it shards: it needs "
                                                               "parallel.zero_stage 3 (got " + num(plan.zero_stage) + ")");
    const int64_t n = plan.sharding_degree();
    if (r != ParallelPlan::kReshardFull && r != 1 && (r < 2 || r >= n || n % r != 0))
      throw ConfigError::rule("parallel.reshard_after_forward", "must be true, false or a group size that divides the sharding "
                                                               "group's " + num(n) + " ranks and is smaller (got " + num(r) + ")");
  }
  if (plan.offload == Offload::Optimizer && plan.zero_stage == 0)
    throw ConfigError::rule("parallel.offload", "offloading the optimizer (ZeRO-Offload) needs sharded optimizer state: set "
                                                  "parallel.zero_stage to 1, 2 or 3 (got zero_stage 0)");
  if (plan.offload == Offload::OptimizerAndParams && plan.zero_stage != 3)
    throw ConfigError::rule("parallel.offload", "offloading parameters needs them sharded: it needs parallel.zero_stage 3 (got " +
                                                  num(plan.zero_stage) + ")");
  if (plan.sharding_group == ShardingGroup::Node) {
    if (plan.zero_stage == 0)
      throw ConfigError::rule("parallel.sharding_group", "node (hybrid) sharding needs parallel.zero_stage 1, 2 or 3 (got 0)");
    const int64_t per_node = plan.node_data_ranks();
    if (per_node < 2)
      throw ConfigError::rule("parallel.sharding_group", "node: a node of " + num(plan.node_gpus) + " GPUs holds " + num(per_node) +
                                                           " data-parallel rank(s) at tensor " + num(plan.tensor) +
                                                           ": nothing to shard inside a node (use data)");
    if (plan.data % per_node != 0)
      throw ConfigError::rule("parallel.sharding_group", "node: data (" + num(plan.data) + ") must be a multiple of the data-parallel "
                                                           "ranks of one node (" + num(per_node) + " = " + num(plan.node_gpus) +
                                                           " GPUs per node / tensor " + num(plan.tensor) + ")");
  }
}

void validate_expert_context(const TransformerSpec& spec, const ParallelPlan& plan) {
  require_positive("parallel.context", plan.context);
  require_positive("parallel.expert", plan.expert);
  if (plan.expert_tensor < 0)
    throw ConfigError::rule("parallel.expert_tensor", "must be a positive integer, or absent for parallel.tensor (got " + num(plan.expert_tensor) + ")");
  if (plan.context > 1) {
    if (spec.seq_length % (2 * plan.context) != 0)
      throw ConfigError::rule("parallel.context", "splits each sequence in 2 × context (" + num(2 * plan.context) +
                                                      ") load-balanced chunks: model.seq_length (" + num(spec.seq_length) + ") must be divisible by it");
    if (spec.attention == AttentionKind::Unfused)
      throw ConfigError::rule("parallel.context", "context parallelism runs on the fused (flash) attention kernel, as Megatron-Core's "
                                                  "does through Transformer Engine: set model.attention: flash (got unfused)");
    // Ulysses trades the sequence shard for a head shard: each context rank takes 1/cp of the
    // tensor rank's query heads and of its key/value heads (Transformer Engine asserts both).
    if (plan.context_comm == ContextComm::AllToAll) {
      const int64_t heads = spec.num_attention_heads, groups = spec.has_mla() ? heads : spec.query_groups();
      if (heads % (plan.tensor * plan.context) != 0 || groups % (plan.tensor * plan.context) != 0)
        throw ConfigError::rule("parallel.context_comm", "alltoall (Ulysses) gives each context rank 1/context of the tensor rank's "
                                                         "heads: tensor × context (" + num(plan.tensor) + " × " + num(plan.context) +
                                                         ") must divide the attention heads (" + num(heads) + ") and the key/value heads (" +
                                                         num(groups) + "); use ring or allgather");
    }
    if (plan.sequence_parallel && (spec.seq_length / plan.context) % plan.tensor != 0)
      throw ConfigError::rule("parallel.sequence_parallel", "the sequence shard of a context rank (" + num(spec.seq_length / plan.context) +
                                                                " tokens) must be divisible by parallel.tensor (" + num(plan.tensor) + ")");
  }
  if (plan.expert > 1 || plan.expert_tensor > 0) {
    if (!spec.has_moe())
      throw ConfigError::rule(plan.expert > 1 ? "parallel.expert" : "parallel.expert_tensor",
                              "expert parallelism needs a mixture-of-experts model (model.moe); this model is dense");
  }
  if (plan.moe_comm_overlap && plan.expert < 2)
    throw ConfigError::rule("parallel.moe_comm_overlap", "overlaps the expert-parallel all-to-alls: it needs parallel.expert > 1 (got " +
                                                         num(plan.expert) + ")");
  if (plan.moe_comm_overlap && !expert_overlap_schedule(plan))
    throw ConfigError::rule("parallel.moe_comm_overlap",
                            "merges a forward and a backward of two microbatches into one step, which with pipeline > 1 Megatron-Core "
                            "runs only in the interleaved schedule (in 1F1B the merged steps of neighbouring ranks would wait on each "
                            "other's inputs and take turns): use parallel.schedule: interleaved, or moe_comm_overlap: false (got " +
                                std::string(to_string(plan.schedule)) + " with pipeline " + num(plan.pipeline) + ")");
  if (spec.has_moe()) {
    if (spec.moe.num_experts % plan.expert != 0)
      throw ConfigError::rule("parallel.expert", "must divide model.moe.num_experts (" + num(spec.moe.num_experts) + "): each expert-parallel "
                                                 "rank holds whole experts (got expert " + num(plan.expert) + ")");
    const int64_t etp = plan.expert_tensor_size();
    if (spec.expert_ffn() % etp != 0)
      throw ConfigError::rule(plan.expert_tensor > 0 ? "parallel.expert_tensor" : "parallel.tensor",
                              num(etp) + " does not divide the experts' ffn size (" + num(spec.expert_ffn()) + ")");
    if (plan.tensor > 1 && !plan.sequence_parallel && (plan.expert > 1 || etp != plan.tensor))
      throw ConfigError::rule("parallel.sequence_parallel", "expert parallelism with tensor parallelism needs sequence parallelism (as "
                                                            "Megatron-Core requires): each tensor rank routes its own sequence shard (got "
                                                            "tensor " + num(plan.tensor) + ", expert " + num(plan.expert) + ", expert_tensor " + num(etp) + ")");
    const int64_t dense_ranks = plan.tensor * plan.context * plan.data;
    if (dense_ranks % (etp * plan.expert) != 0)
      throw ConfigError::rule("parallel.expert", "expert_tensor × expert (" + num(etp) + " × " + num(plan.expert) + " = " + num(etp * plan.expert) +
                                                 ") must divide tensor × context × data (" + num(plan.tensor) + " × " + num(plan.context) +
                                                 " × " + num(plan.data) + " = " + num(dense_ranks) +
                                                 "): expert-parallel ranks are carved from the data-parallel ones");
  }
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
  require_positive("parallel.context", plan.context);
  require_at_most("parallel.context", plan.context, gpus, "cluster.gpus");
  require_at_most("training.micro_batch", plan.micro_batch, plan.global_batch, "training.global_batch");
  if (plan.context == 1 && gpus % (plan.tensor * plan.pipeline) != 0)
    throw ConfigError::rule("parallel.tensor", "tensor × pipeline (" + num(plan.tensor) + " × " + num(plan.pipeline) + " = " +
                                             num(plan.tensor * plan.pipeline) + ") must divide cluster.gpus (" + num(gpus) + ")");
  if (plan.context > 1 && (plan.tensor * plan.pipeline > gpus || gpus % (plan.tensor * plan.pipeline * plan.context) != 0))
    throw ConfigError::rule("parallel.context", "tensor × context × pipeline (" + num(plan.tensor) + " × " + num(plan.context) + " × " +
                                                num(plan.pipeline) + ") must divide cluster.gpus (" + num(gpus) + ")");
  if (plan.gpus() != gpus) {
    const std::string cp = plan.context > 1 ? " × context" : "";
    throw ConfigError::rule("parallel.data", "tensor" + cp + " × pipeline × data must equal cluster.gpus (" + num(gpus) + "); expected data " +
                                           num(gpus / (plan.tensor * plan.pipeline * plan.context)) + " (got " + num(plan.data) + ")");
  }
  if (spec.num_attention_heads % plan.tensor != 0)
    throw ConfigError::rule("parallel.tensor", num(plan.tensor) + " does not divide num_attention_heads (" +
                                             num(spec.num_attention_heads) + ")");
  if (spec.query_groups() % plan.tensor != 0)
    throw ConfigError::rule("parallel.tensor", num(plan.tensor) + " does not divide model.num_query_groups (" +
                                             num(spec.query_groups()) + "): each tensor-parallel rank needs whole key/value groups");
  if (spec.ffn() % plan.tensor != 0)
    throw ConfigError::rule("parallel.tensor", num(plan.tensor) + " does not divide ffn_hidden_size (" + num(spec.ffn()) + ")");
  if (spec.padded_vocab_size > 0 && spec.padded_vocab_size % plan.tensor != 0)
    throw ConfigError::rule("model.padded_vocab_size", num(spec.padded_vocab_size) + " is not divisible by parallel.tensor (" + num(plan.tensor) +
                                                       "): each tensor-parallel rank holds an equal share of the vocabulary");
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
  validate_overlaps(plan);
  validate_framework(plan);
  validate_recompute_modules(spec, plan);
  // A tensor-parallel group exchanges activations twice per layer and microbatch: it lives inside
  // one NVLink domain (a DGX node, an NVL72 rack), never across the network between them.
  if (plan.tensor > plan.node_gpus || plan.node_gpus % plan.tensor != 0)
    throw ConfigError::rule("parallel.tensor", num(plan.tensor) + " GPUs do not tile one NVLink domain of " + num(plan.node_gpus) +
                                                   " GPUs (cluster.topology node.gpus): a tensor-parallel group would span nodes "
                                                   "(or racks, on rack-scale NVLink systems), which Megatron-style TP does not do over "
                                                   "InfiniBand");

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
  } else if (is_v_shape(plan.schedule)) {
    // ZB-V, DualPipeV: stage s on rank s for s < p and on rank 2p − 1 − s after that — two chunks per rank.
    const std::string name = to_string(plan.schedule);
    if (plan.virtual_stages != 2)
      throw ConfigError::rule("parallel.virtual_stages", name + " places two chunks per pipeline rank in a V shape: "
                                                       "virtual_stages must be 2 (got " + num(plan.virtual_stages) + ")");
    // Layers that 2 × pipeline does not divide: validate_partition asks for an uneven split
    // (layers_per_stage, first/last_stage_layers or partition: balanced), as the paper splits them.
    if (plan.schedule == ScheduleKind::DualPipe) {
      // Rank r and rank p − 1 − r hold the same two chunks; the two directions meet in the middle.
      if (plan.pipeline < 2 || plan.pipeline % 2 != 0)
        throw ConfigError::rule("parallel.pipeline", "dualpipe pairs rank r with rank p − 1 − r (both hold the same two "
                                                     "chunks): the pipeline size must be even and at least 2 (got " +
                                                         num(plan.pipeline) + ")");
      if (m % 2 != 0 || m < 2 * plan.pipeline)
        throw ConfigError::rule("training.global_batch", "dualpipe sends half the microbatches from each end of the pipeline "
                                                         "and fills both directions of every rank in its warm-up: it needs an "
                                                         "even number of microbatches per pipeline, at least 2 × pipeline (" +
                                                             num(2 * plan.pipeline) + "; got " + num(m) + ")");
    }
    if (plan.schedule == ScheduleKind::DualPipeV && plan.num_microbatches() < 2 * plan.pipeline)
      throw ConfigError::rule("training.global_batch", "dualpipev needs at least 2 × pipeline (" + num(2 * plan.pipeline) +
                                                     ") microbatches per pipeline: its warm-up fills both chunks of every rank (got " +
                                                     num(plan.num_microbatches()) + ")");
  } else if (plan.virtual_stages != 1) {
    throw ConfigError::rule("parallel.virtual_stages", "virtual stages need schedule: interleaved, zb-v, dualpipev or dualpipe (got " + num(plan.virtual_stages) +
                                                     " with schedule " + to_string(plan.schedule) + ")");
  }
  if (plan.optimizer_sync == OptimizerSync::PostValidate && !is_zero_bubble(plan.schedule))
    throw ConfigError::rule("parallel.optimizer_sync",
                            "post_validate needs a schedule whose ranks finish at different times so that each may "
                            "step before the others (zb-h1, zb-h2, zb-v, zb-auto); " +
                                to_string(plan.schedule) + " has no deferred optimizer step (use barrier)");
  validate_partition(spec, plan);
  validate_sharding(plan);
  validate_expert_context(spec, plan);
  if (plan.vocab_parallel_pipeline) {
    if (plan.pipeline < 2)
      throw ConfigError::rule("parallel.vocab_parallel_pipeline", "splits the output layer over the pipeline ranks: it needs pipeline > 1 (got " +
                                                                  num(plan.pipeline) + ")");
    if (plan.virtual_stages > 1)
      throw ConfigError::rule("parallel.vocab_parallel_pipeline", "is modelled with one stage per pipeline rank (virtual_stages 1, got " +
                                                                  num(plan.virtual_stages) + ")");
    if (spec.vocab_size < plan.pipeline)
      throw ConfigError::rule("parallel.vocab_parallel_pipeline", "gives each of the " + num(plan.pipeline) + " pipeline ranks a share of the vocabulary: "
                                                                  "model.vocab_size (" + num(spec.vocab_size) + ") must be at least pipeline");
  }
  // Schedules hold m·v actions per rank; refuse sizes that could not be generated in memory.
  require_at_most("training.global_batch", m * plan.virtual_stages * plan.pipeline, kMaxScheduleCells,
                  "the schedule (microbatches × virtual stages × pipeline)");
}

}  // namespace ptdp
