#include "model/cost.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace ptdp {
namespace {

struct Dims {
  double b, s, h, a, f, t, e, v;
  double kv = 0;         // key/value width: query groups × head dim
  bool swiglu = false;   // gated MLP: gate and up projections
  std::string norm = "ln";  // op-name prefix of the norms
  double sp = 1;         // sequence-parallel split of the norm/dropout/residual regions (t or 1)
};

Dims dims_of(const TransformerSpec& spec, const ParallelPlan& plan) {
  return Dims{static_cast<double>(plan.micro_batch),        static_cast<double>(spec.seq_length),
              static_cast<double>(spec.hidden_size),        static_cast<double>(spec.num_attention_heads),
              static_cast<double>(spec.ffn()),              static_cast<double>(plan.tensor),
              static_cast<double>(bytes_per_element(plan.precision)),
              static_cast<double>(spec.padded_vocab(plan.tensor)),
              static_cast<double>(spec.kv_width()),
              spec.mlp == MlpKind::SwiGLU,
              spec.normalization == NormKind::RMSNorm ? "rmsnorm" : "ln",
              plan.sequence_parallel ? static_cast<double>(plan.tensor) : 1.0};
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
  op.bytes = e * B * (M * K + K * N + M * N);
  return op;
}

Op elementwise(std::string name, double bytes) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::Elementwise;
  op.bytes = bytes;
  return op;
}

Op collective(std::string name, OpKind kind, double bytes) {
  Op op;
  op.name = std::move(name);
  op.kind = kind;
  op.bytes = bytes;
  return op;
}

Op allreduce(std::string name, double bytes) { return collective(std::move(name), OpKind::TPAllReduce, bytes); }

// The TP operator after a row-parallel GEMM (Megatron's g): an all-reduce, or with sequence
// parallelism a reduce-scatter into the sequence shards. Nothing when t = 1.
void add_output_reduction(std::vector<Op>& ops, const Dims& d, const std::string& gemm, double bytes) {
  if (d.t <= 1) return;
  if (d.sp > 1) ops.push_back(collective(gemm + ".reduce_scatter", OpKind::TPReduceScatter, bytes));
  else ops.push_back(allreduce(gemm + ".allreduce", bytes));
}

int64_t i64(double x) { return static_cast<int64_t>(x); }

// The two GEMMs of a backward: input gradient dX = dY·Wᵀ (m×n·n×k) and weight gradient
// dW = Xᵀ·dY (k×m·m×n). For batched attention products both operands are activations, and the
// two gradients have the same shapes; both are on the input-gradient path (no weight).
void add_backward_gemms(std::vector<Op>& out, const Op& fwd, double e) {
  const bool has_weight = fwd.name.rfind("attn.", 0) != 0;  // attention products (attn.*) have none
  out.push_back(gemm(fwd.name + ".dgrad", e, fwd.batch, fwd.m, fwd.k, fwd.n));
  Op w = gemm(fwd.name + (has_weight ? ".wgrad" : ".dgrad2"), e, fwd.batch, fwd.k, fwd.n, fwd.m);
  w.weight_gradient = has_weight;
  out.push_back(w);
}

std::vector<Op> attention_core(const Dims& d) {
  const double heads = d.a / d.t;
  std::vector<Op> ops;
  ops.push_back(gemm("attn.qk", d.e, i64(d.b * heads), i64(d.s), i64(d.s), i64(d.h / d.a)));
  ops.push_back(elementwise("attn.softmax", 2 * d.b * heads * d.s * d.s * d.e));
  ops.push_back(elementwise("attn.dropout", d.b * heads * d.s * d.s * (2 * d.e + 1)));
  ops.push_back(gemm("attn.av", d.e, i64(d.b * heads), i64(d.s), i64(d.h / d.a), i64(d.s)));
  return ops;
}

std::vector<Op> forward_ops(const Dims& d) {
  const double bsh = d.b * d.s * d.h;
  const int64_t bs = i64(d.b * d.s);
  std::vector<Op> ops;
  ops.push_back(elementwise(d.norm + "1", 2 * bsh * d.e / d.sp));
  // Sequence parallelism: the column-parallel GEMM needs the whole sequence (Megatron's ḡ).
  if (d.sp > 1) ops.push_back(collective(d.norm + "1.allgather", OpKind::TPAllGather, bsh * d.e));
  // Q for every head, K and V for each query group (GQA), column-parallel.
  ops.push_back(gemm("qkv", d.e, 1, bs, i64((d.h + 2 * d.kv) / d.t), i64(d.h)));
  for (auto& op : attention_core(d)) ops.push_back(op);
  ops.push_back(gemm("proj", d.e, 1, bs, i64(d.h), i64(d.h / d.t)));
  add_output_reduction(ops, d, "proj", bsh * d.e);
  ops.push_back(elementwise("bias_dropout_add1", bsh * (3 * d.e + 1) / d.sp));
  ops.push_back(elementwise(d.norm + "2", 2 * bsh * d.e / d.sp));
  if (d.sp > 1) ops.push_back(collective(d.norm + "2.allgather", OpKind::TPAllGather, bsh * d.e));
  if (d.swiglu) {
    // Gate and up projections as one column-parallel GEMM (Megatron fuses them), silu(gate)·up.
    ops.push_back(gemm("fc1", d.e, 1, bs, i64(2 * d.f / d.t), i64(d.h)));
    ops.push_back(elementwise("swiglu", 3 * d.b * d.s * d.f / d.t * d.e));
  } else {
    ops.push_back(gemm("fc1", d.e, 1, bs, i64(d.f / d.t), i64(d.h)));
    ops.push_back(elementwise("bias_gelu", 2 * d.b * d.s * d.f / d.t * d.e));
  }
  ops.push_back(gemm("fc2", d.e, 1, bs, i64(d.h), i64(d.f / d.t)));
  add_output_reduction(ops, d, "fc2", bsh * d.e);
  ops.push_back(elementwise("bias_dropout_add2", bsh * (3 * d.e + 1) / d.sp));
  return ops;
}

std::vector<Op> backward_of(const std::vector<Op>& fwd, const Dims& d) {
  std::vector<Op> ops;
  const double bsh = d.b * d.s * d.h;
  // Walk the forward in reverse; the column-parallel layers (qkv, fc1) all-reduce their input
  // gradient across the tensor-parallel group (Megatron's f operator), or reduce-scatter it into
  // the sequence shards; a forward reduce-scatter becomes an all-gather of the output gradient.
  // (Megatron also re-gathers the norm output for the weight gradient, hidden behind the
  // input-gradient GEMM: not a cost here.)
  for (auto it = fwd.rbegin(); it != fwd.rend(); ++it) {
    const Op& op = *it;
    if (op.kind == OpKind::Gemm) {
      add_backward_gemms(ops, op, d.e);
      if (d.t > 1 && (op.name == "qkv" || op.name == "fc1")) {
        if (d.sp > 1) ops.push_back(collective(op.name + ".dgrad.reduce_scatter", OpKind::TPReduceScatter, bsh * d.e));
        else ops.push_back(allreduce(op.name + ".dgrad.allreduce", bsh * d.e));
      }
    } else if (op.kind == OpKind::TPReduceScatter) {
      ops.push_back(collective(op.name + ".backward_allgather", OpKind::TPAllGather, op.bytes));
    } else if (op.kind == OpKind::Elementwise) {
      ops.push_back(elementwise(op.name + ".backward", 1.5 * op.bytes));
    }
  }
  return ops;
}

}  // namespace

std::vector<Op> layer_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass) {
  const Dims d = dims_of(spec, plan);
  switch (pass) {
    case Pass::Forward: return forward_ops(d);
    case Pass::Backward: return backward_of(forward_ops(d), d);
    case Pass::Recompute:
      if (plan.recompute == Recompute::Full) return forward_ops(d);
      if (plan.recompute == Recompute::Selective) return attention_core(d);
      return {};
  }
  return {};
}

std::vector<Op> embedding_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass) {
  const Dims d = dims_of(spec, plan);
  const double bsh = d.b * d.s * d.h;
  std::vector<Op> ops;
  if (pass == Pass::Forward) {
    ops.push_back(elementwise("embedding.lookup", 3 * bsh * d.e));
    add_output_reduction(ops, d, "embedding", bsh * d.e);
  } else if (pass == Pass::Backward) {
    // With sequence parallelism the output gradient arrives in sequence shards: gathered first.
    if (d.sp > 1) ops.push_back(collective("embedding.backward_allgather", OpKind::TPAllGather, bsh * d.e));
    Op grad = elementwise("embedding.backward", 3 * bsh * d.e);
    grad.weight_gradient = true;  // accumulates into the embedding table's gradient
    ops.push_back(grad);
  }
  return ops;
}

std::vector<Op> head_ops(const TransformerSpec& spec, const ParallelPlan& plan, Pass pass) {
  const Dims d = dims_of(spec, plan);
  const double bsh = d.b * d.s * d.h;
  const int64_t bs = i64(d.b * d.s);
  const double logits = d.b * d.s * d.v / d.t;  // local logits
  std::vector<Op> fwd;
  fwd.push_back(elementwise("final_" + d.norm, 2 * bsh * d.e / d.sp));
  if (d.sp > 1) fwd.push_back(collective("final_" + d.norm + ".allgather", OpKind::TPAllGather, bsh * d.e));
  const size_t logits_at = fwd.size();
  fwd.push_back(gemm("logits", d.e, 1, bs, i64(d.v / d.t), i64(d.h)));
  fwd.push_back(elementwise("cross_entropy", logits * (d.e + 2 * 4)));
  if (d.t > 1) fwd.push_back(allreduce("cross_entropy.allreduce", 3 * d.b * d.s * 4));
  if (pass == Pass::Forward) return fwd;
  if (pass == Pass::Recompute) return {};
  std::vector<Op> bwd;
  bwd.push_back(elementwise("cross_entropy.backward", logits * (4 + d.e)));
  add_backward_gemms(bwd, fwd[logits_at], d.e);
  if (d.t > 1 && d.sp > 1) bwd.push_back(collective("logits.dgrad.reduce_scatter", OpKind::TPReduceScatter, bsh * d.e));
  else if (d.t > 1) bwd.push_back(allreduce("logits.dgrad.allreduce", bsh * d.e));
  bwd.push_back(elementwise("final_" + d.norm + ".backward", 3 * bsh * d.e / d.sp));
  return bwd;
}

double gemm_efficiency(const ComputeProfile& gpu, int64_t m, int64_t n, int64_t k) {
  // Two shape effects: the thinnest dimension bounds the data reuse inside a tile (head-dim 32
  // attention products are slow), and small products cannot fill the GPU's SMs (measured by
  // the product's volume m·n·k against a cube of side half_dim).
  auto f = [](double x, double half) { return x / (x + half); };
  const double M = static_cast<double>(m), N = static_cast<double>(n), K = static_cast<double>(k);
  const double q = gpu.gemm_thin_exponent;
  const double thin = std::pow(std::min({M, N, K}), q);
  const double side = gpu.gemm_half_dim;
  return gpu.gemm_max_efficiency * f(thin, std::pow(gpu.gemm_half_k, q)) * f(M * N * K, side * side * side);
}

double gemm_wave_efficiency(const ComputeProfile& gpu, int64_t batch, int64_t m, int64_t n) {
  if (gpu.sm_count <= 0 || batch <= 0 || m <= 0 || n <= 0) return 1.0;
  const int64_t tm = std::max<int64_t>(1, gpu.gemm_tile_m), tn = std::max<int64_t>(1, gpu.gemm_tile_n);
  const double tiles = static_cast<double>(batch) * static_cast<double>((m + tm - 1) / tm) * static_cast<double>((n + tn - 1) / tn);
  const double sms = static_cast<double>(gpu.sm_count);
  return tiles / (std::ceil(tiles / sms) * sms);
}

double op_time_s(const Op& op, const ComputeProfile& gpu) {
  const double memory_s = op.bytes / (gpu.hbm_Bps * gpu.elementwise_efficiency);
  switch (op.kind) {
    case OpKind::Gemm: {
      const double eff = gemm_efficiency(gpu, op.m, op.n, op.k) * gemm_wave_efficiency(gpu, op.batch, op.m, op.n);
      const double compute_s = op.flops / (gpu.peak_flops * eff);
      return std::max(compute_s, memory_s) + gpu.kernel_launch_s;
    }
    case OpKind::Elementwise: return memory_s + gpu.kernel_launch_s;
    case OpKind::TPAllReduce:
    case OpKind::TPReduceScatter:
    case OpKind::TPAllGather: return 0;
  }
  return 0;
}

bool is_tp_collective(OpKind k) {
  return k == OpKind::TPAllReduce || k == OpKind::TPReduceScatter || k == OpKind::TPAllGather;
}

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

OpsCost cost_of(const std::vector<Op>& ops, const ComputeProfile& gpu) {
  OpsCost c;
  for (const auto& op : ops) {
    if (is_tp_collective(op.kind)) {
      c.tp_allreduce_bytes += op.bytes;
      ++c.tp_allreduces;
    } else {
      c.compute_s += op_time_s(op, gpu);
      c.flops += op.flops;
    }
  }
  return c;
}

double optimizer_time_s(double params, const ComputeProfile& gpu, Precision precision) {
  // Adam reads master weight, momentum, variance and gradient, writes the first three and the
  // low-precision copy; the gradient-norm pass reads the gradients once more.
  const double bytes_per_param = precision == Precision::FP32 ? 32.0 : 30.0;
  return params * bytes_per_param / (gpu.hbm_Bps * gpu.elementwise_efficiency) + 10 * gpu.kernel_launch_s;
}

}  // namespace ptdp
