#include "exec/train.hpp"

#include <algorithm>
#include <fstream>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/json_depth.hpp"
#include "core/json_read.hpp"
#include "exec/io/checkpoint.hpp"
#include "exec/io/checkpoint_run.hpp"
#include "exec/runtime/agree.hpp"
#include "exec/runtime/cpu_time.hpp"
#include "exec/runtime/cuda/cuda.hpp"
#include "exec/io/data.hpp"
#include "exec/runtime/device.hpp"
#include "exec/interpreter.hpp"
#include "exec/speed_probe.hpp"
#include "model/flops.hpp"
#include "model/grid.hpp"
#include "model/memory.hpp"
#include "model/metrics.hpp"
#include "model/partition.hpp"
#include "model/units.hpp"
#include "schedules/graph.hpp"

namespace ptdp::exec {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string num(int64_t v) { return std::to_string(v); }
std::string number(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// Multi-token prediction (exec/model/mtp.hpp) as the executor runs it: on the last stage (each
// lane's under DualPipe, the two copies summed like the rest of the stage), over whole sequences;
// what it does not run is refused, naming the key and the way out.
void check_mtp(const TransformerSpec& spec, const ParallelPlan& plan) {
  auto refuse = [](const std::string& key, const std::string& why) {
    throw ConfigError(key, "with model.mtp_layers " + why + " (ptdp simulate prices the plan)");
  };
  if (plan.mtp_apart())
    refuse("parallel.pipeline_layout", "the executor runs the multi-token-prediction layers with the loss, on the last stage: "
                                       "put the m layers in the stage with L (e.g. \"Et|tt|mL\")");
  if (spec.learned_positions())
    refuse("model.position_embedding", "the modules' embedding (Megatron-Core's) adds the learned position table, which the "
                                       "executor keeps on the first stage only; set model.position_embedding: rope or none");
}

void check_plan(const TransformerSpec& spec, const ParallelPlan& plan, int world_size, bool explicit_schedule, const std::string& backend) {
  if (plan.tensor < 1 || plan.pipeline < 1 || plan.data < 1)
    throw ConfigError("parallel", "tensor, pipeline and data must be positive (got " + num(plan.tensor) + ", " +
                                      num(plan.pipeline) + ", " + num(plan.data) + ")");
  // Mixture of experts: the executor runs the all-to-all and allgather dispatchers with routed
  // experts split over the expert-parallel ranks and each expert's columns over the expert-tensor
  // ranks (t by default; another size folds the stage's t·cp·d ranks into expert-tensor, expert
  // and expert-data groups, model/grid.hpp); what it does not run is refused here, naming the key.
  if (spec.has_moe() || plan.expert > 1 || plan.expert_tensor > 0) {
    auto refuse = [](const std::string& key, const std::string& what) {
      throw ConfigError(key, "the executor's mixture-of-experts layers do not run " + what + "; simulate the plan (ptdp simulate)");
    };
    if (!spec.has_moe()) validate_expert_context(spec, plan);  // expert parallelism without experts: named there
    if (spec.moe.shared_experts > 0 && spec.moe.shared_experts * spec.shared_expert_ffn() % plan.tensor != 0)
      throw ConfigError("model.moe.shared_experts", "the shared experts' inner size (shared_experts × shared_expert_ffn_hidden_size = " +
                                                        num(spec.moe.shared_experts * spec.shared_expert_ffn()) +
                                                        ") must be divisible by parallel.tensor (" + num(plan.tensor) + ")");
    // Without expert parallelism the experts are replicated over the data group like every other
    // weight: sharded and bucketed with them. With it (or folded), their states shard (and their buckets
    // reduce) over the expert-data group, the ranks holding the same experts.
    const bool folded = plan.expert_tensor_size() != plan.tensor;  // Megatron's parallel folding (model/grid.hpp)
    if (plan.zero_stage > 0 && (plan.expert > 1 || folded) && plan.sharding_degree() < plan.gradient_ranks())
      refuse("parallel.sharding_group", "with a node sharding group and expert parallelism (they shard the experts' states "
                                        "over the whole expert-data group and have no per-node expert group with replicas; "
                                        "set parallel.sharding_group: data, or parallel.expert: 1 with parallel.expert_tensor = tensor)");
    if (plan.expert > 1 && !folded && (plan.data * plan.context) % plan.expert != 0)
      throw ConfigError("parallel.expert", "the executor carves the " + num(plan.expert) + " expert-parallel ranks from the " +
                                               num(plan.data * plan.context) + " data" +
                                               (plan.context > 1 ? " × context" : "") + "-parallel ones: expert must divide " +
                                               (plan.context > 1 ? "data × context" : "data"));
  }
  // Overlaps the engines credit but the executor does not run are refused, so that `validate`
  // never compares a prediction with an overlap that did not happen (the key names the way out).
  auto no_overlap = [](const std::string& key, const std::string& what) {
    throw ConfigError(key, "the executor " + what + "; the prediction credits the overlap, so the run would not be the plan "
                                                    "(set it false to train, or simulate the plan)");
  };
  // The expert all-to-all overlap hides a pass's all-to-alls under its compute on a device whose
  // communication runs beside it; the CPU back end's collectives block the core (the engines
  // price no hiding on a CPU host, the schedule is unchanged): there the flag trains as without it.
  if (plan.moe_comm_overlap && backend != "cpu")
    no_overlap("parallel.moe_comm_overlap", "(back end " + backend + ") does not hide the expert all-to-alls under the pass's "
                                            "compute (only --backend cpu runs the flag, where nothing hides)");
  // FSDP2's reshard_after_forward N keeps each unit sharded over N members of the sharding group
  // between its forward and its backward; the routed experts at ep > 1 (or folded) shard over
  // their expert-data group instead, which has no such subgroup in the executor.
  const int64_t regather = reshard_group(plan);
  if (plan.zero_stage >= 3 && regather > 1 && regather < plan.sharding_degree() &&
      (plan.expert > 1 || plan.expert_tensor_size() != plan.tensor))
    throw ConfigError("parallel.reshard_after_forward",
                      "the executor keeps a unit sharded over " + num(regather) + " ranks after its forward only for weights that "
                          "shard over the sharding group; the routed experts at parallel.expert > 1 shard over their "
                          "expert-data group (set true or false, or simulate the plan)");
  // Vocabulary parallelism (Yeung et al. 2024) computes each microbatch's logits on every pipeline
  // rank between the last stage's forward and backward of it: passes of their own in the
  // schedule. The lowering (model/cost.cpp vocab_ops) prices the shares and their pipeline-group
  // collectives inside each stage's F and B, which no run can do as placed (stage 0's F of a
  // microbatch precedes the last stage's), so the executor has no schedule to run it by.
  if (plan.vocab_parallel_pipeline)
    throw ConfigError("parallel.vocab_parallel_pipeline",
                      "the executor computes the output layer and loss on the last stage only: splitting them over the pipeline "
                      "ranks needs a vocabulary pass on every rank between the last stage's forward and backward of each "
                      "microbatch, which ptdp's schedules do not have yet (the prediction spreads that work over each stage's "
                      "F and B); set it false to train the plan, or simulate it (ptdp simulate)");
  if (plan.context > 1) {
    if (plan.sequence_parallel && plan.tensor > 1 && (spec.seq_length / plan.context) % plan.tensor != 0)
      throw ConfigError("parallel.sequence_parallel", "the sequence shard of a context rank (" + num(spec.seq_length / plan.context) +
                                                          " tokens) must be divisible by parallel.tensor (" + num(plan.tensor) + ")");
    if (spec.seq_length % (2 * plan.context) != 0 || spec.attention != AttentionKind::Flash || plan.context_comm == ContextComm::AllToAll)
      validate_expert_context(spec, plan);  // names the key and the numbers (Ulysses: t·cp divides the heads)
  }
  if (spec.has_mla() && plan.tp_comm_overlap)
    throw ConfigError("parallel.tp_comm_overlap", "the executor runs multi-head latent attention's sequence-parallel collectives "
                                                  "whole, not chunked under its GEMMs (set it false to train model.mla, or simulate the plan)");
  if (spec.has_mla() && backend != "cpu" && spec.v_dim() != spec.qk_dim())
    throw ConfigError("model.mla.v_head_dim", "the " + backend + " back end's attention kernels take values as wide as the queries and "
                                              "keys (qk_head_dim + qk_pos_emb_head_dim = " + num(spec.qk_dim()) + ", v_head_dim " +
                                              num(spec.v_dim()) + "); multi-head latent attention trains on --backend cpu");
  if (spec.has_mla() && spec.mla.qk_pos_emb_head_dim == 0)
    throw ConfigError("model.mla.qk_pos_emb_head_dim", "the executor trains multi-head latent attention with a rotary key part "
                                                       "(Megatron's MLA always has one): give it at least 2 channels");
  if (spec.mtp_layers > 0) check_mtp(spec, plan);
  if (plan.gpus() != world_size)
    throw ConfigError("parallel", "tensor × " + std::string(plan.context > 1 ? "context × " : "") + "pipeline × data = " +
                                      num(plan.tensor) + " × " + (plan.context > 1 ? num(plan.context) + " × " : "") +
                                      num(plan.pipeline) + " × " + num(plan.data) + " = " + num(plan.gpus()) + " ranks, but " +
                                      num(world_size) + " were started: launch with mpirun -np " + num(plan.gpus()));
  if (!explicit_schedule) {
    validate_plan(spec, plan, world_size);
  } else {  // the plan's schedule rules do not apply; the executor's own needs do
    validate_model(spec);
    if (plan.micro_batch < 1 || plan.global_batch < 1 || plan.virtual_stages < 1)
      throw ConfigError("training", "micro_batch, global_batch and virtual_stages must be positive");
    if (spec.num_attention_heads % plan.tensor != 0)
      throw ConfigError("parallel.tensor", num(plan.tensor) + " does not divide num_attention_heads (" +
                                               num(spec.num_attention_heads) + ")");
    if (spec.ffn() % plan.tensor != 0)
      throw ConfigError("parallel.tensor", num(plan.tensor) + " does not divide ffn_hidden_size (" + num(spec.ffn()) + ")");
    if (plan.global_batch % (plan.micro_batch * plan.data) != 0)
      throw ConfigError("training.global_batch", "must be divisible by micro_batch × data (" +
                                                     num(plan.micro_batch * plan.data) + ") (got " + num(plan.global_batch) + ")");
  }
  if (explicit_schedule) {
    if (spec.query_groups() % plan.tensor != 0)
      throw ConfigError("parallel.tensor", num(plan.tensor) + " does not divide model.num_query_groups (" +
                                               num(spec.query_groups()) + ")");
    validate_partition(spec, plan);
    validate_sharding(plan);
  }
  // The CPU kernels index with 32-bit sizes.
  const int64_t tokens = plan.micro_batch * spec.seq_length;
  const int64_t widest = std::max({spec.hidden_size * 3, spec.q_width() + 2 * spec.kv_width(),
                                   spec.num_attention_heads * (2 * spec.qk_dim() + spec.v_dim()), spec.ffn(),
                                   spec.padded_vocab(plan.tensor) / plan.tensor,
                                   spec.seq_length * spec.num_attention_heads / plan.tensor});
  if (tokens * widest > INT_MAX || tokens * spec.seq_length > INT_MAX)
    throw ConfigError("training.micro_batch", "micro_batch × seq_length × width (" + num(tokens * widest) +
                                                  ") exceeds what the executor indexes (2³¹ elements per tensor)");
}

// The documented ranges of the optimizer's hyper-parameters (README, `ptdp train --help`).
void validate_adam(const AdamOptions& a) {
  auto in = [](const char* key, double v, double lo, double hi, bool lo_open, bool hi_open) {
    const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (!ok)
      throw ConfigError(key, std::string("must be in ") + (lo_open ? "(" : "[") + number(lo) + ", " + number(hi) +
                                 (hi_open ? ")" : "]") + " (got " + number(v) + ")");
  };
  in("--lr", a.lr, 0, 10, true, false);
  in("adam.beta1", a.beta1, 0, 1, false, true);
  in("adam.beta2", a.beta2, 0, 1, false, true);
  in("adam.eps", a.eps, 0, 1, true, false);
  in("adam.weight_decay", a.weight_decay, 0, 1, false, false);
  in("adam.clip_grad", a.clip_grad, 0, 1e6, false, false);
}

// The plan's schedule (make_schedule), or the given one fitted to the plan (adopt_schedule).
Schedule schedule_for(const ParallelPlan& plan, const TrainOptions& o) {
  try {
    if (o.schedule) return adopt_schedule(*o.schedule, plan, o.schedule_source.empty() ? "schedule" : o.schedule_source);
    return make_schedule(plan);
  } catch (const ScheduleError& e) {
    throw ConfigError("schedule", e.what());
  }
}

RecomputeMode recompute_mode(Recompute r) {
  switch (r) {
    case Recompute::None: return RecomputeMode::None;
    case Recompute::Selective: return RecomputeMode::Selective;
    case Recompute::Full: return RecomputeMode::Full;
  }
  return RecomputeMode::None;
}


// The CPU seconds of computation of each compute action, in the report as
// "compute_cpu_s.KIND.STAGE" (F, B, I, W; OPTIM per pipeline rank): each rank's mean per action
// in every timed iteration, the median over the iterations, then the median over the ranks
// holding that kind and stage (their tensor and data-parallel members compute alike). A spell of
// another process's load inflates an iteration or a rank, not the figure: with the mean over
// iterations on the slowest rank, one row's forward moved 2.45 → 3.27 ms (t 4, two runs minutes
// apart at load 8–10).
void add_compute_cpu(Communicator& world, const std::map<std::pair<ActionKind, int>, std::vector<double>>& mine, int stages,
                     int pipeline, Report& report) {
  const std::vector<ActionKind> kinds = {ActionKind::F, ActionKind::B, ActionKind::I, ActionKind::W};
  auto slot = [&](ActionKind k, int at) {
    if (k == ActionKind::OPTIM) return kinds.size() * static_cast<size_t>(stages) + static_cast<size_t>(at);
    return static_cast<size_t>(std::find(kinds.begin(), kinds.end(), k) - kinds.begin()) * static_cast<size_t>(stages) +
           static_cast<size_t>(at);
  };
  const size_t slots = kinds.size() * static_cast<size_t>(stages) + static_cast<size_t>(pipeline);
  const size_t ranks = static_cast<size_t>(world.size()), me = static_cast<size_t>(world.rank());
  std::vector<double> all(slots * ranks, 0.0);  // [rank][slot], each rank fills its own row
  for (const auto& [at, per_iteration] : mine) all[me * slots + slot(at.first, at.second)] = median(per_iteration);
  world.all_reduce(all.data(), all.size(), ReduceOp::Sum);
  auto put = [&](ActionKind k, int at) {
    std::vector<double> held;
    for (size_t r = 0; r < ranks; ++r)
      if (const double v = all[r * slots + slot(k, at)]; v > 0) held.push_back(v);
    if (!held.empty()) report.extra["compute_cpu_s." + std::string(to_string(k)) + "." + num(at)] = median(std::move(held));
  };
  for (ActionKind k : kinds)
    for (int st = 0; st < stages; ++st) put(k, st);
  for (int pp = 0; pp < pipeline; ++pp) put(ActionKind::OPTIM, pp);
}

// What a run needs before its model exists: the plan checked on every rank, the device, the
// schedule and (fp16) the loss scaler.
struct RunStart {
  std::unique_ptr<Device> dev;
  Schedule schedule;
  std::optional<cuda::DynamicLossScaler> scaler;
};

RunStart start_run(Communicator& world, const TransformerSpec& spec, const ParallelPlan& plan, const TrainOptions& options) {
  RunStart r;
  agree(world, [&] {
    check_plan(spec, plan, world.size(), options.schedule.has_value(), options.backend);
    if (plan.precision == Precision::FP8 && options.backend != "cpu")
      throw ConfigError("training.precision", "fp8 is emulated on the cpu back end only (its e4m3/e5m2 casts run on the host); "
                                              "use --backend cpu, or train with bf16 and simulate fp8");
    if (options.steps < 1) throw ConfigError("steps", "must be at least 1 (got " + num(options.steps) + ")");
    if (options.save_every < 0) throw ConfigError("save_every", "must not be negative (got " + num(options.save_every) + ")");
    if ((options.resume || options.save_every > 0) && options.checkpoint_dir.empty())
      throw ConfigError(options.resume ? "resume" : "save_every", "needs a checkpoint directory (--checkpoint DIR)");
    if (!(options.comm_timeout_s > 0)) throw ConfigError("comm_timeout_s", "must be positive");
    validate_adam(options.adam);
    if (plan.precision == Precision::FP16) r.scaler.emplace(options.loss_scaling);  // names a bad option
    configure_checkpoint_faults(world.rank());
    r.schedule = schedule_for(plan, options);
    if (options.backend == "cuda" && spec.has_moe())
      throw ConfigError("model.moe", "mixture-of-experts layers train on the cpu back end only (their routing and all-to-all run "
                                     "through host memory); use --backend cpu, or simulate the plan");
    if (options.backend == "cuda" && plan.context > 1)
      throw ConfigError("parallel.context", "context parallelism trains on the cpu back end only (its ring attention has no CUDA "
                                            "kernel yet); use --backend cpu, or simulate the plan");
    if (options.backend == "cuda") {
      // The plan's memory estimate is quoted if a GPU allocation fails.
      cuda::CudaDeviceOptions cuda_options;
      cuda_options.precision = plan.precision;
      cuda_options.plan_memory_bytes = peak_memory(memory_per_rank(spec, plan, peak_inflight_activations(r.schedule))).total_bytes;
      r.dev = cuda::make_cuda_device(cuda_options);
    } else if (options.backend == "cpu") {
      // bf16 / fp16 plans: the GEMMs take operands rounded to that format, accumulate in fp32.
      // fp8 plans: Transformer Engine's FP8 runs on top of bf16 (the GEMMs outside the linear layers).
      r.dev = make_cpu_device(plan.precision == Precision::BF16 || plan.precision == Precision::FP8 ? GemmOperands::BF16
                              : plan.precision == Precision::FP16                                   ? GemmOperands::FP16
                                                                                                    : GemmOperands::FP32);
    } else {
      r.dev = make_device(options.backend);
    }
  });
  return r;
}

// This rank's stages of the model, sharded as the plan says, wired to the run's groups.
std::unique_ptr<ModelShard> build_model(Communicator& world, Device& dev, const TransformerSpec& spec, const ParallelPlan& plan,
                                        const Schedule& schedule, const ProcessGroups& groups, int64_t seed) {
  const RankCoordinates& c = groups.coords;
  const int cp = static_cast<int>(plan.context), ep = static_cast<int>(plan.expert);
  std::vector<int> my_stages;
  for (int s = 0; s < schedule.num_stages(); ++s)
    if (schedule.stage_to_rank[s] == c.pp) my_stages.push_back(s);
  std::unique_ptr<ModelShard> model;
  agree(world, [&] {
    ShardingOptions sharding;
    sharding.zero_stage = plan.zero_stage;
    sharding.group = groups.sharding.get();
    sharding.replicas = groups.replicas.get();
    sharding.offload_optimizer = plan.offload != Offload::None;
    sharding.offload_params = plan.offload == Offload::OptimizerAndParams;
    sharding.max_inflight_gathers = static_cast<int>(plan.max_inflight_gathers);
    sharding.expert_group = groups.expert_data.get();  // ep > 1: the experts shard over their expert-data group
    sharding.reduce_once_per_step = gradients_reduced_once_per_step(plan);
    sharding.overlap_param_gather = plan.overlap_param_gather;
    // FSDP2's reshard_after_forward (plan.hpp reshard_group): what a unit is between its forward
    // and its backward; inside UNSHARD … RESHARD windows the stage is held whole anyway.
    if (plan.zero_stage >= 3 && !stage_held_unsharded(plan)) {
      sharding.keep_whole_after_forward = reshard_group(plan) == 1;
      sharding.reshard = groups.reshard.get();
      sharding.keep_last_unit_whole = last_unit_kept_whole(plan);
    }
    // The experts' place from the plan's process grid (model/grid.hpp): expert-tensor fastest, then
    // expert, over the stage's t·cp·d ranks (at expert_tensor = t: the tensor rank, dp mod ep).
    const GridCoord e = ProcessGrid(plan).coord(world.rank());
    model = std::make_unique<ModelShard>(dev, spec, static_cast<int>(plan.micro_batch), c.tp, static_cast<int>(plan.tensor),
                                         stage_layers(spec, plan), my_stages, seed, sharding, plan.sequence_parallel, cp,
                                         c.dp % cp, ep, static_cast<int>(e.ep), static_cast<int>(plan.expert_tensor_size()),
                                         static_cast<int>(e.etp));
    model->set_expert_data_group(groups.expert_data.get());
    model->set_mirror_group(groups.mirror.get());
    model->use_context_all_gather(plan.context_comm == ContextComm::AllGather);
    model->use_context_all_to_all(plan.context_comm == ContextComm::AllToAll);
    model->use_moe_all_gather(plan.moe_dispatcher == MoeDispatcher::AllGather);
  });
  return model;
}

// The fp16 loss scaler's state, as the checkpoint's meta.json holds it.
json loss_scaler_json(const cuda::DynamicLossScaler& scaler) {
  const auto ls = scaler.state();
  return {{"scale", ls.scale}, {"growth_tracker", ls.growth_tracker}, {"hysteresis_tracker", ls.hysteresis_tracker},
          {"skipped", ls.skipped}};
}

void restore_loss_scaler(Communicator& world, const std::string& checkpoint_dir, cuda::DynamicLossScaler& scaler) {
  agree(world, [&] {
    const std::string where = latest_checkpoint_dir(checkpoint_dir), path = where + "/meta.json";
    const json meta = read_checkpoint_meta(where);
    if (!meta.contains("loss_scaler"))
      throw ConfigError("checkpoint", path + " has no loss_scaler state: it was not saved by an fp16 run");
    const json& ls = meta["loss_scaler"];
    scaler.restore({json_get<double>(json_at(ls, "scale", path), path, "loss_scaler.scale"),
                    json_get<int64_t>(json_at(ls, "growth_tracker", path), path, "loss_scaler.growth_tracker"),
                    json_get<int>(json_at(ls, "hysteresis_tracker", path), path, "loss_scaler.hysteresis_tracker"),
                    json_get<int64_t>(json_at(ls, "skipped", path), path, "loss_scaler.skipped")});
  });
}

InterpreterOptions interpreter_options(const TransformerSpec& spec, const ParallelPlan& plan, const TrainOptions& options,
                                       const RankCoordinates& c, CommLedger& ledger, std::optional<Fp8Emulation>& fp8) {
  InterpreterOptions iopt;
  iopt.recompute = recompute_mode(plan.recompute);
  iopt.scatter_gather = scatter_gather_applies(spec, plan);
  iopt.adam = options.adam;
  iopt.post_validate = plan.optimizer_sync == OptimizerSync::PostValidate;
  // Overlapped gradient reduction (zero_stage 0: bucketed all-reduces; 1, the distributed
  // optimizer: bucketed reduce-scatters; at stage ≥ 2 the per-unit reduce-scatters already run
  // during the backward). The first pipeline rank's stages only, as the engines price it:
  // Megatron delays the other pipeline ranks' reductions to the end (one bucket).
  // DualPipe at stage 0 folds the copies' sum into REDUCE_GRAD's reduction, which the lowering
  // (schedules/communication.cpp reduce_grad_steps) leaves whole: nothing to bucket.
  const bool folded_lanes = plan.lanes() > 1 && plan.zero_stage == 0;
  if (plan.reduces_in_buckets(c.pp) && !folded_lanes)
    iopt.overlap_bucket_elements = static_cast<size_t>(plan.bucket_parameters());
  if (!options.comm_ledger_path.empty()) iopt.ledger = &ledger;
  if (plan.precision == Precision::FP8) iopt.fp8 = &fp8.emplace(plan.fp8_recipe, plan.fp8_format);
  iopt.dropout_seed = options.seed;
  iopt.tp_comm_overlap = plan.tp_comm_overlap;
  iopt.blocking_p2p = !plan.overlap_p2p;
  return iopt;
}

// The tokens one rank feeds its first and last stages, per iteration: each microbatch's
// sequences, sampled by their global index, cut to this rank's context share.
class BatchFeeder {
 public:
  BatchFeeder(const TransformerSpec& spec, const ParallelPlan& plan, const Schedule& schedule, const ModelShard& model,
              const RankCoordinates& c)
      : model_(model), m_(schedule.m), b_(static_cast<int>(plan.micro_batch)), local_seq_(model.shape().seq),
        data_rank_(c.dp / static_cast<int>(plan.context)),  // coords.dp spans data × context
        per_replica_(plan.global_batch / plan.data), sample_in_(static_cast<size_t>(spec.seq_length)),
        sample_target_(static_cast<size_t>(spec.seq_length)) {
    for (int st = 0; st < schedule.num_stages(); ++st)
      if (model.holds_stage(st)) {
        needs_tokens_ |= schedule.first_stage(st) || schedule.last_stage(st);
        loss_owner_ |= schedule.last_stage(st) && c.tp == 0;
      }
    if (needs_tokens_) {
      batch_.inputs.assign(m_, std::vector<int32_t>(static_cast<size_t>(b_) * local_seq_));
      batch_.targets.assign(m_, std::vector<int32_t>(static_cast<size_t>(b_) * local_seq_));
    }
    for (int mb = 0; mb < m_; ++mb) batch_.first_sample.push_back(first_sample(mb));
  }
  bool loss_owner() const { return loss_owner_; }
  const IterationBatch& fill(const BatchSampler& sampler, int64_t step) {
    if (!needs_tokens_) return batch_;
    for (int mb = 0; mb < m_; ++mb)
      for (int j = 0; j < b_; ++j) {
        // The whole sequence, then (context parallelism) this rank's tokens of it.
        sampler.sample(step, first_sample(mb) + j, sample_in_.data(), sample_target_.data());
        for (int i = 0; i < local_seq_; ++i) {
          const size_t at = static_cast<size_t>(j) * local_seq_ + i;
          const auto from = static_cast<size_t>(model_.shape().position(i, model_.shape().cp_rank));
          batch_.inputs[mb][at] = sample_in_[from];
          batch_.targets[mb][at] = sample_target_[from];
        }
      }
    return batch_;
  }

 private:
  int64_t first_sample(int mb) const { return data_rank_ * per_replica_ + static_cast<int64_t>(mb) * b_; }
  const ModelShard& model_;
  int m_, b_, local_seq_, data_rank_;
  int64_t per_replica_;
  bool needs_tokens_ = false, loss_owner_ = false;  // a first (embedding) or last (loss) stage of a lane
  std::vector<int32_t> sample_in_, sample_target_;
  IterationBatch batch_;
};

std::string step_line(int64_t step, int64_t steps, double loss, const IterationResult& r, double scale_used,
                      const std::optional<cuda::DynamicLossScaler>& scaler, double tokens, double dt) {
  char line[260];
  if (r.overflow)
    std::snprintf(line, sizeof line,
                  "step %" PRId64 "/%" PRId64 "  loss %.4f  skipped: gradient overflow at loss scale %g (now %g)  %.3f s", step + 1,
                  steps, loss, scale_used, scaler->scale(), dt);
  else
    std::snprintf(line, sizeof line, "step %" PRId64 "/%" PRId64 "  loss %.4f  grad-norm %.3f  %.0f tokens/s  %.3f s", step + 1,
                  steps, loss, r.grad_norm, tokens / dt, dt);
  return line;
}

// Everyone reports rank 0's clock (`times` becomes rank 0's): the median iteration time without
// the first (warm-up) iteration — robust to the odd step a busy machine slows down; the mean is
// kept as well.
void record_times(Communicator& world, std::vector<double>& times, Report& report) {
  uint64_t n_times = times.size();
  world.broadcast(times.data(), n_times * sizeof(double), 0);
  std::vector<double> timed(times.begin() + (times.size() > 1 ? 1 : 0), times.end());
  double total = 0;
  for (double t : timed) total += t;
  std::sort(timed.begin(), timed.end());
  const size_t k = timed.size();
  report.iteration_time_s = k % 2 ? timed[k / 2] : 0.5 * (timed[k / 2 - 1] + timed[k / 2]);
  report.extra["iteration_time_mean_s"] = total / static_cast<double>(k);
}

// Every rank's events of the last iteration travel to rank 0 (the timeline's JSON mapping).
std::vector<TimelineEvent> gather_events(Communicator& world, std::vector<TimelineEvent> events) {
  Timeline mine;
  mine.events = std::move(events);
  const std::string mine_json = timeline_to_json(mine);
  const auto gathered = world.gather_bytes(std::vector<char>(mine_json.begin(), mine_json.end()), 0);
  std::vector<TimelineEvent> all;
  if (world.rank() == 0)
    for (size_t r = 0; r < gathered.size(); ++r) {
      Timeline part = timeline_from_json(std::string(gathered[r].begin(), gathered[r].end()), "rank " + num(r));
      all.insert(all.end(), part.events.begin(), part.events.end());
    }
  return all;
}

void name_devices(const ParallelPlan& plan, const std::string& backend, int world_size, Timeline& timeline) {
  const int t = static_cast<int>(plan.tensor), p = static_cast<int>(plan.pipeline), cp = static_cast<int>(plan.context);
  const int dcp = static_cast<int>(plan.data) * cp;
  for (int g = 0; g < world_size; ++g) {
    const RankCoordinates rc = RankCoordinates::of(g, t, p, dcp);
    timeline.device_names[g] = backend + " rank " + num(g) + " (tp" + num(rc.tp) + (cp > 1 ? " cp" + num(rc.dp % cp) : std::string()) +
                               " dp" + num(rc.dp / cp) + " pp" + num(rc.pp) + ")";
  }
}

void write_ledger(const CommLedger& ledger, const std::string& prefix, int rank, int pp) {
  const std::string path = prefix + ".rank" + num(rank) + ".json";
  std::ofstream out(path);
  out << ledger.to_json(rank, pp);
  if (!out) throw EnvironmentError("cannot write the communication ledger " + path);
}

// The trained parameters, whole, to rank 0's caller when it asked for them (every rank joins).
void hand_out_parameters(Communicator& world, ModelShard& model, ParameterSet* out) {
  double want = (world.rank() == 0 && out != nullptr) ? 1.0 : 0.0;
  world.broadcast(&want, sizeof want, 0);
  if (want > 0) {
    FullStates full;
    gather_states(world, model, false, &full);
    if (world.rank() == 0) *out = std::move(full.values);
  }
}

}  // namespace

void check_trainable(const TransformerSpec& spec, const ParallelPlan& plan, bool explicit_schedule, const std::string& backend) {
  check_plan(spec, plan, static_cast<int>(plan.gpus()), explicit_schedule, backend);
}

namespace {

// The per-rank breakdown of the last iteration, from the pipeline ranks' representatives
// (tensor and data rank 0), scaled to the reported (median) iteration time.
void add_rank_breakdown(const std::vector<TimelineEvent>& events, const RankCoordinates& c, int p, const std::vector<double>& times,
                        Report& report) {
  std::vector<int> representative(p);
  RankCoordinates probe = c;
  probe.tp = 0;
  probe.dp = 0;
  for (int pp = 0; pp < p; ++pp) representative[pp] = probe.global_rank_at_pipeline(pp);
  report.ranks = rank_breakdown(events, representative, times.back());
  // The breakdown is the last iteration's, the reported iteration time the median's: scaled to
  // it, the fractions stay the last iteration's (on a busy machine the two differ, and the
  // bubble of a slow last iteration exceeded the median: a fraction above 1).
  const double scale = report.iteration_time_s / times.back();
  for (RankBreakdown& rb : report.ranks) {
    for (double* x : {&rb.busy_s, &rb.bubble_s, &rb.exposed_tp_s, &rb.exposed_pp_s, &rb.exposed_dp_s, &rb.exposed_cp_s,
                      &rb.exposed_ep_s, &rb.recompute_s, &rb.exposed_shard_s})
      *x *= scale;
    for (double& x : rb.class_time_s) x *= scale;
  }
}

// The measured report's memory (the most bytes the device allocator and the host held on any
// rank), its metrics and the run's extras.
void finish_measured_report(Communicator& world, const Device& dev, ModelShard& model, const TransformerSpec& spec, const ParallelPlan& plan,
                            const TrainOptions& options, int64_t first_step, double grad_norm, int64_t rolled_back,
                            const std::optional<cuda::DynamicLossScaler>& scaler, Report& report) {
  // The most bytes the device allocator held on any rank (offloaded states are host memory).
  double peak = static_cast<double>(dev.peak_bytes());
  world.all_reduce(&peak, 1, ReduceOp::Max);
  double host = static_cast<double>(model.host_bytes());
  world.all_reduce(&host, 1, ReduceOp::Max);

  report.fidelity = "measured";
  report.backend = options.backend;
  // The CPU's peak is unknown (MFU stays 0); TFLOP/s per rank is the measured figure.
  complete_report(report, run_metrics(spec, plan, report.iteration_time_s, /*peak_flops=*/0, options.train_tokens, &options.energy));
  report.peak_memory_bytes = peak;
  report.fits_in_memory = true;
  report.extra["first_step"] = static_cast<double>(first_step);
  report.extra["grad_norm"] = grad_norm;
  if (scaler) {
    report.extra["skipped_steps"] = static_cast<double>(scaler->skipped_steps());
    report.extra["loss_scale"] = scaler->scale();
  }
  if (plan.optimizer_sync == OptimizerSync::PostValidate) report.extra["optimizer_rollbacks"] = static_cast<double>(rolled_back);
  if (plan.overlap_grad_reduce && plan.zero_stage <= 1) {  // every rank joins the all-reduce below
    // Buckets started during the backward (not at REDUCE_GRAD), per iteration, on the busiest rank.
    double started = static_cast<double>(model.buckets_started());
    world.all_reduce(&started, 1, ReduceOp::Max);
    report.extra["overlapped_gradient_buckets"] = started / static_cast<double>(options.steps - first_step);
  }
  report.extra["memory_measured_bytes"] = peak;
  report.extra["host_memory_measured_bytes"] = host;

}

}  // namespace

Report train(const TransformerSpec& spec, const ParallelPlan& plan, const TrainOptions& options, Timeline* timeline) {
  if (!MpiSession::active())
    throw EnvironmentError("MPI is not initialised: create a ptdp::exec::MpiSession before calling train()");
  auto world = make_mpi_world(options.comm_timeout_s);
  RunStart run = start_run(*world, spec, plan, options);
  std::unique_ptr<Device>& dev = run.dev;
  const Schedule& schedule = run.schedule;
  std::optional<cuda::DynamicLossScaler>& scaler = run.scaler;
  const int t = static_cast<int>(plan.tensor), p = static_cast<int>(plan.pipeline), d = static_cast<int>(plan.data);
  const int cp = static_cast<int>(plan.context);
  const int S = schedule.num_stages(), m = schedule.m;
  const int sharding_size = plan.zero_stage > 0 ? static_cast<int>(plan.sharding_degree()) : 0;
  // With context parallelism the d·cp ranks of a (tensor, pipeline) position hold the same weights:
  // they form the gradient (data) group, and coords.dp = cp_rank + cp · data rank.
  const int ep = static_cast<int>(plan.expert);
  GroupLayout layout;
  layout.t = t;
  layout.p = p;
  layout.d = d * cp;
  layout.first_stage_rank = schedule.stage_to_rank[0];
  layout.last_stage_rank = schedule.stage_to_rank[S - 1];
  layout.sharding_size = sharding_size;
  layout.reshard_size = plan.zero_stage >= 3 && !stage_held_unsharded(plan) ? static_cast<int>(reshard_group(plan)) : 0;
  layout.context = cp;
  layout.expert = ep;
  layout.expert_tensor = static_cast<int>(plan.expert_tensor_size());
  layout.mirrored = schedule.lanes > 1;
  layout.moe = spec.has_moe();
  ProcessGroups groups = make_mpi_groups(layout, options.comm_timeout_s);
  // On GPUs, device buffers travel through NCCL communicators over the same groups.
  if (options.backend == "cuda") groups = cuda::make_nccl_groups(*dev, std::move(groups), options.comm_timeout_s);
  const RankCoordinates c = groups.coords;
  CommLedger ledger;
  ledger.set_enabled(false);
  if (!options.comm_ledger_path.empty()) record_traffic(groups, ledger);

  std::optional<TokenCorpus> corpus;
  std::optional<BatchSampler> sampler;
  agree(*world, [&] {
    corpus.emplace(options.data_path.empty() ? TokenCorpus::synthetic(spec.vocab_size)
                                             : TokenCorpus::from_file(options.data_path));
    if (corpus->vocab_size() > spec.vocab_size)
      throw ConfigError("model.vocab_size", "is " + num(spec.vocab_size) + " but the data (" + corpus->description() +
                                                ") has token ids up to " + num(corpus->vocab_size() - 1) +
                                                ": use a vocab_size of at least " + num(corpus->vocab_size()));
    sampler.emplace(*corpus, static_cast<int>(spec.seq_length), options.seed);
  });
  if (world->rank() == 0 && options.progress) options.progress("data: " + corpus->description());

  std::unique_ptr<ModelShard> model = build_model(*world, *dev, spec, plan, schedule, groups, options.seed);
  const json identity = run_identity(spec, plan, options, *corpus);
  prepare_checkpoint_dir(*world, options);
  int64_t first_step = 0;
  std::vector<ShardEntry> saved_fp8;  // this rank's FP8 amax histories of the checkpoint resumed
  if (!options.init_path.empty()) {
    agree(*world, [&] { load_initial_weights(*model, options); });
    if (world->rank() == 0 && options.progress) options.progress("init: weights from " + options.init_path + " (optimizer afresh)");
  }
  if (options.resume) {
    agree(*world, [&] { first_step = load_checkpoint(*world, *model, c, options.checkpoint_dir, identity, &saved_fp8); });
    cross_check_state_dict(*world, *model, options.checkpoint_dir);
    if (scaler) restore_loss_scaler(*world, options.checkpoint_dir, *scaler);
  }
  if (first_step >= options.steps)
    throw ConfigError("steps", "the checkpoint is at iteration " + num(first_step) + " and steps is " +
                                   num(options.steps) + ": nothing left to run (steps counts all iterations)");

  std::optional<Fp8Emulation> fp8;
  Interpreter interpreter(*model, groups, schedule, interpreter_options(spec, plan, options, c, ledger, fp8));
  if (fp8 && options.resume)
    agree(*world, [&] { restore_fp8(*model, *fp8, saved_fp8, options.checkpoint_dir, options, world->rank()); });
  BatchFeeder feeder(spec, plan, schedule, *model, c);
  const double tokens_per_iteration = static_cast<double>(plan.global_batch * spec.seq_length);

  Report report;
  std::vector<double> times;
  std::map<std::pair<ActionKind, int>, std::vector<double>> compute_cpu;  // each timed iteration's mean per action
  std::vector<TimelineEvent> events;
  double grad_norm = 0;
  int64_t rolled_back = 0;  // post-validated steps undone
  // The speed probe before the first iteration, after each and after the last (outside the
  // timed iterations): the median of these samples is the host's speed over the run. Timed only
  // before and after, one suite's two-rank rows read ratios of 1.3-1.5 where their computation
  // was slower by 0.9-1.2: a spell of load at the probe's moment.
  std::unique_ptr<Device> probe_dev = options.speed_probe ? make_cpu_device() : nullptr;
  std::vector<double> probe_samples;
  std::vector<double> cpu_share, switches_per_cpu_s;  // per timed iteration, this rank
  auto sample_speed = [&] {
    if (probe_dev) probe_samples.push_back(time_speed_probe(*world, *probe_dev).gemm_s);
  };
  sample_speed();
  for (int64_t step = first_step; step < options.steps; ++step) {
    const IterationBatch& batch = feeder.fill(*sampler, step);
    model->zero_grads();
    world->barrier();
    const double t0 = now_s();
    const bool last = step + 1 == options.steps;
    if (last) events.clear();
    ledger.set_enabled(!options.comm_ledger_path.empty() && step == first_step);
    const double scale_used = scaler ? scaler->scale() : 1.0;
    if (scaler) interpreter.set_loss_scale(scale_used, scaler->skipped_steps());
    const double cpu0 = thread_cpu_s();
    const long switches0 = thread_involuntary_switches();
    const IterationResult r = interpreter.run(step, batch, last ? &events : nullptr, t0);
    if (step > first_step) {  // the rank's share of a core and how often it lost it (MPI waits poll: always runnable)
      const double cpu = thread_cpu_s() - cpu0, wall = now_s() - t0;
      if (wall > 0 && cpu > 0) {
        cpu_share.push_back(cpu / wall);
        switches_per_cpu_s.push_back(static_cast<double>(thread_involuntary_switches() - switches0) / cpu);
      }
    }
    if (scaler) scaler->update(r.overflow);
    if (step > first_step)  // the first (warm-up) iteration is not timed
      for (const auto& [at, cpu] : r.compute_cpu_s)
        if (cpu.second > 0) compute_cpu[at].push_back(cpu.first / cpu.second);
    ledger.set_enabled(false);
    double losses[2] = {feeder.loss_owner() ? r.loss_sum : 0.0, feeder.loss_owner() ? r.mtp_loss_sum : 0.0};
    world->all_reduce(losses, 2, ReduceOp::Sum);
    const double loss = losses[0] / (static_cast<double>(m) * d * cp);  // every context rank's mean over as many tokens
    if (spec.mtp_layers > 0) report.mtp_losses.push_back(losses[1] / (static_cast<double>(m) * d * cp));
    if (!std::isfinite(loss))  // the same on every rank (all-reduced): all stop together
      throw ConfigError("--lr", "training diverged at step " + num(step + 1) + ": the loss is " + number(loss) +
                                    " (learning rate " + number(options.adam.lr) + "; try a smaller --lr)");
    const double dt = now_s() - t0;
    times.push_back(dt);
    report.losses.push_back(loss);
    grad_norm = r.grad_norm;
    sample_speed();
    rolled_back += r.rolled_back ? 1 : 0;
    if (world->rank() == 0 && options.progress)
      options.progress(step_line(step, options.steps, loss, r, scale_used, scaler, tokens_per_iteration, dt));
    const bool save = !options.checkpoint_dir.empty() &&
                      (last || (options.save_every > 0 && (step + 1) % options.save_every == 0));
    if (save) {
      json state = json::object();
      if (scaler) state["loss_scaler"] = loss_scaler_json(*scaler);
      if (fp8) state["fp8_amax_history"] = fp8_meta(*fp8);
      save_checkpoint(*world, *model, c, options.checkpoint_dir, step + 1, identity, state,
                      fp8 ? fp8_entries(*model, *fp8) : std::vector<ShardEntry>{});
    }
  }

  model->complete_parameter_gathers();  // overlap_param_gather: the last step's, waited for by no forward
  if (probe_dev) report.extra["speed_probe_gemm_s"] = median(std::move(probe_samples));
  report.extra["rank_cpu_share"] = median_over_ranks(*world, median(std::move(cpu_share)));
  report.extra["rank_preemptions_per_cpu_s"] = median_over_ranks(*world, median(std::move(switches_per_cpu_s)));
  if (!options.comm_ledger_path.empty()) write_ledger(ledger, options.comm_ledger_path, world->rank(), c.pp);
  record_times(*world, times, report);
  add_compute_cpu(*world, compute_cpu, S, p, report);
  events = gather_events(*world, std::move(events));
  add_rank_breakdown(events, c, p, times, report);
  finish_measured_report(*world, *dev, *model, spec, plan, options, first_step, grad_norm, rolled_back, scaler, report);

  if (timeline != nullptr) {
    timeline->events = events;
    name_devices(plan, options.backend, world->size(), *timeline);
  }
  hand_out_parameters(*world, *model, options.parameters_out);
  return report;
}

}  // namespace ptdp::exec
