// Kernels by framework and recipe (issue 31): training.framework, training.fp8_recipe,
// cluster.gpu_power_w, model.head_dim and context-parallel attention at its own block size.
// Each knob is checked against the kernel-level figure it was derived from
// (kernel-and-framework-facts.md) and against the direction it must move an end-to-end
// prediction; each bad input is refused naming its key.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/cost.hpp"
#include "model/transformer.hpp"
#include "scenarios/scenario.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/sim_input.hpp"
#include "topologies/compute_profile.hpp"

namespace ptdp {
namespace {

const std::string kRoot = PTDP_SOURCE_DIR;
const char* kLlama8b = "scenarios/llama3-8b.yaml";

Scenario load(const std::string& file, const std::vector<Override>& sets) { return load_scenario(kRoot + "/" + file, sets); }

Report run(const std::string& file, const std::vector<Override>& sets) {
  const Scenario sc = load(file, sets);
  return simulate(input_of(sc), make_schedule(sc.plan), Fidelity::Analytic, false).report;
}

void expect_refused(const std::function<void()>& f, const std::string& key, const std::string& words) {
  try {
    f();
    ADD_FAILURE() << key << " (" << words << "): accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), key) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

const Op& find_op(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& op : ops)
    if (op.name == name) return op;
  ADD_FAILURE() << "no op " << name;
  return ops.front();
}

// --- FP8 recipes -------------------------------------------------------------------------------

// Transformer Engine's GEMM benchmark layer (modern-training-facts.md §2): h 4096, ffn 16384,
// 15 872 tokens, all GEMMs of the layer with their quantisation, on H200.
double layer_gemm_time(Precision precision, Fp8Recipe recipe) {
  const Scenario sc = load(kLlama8b, {{"cluster.topology", "dgx-h200"}});
  TransformerSpec spec = sc.model;
  spec.hidden_size = 4096;
  spec.num_attention_heads = 32;
  spec.num_query_groups = 32;
  spec.ffn_hidden_size = 16384;
  spec.mlp = MlpKind::Gelu;
  spec.seq_length = 15872;
  ParallelPlan plan = sc.plan;
  plan.tensor = 1;
  plan.sequence_parallel = false;
  plan.micro_batch = 1;
  plan.precision = precision;
  plan.fp8_recipe = recipe;
  const GpuSpec& gpu = sc.cluster.gpu;
  double t = 0;
  for (Pass pass : {Pass::Forward, Pass::Backward})
    for (const Op& op : layer_ops(spec, plan, pass))
      if ((op.kind == OpKind::Gemm && op.name.rfind("attn.", 0) != 0) || op.name.find(".cast_fp8") != std::string::npos) t += op_time_s(op, gpu);
  return t;
}

TEST(Fp8Recipes, GainsOverBf16FollowTransformerEnginesGemmBenchmark) {
  const double bf16 = layer_gemm_time(Precision::BF16, Fp8Recipe::Tensorwise);
  const double tensorwise = bf16 / layer_gemm_time(Precision::FP8, Fp8Recipe::Tensorwise);
  const double blockwise = bf16 / layer_gemm_time(Precision::FP8, Fp8Recipe::Blockwise);
  const double rowwise = bf16 / layer_gemm_time(Precision::FP8, Fp8Recipe::Rowwise);
  // TE on H200 NVL with quantisation: delayed (tensorwise) 1.69×, blockwise 1.40×; the ratio
  // of the two gains (0.83) is what the recipe changes, the absolute gain is the preset's FP8 fit.
  RecordProperty("tensorwise", std::to_string(tensorwise));
  RecordProperty("rowwise", std::to_string(rowwise));
  RecordProperty("blockwise", std::to_string(blockwise));
  EXPECT_NEAR(blockwise / tensorwise, 1.40 / 1.69, 0.1 * 1.40 / 1.69) << blockwise << " vs " << tensorwise;
  EXPECT_GT(tensorwise, rowwise);
  EXPECT_GT(rowwise, blockwise);
  EXPECT_GT(blockwise, 1.0);
}

TEST(Fp8Recipes, QuantisationKernelsAreTheRecipesOwn) {
  const Scenario sc = load(kLlama8b, {{"training.precision", "fp8"}});
  ParallelPlan plan = sc.plan;
  plan.fp8_recipe = Fp8Recipe::Tensorwise;
  const double tensorwise = find_op(layer_ops(sc.model, plan, Pass::Forward), "fc1.cast_fp8").bytes;
  plan.fp8_recipe = Fp8Recipe::Rowwise;
  const double rowwise = find_op(layer_ops(sc.model, plan, Pass::Forward), "fc1.cast_fp8").bytes;
  EXPECT_DOUBLE_EQ(rowwise / tensorwise, 6.0 / 4.0);  // separate row- and column-wise passes
  // B200's MXFP8 quantisation (dim0, 16384²: 126 µs at 6.46 TB/s) moves 3.03 B per element per
  // copy; the recipe's two copies are within 10 % of twice that.
  EXPECT_NEAR(fp8_recipe_costs(Fp8Recipe::MXFP8).quant_bytes_per_element / 2, 6.46e12 * 126e-6 / (16384.0 * 16384.0), 0.3);
}

TEST(Fp8Recipes, TheKeyMovesThePredictionAndBadRecipesAreRefused) {
  const Report tensorwise = run(kLlama8b, {{"training.precision", "fp8"}});
  const Report blockwise = run(kLlama8b, {{"training.precision", "fp8"}, {"training.fp8_recipe", "blockwise"}});
  EXPECT_GT(blockwise.iteration_time_s, tensorwise.iteration_time_s);
  expect_refused([] { load(kLlama8b, {{"training.precision", "fp8"}, {"training.fp8_recipe", "mxfp8"}}); }, "training.fp8_recipe",
                 "microscaling");
  expect_refused([] { load(kLlama8b, {{"training.precision", "fp8"}, {"training.fp8_recipe", "rowwise"}}); }, "training.fp8_recipe",
                 "no rowwise recipe");  // Transformer Engine (megatron) has none
  EXPECT_NO_THROW(load(kLlama8b, {{"training.precision", "fp8"}, {"training.fp8_recipe", "rowwise"}, {"training.framework", "torchtitan"},
                                  {"parallel.tp_comm_overlap", "false"}}));
  EXPECT_NO_THROW(load(kLlama8b, {{"cluster.topology", "dgx-b200"}, {"training.precision", "fp8"}, {"training.fp8_recipe", "mxfp8"}}));
  expect_refused([] { load(kLlama8b, {{"training.fp8_recipe", "colwise"}}); }, "training.fp8_recipe", "expected tensorwise");
}

// --- Power limit -------------------------------------------------------------------------------

TEST(PowerLimit, SustainedClockFollowsThePublishedPairs) {
  // H100 bf16 at 500 W: 585 TF against ≈795 at 700 W.
  EXPECT_NEAR(sustained_clock_factor(500, 700), 585.0 / 795.0, 0.1 * 585.0 / 795.0);
  // GB300 at 500 W against its 1400 W cap: 617 against 1600–2174 TF.
  const double gb300 = sustained_clock_factor(500, 1400);
  EXPECT_GT(gb300, 617.0 / 2174.0);
  EXPECT_LT(gb300, 617.0 / 1600.0 * 1.1);
  EXPECT_EQ(sustained_clock_factor(700, 700), 1.0);
}

TEST(PowerLimit, SlowsComputeNotMemoryAndMovesThePrediction) {
  const Scenario full = load(kLlama8b, {});
  const Scenario capped = load(kLlama8b, {{"cluster.gpu_power_w", "500W"}});
  const GpuSpec a = full.cluster.gpu, b = capped.cluster.gpu;
  const std::vector<Op> ops = layer_ops(full.model, full.plan, Pass::Forward);
  EXPECT_NEAR(op_time_s(find_op(ops, "fc1"), b) / op_time_s(find_op(ops, "fc1"), a), 1 / sustained_clock_factor(500, 700), 0.02);
  EXPECT_DOUBLE_EQ(op_time_s(find_op(ops, "rmsnorm1"), b), op_time_s(find_op(ops, "rmsnorm1"), a));
  EXPECT_EQ(capped.cluster.gpu.power_w, 500);  // energy at the limit
  EXPECT_GT(run(kLlama8b, {{"cluster.gpu_power_w", "500"}}).iteration_time_s, run(kLlama8b, {}).iteration_time_s);
  expect_refused([] { load(kLlama8b, {{"cluster.gpu_power_w", "900W"}}); }, "cluster.gpu_power_w", "between a quarter of the TDP");
  expect_refused([] { load(kLlama8b, {{"cluster.gpu_power_w", "100W"}}); }, "cluster.gpu_power_w", "between a quarter of the TDP");
}

// --- Frameworks --------------------------------------------------------------------------------

TEST(Frameworks, ElementwiseKernelsRunAtTheirMeasuredBandwidths) {
  const Scenario sc = load(kLlama8b, {{"parallel.tp_comm_overlap", "false"}});
  const GpuSpec& gpu = sc.cluster.gpu;
  auto swiglu = [&](Framework f) {
    ParallelPlan plan = sc.plan;
    plan.framework = f;
    const Op op = find_op(layer_ops(sc.model, plan, Pass::Forward), "swiglu");
    return op_time_s(op, gpu) - op.kernels * gpu.kernel_launch_s;
  };
  // Eager silu(g)·u at 871–1077 GB/s against fused 2160–3053 (H100, Liger's CSV): 0.35–0.40.
  const double eager = swiglu(Framework::Megatron) / swiglu(Framework::Torchtitan);
  RecordProperty("eager_swiglu_share", std::to_string(eager));
  EXPECT_GT(eager, 0.35 * 0.9);
  EXPECT_LT(eager, 0.40 * 1.1);
  EXPECT_NEAR(swiglu(Framework::TorchtitanCompiled), swiglu(Framework::Megatron), 1e-12);
  // An eager op whose kernels finish before the host has dispatched them costs the dispatch.
  Op tiny;
  tiny.kind = OpKind::Elementwise;
  tiny.bytes = 1024;
  tiny.host_s = 20e-6;
  EXPECT_DOUBLE_EQ(op_time_s(tiny, gpu), 20e-6);
}

TEST(Frameworks, EachFrameworkMovesThePredictionTheWayItsKernelsRun) {
  const std::vector<Override> base = {{"parallel.tp_comm_overlap", "false"}};
  auto with = [&](const char* f) {
    std::vector<Override> o = base;
    o.push_back({"training.framework", f});
    return run(kLlama8b, o).iteration_time_s;
  };
  const double megatron = with("megatron"), eager = with("torchtitan"), compiled = with("torchtitan_compiled"), deepspeed = with("deepspeed");
  for (auto [k, v] : {std::pair{"megatron", megatron}, {"torchtitan", eager}, {"torchtitan_compiled", compiled}, {"deepspeed", deepspeed}})
    RecordProperty(k, std::to_string(v));
  EXPECT_GT(eager, compiled);
  EXPECT_GE(compiled, megatron);  // the optimizer's per-tensor dispatch under DTensor
  EXPECT_GT(deepspeed, megatron);  // HF-style norms at a tenth of the fused bandwidth
  EXPECT_LT(eager / megatron, 1.5);
  // The optimizer: fused AdamW over DTensor parameters, ≈0.29 ms of host time per tensor.
  const Scenario sc = load(kLlama8b, base);
  const GpuSpec& gpu = sc.cluster.gpu;
  const double tensors = parameter_tensor_count(sc.model, 32);
  EXPECT_EQ(tensors, 32 * 9);  // q, k, v, o, gate, up, down, two norms
  EXPECT_NEAR(optimizer_time_s(1e6, tensors, gpu, Precision::BF16, Framework::Torchtitan), tensors * 43e-3 / 150, 1e-9);
  EXPECT_DOUBLE_EQ(optimizer_time_s(1e6, tensors, gpu, Precision::BF16, Framework::Megatron), optimizer_time_s(1e6, gpu, Precision::BF16));
}

TEST(Frameworks, AMechanismTheFrameworkLacksIsRefused) {
  expect_refused([] { load(kLlama8b, {{"training.framework", "torchtitan"}}); }, "parallel.tp_comm_overlap", "torch.compile");
  EXPECT_NO_THROW(load(kLlama8b, {{"training.framework", "torchtitan_compiled"}}));
  expect_refused(
      [] {
        load(kLlama8b, {{"training.framework", "torchtitan_compiled"}, {"parallel.pipeline", "4"}, {"parallel.schedule", "dualpipe"},
                        {"parallel.virtual_stages", "2"}, {"parallel.tensor", "1"}, {"parallel.sequence_parallel", "false"},
                        {"parallel.tp_comm_overlap", "false"}});
      },
      "parallel.schedule", "DualPipe");
  expect_refused([] { load(kLlama8b, {{"training.framework", "deepspeed"}, {"parallel.tp_comm_overlap", "false"}, {"parallel.context", "2"}}); },
                 "parallel.context", "no context parallelism");
  expect_refused([] { load(kLlama8b, {{"training.framework", "jax"}}); }, "training.framework", "expected megatron");
  EXPECT_EQ(parse_framework("megatron-core"), Framework::Megatron);
  EXPECT_EQ(parse_framework("pytorch-fsdp"), Framework::PytorchFsdp);
}

// --- Context-parallel attention ------------------------------------------------------------------

TEST(ContextParallelAttention, RingKernelsReachTheMeasuredShareOfTheWholeSequenceKernel) {
  // 8 GPUs, 8k tokens each, Llama-3.1-8B attention (32 heads, 8 groups, d_h 128): zigzag ring
  // forward + backward 90.2 % (H800) / 89.8 % (A100) of one kernel over the whole 64k sequence.
  for (const char* topo : {"dgx-h100", "dgx-a100"}) {
    auto attention_s = [&](int64_t cp) {
      const Scenario sc = load(kLlama8b, {{"cluster.topology", topo},
                                          {"model.seq_length", "65536"},
                                          {"parallel.tensor", "1"},
                                          {"parallel.sequence_parallel", "false"},
                                          {"parallel.tp_comm_overlap", "false"},
                                          {"parallel.context", std::to_string(cp)}});
      const GpuSpec& gpu = sc.cluster.gpu;
      double t = 0;
      for (Pass pass : {Pass::Forward, Pass::Backward})
        for (const Op& op : layer_ops(sc.model, sc.plan, pass))
          if (op.kind == OpKind::Attention) t += op_time_s(op, gpu);
      return t;
    };
    const double share = attention_s(1) / (8 * attention_s(8));
    RecordProperty(std::string("cp_share_") + topo, std::to_string(share));
    EXPECT_NEAR(share, 0.90, 0.09) << topo;
  }
}

// --- Head dimension ------------------------------------------------------------------------------

TEST(HeadDim, QwenStyleHeadsWidenTheAttentionAndBadWidthsAreRefused) {
  // Qwen3-235B's attention: h 4096, 64 query heads of 128, 4 groups.
  const std::vector<Override> qwen = {{"model.num_attention_heads", "64"}, {"model.num_query_groups", "4"}, {"model.head_dim", "128"}};
  const Scenario sc = load(kLlama8b, qwen);
  EXPECT_EQ(sc.model.q_width(), 8192);
  const std::vector<Op> ops = layer_ops(sc.model, sc.plan, Pass::Forward);
  EXPECT_EQ(find_op(ops, "qkv").n, (8192 + 2 * 4 * 128) / 4);
  EXPECT_EQ(find_op(ops, "proj").k, 8192 / 4);
  const Scenario narrow = load(kLlama8b, {{"model.num_attention_heads", "64"}, {"model.num_query_groups", "4"}});
  EXPECT_GT(layer_parameter_count(sc.model) - layer_parameter_count(narrow.model), 2 * 4096.0 * 4096);
  EXPECT_GT(run(kLlama8b, qwen).iteration_time_s, run(kLlama8b, {{"model.num_attention_heads", "64"}, {"model.num_query_groups", "4"}}).iteration_time_s);
  expect_refused([] { load(kLlama8b, {{"model.head_dim", "127"}}); }, "model.head_dim", "even");
  expect_refused([] { load(kLlama8b, {{"model.head_dim", "512"}}); }, "model.head_dim", "flash attention");
}

}  // namespace
}  // namespace ptdp
