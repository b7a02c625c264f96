// The per-layer operation list (GEMM shapes, FLOPs, TP all-reduces) and the compute-time model.
#include "model/cost.hpp"

#include <gtest/gtest.h>

#include "models.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

namespace ptdp {
namespace {

using test_models::gpt3;

ParallelPlan tp(int64_t t, int64_t b, Recompute r = Recompute::Full) {
  ParallelPlan p;
  p.tensor = t;
  p.micro_batch = b;
  p.global_batch = 1536;
  p.recompute = r;
  p.precision = Precision::FP16;
  return p;
}

double flops_of(const std::vector<Op>& ops) {
  double f = 0;
  for (const auto& op : ops) f += op.flops;
  return f;
}
int allreduces(const std::vector<Op>& ops) {
  return static_cast<int>(std::count_if(ops.begin(), ops.end(), [](const Op& o) { return o.kind == OpKind::AllReduce; }));
}

TEST(LayerOps, ForwardFlopsPerTensorRankAre24Bsh2Plus4Bs2hOverT) {
  const TransformerSpec m = gpt3();
  for (int64_t t : {1, 2, 4, 8}) {
    for (int64_t b : {1, 4}) {
      const double B = static_cast<double>(b), s = 2048, h = 12288;
      const double want = (24 * B * s * h * h + 4 * B * s * s * h) / static_cast<double>(t);
      EXPECT_NEAR(flops_of(layer_ops(m, tp(t, b), Pass::Forward)) / want, 1.0, 1e-12) << "t " << t << " b " << b;
      EXPECT_NEAR(flops_of(layer_ops(m, tp(t, b), Pass::Backward)) / (2 * want), 1.0, 1e-12) << "t " << t;
      EXPECT_NEAR(flops_of(layer_ops(m, tp(t, b, Recompute::Full), Pass::Recompute)) / want, 1.0, 1e-12);
    }
  }
}

TEST(LayerOps, RecomputeListsWhatTheSettingReRuns) {
  const TransformerSpec m = gpt3();
  EXPECT_TRUE(layer_ops(m, tp(8, 1, Recompute::None), Pass::Recompute).empty());
  // Selective recompute re-runs the attention core only: QKᵀ and attention·V, 4bs²h/t FLOPs.
  const double s = 2048, h = 12288;
  EXPECT_NEAR(flops_of(layer_ops(m, tp(8, 1, Recompute::Selective), Pass::Recompute)), 4 * s * s * h / 8, 1.0);
  EXPECT_EQ(allreduces(layer_ops(m, tp(8, 1, Recompute::Selective), Pass::Recompute)), 0);
}

TEST(LayerOps, TensorParallelismAllReducesTwiceInForwardAndTwiceInBackward) {
  const TransformerSpec m = gpt3();
  const double bsh_bytes = 2.0 * 2048 * 12288 * 2;  // b = 2, fp16
  for (Pass pass : {Pass::Forward, Pass::Backward}) {
    const auto ops = layer_ops(m, tp(8, 2), pass);
    EXPECT_EQ(allreduces(ops), 2);
    for (const auto& op : ops) {
      if (op.kind == OpKind::AllReduce) {
        EXPECT_DOUBLE_EQ(op.bytes, bsh_bytes) << op.name;
      }
    }
    EXPECT_EQ(allreduces(layer_ops(m, tp(1, 2), pass)), 0) << "no collectives at t = 1";
  }
  // The recomputed forward repeats its two all-reduces.
  EXPECT_EQ(allreduces(layer_ops(m, tp(8, 2, Recompute::Full), Pass::Recompute)), 2);
}

TEST(LayerOps, GemmShapesAreMegatronsColumnAndRowSplits) {
  const TransformerSpec m = gpt3();
  const auto ops = layer_ops(m, tp(8, 1), Pass::Forward);
  auto find = [&](const std::string& name) {
    auto it = std::find_if(ops.begin(), ops.end(), [&](const Op& o) { return o.name == name; });
    EXPECT_NE(it, ops.end()) << name;
    return *it;
  };
  const Op qkv = find("qkv"), fc1 = find("fc1"), fc2 = find("fc2"), proj = find("proj");
  EXPECT_EQ(qkv.m, 2048);
  EXPECT_EQ(qkv.n, 3 * 12288 / 8);  // column-parallel
  EXPECT_EQ(qkv.k, 12288);
  EXPECT_EQ(fc1.n, 4 * 12288 / 8);
  EXPECT_EQ(fc2.k, 4 * 12288 / 8);  // row-parallel
  EXPECT_EQ(proj.k, 12288 / 8);
  for (const Op& op : {qkv, fc1, fc2, proj})
    EXPECT_DOUBLE_EQ(op.flops, 2.0 * op.batch * op.m * op.n * op.k) << op.name;
}

TEST(HeadOps, LogitFlopsAreSixBshVOverTForForwardAndBackward) {
  // 6·b·s·h·V in total (2 forward + 4 backward), on the padded vocabulary shard of each TP rank.
  TransformerSpec m = gpt3();
  const double s = 2048, h = 12288, V = 51200;
  const double fwd = flops_of(head_ops(m, tp(8, 1), Pass::Forward));
  const double bwd = flops_of(head_ops(m, tp(8, 1), Pass::Backward));
  EXPECT_NEAR((fwd + bwd) / (6 * s * h * V / 8), 1.0, 1e-12);
  EXPECT_NEAR(bwd / fwd, 2.0, 1e-12);
  EXPECT_TRUE(head_ops(m, tp(8, 1), Pass::Recompute).empty());
}

TEST(ComputeModel, GemmEfficiencyGrowsWithShapeAndStaysBelowTheMaximum) {
  const GpuSpec a100;
  const double big = gemm_efficiency(a100, 16384, 16384, 16384);
  EXPECT_LT(big, a100.gemm_max_efficiency);
  EXPECT_GT(big, 0.97 * a100.gemm_max_efficiency);
  EXPECT_LT(gemm_efficiency(a100, 128, 16384, 16384), big);
  // The thinnest side at half_k halves efficiency, whichever of m, n, k it is.
  EXPECT_NEAR(gemm_efficiency(a100, 1e6, 1e6, 64) / a100.gemm_max_efficiency, 0.5, 1e-6);
  EXPECT_NEAR(gemm_efficiency(a100, 64, 1e6, 1e6) / a100.gemm_max_efficiency, 0.5, 1e-6);
  // A product of volume half_dim³ halves it (thin-side effect switched off).
  GpuSpec no_thin = a100;
  no_thin.gemm_half_k = 0;
  EXPECT_NEAR(gemm_efficiency(no_thin, 128, 128, 128) / a100.gemm_max_efficiency, 0.5, 1e-6);
  // A steeper thin-side exponent punishes sides below half_k more and rewards those above.
  GpuSpec steep = a100;
  steep.gemm_thin_exponent = 2;
  EXPECT_LT(gemm_efficiency(steep, 1e6, 1e6, 32), gemm_efficiency(a100, 1e6, 1e6, 32));
  EXPECT_GT(gemm_efficiency(steep, 1e6, 1e6, 256), gemm_efficiency(a100, 1e6, 1e6, 256));
}

TEST(ComputeModel, OpTimesAreComputeOrMemoryBoundPlusLaunch) {
  GpuSpec gpu;
  Op g;
  g.kind = OpKind::Gemm;
  g.m = g.n = g.k = 8192;
  g.flops = 2.0 * 8192 * 8192 * 8192;
  g.bytes = 2.0 * 3 * 8192 * 8192;
  EXPECT_NEAR(op_time_s(g, gpu), g.flops / (gpu.peak_flops * gemm_efficiency(gpu, 8192, 8192, 8192)) + gpu.kernel_launch_s,
              1e-12);
  Op e;
  e.kind = OpKind::Elementwise;
  e.bytes = 1e9;
  EXPECT_NEAR(op_time_s(e, gpu), 1e9 / (gpu.hbm_Bps * gpu.elementwise_efficiency) + gpu.kernel_launch_s, 1e-12);
  Op ar;
  ar.kind = OpKind::AllReduce;
  ar.bytes = 1e9;
  EXPECT_EQ(op_time_s(ar, gpu), 0.0);  // communication is timed by topologies/collectives
  const OpsCost c = cost_of({g, e, ar}, gpu);
  EXPECT_EQ(c.collectives, 1);
  EXPECT_DOUBLE_EQ(c.collective_bytes, 1e9);
  EXPECT_DOUBLE_EQ(c.flops, g.flops);
  EXPECT_NEAR(c.compute_s, op_time_s(g, gpu) + op_time_s(e, gpu), 1e-15);
}

TEST(ComputeModel, LayerForwardOfGpt3AtT8RunsNearTheFittedEfficiency) {
  // A 175B layer at t = 8, b = 1 is GEMM-dominated: its forward must reach between 50 % and 80 %
  // of the 312 TFLOP/s peak in the model (the paper reports 52 % end to end at this scale).
  const TransformerSpec m = gpt3();
  GpuSpec a100;
  const OpsCost c = cost_of(layer_ops(m, tp(8, 1), Pass::Forward), a100);
  const double achieved = c.flops / c.compute_s / a100.peak_flops;
  EXPECT_GT(achieved, 0.5);
  EXPECT_LT(achieved, 0.8);
}

TEST(ComputeModel, OptimizerStepIsMemoryBound) {
  GpuSpec gpu;
  const double t1 = optimizer_time_s(1e9, gpu, Precision::FP16);
  const double t2 = optimizer_time_s(2e9, gpu, Precision::FP16);
  // Linear in the parameters: at least the 16 bytes of state per parameter through HBM.
  EXPECT_NEAR((t2 - t1) / (1e9 * 16 / (gpu.hbm_Bps * gpu.elementwise_efficiency)), 30.0 / 16, 0.5);
  EXPECT_GT(t1, 1e9 * 16 / gpu.hbm_Bps);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

int count_kind(const std::vector<Op>& ops, OpKind k) {
  return static_cast<int>(std::count_if(ops.begin(), ops.end(), [k](const Op& o) { return o.kind == k; }));
}
double bytes_of(const std::vector<Op>& ops, OpKind k) {
  double b = 0;
  for (const auto& op : ops)
    if (op.kind == k) b += op.bytes;
  return b;
}

TEST(LayerOps, SequenceParallelismTurnsEachAllReduceIntoReduceScatterPlusAllGather) {
  const TransformerSpec m = test_models::gpt3();
  ParallelPlan sp = tp(8, 2, Recompute::None);
  sp.sequence_parallel = true;
  const double bsh_bytes = 2.0 * 2048 * 12288 * 2;
  for (Pass pass : {Pass::Forward, Pass::Backward}) {
    const auto plain = layer_ops(m, tp(8, 2, Recompute::None), pass);
    const auto ops = layer_ops(m, sp, pass);
    EXPECT_EQ(count_kind(ops, OpKind::AllReduce), 0);
    EXPECT_EQ(count_kind(ops, OpKind::ReduceScatter), 2);
    // The same volume: each all-reduce of b·s·h is a reduce-scatter and an all-gather of b·s·h;
    // the backward also re-gathers the two column-parallel GEMMs' inputs for their weight
    // gradients (Megatron keeps only their sequence shards), under the input-gradient GEMMs.
    const int regathers = pass == Pass::Backward ? 2 : 0;
    EXPECT_EQ(count_kind(ops, OpKind::AllGather), 2 + regathers);
    EXPECT_DOUBLE_EQ(bytes_of(ops, OpKind::ReduceScatter), bytes_of(plain, OpKind::AllReduce));
    EXPECT_DOUBLE_EQ(bytes_of(ops, OpKind::AllGather), (2 + regathers) * bsh_bytes);
    for (const Op& op : ops)
      if (op.name == "qkv.input.allgather" || op.name == "fc1.input.allgather") {
        EXPECT_EQ(op.group, CommGroup::Tensor);
        EXPECT_FALSE(op.weight_gradient) << "a split backward's I gathers it and keeps it for its W";
        EXPECT_EQ(op.overlaps, op.name.substr(0, op.name.find('.')) + ".dgrad");
      }
    // The GEMMs are the same; the norms, dropouts and residual adds move 1/t of the bytes.
    EXPECT_DOUBLE_EQ(flops_of(ops), flops_of(plain));
    auto norm_dropout_bytes = [](const std::vector<Op>& list) {
      double b = 0;
      for (const auto& op : list)
        if (op.kind == OpKind::Elementwise && (op.name.rfind("ln", 0) == 0 || op.name.rfind("bias_dropout_add", 0) == 0))
          b += op.bytes;
      return b;
    };
    const double ew_plain = norm_dropout_bytes(plain), ew_sp = norm_dropout_bytes(ops);
    EXPECT_GT(ew_plain, 0);
    EXPECT_NEAR(ew_sp / ew_plain, 1.0 / 8, 1e-12) << "pass " << static_cast<int>(pass);
  }
  // Selective recompute re-runs the attention core: no collectives, with or without SP.
  sp.recompute = Recompute::Selective;
  EXPECT_EQ(count_kind(layer_ops(m, sp, Pass::Recompute), OpKind::AllGather), 0);
  EXPECT_NEAR(flops_of(layer_ops(m, sp, Pass::Recompute)), 4.0 * 2 * 2048 * 2048 * 12288 / 8, 1.0);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {
// A CPU profile's measurements of the executor's kernels (calibrate --backend cpu) price what the
// executor runs: the measured GEMM rate at a measured shape, the curve corrected by its
// neighbours near one, the curve alone far from every one; element-wise ops at the bandwidth of
// their working set; emulated FP8 casts and bf16 roundings per element inside the GEMM.
GpuSpec measured_cpu() {
  GpuSpec g;
  g.peak_flops = 100e9;
  g.gemm_max_efficiency = 1;
  g.gemm_half_dim = 20;
  g.gemm_half_k = 10;
  g.gemm_thin_exponent = 0.5;
  g.hbm_Bps = 10e9;
  g.elementwise_efficiency = 0.5;
  g.kernel_launch_s = 0;
  g.gemm_rates = {{256, 512, 128, 40e9}, {256, 128, 512, 70e9}};
  g.elementwise_bandwidth = {{64e3, 40e9}, {4e6, 20e9}, {64e6, 5e9}};
  return g;
}

TEST(MeasuredKernels, AMeasuredGemmShapeCostsItsMeasuredRate) {
  const GpuSpec g = measured_cpu();
  EXPECT_NEAR(gemm_efficiency(g, 256, 512, 128), 0.4, 1e-12);
  EXPECT_NEAR(gemm_efficiency(g, 256, 128, 512), 0.7, 1e-12);
  Op op;
  op.kind = OpKind::Gemm;
  op.m = 256, op.n = 512, op.k = 128;
  op.flops = 2.0 * 256 * 512 * 128;
  EXPECT_NEAR(op_time_s(op, g), op.flops / 40e9, 1e-12);
}

TEST(MeasuredKernels, NearAMeasuredShapeTheCurveIsCorrectedFarFromAllItIsTheCurve) {
  const GpuSpec g = measured_cpu();
  GpuSpec bare = g;
  bare.gemm_rates.clear();
  // 10 % away from (256, 512, 128) in m: close to the measured ratio.
  const double ratio = 0.4 / gemm_curve_efficiency(g, 256, 512, 128);
  const double near = gemm_efficiency(g, 282, 512, 128) / gemm_curve_efficiency(g, 282, 512, 128);
  EXPECT_NEAR(near, ratio, 0.15 * std::fabs(ratio - 1));
  // 64× away in every side: the curve.
  EXPECT_NEAR(gemm_efficiency(g, 16384, 32768, 8192), gemm_curve_efficiency(g, 16384, 32768, 8192), 1e-9);
  EXPECT_DOUBLE_EQ(gemm_efficiency(bare, 282, 512, 128), gemm_curve_efficiency(g, 282, 512, 128));
}

TEST(MeasuredKernels, ElementwiseOpsRunAtTheBandwidthOfTheirWorkingSet) {
  const GpuSpec g = measured_cpu();
  Op small;
  small.kind = OpKind::Elementwise;
  small.bytes = 32e3;  // below the smallest measured size: the cache's bandwidth
  EXPECT_NEAR(op_time_s(small, g), 32e3 / 40e9, 1e-15);
  Op mid = small;
  mid.bytes = 16e6;  // between 4 MB and 64 MB: log-log interpolation, 10 GB/s at the geometric middle
  EXPECT_NEAR(op_time_s(mid, g), 16e6 / 10e9, 1e-9);
  Op big = small;
  big.bytes = 1e9;
  EXPECT_NEAR(op_time_s(big, g), 1e9 / 5e9, 1e-9);
  GpuSpec bare = g;
  bare.elementwise_bandwidth.clear();
  EXPECT_NEAR(op_time_s(small, bare), 32e3 / (10e9 * 0.5), 1e-15);
  // The optimizer's step streams its states at the bandwidth of their size too.
  EXPECT_LT(optimizer_time_s(1e4, g, Precision::FP32), optimizer_time_s(1e4, bare, Precision::FP32));
}

TEST(MeasuredKernels, EmulatedFp8CastsAreChargedInsideTheGemmThatCastsItsOperands) {
  GpuSpec g = measured_cpu();
  g.fp8_cast_s = 1e-9;
  g.operand_rounding_s = 0.5e-9;
  ParallelPlan plan = tp(1, 1, Recompute::None);
  plan.precision = Precision::FP8;
  const TransformerSpec spec = gpt3();
  const std::vector<Op> fwd = layer_ops(spec, plan, Pass::Forward);
  int gemms = 0;
  for (const Op& op : fwd) {
    if (op.kind == OpKind::Elementwise && op.fp8_cast) {
      EXPECT_EQ(op_time_s(op, g), 0) << op.name;  // no kernel of its own
    }
    if (op.kind != OpKind::Gemm || !op.fp8) continue;
    ++gemms;
    Op plain = op;
    plain.fp8 = false;
    plain.rounded_operands = false;
    const double casts = static_cast<double>(op.m * op.k + op.k * op.n) * 1e-9;
    EXPECT_NEAR(op_time_s(op, g) - op_time_s(plain, g), casts, 1e-6 * casts) << op.name;
  }
  EXPECT_GE(gemms, 4);
  // A GPU with FP8 tensor cores prices neither.
  GpuSpec h = g;
  h.fp8_peak_flops = 2 * h.peak_flops;
  for (const Op& op : fwd)
    if (op.kind == OpKind::Elementwise && op.fp8_cast) {
      EXPECT_GT(op_time_s(op, h), 0) << op.name;
    }
  // bf16 operands: the rounded copies.
  plan.precision = Precision::BF16;
  for (const Op& op : layer_ops(spec, plan, Pass::Forward))
    if (op.kind == OpKind::Gemm && op.batch == 1) {
      Op fp32 = op;
      fp32.rounded_operands = false;
      EXPECT_NEAR(op_time_s(op, g) - op_time_s(fp32, g), static_cast<double>(op.m * op.k + op.k * op.n) * 0.5e-9, 1e-12) << op.name;
    }
}

TEST(MeasuredKernels, SwigluAndRotaryArePricedPerElementWhereTheHostComputesThem) {
  // The CPU executor's SwiGLU (scalar exp) and rotary embedding (trigonometry, copies) cost their
  // arithmetic: a profile that measured them prices the ops per element, forward and backward.
  TransformerSpec spec = gpt3();
  spec.mlp = MlpKind::SwiGLU;
  spec.position_embedding = PositionKind::Rope;
  spec.num_query_groups = 8;
  const ParallelPlan plan = tp(4, 2, Recompute::None);
  GpuSpec g = measured_cpu();
  const GpuSpec traffic = g;
  g.swiglu_s = 4e-9;
  g.swiglu_backward_s = 6e-9;
  g.rotary_s = 2e-9;
  const double tokens = 2.0 * static_cast<double>(spec.seq_length);
  const double inner = tokens * static_cast<double>(spec.ffn()) / 4;
  const double rotated = tokens * static_cast<double>(spec.q_width() + spec.kv_width()) / 4;
  std::map<std::string, double> expected = {{"swiglu", inner * 4e-9},   {"swiglu.backward", inner * 6e-9},
                                            {"rope", rotated * 2e-9},   {"rope.backward", rotated * 2e-9}};
  for (Pass pass : {Pass::Forward, Pass::Backward})
    for (const Op& op : layer_ops(spec, plan, pass)) {
      const auto it = expected.find(op.name);
      if (it == expected.end()) continue;
      EXPECT_NEAR(op_time_s(op, g), it->second + g.kernel_launch_s, 1e-3 * it->second) << op.name;
      EXPECT_LT(op_time_s(op, traffic), op_time_s(op, g)) << op.name;  // priced as traffic without the measurement
      expected.erase(it);
    }
  for (const auto& [name, time] : expected) ADD_FAILURE() << name << " is not among the layer's ops";
  // Without rotary embeddings there is no rope op.
  spec.position_embedding = PositionKind::Learned;
  for (const Op& op : layer_ops(spec, plan, Pass::Forward)) EXPECT_NE(op.name, "rope");
}

TEST(MeasuredKernels, ContextParallelBlocksArePricedAtTheHostsMeasuredBlockRate) {
  // The CPU executor's context-parallel attention runs a block kernel of its own (each query's
  // visible keys one by one): a profile that measured it prices the ring's and the all-gather
  // variant's attention at that rate, forward and backward; without it, the flash curve.
  TransformerSpec spec = gpt3();
  spec.attention = AttentionKind::Flash;
  GpuSpec g = measured_cpu();
  g.attention_fwd_max_efficiency = 0.5;
  g.attention_bwd_max_efficiency = 0.5;
  const GpuSpec curve = g;
  g.context_attention_flops = 5e9;
  g.context_attention_backward_flops = 12e9;
  for (ContextComm comm : {ContextComm::Ring, ContextComm::AllGather}) {
    ParallelPlan plan = tp(1, 1, Recompute::None);
    plan.context = 2;
    plan.context_comm = comm;
    int priced = 0;
    for (Pass pass : {Pass::Forward, Pass::Backward})
      for (const Op& op : layer_ops(spec, plan, pass)) {
        if (op.kind != OpKind::Attention) continue;
        const double rate = op.backward ? 12e9 : 5e9;
        EXPECT_NEAR(op_time_s(op, g), op.flops / rate, 1e-9 * op.flops / rate) << op.name;
        EXPECT_NE(op_time_s(op, curve), op_time_s(op, g)) << op.name;
        ++priced;
      }
    EXPECT_EQ(priced, 2);
  }
  // One rank holding the whole sequence runs the flash kernel: the block rate does not apply.
  for (const Op& op : layer_ops(spec, tp(1, 1, Recompute::None), Pass::Forward))
    if (op.kind == OpKind::Attention) { EXPECT_DOUBLE_EQ(op_time_s(op, g), op_time_s(op, curve)); }
}
}  // namespace
}  // namespace ptdp
