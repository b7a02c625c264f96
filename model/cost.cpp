#include "model/cost.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>

#include "core/error.hpp"
#include "model/measured_kernels.hpp"
#include "model/memory.hpp"

namespace ptdp {
namespace {

struct Dims {
  double b, s, h, a, f, t, e, v;
  double kv = 0;         // key/value width: query groups × head dim
  bool swiglu = false;   // gated MLP: gate and up projections
  std::string norm = "ln";  // op-name prefix of the norms
  double sp = 1;         // sequence-parallel split of the norm/dropout/residual regions (t or 1)
  bool flash = true;     // fused attention kernel
  bool dropout = false;  // dropout kernels and masks
  bool bias = true;      // biases in the linear layers
  bool fp8 = false;      // the linear layers' GEMMs in FP8 (Transformer Engine)
  double dh = 0;         // head dim
  double rotary = 0;     // rotated channels per query/key head (rotary embeddings; 0: none)
  double q = 0;          // attention-output width: heads · head dim (= h by default; MLA heads · v_head_dim)
  // The attention kernel's operand widths over all heads: Q and K (QKᵀ), V (·V); = q, kv, kv
  // without MLA, whose K and V are per head after the up-projection.
  double attn_q = 0, attn_k = 0, attn_v = 0;
  // Multi-head latent attention: the latents' widths (q 0 = queries projected from h), the
  // rotary and non-rotary parts of each head's QKᵀ width, and each head's value width.
  bool mla = false;
  double q_lora = 0, kv_lora = 0, qk_rope = 0, qk_nope = 0, v_dh = 0;  // v_dh = dh without MLA
  // Mixture of experts (this layer's MLP): E experts of ffn fe, top k, S shared of ffn fs, the
  // busiest expert's load factor, the capacity factor (0 = dropless).
  bool moe = false;
  double experts = 0, top_k = 0, fe = 0, shared = 0, fs = 0, imbalance = 1, capacity = 0;
  // Expert parallelism: ep ranks share the experts, each expert split over etp; the all-to-all
  // dispatcher (else all-gather).
  double ep = 1, etp = 1;
  bool alltoall = true;
  bool flex = false;  // the alltoall is DeepEP's (parallel.moe_dispatcher: flex)
  // Context parallelism: cp ranks hold s/cp tokens each (s above is the local length, s_full
  // the whole sequence); the ring K/V exchange (else all-gather).
  double cp = 1, s_full = 0;
  bool ring = true;
  bool ulysses = false;  // all-to-alls trading the sequence shard for a head shard (context_comm alltoall)
  // The framework's implementation costs and the FP8 recipe's.
  FrameworkCosts fw{};
  Framework framework = Framework::Megatron;
  AttentionKernel attention_kernel = AttentionKernel::Cudnn;
  Fp8RecipeCosts recipe{};
  Fp8Recipe fp8_recipe = Fp8Recipe::Tensorwise;
};

Dims dims_of(const TransformerSpec& spec, const ParallelPlan& plan) {
  Dims d{static_cast<double>(plan.micro_batch),        static_cast<double>(spec.seq_length),
         static_cast<double>(spec.hidden_size),        static_cast<double>(spec.num_attention_heads),
         static_cast<double>(spec.ffn()),              static_cast<double>(plan.tensor),
         static_cast<double>(bytes_per_element(plan.precision)),
         static_cast<double>(spec.padded_vocab(plan.tensor)),
         static_cast<double>(spec.kv_width()),
         spec.mlp == MlpKind::SwiGLU,
         spec.normalization == NormKind::RMSNorm ? "rmsnorm" : "ln",
         plan.sequence_parallel ? static_cast<double>(plan.tensor) : 1.0};
  d.flash = spec.attention == AttentionKind::Flash;
  d.dropout = spec.has_dropout();
  d.bias = spec.has_bias();
  d.fp8 = plan.precision == Precision::FP8;
  d.dh = static_cast<double>(spec.head_dim());
  d.rotary = static_cast<double>(spec.rotary_dim());
  d.q = static_cast<double>(spec.q_width());
  d.attn_q = d.q, d.attn_k = d.attn_v = d.kv, d.v_dh = d.dh;
  if (spec.has_mla()) {
    const MlaSpec& m = spec.mla;
    d.mla = true;
    d.q_lora = static_cast<double>(m.q_lora_rank), d.kv_lora = static_cast<double>(m.kv_lora_rank);
    d.qk_rope = static_cast<double>(m.qk_pos_emb_head_dim), d.qk_nope = static_cast<double>(m.qk_head_dim);
    d.v_dh = static_cast<double>(m.v_head_dim);
    d.dh = d.qk_nope + d.qk_rope;  // the kernel's QKᵀ width
    d.rotary = static_cast<double>(spec.rotary_dim());  // MLA rotates its positional channels only (decoupled rope)
    d.q = d.a * d.v_dh;
    d.attn_q = d.attn_k = d.a * d.dh, d.attn_v = d.q;
  }
  d.experts = static_cast<double>(spec.moe.num_experts);
  d.top_k = static_cast<double>(spec.moe.top_k);
  d.fe = static_cast<double>(spec.expert_ffn());
  d.shared = static_cast<double>(spec.moe.shared_experts);
  d.fs = static_cast<double>(spec.shared_expert_ffn());
  d.imbalance = spec.moe.imbalance;
  d.capacity = spec.moe.capacity_factor;
  d.ep = static_cast<double>(plan.expert);
  d.etp = static_cast<double>(plan.expert_tensor_size());
  d.alltoall = plan.moe_dispatcher != MoeDispatcher::AllGather;  // flex: DeepEP, an all-to-all of its own
  d.flex = plan.moe_dispatcher == MoeDispatcher::Flex;
  d.cp = static_cast<double>(plan.context);
  d.s_full = d.s;
  d.s = d.s_full / d.cp;
  d.ring = plan.context_comm == ContextComm::Ring;
  d.ulysses = d.cp > 1 && plan.context_comm == ContextComm::AllToAll;
  d.framework = plan.framework;
  d.attention_kernel = resolved_attention_kernel(plan);
  d.fw = framework_costs(plan.framework);
  d.fp8_recipe = plan.fp8_recipe;
  d.recipe = fp8_recipe_costs(plan.fp8_recipe);
  return d;
}

Op gemm(std::string name, double e, int64_t batch, int64_t m, int64_t n, int64_t k) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::Gemm;
  op.batch = batch;
  op.m = m;
  op.n = n;
  op.k = k;
  const double B = static_cast<double>(batch), M = static_cast<double>(m), N = static_cast<double>(n),
               K = static_cast<double>(k);
  op.flops = 2 * B * M * N * K;
  op.model_flops = op.flops;
  op.bytes = e * B * (M * K + K * N + M * N);
  op.rounded_operands = e < 4;
  return op;
}

// A linear layer's GEMM (weights k × n): in FP8 with training.precision fp8, reading 1-byte
// operands; it keeps its input for the weight gradient (1 byte per element in FP8: TE saves the
// quantised copy), `input_saved` false when another op already keeps that tensor.
Op linear(std::string name, const Dims& d, int64_t m, int64_t n, int64_t k, double input_elements, bool input_saved = true) {
  Op op = gemm(std::move(name), d.fp8 ? 1.0 : d.e, 1, m, n, k);
  op.fp8 = d.fp8;
  if (d.fp8) {
    op.kernel_factor = d.recipe.gemm_factor;
    op.kernel = d.recipe.kernel;
  }
  if (input_saved) op.saved_bytes = input_elements * (d.fp8 ? 1.0 : d.e);
  return op;
}

Op elementwise(std::string name, double bytes, double saved_bytes = 0) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::Elementwise;
  op.bytes = bytes;
  op.saved_bytes = saved_bytes;
  return op;
}

// The framework's kernel for a norm or an activation: its bandwidth relative to the fused kernel
// and the kernels an eager implementation launches.
enum class ElementwiseClass { Norm, Activation, Rotary };
Op framework_elementwise(const Dims& d, ElementwiseClass c, std::string name, double bytes, double saved_bytes = 0) {
  Op op = elementwise(std::move(name), bytes, saved_bytes);
  switch (c) {
    case ElementwiseClass::Norm: op.bandwidth_factor = d.fw.norm_bandwidth, op.kernels = d.fw.norm_kernels; break;
    case ElementwiseClass::Activation: op.bandwidth_factor = d.fw.activation_bandwidth, op.kernels = d.fw.activation_kernels; break;
    case ElementwiseClass::Rotary: op.bandwidth_factor = d.fw.rotary_bandwidth, op.kernels = d.fw.rotary_kernels; break;
  }
  op.kernel = c == ElementwiseClass::Rotary ? d.fw.rotary_kernel : d.fw.elementwise_kernel;
  return op;
}

// Eager frameworks dispatch every kernel from the host (Python, autograd, ATen: 5–20 µs each in
// traces); a compute op then takes max(its GPU time, its dispatch), which only small ops reach.
std::vector<Op> with_host_dispatch(std::vector<Op> ops, const Dims& d) {
  if (d.fw.host_per_kernel_s > 0)
    for (Op& op : ops)
      if (!is_communication(op.kind)) op.host_s = op.kernels * d.fw.host_per_kernel_s;
  return ops;
}

Op collective(std::string name, OpKind kind, double bytes) {
  Op op;
  op.name = std::move(name);
  op.kind = kind;
  op.bytes = bytes;
  return op;
}

Op allreduce(std::string name, double bytes) { return collective(std::move(name), OpKind::AllReduce, bytes); }

Op collective(std::string name, OpKind kind, double bytes, CommGroup group) {
  Op op = collective(std::move(name), kind, bytes);
  op.group = group;
  return op;
}

// The TP operator after a row-parallel GEMM (Megatron's g): an all-reduce, or with sequence
// parallelism a reduce-scatter into the sequence shards. Nothing when t = 1.
void add_output_reduction(std::vector<Op>& ops, const Dims& d, const std::string& gemm, double bytes) {
  if (d.t <= 1) return;
  if (d.sp > 1) ops.push_back(collective(gemm + ".reduce_scatter", OpKind::ReduceScatter, bytes));
  else ops.push_back(allreduce(gemm + ".allreduce", bytes));
}

int64_t i64(double x) { return static_cast<int64_t>(x); }

// FP8 GEMMs need their operands quantised: each activation input is cast (and transposed for the
// weight gradient) once in forward, each output gradient once in backward: read 2 bytes, write
// the row- and column-wise FP8 copies (1 + 1), amax fused (Transformer Engine's cast_transpose).
void add_fp8_cast(std::vector<Op>& ops, const Dims& d, const std::string& name, double elements) {
  if (!d.fp8) return;
  // The recipe's quantisation kernels: bytes per element (tensorwise 4: TE's cast_transpose;
  // rowwise, blockwise, mxfp8 6: separate row- and column-wise passes with their scales).
  Op cast = elementwise(name + ".cast_fp8", elements * d.recipe.quant_bytes_per_element);
  cast.kernel = std::string(to_string(d.fp8_recipe)) + " quantisation";
  cast.fp8_cast = true;
  ops.push_back(cast);
}

// The two GEMMs of a backward: input gradient dX = dY·Wᵀ (m×n·n×k) and weight gradient
// dW = Xᵀ·dY (k×m·m×n). For batched attention products both operands are activations, and the
// two gradients have the same shapes; both are on the input-gradient path (no weight).
void add_backward_gemms(std::vector<Op>& out, const Op& fwd, double e, double grouped_wgrad_slowdown) {
  const bool has_weight = fwd.name.rfind("attn.", 0) != 0;  // attention products (attn.*) have none
  const double operand_e = fwd.fp8 ? 1.0 : e;
  Op dx = gemm(fwd.name + ".dgrad", operand_e, fwd.batch, fwd.m, fwd.k, fwd.n);
  Op w = gemm(fwd.name + (has_weight ? ".wgrad" : ".dgrad2"), operand_e, fwd.batch, fwd.k, fwd.n, fwd.m);
  for (Op* op : {&dx, &w}) {
    op->fp8 = op->backward_quantised = fwd.fp8;
    op->kernel_factor = fwd.kernel_factor;  // the recipe's kernel runs the backward GEMMs too
    op->kernel = fwd.kernel;
  }
  w.weight_gradient = has_weight;
  if (has_weight && fwd.batch > 1) {
    // A grouped GEMM's weight gradient reduces over each expert's ragged token count (K-grouped):
    // slower than the input gradient at equal FLOPs by the recipe's measured factor
    // (Fp8RecipeCosts::grouped_wgrad_slowdown: kernel-and-framework-facts.md §2).
    w.kernel_factor /= grouped_wgrad_slowdown;
    w.kernel += std::string(w.kernel.empty() ? "" : ", ") + "K-grouped wgrad";
  }
  out.push_back(dx);
  out.push_back(w);
}

std::vector<Op> attention_core(const Dims& d) {
  // Ulysses (context_comm alltoall, DeepSpeed-Ulysses / Transformer Engine's a2a): a context rank
  // attends with 1/cp of the tensor rank's heads over the whole sequence (its query rows), between
  // two all-to-alls over the context group — Q, K and V in (each rank sends (cp − 1)/cp of its
  // sequence shard's q, k and v), the output back; their backward runs the two the other way (dO
  // in, dQ/dK/dV back): 4·s·h/cp per layer and pass with multi-head attention, less with GQA's
  // narrower K/V (kernel-and-framework-facts.md §7). The kernel is the single-GPU causal kernel on
  // the whole sequence, at its own efficiency.
  const double heads = d.a / (d.t * (d.ulysses ? d.cp : 1.0));
  const double rows = d.ulysses ? d.s_full : d.s;  // the kernel's queries per sequence
  std::vector<Op> ops;
  if (d.flash) {
    // One fused kernel: QKᵀ, causal mask, online softmax, dropout (its mask regenerated from the
    // RNG state, never stored) and ·V, tile by tile. It keeps only its output (the projection's
    // input, kept there) and the fp32 log-sum-exp of each query row.
    Op op;
    op.name = "attn.flash";
    op.kind = OpKind::Attention;
    op.batch = i64(d.b * heads);
    op.seq = i64(rows);
    op.head_dim = i64(d.dh);
    // With context parallelism the rank's s/cp queries meet all s keys, block by block (cp blocks
    // of s/cp keys; the load-balanced chunks give every rank the same causal half), so each
    // kernel call is an unmasked s/cp × s/cp block but for the diagonal ones.
    op.causal = d.cp <= 1 || d.ulysses;
    if (d.ulysses) {
      op.kernel = "Ulysses: the whole sequence, 1/cp of the heads";
    } else if (d.cp > 1 && d.ring) {
      // The ring runs one kernel per step on chunks of s/(2·cp) queries and keys (Megatron's
      // 2·cp load-balanced chunks) and rescales the partial outputs between steps: measured
      // zigzag ring attention reaches 85.2 % (H800) / 81.7 % (A100) of the single-GPU kernel on
      // the whole sequence in forward, 90.2 / 89.8 % in forward + backward (8 GPUs, 8k tokens
      // each; kernel-and-framework-facts.md §7) — backward alone 0.92 / 0.94 (derived, the
      // backward being 2.5× the forward's FLOPs).
      op.seq = i64(std::max(1.0, d.s / 2));
      op.kernel_factor = 0.835;
      op.kernel = "ring attention, 2·cp load-balanced chunks";
    } else if (d.cp > 1) {
      // All-gathered K/V (Llama 3's way): one kernel over the rank's queries against the whole
      // sequence with a partial causal mask; measured at 57.0 % (fwd) / 58.1 % (fwd + bwd) of the
      // single-GPU kernel against the zigzag ring's 70.2 / 75.9 % (varlen, 8×H800, §7): the ring's
      // factors × 0.81 (fwd) and × 0.765 (fwd + bwd, applied to the backward).
      op.kernel_factor = 0.835 * 57.0 / 70.2;
      op.kernel = "all-gathered K/V, partial causal mask";
    }
    // The kernel (training.attention_kernel): by default Megatron runs Transformer Engine's
    // default backend, cuDNN's fused attention; the PyTorch frameworks FlashAttention-2 (SDPA's
    // flash backend; DeepSpeed's flash-attn 2).
    op.attention_kernel = d.attention_kernel;
    const char* kernel = d.attention_kernel == AttentionKernel::Cudnn    ? "cuDNN fused attention (Transformer Engine)"
                         : d.attention_kernel == AttentionKernel::Flash2 ? "FlashAttention-2 (PyTorch SDPA, flash-attn 2)"
                                                                          : "flash attention (the GPU's flash curve)";
    op.kernel = op.kernel.empty() ? kernel : op.kernel + ", " + kernel;
    op.causal_blocks = d.cp > 1 && !d.ulysses;
    // QKᵀ over the QK width + ·V over the V width (MLA: 192 + 128), every (query, key) pair.
    op.model_flops = 2 * d.b * heads * rows * d.s_full * (d.dh + d.v_dh);
    op.flops = op.model_flops / 2;  // the causal kernel skips the upper half
    // Q, K, V in, O out (the query and output widths of this rank's heads).
    op.bytes = d.e * d.b * (rows * (d.attn_q + d.q) + d.s_full * (d.attn_k + d.attn_v)) / (d.t * (d.ulysses ? d.cp : 1.0));
    op.saved_bytes = 4 * d.b * heads * rows;
    if (d.ulysses) {
      ops.push_back(collective("attn.qkv.alltoall", OpKind::AllToAll, d.e * d.b * d.s * (d.attn_q + d.attn_k + d.attn_v) / d.t, CommGroup::Context));
      ops.back().kernel = "Ulysses: Q, K, V (their gradients in the backward) between the sequence and head shards";
      ops.push_back(op);
      ops.push_back(collective("attn.out.alltoall", OpKind::AllToAll, d.e * d.b * d.s * d.q / d.t, CommGroup::Context));
      ops.back().kernel = "Ulysses: the output (its gradient in the backward) between the head and sequence shards";
    } else if (d.cp > 1) {
      // K and V of the other context ranks: a ring passing one rank's K/V chunk per step,
      // overlapped with the attention of the chunk in hand, or one all-gather before it.
      const double kv_chunk = d.b * d.s * (d.attn_k + d.attn_v) / d.t * d.e;
      if (d.ring) {
        Op ring = collective("attn.kv_ring", OpKind::RingExchange, kv_chunk, CommGroup::Context);
        ring.ring_steps = i64(d.cp) - 1;
        ring.overlaps = op.name;  // each step under the block in hand
        ops.push_back(ring);
      } else {
        ops.push_back(collective("attn.kv_allgather", OpKind::AllGather, kv_chunk * d.cp, CommGroup::Context));
      }
    }
    if (!d.ulysses) ops.push_back(op);
  } else {
    ops.push_back(gemm("attn.qk", d.e, i64(d.b * heads), i64(d.s), i64(d.s), i64(d.dh)));
    const double scores = d.b * heads * d.s * d.s;
    ops.push_back(elementwise("attn.softmax", 2 * scores * d.e, scores * d.e));  // keeps its output
    if (d.dropout) ops.push_back(elementwise("attn.dropout", scores * (2 * d.e + 1), scores * (1 + d.e)));  // mask and output
    ops.push_back(gemm("attn.av", d.e, i64(d.b * heads), i64(d.s), i64(d.dh), i64(d.s)));
  }
  for (Op& op : ops) op.attention_core = true;
  return ops;
}

// The residual add after the attention and MLP blocks, with the row-parallel bias and the
// hidden dropout fused in when the model has them (Megatron's bias_dropout_add): reads the
// block output and the residual, writes the sum (and a one-byte mask with dropout).
Op residual_add(const Dims& d, int which) {
  const double bsh = d.b * d.s * d.h / d.sp;
  const std::string name = std::string(d.bias ? "bias_" : "") + (d.dropout ? "dropout_" : "") + "add" + std::to_string(which);
  return elementwise(name, bsh * (3 * d.e + (d.dropout ? 1 : 0)), d.dropout ? bsh : 0);
}

// An MLP of `n` GEMM "experts" on `rows` tokens each (batched: Megatron's grouped GEMM), inner size
// f, named prefix.fc1 / prefix.fc2; `model_rows` is what the model-FLOPs convention counts (the
// routed tokens, without the busiest expert's excess or capacity padding).
// `split`: the tensor-parallel split of f (t for shared experts, etp for routed ones).
void add_expert_mlp(std::vector<Op>& ops, const Dims& d, const std::string& prefix, double n, double rows, double model_rows, double f,
                    double split) {
  const double inner = n * rows * f / split;
  const double in = d.swiglu ? 2 : 1;
  Op fc1 = linear(prefix + ".fc1", d, i64(rows), i64(in * f / split), i64(d.h), n * rows * d.h);
  fc1.batch = i64(n);
  fc1.flops *= n;
  fc1.bytes *= n;
  fc1.model_flops = n * 2 * model_rows * in * f / split * d.h;
  add_fp8_cast(ops, d, prefix + ".fc1", n * rows * d.h);
  ops.push_back(fc1);
  if (d.swiglu) {
    ops.push_back(framework_elementwise(d, ElementwiseClass::Activation, prefix + ".swiglu", 3 * inner * d.e, 2 * inner * d.e));
    ops.back().host_kernel = HostKernel::Swiglu;
    ops.back().elements = inner;
  } else ops.push_back(framework_elementwise(d, ElementwiseClass::Activation, prefix + ".gelu", 2 * inner * d.e, inner * d.e));
  Op fc2 = linear(prefix + ".fc2", d, i64(rows), i64(d.h), i64(f / split), inner);
  fc2.batch = i64(n);
  fc2.flops *= n;
  fc2.bytes *= n;
  fc2.model_flops = n * 2 * model_rows * f / split * d.h;
  add_fp8_cast(ops, d, prefix + ".fc2", inner);
  ops.push_back(fc2);
}

// The MLP of an MoE layer (Megatron-Core): router GEMM and top-k on the rank's tokens, tokens
// permuted and dispatched to the ranks of their experts, one grouped GEMM per projection over the
// rank's E/ep experts — each sized for the busiest expert (imbalance, or the capacity with a
// capacity factor) — then combined back and unpermuted; shared experts as one more MLP of S·fs.
// Tokens: with sequence parallelism (or t = 1) each rank routes its own T_r = b·s/(cp·t) tokens
// and an expert's etp ranks gather those of their group, so an expert sees ep·etp·T_r·k/E rows;
// without it (t > 1, ep 1, etp = t) the t ranks hold the same b·s/cp tokens, an expert sees
// T_r·k/E of them, and the MLP output is all-reduced over the TP group as a dense MLP's is.
// Dispatcher alltoall: an all-to-all over the ep ranks of the rank's T_r·k token copies
// (dispatch, and combine after the experts), then an all-gather over the etp ranks before the
// experts and a reduce-scatter after; allgather: every rank of the etp·ep group gathers all
// T_r tokens of the group, and the outputs are reduce-scattered back.
void add_moe_mlp(std::vector<Op>& ops, const Dims& d) {
  const bool token_split = d.sp > 1 || d.t <= 1;
  const double T = d.b * d.s / d.sp, routed = T * d.top_k;
  // The router's h → E product is a matrix-vector product per token (E ≪ h): bound by reading the
  // tokens, timed as memory traffic; its FLOPs still count.
  Op router = elementwise("router", d.e * T * d.h + 4 * T * d.experts);
  router.flops = router.model_flops = 2 * T * d.h * d.experts;
  ops.push_back(router);
  ops.push_back(elementwise("router.topk", T * d.experts * 2 * 4, T * d.experts * 4));
  if (d.shared > 0) {
    // Shared experts run as a dense MLP: tensor-parallel over the whole (gathered) sequence.
    const double bsh = d.b * d.s * d.h;
    if (d.sp > 1) ops.push_back(collective("shared.allgather", OpKind::AllGather, bsh * d.e));
    add_expert_mlp(ops, d, "shared", 1, d.b * d.s, d.b * d.s, d.shared * d.fs, d.t);
    if (d.sp > 1) ops.push_back(collective("shared.fc2.reduce_scatter", OpKind::ReduceScatter, bsh * d.e));
  }
  // Tokens per local expert: the mean, the busiest one imbalance× that (dropless), or the
  // capacity ceil(tokens·k/E·factor) (tokens beyond it dropped, shorter ones padded).
  const double sources = d.ep * (token_split ? d.etp : 1);
  const double mean = sources * routed / d.experts;
  const double rows = d.capacity > 0 ? std::ceil(mean * d.capacity) : std::ceil(mean * d.imbalance);
  const double token_bytes = d.h * d.e;
  ops.push_back(elementwise("moe.permute", 2 * routed * token_bytes, routed * token_bytes));
  const bool dispatch = token_split && d.ep * d.etp > 1;
  // Before any token moves, each rank learns what it will receive: the all-to-all dispatcher
  // gathers every rank's tokens per expert (E counts, 4-byte each, as the executor sends them)
  // over the expert group, and with split tokens the expert-tensor members' counts too
  // (Megatron-Core gathers them once over tp×ep; the executor in these two steps); the allgather
  // dispatcher gathers every rank's choices and weights (2·T·k values). Small, but each is a
  // synchronising collective of its own: its latency is the pass's. (DeepEP's flex dispatcher
  // exchanges its counts inside its dispatch kernel, priced with it.)
  auto metadata = [&](const char* name, double bytes, CommGroup group) {
    ops.push_back(collective(name, OpKind::AllGather, bytes, group));
    ops.back().routing_metadata = true;
  };
  if (dispatch && d.alltoall && !d.flex) {
    if (d.ep > 1) metadata("moe.dispatch.counts.allgather", d.ep * d.experts * 4, CommGroup::Expert);
    if (d.etp > 1) metadata("moe.dispatch.member_counts.allgather", d.etp * d.ep * d.experts * 4, CommGroup::ExpertTensor);
  } else if (dispatch && !d.alltoall) {
    metadata("moe.dispatch.routing.allgather", d.ep * d.etp * 2 * routed * 4, CommGroup::ExpertModel);
  }
  if (dispatch && d.alltoall) {
    if (d.ep > 1) {
      ops.push_back(collective("moe.dispatch.alltoall", OpKind::AllToAll, routed * token_bytes, CommGroup::Expert));
      ops.back().token_copies = i64(d.top_k);
      if (d.flex) ops.back().kernel = "DeepEP dispatch (flex: one copy per rank, per node across nodes)";
    }
    if (d.etp > 1) ops.push_back(collective("moe.dispatch.allgather", OpKind::AllGather, d.etp * routed * token_bytes, CommGroup::ExpertTensor));
  } else if (dispatch) {
    ops.push_back(collective("moe.dispatch.allgather", OpKind::AllGather, d.ep * d.etp * T * token_bytes, CommGroup::ExpertModel));
  }
  // Megatron-Core's alltoall dispatcher receives its tokens ordered by source rank, then by
  // expert: with more than one local expert it sorts them into one chunk per local expert
  // (sort_chunks_by_idxs: a gather of every received row) before the grouped GEMM, and back into
  // source order before the combine — a read and a write of the rank's received rows each, and
  // again in the backward. (DeepEP's flex dispatcher lays the rows out by expert itself.)
  const double local_experts = d.experts / d.ep;
  const bool sorts = dispatch && d.alltoall && !d.flex && d.ep > 1 && local_experts > 1;
  const double received_bytes = local_experts * mean * token_bytes;
  if (sorts) {
    ops.push_back(elementwise("moe.sort_chunks", 2 * received_bytes));
    ops.back().kernel = "sort_chunks_by_idxs (alltoall dispatcher, " + std::to_string(i64(local_experts)) + " local experts)";
  }
  add_expert_mlp(ops, d, "expert", local_experts, rows, mean, d.fe, token_split ? d.etp : d.t);
  if (sorts) {
    ops.push_back(elementwise("moe.unsort_chunks", 2 * received_bytes));
    ops.back().kernel = "sort_chunks_by_idxs, back to source order";
  }
  if (dispatch && d.alltoall) {
    if (d.etp > 1) ops.push_back(collective("moe.combine.reduce_scatter", OpKind::ReduceScatter, d.etp * routed * token_bytes, CommGroup::ExpertTensor));
    if (d.ep > 1) {
      ops.push_back(collective("moe.combine.alltoall", OpKind::AllToAll, routed * token_bytes, CommGroup::Expert));
      ops.back().token_copies = i64(d.top_k);
      if (d.flex) ops.back().kernel = "DeepEP combine (flex: one copy per rank, per node across nodes)";
    }
  } else if (dispatch) {
    ops.push_back(collective("moe.combine.reduce_scatter", OpKind::ReduceScatter, d.ep * d.etp * T * token_bytes, CommGroup::ExpertModel));
  }
  ops.push_back(elementwise("moe.unpermute", 2 * routed * token_bytes, routed * 4));
}

// Multi-head latent attention's projections (Megatron-Core's MLASelfAttention): the down
// projections to the query and key/value latents (and the shared rope key) are replicated over
// the tensor group and run on the rank's sequence shard, as one GEMM of the norm's output; the
// latents are normed (q_norm, kv_norm), gathered over the sequence-parallel group, and projected
// up column-parallel — queries to every head's QK width, keys' non-rotary part and values to
// every head's. Keeps the latents for the up-projections' weight gradients and Q, K, V for the
// attention core's backward. Without a query latent the queries come from h directly.
void add_mla_projections(std::vector<Op>& ops, const Dims& d) {
  const double tokens = d.b * d.s, shard = tokens / d.sp, heads = d.a / d.t;
  const double down = d.q_lora + d.kv_lora + d.qk_rope;
  // Two GEMMs of the one input (Megatron's linear_q_down_proj and linear_kv_down_proj).
  if (d.q_lora > 0) {
    add_fp8_cast(ops, d, "mla.q_down", shard * d.h);
    ops.push_back(linear("mla.q_down", d, i64(shard), i64(d.q_lora), i64(d.h), shard * d.h));
  }
  add_fp8_cast(ops, d, "mla.kv_down", shard * d.h);
  ops.push_back(linear("mla.kv_down", d, i64(shard), i64(d.kv_lora + d.qk_rope), i64(d.h), d.q_lora > 0 ? 0 : shard * d.h));
  const double latents = shard * (d.q_lora + d.kv_lora);
  ops.push_back(framework_elementwise(d, ElementwiseClass::Norm, "mla.latent_norm", 2 * latents * d.e, latents * d.e));
  // The up-projections need every token's latents (and, without a query latent, the input).
  if (d.sp > 1) ops.push_back(collective("mla.latent.allgather", OpKind::AllGather, tokens * (down + (d.q_lora > 0 ? 0 : d.h)) * d.e));
  // Each up-projection keeps its latent's sequence shard (re-gathered for its weight gradient,
  // as the QKV GEMM's input is); queries from h read the input the down projections keep.
  const double q_in = d.q_lora > 0 ? d.q_lora : d.h;
  if (d.q_lora > 0) add_fp8_cast(ops, d, "mla.q_up", tokens * d.q_lora);
  ops.push_back(linear("mla.q_up", d, i64(tokens), i64(heads * d.dh), i64(q_in), shard * q_in, d.q_lora > 0));
  add_fp8_cast(ops, d, "mla.kv_up", tokens * d.kv_lora);
  ops.push_back(linear("mla.kv_up", d, i64(tokens), i64(heads * (d.qk_nope + d.v_dh)), i64(d.kv_lora), shard * d.kv_lora));
  ops.back().saved_output_bytes = tokens * (d.attn_q + d.attn_k + d.attn_v) / d.t * d.e;
  ops.back().saved_bytes += ops.back().saved_output_bytes;
}

std::vector<Op> untagged_forward_ops(const Dims& d) {
  const double bsh = d.b * d.s * d.h;
  const int64_t bs = i64(d.b * d.s);
  std::vector<Op> ops;
  // The layer's input: what full recompute keeps (sequence-sharded with sequence parallelism).
  ops.push_back(framework_elementwise(d, ElementwiseClass::Norm, d.norm + "1", 2 * bsh * d.e / d.sp, bsh * d.e / d.sp));
  // Sequence parallelism: the column-parallel GEMM needs the whole sequence (Megatron's ḡ); MLA's
  // down projections run on the shard and gather their latents (with the norm output when the
  // queries come from it) in mla.latent.allgather.
  if (d.sp > 1 && !d.mla) ops.push_back(collective(d.norm + "1.allgather", OpKind::AllGather, bsh * d.e));
  if (d.mla) {
    add_mla_projections(ops, d);
  } else {
    add_fp8_cast(ops, d, "qkv", bsh / d.sp);
    // Q for every head, K and V for each query group (GQA), column-parallel. Keeps its input (the
    // norm's output, sequence-sharded) and Q, K, V for the attention core's backward.
    ops.push_back(linear("qkv", d, bs, i64((d.q + 2 * d.kv) / d.t), i64(d.h), bsh / d.sp));
    ops.back().saved_bytes += d.b * d.s * (d.q + 2 * d.kv) / d.t * d.e;
  }
  if (d.rotary > 0) {
    // Rotary embeddings rotate the first `rotary` channels of every query and key head in place
    // (a fused rope reads and writes them once; eager implementations more: the framework's
    // rotary class); MLA's queries' rope channels and the one rope key all heads share.
    const double rotated = d.mla ? d.b * d.s * (d.a / d.t + 1) * d.rotary : d.b * d.s * (d.q + d.kv) / d.t * (d.rotary / d.dh);
    Op rope = framework_elementwise(d, ElementwiseClass::Rotary, "rope", 2 * rotated * d.e);
    rope.host_kernel = HostKernel::Rotary;
    rope.elements = rotated;
    ops.push_back(rope);
  }
  for (auto& op : attention_core(d)) ops.push_back(op);
  const double bsq = d.b * d.s * d.q;  // the heads' outputs
  add_fp8_cast(ops, d, "proj", bsq / d.t);
  ops.push_back(linear("proj", d, bs, i64(d.h), i64(d.q / d.t), bsq / d.t));
  add_output_reduction(ops, d, "proj", bsh * d.e);
  ops.push_back(residual_add(d, 1));
  ops.push_back(framework_elementwise(d, ElementwiseClass::Norm, d.norm + "2", 2 * bsh * d.e / d.sp, bsh * d.e / d.sp));
  if (d.moe) {
    // The MoE layer routes the sequence shards itself (its dispatcher gathers what the experts
    // need and returns the outputs to the shards); without sequence parallelism the t ranks hold
    // the same tokens and sum the experts' partial outputs as a dense MLP does.
    add_moe_mlp(ops, d);
    if (d.sp <= 1) add_output_reduction(ops, d, "fc2", bsh * d.e);
    ops.push_back(residual_add(d, 2));
    return ops;
  }
  if (d.sp > 1) ops.push_back(collective(d.norm + "2.allgather", OpKind::AllGather, bsh * d.e));
  add_fp8_cast(ops, d, "fc1", bsh / d.sp);
  const double inner = d.b * d.s * d.f / d.t;  // MLP inner activations per TP rank
  if (d.swiglu) {
    // Gate and up projections as one column-parallel GEMM (Megatron fuses them), silu(gate)·up,
    // which keeps gate and up for its backward.
    ops.push_back(linear("fc1", d, bs, i64(2 * d.f / d.t), i64(d.h), bsh / d.sp));
    ops.push_back(framework_elementwise(d, ElementwiseClass::Activation, d.bias ? "bias_swiglu" : "swiglu", 3 * inner * d.e, 2 * inner * d.e));
    ops.back().host_kernel = HostKernel::Swiglu;
    ops.back().elements = inner;
  } else {
    ops.push_back(linear("fc1", d, bs, i64(d.f / d.t), i64(d.h), bsh / d.sp));
    ops.push_back(framework_elementwise(d, ElementwiseClass::Activation, d.bias ? "bias_gelu" : "gelu", 2 * inner * d.e, inner * d.e));
  }
  add_fp8_cast(ops, d, "fc2", inner);
  ops.push_back(linear("fc2", d, bs, i64(d.h), i64(d.f / d.t), inner));
  add_output_reduction(ops, d, "fc2", bsh * d.e);
  ops.push_back(residual_add(d, 2));
  return ops;
}

// The Megatron recompute module of each forward op (Op::modules): the attention core, the two
// norms, then the MLP block up to (not including) the closing residual add: a dense MLP, or the
// MoE block with its shared experts and the experts' activation.
std::vector<Op> forward_ops(const Dims& d) {
  std::vector<Op> ops = untagged_forward_ops(d);
  bool mlp_block = false;
  for (size_t i = 0; i + 1 < ops.size(); ++i) {
    Op& op = ops[i];
    if (op.attention_core) op.modules |= kRecomputeCoreAttn;
    // MLA's up projections (with their quantisation) and the rotary embedding of their outputs.
    if (d.mla && (op.name.rfind("mla.q_up", 0) == 0 || op.name.rfind("mla.kv_up", 0) == 0 || op.name == "rope"))
      op.modules |= kRecomputeMlaUpProj;
    if (op.name == d.norm + "1" || op.name == d.norm + "2") {
      op.modules |= kRecomputeLayerNorm;
      mlp_block = op.name == d.norm + "2";
      continue;
    }
    if (!mlp_block) continue;
    if (!d.moe) {
      op.modules |= kRecomputeMlp;
      continue;
    }
    op.modules |= kRecomputeMoe;
    if (op.name.rfind("shared.", 0) == 0) op.modules |= kRecomputeSharedExperts;
    if (op.name == "expert.swiglu" || op.name == "expert.gelu") op.modules |= kRecomputeMoeAct;
  }
  return ops;
}

// Megatron's selective recompute of parallel.recompute_modules: a checkpointed block (the
// attention core, mlp, moe, shared_experts) keeps nothing inside it but its input, once; layernorm
// and moe_act drop their op's output, which the GEMM after it keeps as its input; mla_up_proj drops
// the up projections' outputs (the queries, keys and values the attention core keeps), their
// inputs (the latents) kept to recompute them.
double megatron_selective_bytes(const std::vector<Op>& fwd, unsigned modules) {
  const unsigned blocks = modules & (kRecomputeCoreAttn | kRecomputeMlp | kRecomputeMoe | kRecomputeSharedExperts);
  double bytes = 0, block_input = 0;
  bool checkpointed_block = false;
  for (size_t i = 0; i < fwd.size(); ++i) {
    const Op& op = fwd[i];
    if (op.name.size() > 1 && (op.modules & kRecomputeLayerNorm) && op.name.back() == '2') block_input = op.saved_bytes;
    if (op.modules & blocks) {
      checkpointed_block = checkpointed_block || (op.modules & blocks & ~kRecomputeCoreAttn) != 0;
      continue;
    }
    bytes += op.saved_bytes;
    if (op.modules & modules & kRecomputeMlaUpProj) bytes -= op.saved_output_bytes;
    if (!(op.modules & modules & (kRecomputeLayerNorm | kRecomputeMoeAct))) continue;
    for (size_t j = i + 1; j < fwd.size(); ++j)
      if (fwd[j].kind == OpKind::Gemm) {
        if (!(fwd[j].modules & blocks)) bytes -= std::min(fwd[j].saved_bytes, op.modules & kRecomputeMoeAct ? fwd[j].saved_bytes : op.saved_bytes);
        break;
      }
  }
  // The MLP / MoE block's input: the second norm's output, the size of the norm's input.
  return bytes + (checkpointed_block ? block_input : 0.0);
}

// torchtitan's op-level selective checkpointing (its `op` policy on torch.utils.checkpoint):
// saves the outputs of the compute-intensive ops — every second aten.mm (half of the GEMMs'
// outputs, counted by bytes), the attention kernel (output and log-sum-exp) — and of the
// expert all-to-alls and tensor-parallel reduce-scatters; the layer's input is the checkpoint's.
// Everything else (norms, activations, rotary, residual adds, the other half of the matmuls,
// all-gathers) is recomputed.
bool op_level_checkpointing(Framework f) { return f == Framework::Torchtitan || f == Framework::TorchtitanCompiled || f == Framework::PytorchFsdp; }

double op_level_saved_bytes(const std::vector<Op>& fwd, const Dims& d) {
  double bytes = fwd.front().saved_bytes, gemm_outputs = 0;
  for (const Op& op : fwd) {
    if (op.attention_core) {
      bytes += op.saved_bytes + (op.kind == OpKind::Attention ? d.b * d.s * d.q / d.t * d.e : 0.0);
    } else if (op.kind == OpKind::Gemm) {
      gemm_outputs += static_cast<double>(op.batch) * static_cast<double>(op.m) * static_cast<double>(op.n) * d.e;
    } else if (op.kind == OpKind::AllToAll) {
      bytes += op.bytes;
    } else if (op.kind == OpKind::ReduceScatter && op.group == CommGroup::Tensor) {
      bytes += op.bytes / d.t;
    }
  }
  return bytes + gemm_outputs / 2;
}

// What the op-level policy re-runs before the backward: the element-wise ops, the tensor-parallel
// all-gathers and the unsaved half of the matmuls (each GEMM at half its work, on average).
std::vector<Op> op_level_recompute(const std::vector<Op>& fwd) {
  std::vector<Op> ops;
  for (const Op& op : fwd) {
    if (op.attention_core) continue;
    if (op.kind == OpKind::Elementwise || (op.kind == OpKind::AllGather && op.group == CommGroup::Tensor)) {
      ops.push_back(op);
    } else if (op.kind == OpKind::Gemm) {
      Op half = op;
      half.name += " (every second matmul)";
      half.flops /= 2, half.model_flops /= 2, half.bytes /= 2;
      ops.push_back(half);
    }
  }
  return ops;
}

std::vector<Op> backward_of(const std::vector<Op>& fwd, const Dims& d) {
  std::vector<Op> ops;
  const double bsh = d.b * d.s * d.h;
  // Walk the forward in reverse; the column-parallel layers (qkv, fc1) all-reduce their input
  // gradient across the tensor-parallel group (Megatron's f operator), or reduce-scatter it into
  // the sequence shards; a forward reduce-scatter becomes an all-gather of the output gradient.
  // With sequence parallelism Megatron also re-gathers the norm output for the weight gradient,
  // under the input-gradient GEMM.
  for (auto it = fwd.rbegin(); it != fwd.rend(); ++it) {
    const Op& op = *it;
    if (op.kind == OpKind::Gemm) {
      // FP8: the output gradient is quantised (E5M2 with the hybrid format) before the two GEMMs.
      // A grouped GEMM quantises the output gradients of all its experts.
      if (op.fp8) add_fp8_cast(ops, d, op.name + ".grad", static_cast<double>(op.batch) * static_cast<double>(op.m) * static_cast<double>(op.n));
      // (The routed experts' tokens come through the dispatcher, whose backward returns their
      // gradients, except when the t ranks hold the same tokens.)
      const bool mla_up = op.name == "mla.q_up" || op.name == "mla.kv_up";
      const bool mtp_proj = op.name == "mtp.eh_proj";  // the MTP's column-parallel 2h → h projection
      const bool column = d.t > 1 && (op.name == "qkv" || op.name == "fc1" || op.name == "shared.fc1" || mla_up || mtp_proj ||
                                      (op.name == "expert.fc1" && d.sp <= 1));
      // The input a column-parallel GEMM shares over the tensor group: the hidden states, or
      // MLA's latent, or the MTP's concatenated [embedding; hidden] (its m × k input).
      const double shared_input = mla_up || mtp_proj ? static_cast<double>(op.m) * static_cast<double>(op.k) * d.e : bsh * d.e;
      if (column && d.sp > 1) {
        // Sequence parallelism keeps only the sequence shard of the GEMM's input: its weight
        // gradient needs the whole input, all-gathered again under the input-gradient GEMM (on
        // the input-gradient path: a split backward's I gathers it and keeps it for its W).
        Op gather = collective(op.name + ".input.allgather", OpKind::AllGather, shared_input);
        gather.overlaps = op.name + ".dgrad";
        ops.push_back(gather);
      }
      add_backward_gemms(ops, op, d.e, op.fp8 ? d.recipe.grouped_wgrad_slowdown : Fp8RecipeCosts::kGroupedWgradSlowdown);
      if (column) {
        // MLA's shared rotary key leaves kv_down beside the kv latent and is broadcast to every
        // head: its gradient, partial over the tensor group's heads, is summed with the latent's
        // (Megatron gathers kv_down's whole output, so its backward reduces the whole).
        const double reduced = op.name == "mla.kv_up" ? shared_input + static_cast<double>(op.m) * d.qk_rope * d.e : shared_input;
        Op reduce = d.sp > 1 ? collective(op.name + ".dgrad.reduce_scatter", OpKind::ReduceScatter, reduced)
                             : allreduce(op.name + ".dgrad.allreduce", reduced);
        reduce.overlaps = op.name + ".wgrad";
        ops.push_back(reduce);
      }
    } else if (op.kind == OpKind::Attention) {
      // The flash backward: recomputes QKᵀ and the probabilities blockwise from Q, K, V and the
      // log-sum-exp, then dV, dP, dS, dQ, dK: 5 matmuls against the forward's 2 (2.5×).
      Op b = op;
      b.name = op.name + ".backward";
      b.backward = true;
      if (d.cp > 1 && !d.ulysses) b.kernel_factor = d.ring ? 0.93 : 0.93 * 58.1 / 75.9;
      b.flops = 2.5 * op.flops;
      b.model_flops = 2 * op.model_flops;
      b.bytes = 2 * op.bytes;
      b.saved_bytes = 0;
      ops.push_back(b);
    } else if (op.kind == OpKind::ReduceScatter) {
      ops.push_back(collective(op.name + ".backward_allgather", OpKind::AllGather, op.bytes, op.group));
    } else if (op.kind == OpKind::AllGather && op.group != CommGroup::Tensor && !op.routing_metadata) {
      // Context parallelism keeps only its own K/V chunk: gathered again for the backward, and
      // the dK/dV of every chunk reduce-scattered to its owner. The MoE dispatcher's all-gather
      // returns the tokens' gradients by a reduce-scatter.
      if (op.group == CommGroup::Context) ops.push_back(collective(op.name + ".backward_allgather", OpKind::AllGather, op.bytes, op.group));
      ops.push_back(collective(op.name + ".backward_reduce_scatter", OpKind::ReduceScatter, op.bytes, op.group));
    } else if (op.kind == OpKind::AllToAll) {
      ops.push_back(collective(op.name + ".backward", OpKind::AllToAll, op.bytes, op.group));
      ops.back().token_copies = op.token_copies;
      ops.back().kernel = op.kernel;
    } else if (op.kind == OpKind::RingExchange) {
      // The backward ring passes each K/V chunk again with its accumulating dK/dV, under the
      // blocks' backward; after the last block the gradients take one more hop home, exposed.
      Op ring = collective(op.name + ".backward", OpKind::RingExchange, 2 * op.bytes, op.group);
      ring.ring_steps = op.ring_steps;
      if (!op.overlaps.empty()) ring.overlaps = op.overlaps + ".backward";
      ops.push_back(ring);
      Op home = collective(op.name + ".grad_home", OpKind::RingExchange, op.bytes, op.group);
      home.ring_steps = 1;
      ops.push_back(home);
    } else if (op.kind == OpKind::Elementwise && op.name.find(".cast_fp8") == std::string::npos) {
      // The same implementation (fused or eager) runs the backward of an element-wise op.
      Op b = elementwise(op.name + ".backward", 1.5 * op.bytes);
      b.bandwidth_factor = op.bandwidth_factor;
      b.kernels = op.kernels;
      b.kernel = op.kernel;
      // The host kernels' backward: SwiGLU's own; rotary embeddings rotate the gradients back.
      b.host_kernel = op.host_kernel == HostKernel::Swiglu ? HostKernel::SwigluBackward : op.host_kernel;
      b.elements = op.elements;
      ops.push_back(b);
    }
  }
  for (Op& op : ops) op.saved_bytes = 0;
  return ops;
}

}  // namespace

std::vector<std::pair<double, bool>> layer_mix(const TransformerSpec& spec) {
  if (!spec.has_moe()) return {{1.0, false}};
  const double moe = static_cast<double>(spec.moe_layer_count()) / static_cast<double>(spec.num_layers);
  if (moe >= 1) return {{1.0, true}};
  if (moe <= 0) return {{1.0, false}};
  return {{1 - moe, false}, {moe, true}};
}

std::vector<Op> layer_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass) {
  const auto mix = layer_mix(spec);
  return layer_ops(spec, plan, pass, mix.back().second);
}

namespace {

// layer_ops' key under a LayerOpsMemo: every plan field dims_of reads, and for Pass::Recompute
// what layer_ops picks the re-run ops by (the recompute setting, its modules, the framework).
// The key of a list under a LayerOpsMemo: every plan field dims_of reads, the pass, and
// - a layer's (head false): its kind, and for Pass::Recompute what layer_ops picks the re-run ops
//   by (the recompute setting and modules; the framework is in already);
// - the head's (head true): the recompute setting and modules (its MTP modules' layers recompute in
//   their backward, and what their forward keeps depends on them), whether the output layer is
//   split over the pipeline and then p, and whether the MTP modules' body stands apart.
LayerOpsMemo::Key ops_key(const ParallelPlan& plan, Pass pass, bool moe, bool head) {
  const bool recompute = head || pass == Pass::Recompute;
  return {head, plan.tensor, plan.context, plan.expert, plan.expert_tensor, plan.micro_batch, static_cast<int64_t>(plan.precision),
          plan.sequence_parallel, static_cast<int64_t>(plan.moe_dispatcher), static_cast<int64_t>(plan.context_comm),
          static_cast<int64_t>(plan.framework), static_cast<int64_t>(resolved_attention_kernel(plan)),
          static_cast<int64_t>(plan.fp8_recipe), static_cast<int64_t>(pass), moe && !head,
          recompute ? static_cast<int64_t>(plan.recompute) : -1, recompute ? static_cast<int64_t>(plan.recompute_modules) : -1,
          head && plan.vocab_parallel_pipeline, head && plan.vocab_parallel_pipeline ? plan.pipeline : -1, head && plan.mtp_apart()};
}

// The memo's list of `key`, made by `make()` on a miss (outside the lock: threads may make the
// same one, the first is kept); without a memo in scope, made afresh.
template <class Make>
std::shared_ptr<const std::vector<Op>> kept_ops(const LayerOpsMemo::Key& key, Make make) {
  LayerOpsMemo* memo = LayerOpsScope::current();
  if (!memo) return std::make_shared<const std::vector<Op>>(make());
  {
    std::lock_guard<std::mutex> lock(memo->mutex);
    if (const auto it = memo->lists.find(key); it != memo->lists.end()) return it->second;
  }
  auto made = std::make_shared<const std::vector<Op>>(make());
  std::lock_guard<std::mutex> lock(memo->mutex);
  return memo->lists.emplace(key, std::move(made)).first->second;
}

std::vector<Op> make_layer_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass, bool moe);
std::vector<Op> make_head_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass);

}  // namespace


std::shared_ptr<const std::vector<Op>> shared_layer_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass, bool moe) {
  return kept_ops(ops_key(plan, pass, moe, false), [&] { return make_layer_ops(spec, plan, pass, moe); });
}

std::shared_ptr<const std::vector<Op>> shared_head_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass) {
  return kept_ops(ops_key(plan, pass, false, true), [&] { return make_head_ops(spec, plan, pass); });
}

std::vector<Op> layer_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass, bool moe) {
  if (!LayerOpsScope::current()) return make_layer_ops(spec, plan, pass, moe);
  return *shared_layer_ops(spec, plan, pass, moe);
}

namespace {

std::vector<Op> make_layer_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass, bool moe) {
  Dims d = dims_of(spec, plan);
  d.moe = moe && spec.has_moe();
  if (pass == Pass::Forward) return with_host_dispatch(forward_ops(d), d);
  if (pass == Pass::Recompute && plan.recompute != Recompute::Full && plan.recompute != Recompute::Selective) return {};
  // The backward and the recompute are made from the forward list (the LayerOpsMemo's when one is
  // in scope: one forward per shape whatever the recompute). Its host dispatch times are those
  // with_host_dispatch sets again on each list made from it (compute ops; never on collectives).
  const auto forward = shared_layer_ops(spec, plan, Pass::Forward, moe);
  const std::vector<Op>& fwd = *forward;
  switch (pass) {
    case Pass::Forward: break;
    case Pass::Backward: return with_host_dispatch(backward_of(fwd, d), d);
    case Pass::Recompute:
      if (plan.recompute == Recompute::Full) return fwd;
      if (plan.recompute == Recompute::Selective) {
        if (op_level_checkpointing(plan.framework)) return with_host_dispatch(op_level_recompute(fwd), d);
        std::vector<Op> ops;
        for (const Op& op : fwd)
          if (op.modules & plan.recompute_modules) ops.push_back(op);
        return with_host_dispatch(ops, d);
      }
      return {};
  }
  return {};
}

}  // namespace

std::vector<Op> embedding_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass) {
  const Dims d = dims_of(spec, plan);
  const double bsh = d.b * d.s * d.h;
  std::vector<Op> ops;
  if (pass == Pass::Forward) {
    // Gather the table rows (+ positions), write the sum (+ the dropout mask).
    // It keeps the one-byte dropout mask for the backward (in sequence shards under SP).
    ops.push_back(elementwise("embedding.lookup", bsh * (d.dropout ? 3 * d.e + 1 : 3 * d.e), d.dropout ? bsh / d.sp : 0.0));
    add_output_reduction(ops, d, "embedding", bsh * d.e);
  } else if (pass == Pass::Backward) {
    // With sequence parallelism the output gradient arrives in sequence shards: gathered first.
    if (d.sp > 1) ops.push_back(collective("embedding.backward_allgather", OpKind::AllGather, bsh * d.e));
    Op grad = elementwise("embedding.backward", 3 * bsh * d.e);
    grad.weight_gradient = true;  // accumulates into the embedding table's gradient
    ops.push_back(grad);
  }
  return with_host_dispatch(ops, d);
}

namespace {
// The output layer and cross-entropy over `parts` shares of the vocabulary (1: all of it, on the
// last stage; p: one pipeline rank's share under vocabulary parallelism, between the broadcast of
// the final hidden states and the reduction of their gradients over the pipeline group).
void add_output_layer(const Dims& d, Pass pass, double parts, std::vector<Op>& fwd, std::vector<Op>* bwd) {
  const double bsh = d.b * d.s * d.h;
  const int64_t bs = i64(d.b * d.s);
  const double logits = d.b * d.s * d.v / (d.t * parts);  // local logits
  auto pipeline_op = [](Op op) {
    op.group = CommGroup::Pipeline;
    return op;
  };
  const bool split = parts > 1;
  if (split) fwd.push_back(pipeline_op(collective("vocab.hidden_broadcast", OpKind::AllGather, bsh * d.e)));
  const size_t logits_at = fwd.size();
  fwd.push_back(gemm("logits", d.e, 1, bs, i64(std::max(1.0, d.v / (d.t * parts))), i64(d.h)));
  // The loss's memory as the framework allocates it (FrameworkCosts::loss_kept_bytes,
  // loss_peak_bytes): Megatron's fused loss keeps the fp32 logits and their gradient through the
  // microbatch's backward; the eager loss has more alive at its own backward, and nothing after.
  Op loss = elementwise("cross_entropy", logits * (d.e + 2 * 4), d.fw.loss_kept_bytes * logits);
  loss.peak_bytes = d.fw.loss_peak_bytes * logits;
  fwd.push_back(loss);
  if (d.t > 1) fwd.push_back(allreduce("cross_entropy.allreduce", 3 * d.b * d.s * 4));
  if (split) fwd.push_back(pipeline_op(allreduce("vocab.softmax_stats.allreduce", 3 * d.b * d.s * 4)));
  if (pass != Pass::Backward || bwd == nullptr) return;
  bwd->push_back(elementwise("cross_entropy.backward", logits * (4 + d.e)));
  add_backward_gemms(*bwd, fwd[logits_at], d.e, Fp8RecipeCosts::kGroupedWgradSlowdown);
  if (d.t > 1) {
    Op reduce = d.sp > 1 ? collective("logits.dgrad.reduce_scatter", OpKind::ReduceScatter, bsh * d.e)
                         : allreduce("logits.dgrad.allreduce", bsh * d.e);
    reduce.overlaps = "logits.wgrad";
    bwd->push_back(reduce);
  }
  if (split) bwd->push_back(pipeline_op(collective("vocab.hidden_grad_reduce", OpKind::ReduceScatter, bsh * d.e)));
}
}  // namespace

namespace {
// Which part of a multi-token-prediction module: all of it (on the last stage), its body on a
// layout's MTP stage before the last (the lookup, the projection, its layer, its final norm), or
// the rest on the last stage (its logits and loss through the shared output layer).
enum class MtpPart { Whole, Body, Output };

// One multi-token-prediction module (TransformerSpec::mtp_layers) in `pass`: the next token's
// embedding gathered from the shared table, it and the main model's hidden state normed,
// concatenated and projected 2h → h (column-parallel, gathered back over the tensor group), one
// layer of the last layer's kind (its recompute before its backward), its final norm, and the
// shared output layer and loss again. Its layer's activations are kept as a layer's.
std::vector<Op> mtp_module_ops(const TransformerSpec& spec, const ParallelPlan& plan, const Dims& d, Pass pass, MtpPart part) {
  const double bsh = d.b * d.s * d.h;
  std::vector<Op> in;
  in.push_back(elementwise("mtp.embedding.lookup", 3 * bsh * d.e));
  add_output_reduction(in, d, "mtp.embedding", bsh * d.e);  // the vocab-parallel lookup's sum (into sequence shards)
  in.push_back(framework_elementwise(d, ElementwiseClass::Norm, "mtp.enorm_hnorm", 4 * bsh * d.e / d.sp, 2 * bsh * d.e / d.sp));
  if (d.sp > 1) in.push_back(collective("mtp.eh_proj.input.allgather", OpKind::AllGather, 2 * bsh * d.e));
  add_fp8_cast(in, d, "mtp.eh_proj", 2 * bsh / d.sp);
  in.push_back(linear("mtp.eh_proj", d, i64(d.b * d.s), i64(d.h / d.t), i64(2 * d.h), 2 * bsh / d.sp));
  if (d.t > 1) in.push_back(collective("mtp.eh_proj.allgather", OpKind::AllGather, bsh * d.e));
  const bool body = part != MtpPart::Output, output = part != MtpPart::Body;
  std::vector<Op> layer;  // its forward (the backward lists its recompute and backward below)
  if (pass == Pass::Forward && body) {
    layer = layer_ops(spec, plan, Pass::Forward, spec.mtp_moe());
    for (Op& op : layer) op.saved_bytes = 0;
    layer.front().saved_bytes = layer_kind_activation_bytes(spec, plan, spec.mtp_moe());  // per shape under a memo
  }
  std::vector<Op> norm_fwd, out_fwd, out_bwd;
  norm_fwd.push_back(framework_elementwise(d, ElementwiseClass::Norm, "mtp.final_" + d.norm, 2 * bsh * d.e / d.sp, 2 * bsh * d.e / d.sp));
  if (d.sp > 1) out_fwd.push_back(collective("mtp.final_" + d.norm + ".allgather", OpKind::AllGather, bsh * d.e));
  add_output_layer(d, pass, 1, out_fwd, &out_bwd);
  std::vector<Op> ops;
  auto append = [&](const std::vector<Op>& more) { ops.insert(ops.end(), more.begin(), more.end()); };
  if (pass == Pass::Forward) {
    if (body && d.cp > 1) {
      // Megatron-Core's roll_tensor over the context group: each chunk's last place takes the
      // next chunk's first [token, label] (4-byte words), from the neighbouring context rank;
      // the end ranks exchange with one neighbour, the others with two: 2(cp − 1)/cp pairs per
      // rank and sequence on average (the executor's exactly at cp 2).
      Op roll = collective("mtp.roll", OpKind::RingExchange, d.b * 2 * 4 * 2 * (d.cp - 1) / d.cp, CommGroup::Context);
      roll.ring_steps = 1;
      ops.push_back(roll);
    }
    if (body) append(in), append(layer), append(norm_fwd);
    if (output) append(out_fwd);
  } else {
    if (output) append(out_bwd);
    if (body) {
      ops.push_back(framework_elementwise(d, ElementwiseClass::Norm, "mtp.final_" + d.norm + ".backward", 3 * bsh * d.e / d.sp));
      append(*shared_layer_ops(spec, plan, Pass::Recompute, spec.mtp_moe()));
      append(*shared_layer_ops(spec, plan, Pass::Backward, spec.mtp_moe()));
      // Under SP the projection's output was cut to the sequence shard (no communication): its
      // gradient is all-gathered back (the gather over the tensor group's backward takes a slice).
      if (d.sp > 1) ops.push_back(collective("mtp.eh_proj.output_grad.allgather", OpKind::AllGather, bsh * d.e));
      append(backward_of(in, d));
    }
  }
  for (Op& op : ops) op.name = op.name.rfind("mtp.", 0) == 0 ? op.name : "mtp." + op.name;
  return ops;
}

// The mtp_layers modules' `part` in `pass`, one after the other.
std::vector<Op> mtp_modules(const TransformerSpec& spec, const ParallelPlan& plan, const Dims& d, Pass pass, MtpPart part) {
  std::vector<Op> out;
  for (int64_t i = 0; i < spec.mtp_layers; ++i) {
    const std::vector<Op> module = mtp_module_ops(spec, plan, d, pass, part);
    out.insert(out.end(), module.begin(), module.end());
  }
  return out;
}
}  // namespace

std::vector<Op> head_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass) {
  if (!LayerOpsScope::current()) return make_head_ops(spec, plan, pass);
  return *shared_head_ops(spec, plan, pass);
}

namespace {

std::vector<Op> make_head_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass) {
  const Dims d = dims_of(spec, plan);
  const double bsh = d.b * d.s * d.h;
  const bool vocab_parallel = plan.vocab_parallel_pipeline && plan.pipeline > 1;
  if (pass == Pass::Recompute) return {};  // the head's recompute is in its backward
  std::vector<Op> fwd;
  // The final norm keeps its input and output for the backward (sequence shards under SP).
  fwd.push_back(framework_elementwise(d, ElementwiseClass::Norm, "final_" + d.norm, 2 * bsh * d.e / d.sp, 2 * bsh * d.e / d.sp));
  if (d.sp > 1) fwd.push_back(collective("final_" + d.norm + ".allgather", OpKind::AllGather, bsh * d.e));
  std::vector<Op> bwd;
  if (!vocab_parallel) add_output_layer(d, pass, 1, fwd, &bwd);
  const std::vector<Op> mtp = mtp_modules(spec, plan, d, pass, plan.mtp_apart() ? MtpPart::Output : MtpPart::Whole);
  if (pass == Pass::Forward) {
    fwd.insert(fwd.end(), mtp.begin(), mtp.end());
    return with_host_dispatch(fwd, d);
  }
  bwd.insert(bwd.begin(), mtp.begin(), mtp.end());  // the MTP modules' backward runs first
  bwd.push_back(framework_elementwise(d, ElementwiseClass::Norm, "final_" + d.norm + ".backward", 3 * bsh * d.e / d.sp));
  return with_host_dispatch(bwd, d);
}

}  // namespace

std::vector<Op> mtp_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass) {
  if (!plan.mtp_apart() || pass == Pass::Recompute) return {};
  const Dims d = dims_of(spec, plan);
  return with_host_dispatch(mtp_modules(spec, plan, d, pass, MtpPart::Body), d);
}

std::vector<Op> vocab_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass) {
  if (!plan.vocab_parallel_pipeline || plan.pipeline < 2 || pass == Pass::Recompute) return {};
  const Dims d = dims_of(spec, plan);
  std::vector<Op> fwd, bwd;
  add_output_layer(d, pass, static_cast<double>(plan.pipeline), fwd, &bwd);
  return with_host_dispatch(pass == Pass::Forward ? fwd : bwd, d);
}

double saved_activation_bytes(const TransformerSpec& spec, const ParallelPlan& plan) {
  double total = 0;
  for (const auto& [share, moe] : layer_mix(spec)) total += share * layer_kind_activation_bytes(spec, plan, moe);
  return total;
}

double layer_kind_saved_bytes(const TransformerSpec& spec, const ParallelPlan& plan, bool moe) {
  const std::vector<Op> fwd = layer_ops(spec, plan, Pass::Forward, moe);
  PTDP_ASSERT(!fwd.empty(), "a layer has operations");
  // Full recompute keeps the layer's input only: what its first op (the first norm) keeps.
  if (plan.recompute == Recompute::Full) return fwd.front().saved_bytes;
  if (plan.recompute == Recompute::Selective) {
    Dims d = dims_of(spec, plan);
    d.moe = moe && spec.has_moe();
    return op_level_checkpointing(plan.framework) ? op_level_saved_bytes(fwd, d) : megatron_selective_bytes(fwd, plan.recompute_modules);
  }
  double bytes = 0;
  for (const Op& op : fwd) bytes += op.saved_bytes;
  return bytes;
}

double layer_model_flops(const TransformerSpec& spec, int64_t batch) {
  double flops = 0;
  for (const auto& [share, moe] : layer_mix(spec)) flops += share * layer_kind_model_flops(spec, batch, moe);
  return flops;
}

double layer_kind_model_flops(const TransformerSpec& spec, int64_t batch, bool moe) {
  ParallelPlan whole;  // one rank holds the whole layer
  whole.micro_batch = batch;
  whole.global_batch = batch;
  double flops = 0;
  for (const Op& op : layer_ops(spec, whole, Pass::Forward, moe)) flops += op.model_flops;
  return flops;
}

bool is_communication(OpKind k) {
  return k == OpKind::AllReduce || k == OpKind::ReduceScatter || k == OpKind::AllGather || k == OpKind::AllToAll ||
         k == OpKind::RingExchange;
}

int64_t group_size(const ParallelPlan& plan, CommGroup g) { return ProcessGrid(plan).size(g); }

int64_t group_stride(const ParallelPlan& plan, CommGroup g) { return ProcessGrid(plan).stride(g); }

std::vector<Op> weight_gradient_ops(const std::vector<Op>& backward) {
  std::vector<Op> out;
  for (const Op& op : backward)
    if (op.weight_gradient) out.push_back(op);
  return out;
}

std::vector<Op> input_gradient_ops(const std::vector<Op>& backward) {
  std::vector<Op> out;
  for (const Op& op : backward)
    if (!op.weight_gradient) out.push_back(op);
  return out;
}

double parameter_tensor_count(const TransformerSpec& spec, double layers) {
  double per_layer = 0;
  for (const auto& [share, moe] : layer_mix(spec)) {
    const double matrices = 4 + (moe ? 1 + (spec.mlp == MlpKind::SwiGLU ? 3 : 2) * (spec.moe.shared_experts > 0 ? 2 : 1)
                                     : (spec.mlp == MlpKind::SwiGLU ? 3 : 2));
    per_layer += share * (2 + matrices) * (spec.has_bias() ? 2 : 1);
  }
  return per_layer * layers;
}

double optimizer_time_s(double params, double tensors, const GpuSpec& gpu, Precision precision, Framework framework) {
  return std::max(optimizer_time_s(params, gpu, precision), tensors * framework_costs(framework).optimizer_host_per_tensor_s);
}

double optimizer_time_s(double params, const GpuSpec& gpu, Precision precision) {
  if (gpu.adam_step_s > 0) return params * gpu.adam_step_s + 10 * gpu.kernel_launch_s;
  const double bytes = params * state_bytes(precision).adam_step;
  return bytes / elementwise_bandwidth(gpu, bytes) + 10 * gpu.kernel_launch_s;
}

}  // namespace ptdp
