// Cost model: the operations of one transformer layer on one tensor-parallel rank for one
// microbatch, and how long the compute ones take on a GPU. Communication is timed elsewhere
// (topologies/collectives) from the bytes listed here.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_scope.hpp"
#include "model/gpu.hpp"
#include "model/grid.hpp"
#include "model/measured_kernels.hpp"
#include "model/plan.hpp"
#include "model/transformer.hpp"

namespace ptdp {

/// Collectives of a layer (over the ranks of Op::group): TP all-reduce without sequence
/// parallelism, with it a reduce-scatter (into the sequence shards) and an all-gather (out of
/// them) of the same total; context parallelism's K/V all-gather and dK/dV reduce-scatter; the
/// MoE dispatcher's all-to-all (tokens to the ranks of their experts and back) and its
/// all-gather / reduce-scatter. RingExchange: context parallelism's ring — ring_steps
/// point-to-point transfers of `bytes` each to the next context rank, each overlapped with the
/// attention of the block in hand (the next Attention op of the list).
/// Attention: one fused flash-attention kernel (forward, or backward with its blockwise
/// recomputation of the scores).
enum class OpKind { Gemm, Attention, Elementwise, AllReduce, ReduceScatter, AllGather, AllToAll, RingExchange };
/// True for the communication ops (timed by the topology, 0 in op_time_s).
bool is_communication(OpKind k);
/// The size of a group under a plan, and the global-rank stride between its members
/// (ProcessGrid's, model/grid.hpp).
int64_t group_size(const ParallelPlan& plan, CommGroup g);
int64_t group_stride(const ParallelPlan& plan, CommGroup g);
enum class Pass { Forward, Backward, Recompute };

/// One operation of a layer. GEMMs: `batch` independent m×k·k×n products (flops = 2·batch·m·n·k).
/// Fraction of the SMs' time a GEMM of `batch` × (m × n) outputs keeps busy: tiles / (waves ·
/// sm_count), 1 when sm_count is 0. Large GEMMs whose tile count just exceeds a multiple of
/// the SM count lose up to half a wave (e.g. 145B at t 8: 288 tiles on 108 SMs = 89%).
double gemm_wave_efficiency(const GpuSpec& gpu, int64_t batch, int64_t m, int64_t n);

struct Op {
  std::string name;
  OpKind kind = OpKind::Gemm;
  int64_t batch = 1, m = 0, n = 0, k = 0;
  double flops = 0;
  double bytes = 0;  // memory traffic (compute ops) or the whole tensor a TP collective reduces or gathers
  /// Backward ops only: part of the weight gradient (the schedule's W: wgrad GEMMs of weight
  /// matrices, the embedding's gradient accumulation); false = on the input-gradient path (I).
  bool weight_gradient = false;
  /// GEMMs: runs on FP8 tensor cores (training.precision fp8: the linear layers' fprop, dgrad and
  /// wgrad); `backward_quantised`: a dgrad/wgrad of such a GEMM.
  bool fp8 = false;
  bool backward_quantised = false;
  /// GEMMs with bf16/fp16 operands (a device without such tensor cores rounds copies of them:
  /// GpuSpec::operand_rounding_s); element-wise ops that quantise an FP8 GEMM's operand.
  bool rounded_operands = false;
  bool fp8_cast = false;
  /// FLOPs the model-FLOPs convention counts (MFU, Eq. 3): the GEMM's flops; for attention the
  /// full (non-causal) 4·s²·d_h per head in forward, as Megatron's formulas count it. `flops` is
  /// what the kernel executes (causal half, the backward's recomputation).
  double model_flops = 0;
  /// Forward ops: activation bytes this op keeps for the backward (per TP rank, one microbatch).
  double saved_bytes = 0;
  /// Of saved_bytes, what the op's output is (kept by the op after it, counted here): what an
  /// output-discarding recompute module (Megatron's mla_up_proj) drops and recomputes.
  double saved_output_bytes = 0;
  /// Forward ops: the most bytes the op has alive at once, in its forward or in its own backward
  /// (per TP rank, one microbatch), when that exceeds saved_bytes; the excess is freed before the
  /// layers' backward runs, so memory counts it at a moment of its own (the eager loss).
  double peak_bytes = 0;
  /// In the attention core (QKᵀ, softmax, dropout, ·V; or the flash kernel): the region selective
  /// recompute re-runs, whose saved tensors it therefore does not keep.
  bool attention_core = false;
  /// Forward ops: the Megatron recompute modules (RecomputeModule bits: core_attn, layernorm,
  /// mlp, moe, moe_act, shared_experts) the op belongs to; selective recompute re-runs the ops
  /// of the plan's parallel.recompute_modules.
  unsigned modules = 0;
  /// Attention kernels: sequence length, head dim, causal mask, and forward (false) or backward.
  int64_t seq = 0, head_dim = 0;
  bool causal = true;
  bool backward = false;
  /// Attention kernels: which kernel runs (training.attention_kernel, resolved: the flash curve,
  /// FlashAttention-2 or cuDNN's fused attention, each where the GPU has its table);
  /// `causal_blocks`: the blocks of a context-parallel causal sequence (each unmasked, measured
  /// against the causal kernel over the whole sequence).
  AttentionKernel attention_kernel = AttentionKernel::Flash;
  bool causal_blocks = false;
  /// Communication ops: over which ranks; RingExchange: how many transfers of `bytes`.
  CommGroup group = CommGroup::Tensor;
  int64_t ring_steps = 0;
  /// Expert all-to-alls: the copies of each token `bytes` holds (top-k). The flex dispatcher
  /// (DeepEP) sends one copy per destination node across nodes and fans out over NVLink there.
  int64_t token_copies = 0;
  /// The MoE dispatcher's routing metadata (tokens per expert; the allgather dispatcher's
  /// choices and weights), gathered in the forward before the tokens move: the backward reuses
  /// it, so it has no backward collective.
  bool routing_metadata = false;
  /// Communication ops Megatron runs asynchronously under a GEMM of the same pass: that GEMM's
  /// name (the input gradient's all-reduce / reduce-scatter under "<gemm>.wgrad"; with sequence
  /// parallelism the re-gather of a column-parallel GEMM's input for its weight gradient under
  /// "<gemm>.dgrad"). Empty: the collective runs on its own.
  std::string overlaps;
  /// The kernel that runs the op and why (training.framework, training.fp8_recipe): `ptdp cost`
  /// prints it. Empty for the framework-independent ones (GEMMs in bf16, collectives).
  std::string kernel;
  /// Element-wise ops: the fraction of the GPU's element-wise bandwidth this implementation
  /// reaches (1 = the fused kernel the profile's elementwise_efficiency was measured with; eager
  /// PyTorch's unfused chains less), and the kernels it launches (each with its launch cost).
  double bandwidth_factor = 1;
  int kernels = 1;
  /// Host time to dispatch the op (eager frameworks: Python + ATen dispatch per kernel); the op
  /// takes max(GPU time, host time): a small op is CPU-bound.
  double host_s = 0;
  /// Throughput of the kernel relative to the profile's efficiency curve: FP8 GEMMs, the recipe's
  /// kernel against a tensorwise-scaled cuBLAS GEMM; context-parallel attention, the ring's
  /// load-balanced chunks against one kernel over the whole sequence.
  double kernel_factor = 1;
  /// Element-wise ops whose host implementation (the CPU executor) costs its arithmetic: which
  /// kernel, and how many elements it computes (priced by the profile's measured time per
  /// element when it has one, else by `bytes`).
  HostKernel host_kernel = HostKernel::None;
  double elements = 0;
};

/// Operations of one layer on one TP rank for one microbatch of b sequences, for a pass.
/// Recompute lists what the plan's recompute setting re-runs before the backward (empty for none):
/// the whole forward (full) or the attention core QKᵀ, softmax, dropout, ·V (selective).
/// With sequence parallelism the norms, dropouts and residual adds work on s/t of the sequence,
/// and the TP collectives are reduce-scatters and all-gathers (Korthikanti et al. 2022).
/// This list is the one description of a layer: attention kind, MLP kind, dropout, bias and
/// precision decide which operations it has; the cost model, memory (saved_bytes), the FLOP
/// count (model_flops), `ptdp cost` and the executors read it.
std::vector<Op> layer_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass);
/// The ops of a dense layer (moe false) or of an MoE layer (moe true) of the model.
std::vector<Op> layer_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass, bool moe);

/// Layer and head op lists (layer_ops, head_ops) shared by the calls a LayerOpsScope covers, on
/// any thread. Whoever opens the scope vouches that every call in it lists the same model's
/// layers: the memo is keyed by the plan fields the lists read (t, cp, ep, etp, micro batch,
/// precision, sequence parallelism, the MoE dispatcher, context communication, framework,
/// attention kernel, FP8 recipe; a layer's Pass::Recompute and the head the recompute setting and
/// modules; the head whether its output layer is split over the pipeline, then p, and whether the
/// MTP modules' body stands apart), the pass and the layer kind — not the data degree, schedule,
/// sharding or overlaps, which they do not read. The plans of a sweep share the lists across their
/// recompute and overlap choices and across what prices them (layer and unit prices, memory).
struct LayerOpsMemo {
  using Key = std::array<int64_t, 20>;
  std::mutex mutex;
  std::map<Key, std::shared_ptr<const std::vector<Op>>> lists;
};
/// The calling thread's layer_ops use `memo` (nullptr: none) while the scope lives.
using LayerOpsScope = ThreadScope<LayerOpsMemo>;
/// layer_ops' and head_ops' lists without a copy: the memo's in scope (made on a miss), or made afresh.
std::shared_ptr<const std::vector<Op>> shared_layer_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass, bool moe);
std::shared_ptr<const std::vector<Op>> shared_head_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass);
/// The kinds of layer the model has and their share of its layers: {(1, false)} for a dense
/// model, {(1, true)} when every layer is MoE, else both. Per-layer figures (cost, memory, FLOPs)
/// are the share-weighted mean (exact for the model, the mean for a stage of mixed layers).
std::vector<std::pair<double, bool>> layer_mix(const TransformerSpec& spec);

/// Operations of the embedding (first stage) and of the LM head + cross-entropy (last stage), with
/// the multi-token-prediction modules (model.mtp_layers): whole, or only their logits and loss
/// when a layout puts them on a stage before the last (ParallelPlan::mtp_apart).
std::vector<Op> embedding_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass);
std::vector<Op> head_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass);
/// The multi-token-prediction modules on a layout's MTP stage before the last (mtp_apart): the
/// next tokens' embedding lookup, norms, 2h → h projection, layer and final norm of each. Empty
/// otherwise (head_ops holds them) and for Pass::Recompute (their recompute is in the backward).
std::vector<Op> mtp_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass);
/// Vocabulary parallelism across pipeline stages (plan.vocab_parallel_pipeline): each pipeline
/// rank's share of the output layer and cross-entropy (V/(t·p) columns), with the broadcast of
/// the final hidden states, the all-reduce of the softmax statistics over the pipeline group and
/// the reduction of the input gradients back. head_ops then keeps the final norm only. Empty
/// without vocabulary parallelism.
std::vector<Op> vocab_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass);

double gemm_efficiency(const GpuSpec& gpu, int64_t m, int64_t n, int64_t k);
/// The efficiency curve alone (gemm_efficiency without the profile's measured gemm_rates).
double gemm_curve_efficiency(const GpuSpec& gpu, int64_t m, int64_t n, int64_t k);
/// The same shape model with the FP8 parameters (fp8_gemm_max_efficiency, fp8_gemm_half_dim).
double fp8_gemm_efficiency(const GpuSpec& gpu, int64_t m, int64_t n, int64_t k);
/// Fraction of peak_flops a fused attention kernel reaches (forward or backward) at sequence
/// length `seq` and head dim `head_dim`, causal or not (see GpuSpec). Without a kernel
/// table: the GEMM efficiency of one head's QKᵀ (seq × seq × head_dim).
double attention_efficiency(const GpuSpec& gpu, int64_t seq, int64_t head_dim, bool causal, bool backward);
/// The same for a kernel: cuDNN's fused attention (gpu.cudnn_attention_*; causal: ×
/// cudnn_attention_causal_factor) or FlashAttention-2 (gpu.fa2_attention_*) where the GPU has its
/// table, else the flash curve.
double attention_efficiency(const GpuSpec& gpu, int64_t seq, int64_t head_dim, bool causal, bool backward, AttentionKernel kernel);

/// The activation bytes one layer keeps for one microbatch on one TP rank until its backward,
/// read from the layer's forward op list (saved_bytes): everything without recompute; only the
/// layer's input with full recompute. Selective recompute by framework: Megatron drops what the
/// ops of parallel.recompute_modules keep (core_attn, the default: the attention core's internal
/// tensors; mlp / moe / shared_experts: the block's ops keep nothing but the block's input;
/// layernorm / moe_act: the norm's or activation's output, which the GEMM after it keeps);
/// torchtitan's op-level policy keeps the layer's input, the attention kernels' outputs, the
/// outputs of the expert all-to-alls and tensor-parallel reduce-scatters, and every second
/// matmul's output (half of the GEMMs' outputs, by bytes), and recomputes the rest.
double saved_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan);
/// The same for one layer of the given kind (dense or MoE): what a multi-token-prediction
/// module's layer keeps.
double layer_kind_saved_bytes(const TransformerSpec& spec, const ParallelPlan& plan, bool moe);
/// Model FLOPs (Op::model_flops) of one layer's forward for `batch` sequences, whole layer (all
/// TP ranks): the count behind MFU and the paper's Eq. 3.
double layer_model_flops(const TransformerSpec& spec, int64_t batch);
/// The same for one layer of the given kind (dense or MoE).
double layer_kind_model_flops(const TransformerSpec& spec, int64_t batch, bool moe);
/// Time of a compute op (Gemm or Elementwise) in seconds. All-reduces are 0 here.
double op_time_s(const Op& op, const GpuSpec& gpu);

/// The ops of a backward list that belong to W (weight_gradient) or to I (the others).
std::vector<Op> weight_gradient_ops(const std::vector<Op>& backward);
std::vector<Op> input_gradient_ops(const std::vector<Op>& backward);

/// Sum over a list: compute seconds, and bytes + count of its collectives (of every group).
struct OpsCost {
  double compute_s = 0;
  double flops = 0;
  double collective_bytes = 0;  // bytes of each collective summed
  int collectives = 0;          // collectives (all-reduces, reduce-scatters, all-gathers, all-to-alls, …)
};
OpsCost cost_of(const std::vector<Op>& ops, const GpuSpec& gpu);

/// Time of the optimizer step for `params` local parameters (memory-bound: reads and writes the
/// 16–18 bytes of mixed-precision Adam state per parameter).
double optimizer_time_s(double params, const GpuSpec& gpu, Precision precision);
/// The same for a framework's optimizer implementation over `tensors` parameter tensors:
/// max(the bandwidth term, the host's per-tensor dispatch), which dominates for many small
/// tensors under DTensor (torchtitan's FSDP2) and vanishes for fused multi-tensor kernels over
/// flat buffers (Megatron, DeepSpeed, FSDP1).
double optimizer_time_s(double params, double tensors, const GpuSpec& gpu, Precision precision, Framework framework);

/// The share of its peak FLOP/s a GPU sustains under a power limit `limit_w` below its TDP:
/// (limit / TDP)^0.9 (1 at or above the TDP). Fitted to the two published pairs: H100 bf16 at
/// 500 W ≈585 vs ≈795 TF at 700 W (0.74; exponent 0.895) and GB300 at 500 vs 1400 W, 617 vs
/// 1600–2174 TF (0.28–0.39; exponent 0.90–1.22) — kernel-and-framework-facts.md §6.
double sustained_clock_factor(double limit_w, double tdp_w);

/// Parameter tensors of `layers` layers as PyTorch modules hold them (q, k, v, o; gate, up, down
/// or fc1, fc2; two norms; biases; an MoE layer's router and stacked expert weights): the count
/// a per-tensor optimizer dispatches over.
double parameter_tensor_count(const TransformerSpec& spec, double layers);

/// What a framework's implementation costs: element-wise bandwidth relative to the fused kernels
/// (per op class), kernels per op, host dispatch per kernel, optimizer host time per tensor.
/// From kernel-and-framework-facts.md §5 (Liger's CSV: fused vs eager bandwidths on H100).
struct FrameworkCosts {
  double norm_bandwidth = 1;        // RMSNorm / LayerNorm
  double activation_bandwidth = 1;  // SwiGLU / GeLU
  double rotary_bandwidth = 1;      // rotary embeddings (queries and keys)
  int norm_kernels = 1, activation_kernels = 1, residual_kernels = 1, rotary_kernels = 1;
  double host_per_kernel_s = 0;     // CPU dispatch of one eager kernel (0: hidden behind the GPU)
  double optimizer_host_per_tensor_s = 0;
  const char* elementwise_kernel = "";
  const char* rotary_kernel = "";
  /// The loss's memory per local logit element (b·s·V/t): what it keeps through the microbatch's
  /// backward (Megatron's fused vocab-parallel cross-entropy: the fp32 logits and their gradient,
  /// 8 bytes), and what it has alive at its own peak moment (the eager loss: 12 bytes at its
  /// backward, none of it held past it).
  double loss_kept_bytes = 8;
  double loss_peak_bytes = 8;
};
FrameworkCosts framework_costs(Framework f);

/// An FP8 recipe's costs: the GEMM kernel's throughput relative to tensorwise cuBLAS, and the
/// bytes its quantisation kernels move per quantised element (read bf16, write the FP8 copies the
/// GEMMs need — row- and column-wise — and their scales).
struct Fp8RecipeCosts {
  double gemm_factor = 1;
  double quant_bytes_per_element = 4;
  const char* kernel = "";
  /// A grouped GEMM's weight gradient (K-grouped: it reduces over each expert's ragged token
  /// count) against its input gradient at equal FLOPs, in this recipe's kernels.
  double grouped_wgrad_slowdown = kGroupedWgradSlowdown;
  /// The slowdown where no recipe-specific measurement exists (bf16, tensorwise, rowwise): the
  /// geometric mean of the measured ones (2.70 H100 blockwise, 1.25 B200 MXFP8).
  static constexpr double kGroupedWgradSlowdown = 1.84;
};
Fp8RecipeCosts fp8_recipe_costs(Fp8Recipe r);

}  // namespace ptdp
