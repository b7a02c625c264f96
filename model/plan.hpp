// How a model is trained in parallel: tensor (t), pipeline (p), data (d) parallel sizes,
// virtual stages, microbatching, schedule and activation recomputation.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ptdp {

/// Pipeline schedules: the paper's three, and the zero-bubble ones (Qi et al., ICLR 2024), which
/// split the backward into I (input gradient) and W (weight gradient): zb-h1 (1F1B's peak
/// memory), zb-h2 (about twice that, bubble ~0), zb-v (two chunks per rank in a V, 1F1B's
/// memory), zb-auto (W placed from the costed F/I/W times under the GPUs' free memory); and
/// DualPipeV (DeepSeek-V3's DualPipe cut in half, as PyTorch ships it: zb-v's V placement, the
/// steady state running a forward and a backward of two microbatches overlapped, OVERLAP_F_B);
/// and DualPipe itself (bidirectional: every rank holds two copies' chunks, half the microbatches
/// enter at rank 0 and half at rank p − 1; see ParallelPlan::lanes).
enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubbleH1, ZeroBubbleH2, ZeroBubbleV, ZeroBubbleAuto, DualPipeV, DualPipe };
/// The schedule kinds `--auto` sweeps, in its order.
inline constexpr ScheduleKind kScheduleKinds[] = {ScheduleKind::GPipe,        ScheduleKind::OneFOneB,
                                                   ScheduleKind::Interleaved,  ScheduleKind::ZeroBubbleH1,
                                                   ScheduleKind::ZeroBubbleH2, ScheduleKind::ZeroBubbleV,
                                                   ScheduleKind::ZeroBubbleAuto, ScheduleKind::DualPipeV,
                                                   ScheduleKind::DualPipe};
/// True for the schedules whose backward is split into I and W.
bool is_zero_bubble(ScheduleKind k);
/// True for the schedules with two chunks per rank in a V (rank r holds stages r and 2p − 1 − r);
/// DualPipe places its second lane's stages so too (stage p + j, a copy of stage j, on rank p − 1 − j).
bool is_v_shape(ScheduleKind k);
/// True for the schedules that run OVERLAP_F_B pairs (DualPipeV, DualPipe).
bool has_overlapped_pairs(ScheduleKind k);
struct ParallelPlan;
/// Megatron's --overlap-moe-expert-parallel-comm as the schedule runs it: 1F1B and interleaved
/// schedules merge a forward and a backward of two microbatches into OVERLAP_F_B pairs, each
/// one's expert all-to-alls under the other's compute (schedules/generators.cpp).
bool merges_expert_overlap(const ParallelPlan& plan);
/// The schedules parallel.moe_comm_overlap runs with: without pipelining, interleaved, or
/// DualPipe's own pairs (Megatron-Core refuses 1F1B with pipeline > 1).
bool expert_overlap_schedule(const ParallelPlan& plan);
/// Whether the plan's schedule runs OVERLAP_F_B pairs (DualPipe's or Megatron's merged steps).
bool runs_overlapped_pairs(const ParallelPlan& plan);
enum class Recompute { None, Selective, Full };
/// Megatron-Core's --recompute-modules (parallel.recompute_modules, with recompute selective):
/// which parts of a layer selective recompute re-runs, as a bit set. core_attn: the attention
/// core; layernorm: the norms' outputs are dropped and recomputed (the GEMM after each keeps no
/// input); mlp: the dense MLP checkpointed (only its input kept); moe: the whole MoE block
/// (router, dispatch, experts, combine) checkpointed; moe_act: the experts' activation output
/// dropped and recomputed; shared_experts: the shared experts checkpointed; mla_up_proj
/// (multi-head latent attention): the up projections' outputs and their rotary embedding — the
/// queries, keys and values the attention core keeps — dropped and recomputed from the latents.
enum RecomputeModule : unsigned {
  kRecomputeCoreAttn = 1u << 0,
  kRecomputeLayerNorm = 1u << 1,
  kRecomputeMlp = 1u << 2,
  kRecomputeMoe = 1u << 3,
  kRecomputeMoeAct = 1u << 4,
  kRecomputeSharedExperts = 1u << 5,
  kRecomputeMlaUpProj = 1u << 6,
};
/// The names, in Megatron's spelling, and their bits.
inline constexpr std::pair<const char*, unsigned> kRecomputeModuleNames[] = {
    {"core_attn", kRecomputeCoreAttn}, {"layernorm", kRecomputeLayerNorm}, {"mlp", kRecomputeMlp},
    {"moe", kRecomputeMoe},            {"moe_act", kRecomputeMoeAct},      {"shared_experts", kRecomputeSharedExperts},
    {"mla_up_proj", kRecomputeMlaUpProj}};
/// Training precision. FP8 = Transformer Engine's FP8 recipe on top of bf16: the linear layers'
/// GEMMs (fprop, dgrad, wgrad) run on FP8 tensor cores with delayed scaling, everything else
/// (attention, norms, the LM head, optimizer and master weights) stays bf16/fp32.
enum class Precision { FP16, BF16, FP32, FP8 };
/// Megatron's --fp8-format: hybrid (E4M3 forward, E5M2 gradients) or e4m3 everywhere. Same cost.
enum class Fp8Format { Hybrid, E4M3 };
/// How FP8 tensors are scaled (training.fp8_recipe), which decides the GEMM kernel and the
/// quantisation kernels around it: tensorwise (one scale per tensor: TE's delayed scaling,
/// torchao's tensorwise Float8Linear, cuBLAS), rowwise (one per row: torchao/FBGEMM CUTLASS
/// kernels), blockwise (1×128 activation, 128×128 weight blocks: DeepSeek-V3, TE
/// Float8BlockScaling, DeepGEMM), mxfp8 (32-element blocks with E8M0 scales: Blackwell tensor
/// cores only).
enum class Fp8Recipe { Tensorwise, Rowwise, Blockwise, MXFP8 };
/// The training framework (training.framework): which kernels exist and how they run.
/// megatron: Megatron-Core with Transformer Engine (fused norms, activations, rotary, fused
/// Adam, every overlap); torchtitan: eager PyTorch with FSDP2 (per-op dispatch, eager element-wise
/// kernels, DTensor optimizer); torchtitan_compiled: the same under torch.compile (element-wise
/// chains fused by Inductor); deepspeed: DeepSpeed with its fused Adam and fused kernels off by
/// default for training (eager element-wise ops); pytorch_fsdp: plain PyTorch FSDP (eager,
/// flat-parameter optimizer).
enum class Framework { Megatron, Torchtitan, TorchtitanCompiled, DeepSpeed, PytorchFsdp };
/// The attention kernel (training.attention_kernel): auto = the framework's (megatron: cuDNN's
/// fused attention, Transformer Engine's default backend; the PyTorch frameworks: FlashAttention-2,
/// which scaled_dot_product_attention's flash backend and flash-attn 2 run); flash = the GPU's
/// flash curve (FlashAttention-3 on the Hopper presets, FlashAttention-2 on A100); flash2; cudnn.
/// A GPU without the kernel's table runs the flash curve.
enum class AttentionKernel { Auto, Flash, Flash2, Cudnn };
/// How layers are placed on pipeline stages when no explicit list is given: uniform (l / (p·v)
/// each, Megatron's rule) or balanced (costed stage times as equal as possible, embedding on the
/// first and output layer + loss on the last stage included).
enum class Partition { Uniform, Balanced };
/// Which data-parallel ranks share one copy of the sharded model states: the whole data-parallel
/// group (ZeRO, FSDP FULL_SHARD), or the ranks of one node, replicated across nodes (FSDP
/// HYBRID_SHARD).
enum class ShardingGroup { Data, Node };
/// What lives in host memory instead of the GPU: nothing; the optimizer state and its step
/// (ZeRO-Offload, stages 1–3); or also the parameters (ZeRO-Infinity / FSDP offload_params, stage 3).
enum class Offload { None, Optimizer, OptimizerAndParams };
/// When the optimizer step of a pipeline rank may start: after the gradient-norm all-reduce over
/// the whole model-parallel group (barrier: every rank waits for the last one), or at once after
/// the rank's own last action, speculatively, validated afterwards and rolled back when a
/// gradient is non-finite or clipping applies (post_validate: the zero-bubble paper's optimizer
/// post-validation, Qi et al. 2024 §4). Only the zero-bubble schedules finish their ranks at
/// different times, so only they gain from it.
enum class OptimizerSync { Barrier, PostValidate };
/// Megatron-Core's MoE token dispatcher: all-to-all (tokens sent to the EP rank of their expert
/// and back) or all-gather (every EP rank gathers all tokens, keeps its experts' ones, and the
/// outputs are reduce-scattered back).
enum class MoeDispatcher { AllToAll, AllGather, Flex };
/// Context parallelism's attention exchange: a ring passing K/V blocks peer to peer, overlapped
/// with the attention of the block in hand (Megatron's p2p), or one all-gather of K/V before
/// the attention (allgather).
/// Context parallelism's attention exchange (parallel.context_comm, Transformer Engine's cp_comm_type):
/// the K/V ring (p2p), one all-gather of K/V (Llama 3's), or all-to-alls that trade the sequence
/// shard for a head shard (DeepSpeed-Ulysses, TE's a2a).
enum class ContextComm { Ring, AllGather, AllToAll };

std::string to_string(ScheduleKind k);
std::string to_string(Recompute r);
std::string to_string(Precision p);
/// Parse one of kRecomputeModuleNames; throws ConfigError naming the choices.
unsigned parse_recompute_module(const std::string& text);
/// The modules of a bit set, space-separated in kRecomputeModuleNames' order ("core_attn mlp").
std::string recompute_modules_string(unsigned modules);
/// The same as a list of names.
std::vector<std::string> recompute_module_list(unsigned modules);
/// Parse "gpipe" | "1f1b" | "interleaved" | "zb-h1" | "zb-h2" | "zb-v" | "zb-auto"; throws
/// ConfigError naming the choices.
ScheduleKind parse_schedule_kind(const std::string& text);
Recompute parse_recompute(const std::string& text);
Precision parse_precision(const std::string& text);
std::string to_string(Fp8Format f);
Fp8Format parse_fp8_format(const std::string& text);
std::string to_string(Fp8Recipe r);
/// Parse "tensorwise" | "rowwise" | "blockwise" | "mxfp8"; throws ConfigError naming the choices.
Fp8Recipe parse_fp8_recipe(const std::string& text);
std::string to_string(Framework f);
std::string to_string(AttentionKernel k);
/// Parse "auto" | "flash" | "flash2" | "cudnn"; throws ConfigError naming the choices.
AttentionKernel parse_attention_kernel(const std::string& text);
/// The kernel a plan's attention runs: plan.attention_kernel, or the framework's for auto.
AttentionKernel resolved_attention_kernel(const ParallelPlan& plan);
/// Parse "megatron" | "torchtitan" | "torchtitan_compiled" | "deepspeed" | "pytorch_fsdp"
/// (also "megatron-core", "torchtitan-compiled", "pytorch-fsdp"); throws ConfigError naming them.
Framework parse_framework(const std::string& text);
/// True for the frameworks whose element-wise ops run eagerly, one dispatched kernel each.
bool is_eager(Framework f);
/// torchtitan, eager or compiled.
bool is_torchtitan(Framework f);
std::string to_string(Partition p);
Partition parse_partition(const std::string& text);
std::string to_string(ShardingGroup g);
ShardingGroup parse_sharding_group(const std::string& text);
std::string to_string(Offload o);
Offload parse_offload(const std::string& text);
std::string to_string(OptimizerSync s);
std::string to_string(MoeDispatcher d);
/// Parse "alltoall" | "allgather"; throws ConfigError naming the choices.
MoeDispatcher parse_moe_dispatcher(const std::string& text);
std::string to_string(ContextComm c);
/// The short mark plan labels give a context exchange: "" (ring), "-ag", "-a2a".
const char* context_comm_mark(ContextComm c);
/// Parse "ring" | "allgather"; throws ConfigError naming the choices.
ContextComm parse_context_comm(const std::string& text);
/// Parse "barrier" | "post_validate"; throws ConfigError naming the choices.
OptimizerSync parse_optimizer_sync(const std::string& text);
/// Bytes of one element of activations/weights in this precision.
int bytes_per_element(Precision p);
/// Bytes of one gradient element as Megatron keeps and reduces it: fp16 with fp16 training,
/// fp32 with bf16 (accumulated in fp32) and with fp32.
int gradient_bytes(Precision p);
/// The model states' bytes per parameter with Adam, in one place (memory, the optimizer's time on
/// the GPU and on the host read it): Megatron's mixed precision keeps the working weights in 2
/// bytes and an fp32 master copy with the two fp32 moments (12 bytes); fp32 training's weights are
/// their own master (8 bytes of moments).
struct StateBytes {
  int weight = 4;       // the working copy (bytes_per_element)
  int gradient = 4;     // the accumulated gradient (gradient_bytes)
  int optimizer = 8;    // master weights (mixed) + momentum + variance
  double adam_step = 32;  // what one memory-bound Adam step moves: reads master, moments, gradient,
                          // writes master and moments (+ the low-precision copy when mixed)
};
StateBytes state_bytes(Precision p);

struct ParallelPlan {
  int64_t tensor = 1;          // t
  int64_t pipeline = 1;        // p
  int64_t data = 1;            // d
  /// cp, context parallelism: each sequence split in 2·cp chunks, chunks i and 2·cp − 1 − i on
  /// context rank i (causal load balance); the world is t · cp · p · d ranks (Megatron's order:
  /// tensor fastest, then context, then data, then pipeline).
  int64_t context = 1;
  ContextComm context_comm = ContextComm::Ring;
  /// ep, expert parallelism: the routed experts of an MoE layer split over ep ranks carved from
  /// the t · cp · d ranks of a pipeline stage (Megatron-Core: expert-tensor × expert × expert-data
  /// = tensor × context × data); expert_tensor (etp) splits each expert's MLP; 0 = tensor.
  int64_t expert = 1;
  int64_t expert_tensor = 0;
  MoeDispatcher moe_dispatcher = MoeDispatcher::AllToAll;
  /// Megatron's --overlap-moe-expert-parallel-comm: the expert all-to-alls of one microbatch run
  /// under the compute of another (forward and backward of adjacent microbatches merged, 1F1B
  /// steady state); needs expert > 1 and a pipeline schedule with a steady state.
  bool moe_comm_overlap = false;
  int64_t virtual_stages = 1;  // v, model chunks per pipeline rank (interleaved only)
  int64_t micro_batch = 1;     // b
  int64_t global_batch = 1;    // B
  int64_t microbatch_group = 0;  // interleaved group size G; 0 = p
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  Recompute recompute = Recompute::None;
  /// With recompute selective under Megatron: the modules it re-runs (RecomputeModule bits);
  /// Megatron's default is core_attn. Other frameworks have their own selective policy
  /// (torchtitan: op-level, see model/cost.hpp saved_activation_bytes).
  unsigned recompute_modules = kRecomputeCoreAttn;
  bool scatter_gather = true;
  bool overlap_p2p = false;  // overlapped p2p: lets interleaving run with pipeline 2
  /// Sequence parallelism (Korthikanti et al. 2022): LayerNorm, dropout and residual regions
  /// split along the sequence over the t ranks; each TP all-reduce becomes a reduce-scatter +
  /// all-gather. Needs t > 1 and the sequence length divisible by t.
  bool sequence_parallel = false;
  Precision precision = Precision::BF16;
  Fp8Format fp8_format = Fp8Format::Hybrid;
  Fp8Recipe fp8_recipe = Fp8Recipe::Tensorwise;
  AttentionKernel attention_kernel = AttentionKernel::Auto;
  Framework framework = Framework::Megatron;
  /// --fp8-param-gather: FP8 primary weights (no bf16 weight copy), gathered in FP8 by the
  /// distributed optimizer (half the all-gather bytes). Needs precision fp8 and zero_stage ≥ 1.
  bool fp8_param_gather = false;
  /// Megatron's overlapped communication. overlap_grad_reduce: the data-parallel gradient
  /// all-reduce (reduce-scatter with the distributed optimizer) runs in buckets launched during
  /// the backward as each bucket's gradients are ready. overlap_param_gather: the distributed
  /// optimizer's parameter all-gather runs per bucket, overlapped with the next forward (needs
  /// zero_stage ≥ 1 and overlap_grad_reduce). tp_comm_overlap: the tensor-parallel all-gathers
  /// and reduce-scatters are split into chunks and pipelined with their GEMMs (needs
  /// sequence_parallel). bucket_size: parameters per bucket; 0 = Megatron's max(40 M, 1 M·d).
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  bool tp_comm_overlap = false;
  int64_t bucket_size = 0;
  /// The bucket size in effect (parameters).
  int64_t bucket_parameters() const { return bucket_size > 0 ? bucket_size : (data * 1'000'000 > 40'000'000 ? data * 1'000'000 : 40'000'000); }
  /// Layers of each stage, p·v entries in stage order (stage s on pipeline rank s mod p);
  /// empty = from first/last_stage_layers or the partition.
  std::vector<int64_t> layers_per_stage;
  /// Megatron-LM's --decoder-first/last-pipeline-num-layers; 0 = not set. The other stages
  /// share the remaining layers evenly.
  int64_t first_stage_layers = 0;
  int64_t last_stage_layers = 0;
  Partition partition = Partition::Uniform;
  /// Megatron-LM's --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split:
  /// with partition uniform, the embedding (first stage) and the output layer + loss (last stage)
  /// each count as one layer, so those stages get one layer fewer: (num_layers + e + o) / stages
  /// each, minus one at either end. (The balanced partition weighs both by their costed times.)
  bool account_embedding_in_split = false;
  bool account_loss_in_split = false;
  /// Megatron-Core's --pipeline-model-parallel-layout (model/layout.hpp), parsed: the decoder
  /// layers and the multi-token-prediction layers of each stage, p·v entries each in stage order
  /// (a stage may hold none of either: the embedding alone, the MTP layers alone, the loss alone).
  /// Empty = no layout. The embedding opens the first stage and the loss closes the last.
  std::vector<int64_t> layout_layers;
  std::vector<int64_t> layout_mtp;
  /// Vocabulary parallelism across pipeline stages (Yeung et al. 2024): the output layer and the
  /// cross-entropy are split over all p pipeline ranks, V/p columns each, instead of all on the
  /// last stage. Per microbatch the last stage's final hidden states are broadcast to the p ranks,
  /// the softmax statistics all-reduced over them and the input gradients reduced back.
  bool vocab_parallel_pipeline = false;
  /// The balanced partition's result for the cluster's GPU (resolve_partition in
  /// model/partition.hpp; the scenario loader does it). Empty otherwise.
  std::vector<int64_t> balanced_layers;
  /// Sharded data parallelism (ZeRO): 0 none, 1 optimizer state (= Megatron's distributed
  /// optimizer), 2 + gradients, 3 + parameters (= FSDP FULL_SHARD).
  int zero_stage = 0;
  ShardingGroup sharding_group = ShardingGroup::Data;
  Offload offload = Offload::None;
  OptimizerSync optimizer_sync = OptimizerSync::Barrier;
  /// FSDP's limit on parameter all-gathers in flight (units gathered ahead of the one computing).
  int64_t max_inflight_gathers = 2;
  /// parallel.reshard_after_forward (FSDP2's, stage 3): what a unit's parameters are after its
  /// forward. kReshardDefault: the framework's choice (reshard_group() resolves it);
  /// kReshardFull (true): sharded again over the whole sharding group, re-gathered in the
  /// backward (ZeRO-3); 1 (false): kept whole until the backward, no second gather; N ≥ 2: kept
  /// sharded over groups of N consecutive members of the sharding group, re-gathered in the
  /// backward over those N only (FSDP2's int, hpZ).
  int reshard_after_forward = kReshardDefault;
  static constexpr int kReshardDefault = 0;
  static constexpr int kReshardFull = -1;
  /// GPUs per node of the cluster (the scenario loader copies it from the topology); decides the
  /// size of a node sharding group.
  int64_t node_gpus = 8;
  /// Count each process's GPU runtime memory (model/memory.hpp runtime_memory_bytes: the CUDA
  /// context, NCCL's buffers per communicator): the scenario loader sets it for GPU clusters
  /// (the CPU back end has neither), and `nvls` when the nodes all-reduce with NVLink SHARP.
  bool gpu_runtime_memory = false;
  bool nvls = false;
  /// training.expandable_segments: PyTorch's caching allocator maps its memory in 2 MiB pages
  /// into one growing range (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, what torchtitan's
  /// and NeMo's launch scripts set); false = separate segments, which fragment (the memory
  /// breakdown's allocator reserve).
  bool expandable_segments = true;

  int64_t gpus() const { return tensor * context * pipeline * data; }
  /// The expert-tensor size in effect (etp; 0 = tensor).
  int64_t expert_tensor_size() const { return expert_tensor > 0 ? expert_tensor : tensor; }
  /// Expert-data-parallel ranks: the ranks holding the same experts, over which expert gradients
  /// are reduced: t · cp · d / (etp · ep).
  int64_t expert_data() const { return tensor * context * data / (expert_tensor_size() * expert); }
  /// Ranks a dense gradient is reduced over: d · cp (context ranks hold the same weights).
  int64_t gradient_ranks() const { return data * context; }
  /// overlap_grad_reduce launches a stage's bucketable REDUCE_GRAD steps in buckets during its
  /// last backward: stages 0–1, more than one gradient rank, on the first pipeline rank only
  /// (Megatron gives the others one bucket, reduced after their backward). The executor, the
  /// engines and the conformance ledger read this one rule.
  bool reduces_in_buckets(int64_t pipeline_rank) const {
    return overlap_grad_reduce && zero_stage <= 1 && gradient_ranks() > 1 && pipeline_rank == 0;
  }
  /// m = B / (b·d): microbatches per pipeline per iteration.
  int64_t num_microbatches() const { return global_batch / (micro_batch * data); }
  int64_t num_stages() const { return pipeline * virtual_stages; }
  /// Lanes: the paths through the stages a microbatch can take. DualPipe has two: lane 0 is
  /// stages 0 … p − 1 (stage j on rank j), lane 1 stages p … 2p − 1 (stage p + j on rank
  /// p − 1 − j, holding the same layers as stage j, a second copy of them); the first half of the
  /// microbatches takes lane 0, the second half lane 1. Every other schedule has one lane.
  int64_t lanes() const { return schedule == ScheduleKind::DualPipe ? 2 : 1; }
  /// Stages a microbatch passes through: the model's layers are split over these.
  int64_t lane_stages() const { return num_stages() / lanes(); }
  /// The stages holding the embedding (first of a lane) and the final norm, output layer and loss
  /// (last of a lane).
  bool is_first_stage(int64_t stage) const { return stage % lane_stages() == 0; }
  bool is_last_stage(int64_t stage) const { return stage % lane_stages() == lane_stages() - 1; }
  /// The stage holding the multi-token-prediction layers (TransformerSpec::mtp_layers): the
  /// layout's m stage, else the last. mtp_apart: a stage before the last, where the MTP layers
  /// are a unit of their own (model/cost.hpp mtp_ops) and the last stage keeps their output layer
  /// and loss (Megatron-Core runs the MTP block where the layout puts it, its logits with the loss).
  int64_t mtp_stage() const {
    for (size_t s = 0; s < layout_mtp.size(); ++s)
      if (layout_mtp[s] > 0) return static_cast<int64_t>(s);
    return lane_stages() - 1;
  }
  bool mtp_apart() const { return mtp_stage() != lane_stages() - 1; }
  int64_t group_size() const { return microbatch_group > 0 ? microbatch_group : pipeline; }
  /// N_d: data-parallel ranks that share one copy of the sharded states (1 when zero_stage is 0).
  /// A node group holds the data-parallel ranks of one node: node_gpus / t of them (Megatron's
  /// rank order puts tensor ranks fastest, then data), at most d.
  /// With context parallelism the group is the d·cp ranks holding the same weights (Megatron's
  /// data-parallel group with context).
  int64_t sharding_degree() const {
    if (zero_stage == 0) return 1;
    const int64_t replicas = data * context;
    if (sharding_group == ShardingGroup::Data) return replicas;
    const int64_t per_node = node_data_ranks();
    return per_node < replicas ? per_node : replicas;
  }
  /// The plan as the routed experts' weights see it: their tensor split is expert_tensor, their
  /// replicas (gradient reduction, sharding) the expert-data-parallel ranks.
  ParallelPlan expert_view() const {
    ParallelPlan e = *this;
    e.tensor = expert_tensor_size();
    e.data = expert_data();
    e.context = 1;
    e.expert = 1;
    e.expert_tensor = 0;
    return e;
  }
  /// The plan as the data-parallel machinery (rank placement, gradient rings, sharding) sees it:
  /// the d·cp ranks that hold the same weights as its data-parallel replicas.
  ParallelPlan replica_view() const {
    ParallelPlan r = *this;
    r.data = data * context;
    r.global_batch = global_batch * context;  // the same microbatches per pipeline
    r.context = 1;
    return r;
  }
  /// Data-parallel ranks one node holds when it is full: node_gpus / t (at least 1).
  int64_t node_data_ranks() const { return tensor > 0 && node_gpus >= tensor ? node_gpus / tensor : 1; }
};

/// Stage 3: the size of the group a unit's parameters are re-gathered over in its backward — the
/// sharding degree with reshard_after_forward true, 1 (no backward gather) with false, N with an
/// int. The default is the framework's: torchtitan (eager or compiled) keeps the parameters whole
/// with pipeline parallelism (its "default" policy: not resharding avoids a second gather per
/// microbatch) and reshards without; every other framework reshards (ZeRO-3, FSDP FULL_SHARD).
/// 1 when the plan does not shard parameters.
int64_t reshard_group(const ParallelPlan& plan);
/// Stage 3 under PyTorch FSDP (torchtitan's FSDP2, eager or compiled; pytorch_fsdp's FSDP1 with
/// mixed precision): the sharded parameter is itself the fp32 master copy, with no bf16 shard
/// beside it (the bf16 copies exist only gathered, for the units in flight), and the sharded
/// gradient is fp32 (reduce_dtype fp32): 4 + 4 + 8 (Adam's moments) bytes per parameter per
/// shard, against Megatron's and DeepSpeed's 2 + 4 (or 2) + 12. False for fp32 training (its
/// weights are their own master everywhere).
bool sharded_parameter_is_master(const ParallelPlan& plan);
/// torchtitan's FSDP with pipeline parallelism (stage 3, pipeline > 1): PyTorch's pipeline
/// stages run every backward but the stage's last without gradient synchronisation, so the
/// unsharded gradients accumulate across the step and are reduce-scattered once, at the
/// stage's REDUCE_GRAD (not after every microbatch's backward).
bool gradients_reduced_once_per_step(const ParallelPlan& plan);
/// Parameters gathered once per step and held whole until the stage's last backward (the
/// schedule's UNSHARD … RESHARD window around each stage): gradients_reduced_once_per_step with
/// reshard_group 1 (PyTorch's pipelining with FSDP also skips the reshard after each backward).
bool stage_held_unsharded(const ParallelPlan& plan);
/// torchtitan's default policy (reshard_after_forward unset) keeps the last unit — the final
/// norm with the output layer, whose backward follows its forward at once — whole after its
/// forward (fully_shard(norm, output) with reshard_after_forward false): no backward gather of
/// it, its parameters held from forward to backward. Only where units are otherwise resharded
/// (stage 3, reshard_group > 1).
bool last_unit_kept_whole(const ParallelPlan& plan);

/// FSDP's sharding strategies as spellings of (zero_stage, sharding_group): full_shard (3, data),
/// shard_grad_op (2, data), hybrid_shard (3, node), no_shard (0, data). Throws ConfigError.
void apply_fsdp_strategy(const std::string& text, ParallelPlan& plan);
/// The FSDP name of a plan's sharding, or "" when it has none (e.g. stage 1).
std::string fsdp_strategy_name(const ParallelPlan& plan);

struct TransformerSpec;

/// Largest sizes ptdp accepts; beyond them a value is treated as a mistake rather than simulated.
inline constexpr int64_t kMaxMicrobatches = 1'000'000;
inline constexpr int64_t kMaxGpus = 10'000'000;
/// Largest m·v·p (each cell becomes ~6 actions in memory, ~100 bytes each with the graph).
inline constexpr int64_t kMaxScheduleCells = 4'000'000;

/// Checks every Megatron-LM rule (ptdp-facts.md) for this plan on `gpus` GPUs.
/// Throws ConfigError whose key path names the offending scenario key (e.g. "parallel.tensor").
/// The sharding rules alone (zero_stage, offload, sharding_group against t, p, d and node_gpus);
/// part of validate_plan. Throws ConfigError naming the key.
void validate_sharding(const ParallelPlan& plan);
/// The expert- and context-parallel rules alone (divisibility of experts, ranks and sequence).
void validate_expert_context(const TransformerSpec& spec, const ParallelPlan& plan);
/// The overlap and FP8 rules alone (tp_comm_overlap needs sequence parallelism, overlap_param_gather
/// the distributed optimizer and overlap_grad_reduce, fp8_param_gather fp8 and zero_stage ≥ 1).
void validate_overlaps(const ParallelPlan& plan);
/// What a framework (training.framework) runs, one table for the two that read it:
/// validate_framework refuses a plan asking for a mechanism its framework lacks, and `ptdp sweep
/// --auto` builds only plans within it (search/sweep_candidates.cpp), so that no plan it ranks is
/// one the framework would refuse.
struct FrameworkMechanisms {
  bool pipeline = true;            ///< pipeline stages at all (plain PyTorch FSDP has none)
  bool context = true;             ///< context parallelism by a K/V ring or all-gather (Megatron-Core, torchtitan)
  bool ulysses = true;             ///< context parallelism by all-to-alls (Megatron-Core's a2a, DeepSpeed-Ulysses)
  /// The pipeline schedules it runs (bit ScheduleKind): DualPipe (bidirectional) is Megatron's
  /// alone here (torchtitan ships DualPipeV), DeepSpeed's pipeline engine runs 1F1B only.
  unsigned schedules = ~0u;
  bool runs(ScheduleKind kind) const { return (schedules >> static_cast<unsigned>(kind) & 1u) != 0; }
  bool tp_comm_overlap = true;     ///< Transformer Engine's userbuffers, torchtitan's async TP
  bool moe_comm_overlap = true;    ///< Megatron-Core's merged-step expert all-to-all overlap
  bool flex_dispatcher = true;     ///< Megatron-Core's DeepEP (flex) dispatcher
  /// The highest ZeRO stage run together with pipeline stages (DeepSpeed's pipeline engine
  /// asserts stage < 2).
  int max_zero_with_pipeline = 3;
  /// The ZeRO stages `--auto` builds with pipeline stages (bit z: stage z). No framework
  /// reduce-scatters sharded gradients after every microbatch with pipelines — DeepSpeed refuses
  /// it, PyTorch's pipelining with FSDP reduces once per step (stage 3 under torchtitan,
  /// gradients_reduced_once_per_step) — so stage 2 with pipelines, which ptdp's engines and
  /// executor run that way, is a plan only when asked for (parallel.zero_stage).
  unsigned auto_zero_with_pipeline = 0b0011;
  /// The ZeRO stages `--auto` builds without pipeline stages: PyTorch's FSDP (torchtitan's FSDP2,
  /// plain FSDP) shards parameters and gradients (stage 3; stage 2 as SHARD_GRAD_OP or
  /// reshard_after_forward false) and has no optimizer-only sharding (stage 1, Megatron's
  /// distributed optimizer and DeepSpeed's).
  unsigned auto_zero = 0b1111;
  /// Whether `--auto` builds ZeRO stage `zero_stage` (1–3), with pipeline stages or without.
  bool auto_builds(int zero_stage, bool pipelined) const {
    if (!(auto_zero >> zero_stage & 1u)) return false;
    return !pipelined || ((auto_zero_with_pipeline >> zero_stage & 1u) && zero_stage <= max_zero_with_pipeline);
  }
};
FrameworkMechanisms framework_mechanisms(Framework f);
/// The mechanisms training.framework lacks (overlaps, schedules, FP8 recipes, context
/// parallelism; framework_mechanisms): throws ConfigError naming the key and the framework.
void validate_framework(const ParallelPlan& plan);
/// parallel.recompute_modules: needs recompute selective and framework megatron; each module one
/// the model's layers have.
void validate_recompute_modules(const TransformerSpec& spec, const ParallelPlan& plan);
void validate_plan(const TransformerSpec& spec, const ParallelPlan& plan, int64_t gpus);

/// Checks the model sizes alone (positive, hidden divisible by heads, sane magnitudes).
void validate_model(const TransformerSpec& spec);

}  // namespace ptdp
