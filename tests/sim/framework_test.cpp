// Kernels by framework and recipe (issue 31): training.framework, training.fp8_recipe,
// cluster.gpu_power_w, model.head_dim and context-parallel attention at its own block size.
// Each knob is checked against the kernel-level figure it was derived from
// (kernel-and-framework-facts.md) and against the direction it must move an end-to-end
// prediction; each bad input is refused naming its key.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/cost.hpp"
#include "model/memory.hpp"
#include "model/transformer.hpp"
#include "report/timeline.hpp"
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
  // Rotary embeddings: torchtitan's complex multiplication moves 20 B per rotated element
  // against a fused kernel's 4 (casts to and from fp32 around it); DeepSpeed's HF-style
  // rotate_half at the measured 0.276 / 1.133 ms; torch.compile fuses it.
  auto rope = [&](Framework f, const char* name) {
    ParallelPlan plan = sc.plan;
    plan.framework = f;
    const Op op = find_op(layer_ops(sc.model, plan, name == std::string("rope") ? Pass::Forward : Pass::Backward), name);
    return op_time_s(op, gpu) - op.kernels * gpu.kernel_launch_s;
  };
  for (const char* name : {"rope", "rope.backward"}) {
    EXPECT_NEAR(rope(Framework::Torchtitan, name) / rope(Framework::Megatron, name), 5.0, 1e-9) << name;
    EXPECT_NEAR(rope(Framework::DeepSpeed, name) / rope(Framework::Megatron, name), 1.133 / 0.276, 1e-9) << name;
    EXPECT_EQ(rope(Framework::TorchtitanCompiled, name), rope(Framework::Megatron, name)) << name;
  }
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
                 "parallel.context", "by all-to-alls only (DeepSpeed-Ulysses)");
  expect_refused([] { load(kLlama8b, {{"training.framework", "pytorch_fsdp"}, {"parallel.tp_comm_overlap", "false"}, {"parallel.pipeline", "1"}, {"parallel.context", "2"}}); },
                 "parallel.context", "no context parallelism");
  // DeepSpeed's pipeline engine runs ZeRO stage 0 or 1 only; without pipeline stages stage 2 runs.
  auto deepspeed = [](const char* zero, const char* pipeline) {
    load(kLlama8b, {{"training.framework", "deepspeed"}, {"parallel.tp_comm_overlap", "false"}, {"parallel.pipeline", pipeline},
                    {"parallel.zero_stage", zero}});
  };
  expect_refused([&] { deepspeed("2", "4"); }, "parallel.zero_stage", "ZeRO stage 0 or 1 only");
  EXPECT_NO_THROW(deepspeed("1", "4"));
  EXPECT_NO_THROW(deepspeed("2", "1"));
  // Its pipeline engine runs one schedule, 1F1B (TrainSchedule).
  expect_refused(
      [] {
        load(kLlama8b, {{"training.framework", "deepspeed"}, {"parallel.tp_comm_overlap", "false"}, {"parallel.pipeline", "4"},
                        {"parallel.schedule", "interleaved"}, {"parallel.virtual_stages", "2"}});
      },
      "parallel.schedule", "1F1B schedule (TrainSchedule) only, not interleaved");
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

// --- Memory as frameworks allocate it: selective recompute by framework --------------------------

namespace {
double saved_per_layer(const Scenario& sc) { return saved_activation_bytes(sc.model, sc.plan); }
double recompute_time(const Scenario& sc) {
  double t = 0;
  for (const Op& op : layer_ops(sc.model, sc.plan, Pass::Recompute)) t += op_time_s(op, sc.cluster.gpu);
  return t;
}
}  // namespace

TEST(SelectiveRecompute, MegatronsModulesDropWhatTheyRerunAndPayForIt) {
  // Llama 3 8B, t 4 with sequence parallelism, selective: the default is the attention core.
  const Scenario core = load(kLlama8b, {});
  EXPECT_EQ(core.plan.recompute_modules, kRecomputeCoreAttn);
  const Scenario mlp = load(kLlama8b, {{"parallel.recompute_modules", "[core_attn, mlp]"}});
  const Scenario norms = load(kLlama8b, {{"parallel.recompute_modules", "[core_attn, layernorm]"}});
  EXPECT_EQ(mlp.plan.recompute_modules, kRecomputeCoreAttn | kRecomputeMlp);
  // mlp: the MLP's ops keep nothing but the block's input (the second norm's output).
  const std::vector<Op> fwd = layer_ops(core.model, core.plan, Pass::Forward);
  double mlp_saved = 0;
  for (const Op& op : fwd)
    if (op.modules & kRecomputeMlp) mlp_saved += op.saved_bytes;
  const Op& norm2 = find_op(fwd, "rmsnorm2");
  EXPECT_GT(mlp_saved, 3 * norm2.saved_bytes);
  EXPECT_NEAR(saved_per_layer(mlp), saved_per_layer(core) - mlp_saved + norm2.saved_bytes, 1.0);
  // layernorm: the two norms' outputs (the QKV and fc1 GEMMs' inputs) go.
  // (qkv keeps its input, the first norm's output, and Q, K, V.)
  const Op& norm1 = find_op(fwd, "rmsnorm1");
  EXPECT_NEAR(saved_per_layer(norms), saved_per_layer(core) - 2 * norm1.saved_bytes, 1.0);
  // Each pays its re-run: the MLP's GEMMs and gathers, or the two norms.
  EXPECT_GT(recompute_time(mlp), 3 * recompute_time(core));
  EXPECT_GT(recompute_time(norms), recompute_time(core));
  // End to end: less memory, longer iterations.
  const Report a = run(kLlama8b, {}), b = run(kLlama8b, {{"parallel.recompute_modules", "[core_attn, mlp]"}});
  EXPECT_LT(peak_memory(b.memory).activations_bytes, peak_memory(a.memory).activations_bytes);
  EXPECT_GT(b.iteration_time_s, a.iteration_time_s);
  RecordProperty("activations_core_attn_GB", std::to_string(peak_memory(a.memory).activations_bytes / 1e9));
  RecordProperty("activations_core_attn_mlp_GB", std::to_string(peak_memory(b.memory).activations_bytes / 1e9));
}

TEST(SelectiveRecompute, MegatronsMoeModulesDropTheExpertActivations) {
  const char* moe = "scenarios/moe/mixtral-8x7b.yaml";
  const Scenario base = load(moe, {{"parallel.recompute", "selective"}});
  const Scenario act = load(moe, {{"parallel.recompute", "selective"}, {"parallel.recompute_modules", "[core_attn, moe_act]"}});
  const Scenario block = load(moe, {{"parallel.recompute", "selective"}, {"parallel.recompute_modules", "[core_attn, moe]"}});
  EXPECT_LT(saved_per_layer(act), saved_per_layer(base));
  EXPECT_LT(saved_per_layer(block), saved_per_layer(act));
  EXPECT_GT(recompute_time(act), recompute_time(base));
  EXPECT_GT(recompute_time(block), recompute_time(act));
}

// mla_up_proj (Megatron-Core): MLA's queries, keys and values — the up projections' outputs with
// their rotary embedding, which the attention core keeps — are dropped after the forward and
// recomputed from the latents the up projections keep: per layer the keeper gives up exactly
// tokens · (heads · (qk + rope) · 2 + heads · v) / t elements; the backward re-runs the two up
// projections (with their FP8 quantisation) and the rotary embedding.
TEST(SelectiveRecompute, MlaUpProjDropsTheQueriesKeysAndValuesAndRerunsTheUpProjections) {
  const char* v3 = "scenarios/moe/deepseek-v3.yaml";
  const std::vector<Override> layout = {{"cluster.gpus", "1024"},          {"parallel.tensor", "2"},
                                        {"parallel.pipeline", "8"},        {"parallel.expert", "64"}, {"parallel.expert_tensor", "1"},
                                        {"parallel.sequence_parallel", "true"}, {"parallel.recompute", "selective"},
                                        {"training.global_batch", "8192"}};
  std::vector<Override> up = layout;
  up.push_back({"parallel.recompute_modules", "[core_attn, mla_up_proj]"});
  const Scenario base = load(v3, layout), mla = load(v3, up);
  const double tokens = 4096, heads_per_rank = 128 / 2, bf16 = 2;
  const double qkv = tokens * heads_per_rank * ((128 + 64) * 2 + 128) * bf16;
  EXPECT_NEAR(saved_per_layer(base) - saved_per_layer(mla), qkv, 1.0);
  std::vector<std::string> rerun;
  for (const Op& op : layer_ops(mla.model, mla.plan, Pass::Recompute)) rerun.push_back(op.name);
  for (const char* name : {"mla.q_up", "mla.kv_up", "mla.q_up.cast_fp8", "mla.kv_up.cast_fp8", "rope"})
    EXPECT_NE(std::find(rerun.begin(), rerun.end(), name), rerun.end()) << name;
  EXPECT_GT(recompute_time(mla), recompute_time(base));
  // End to end (DeepSeek-V3 as NeMo lays it out on 1024 H100s): the peak falls by the layers in
  // flight times the Q, K, V they no longer keep, and the iteration pays for the re-runs.
  const Report a = run(v3, layout), b = run(v3, up);
  EXPECT_LT(peak_memory(b.memory).activations_bytes, peak_memory(a.memory).activations_bytes - 10 * qkv);
  EXPECT_GT(b.iteration_time_s, a.iteration_time_s);
  RecordProperty("peak_core_attn_GB", std::to_string(peak_memory(a.memory).total_bytes / 1e9));
  RecordProperty("peak_core_attn_mla_up_proj_GB", std::to_string(peak_memory(b.memory).total_bytes / 1e9));
}

TEST(SelectiveRecompute, TorchtitansOpLevelPolicyKeepsHalfTheMatmulOutputs) {
  // Llama 3 8B, FSDP over 8 GPUs, t 1, 8192 tokens: the layer's input, the attention output and
  // its log-sum-exp, half of the GEMM outputs (q + 2kv, h, 2·ffn, h).
  const std::vector<Override> fsdp = {{"cluster.gpus", "8"},          {"parallel.tensor", "1"},
                                      {"parallel.sequence_parallel", "false"}, {"parallel.tp_comm_overlap", "false"},
                                      {"parallel.overlap_param_gather", "false"}, {"parallel.zero_stage", "3"},
                                      {"training.global_batch", "16"}, {"training.micro_batch", "2"}};
  std::vector<Override> tt = fsdp;
  tt.push_back({"training.framework", "torchtitan"});
  const Scenario titan = load(kLlama8b, tt), megatron = load(kLlama8b, fsdp);
  const double h = 4096, q = 4096, kv = 1024, f = 14336, tokens = 2 * 8192, heads = 32;
  const double expected = tokens * (2 * (h + q + (q + 2 * kv + h + 2 * f + h) / 2) + 4 * heads);
  EXPECT_NEAR(saved_per_layer(titan), expected, 1.0);
  // Against Megatron's attention-core policy on the same plan: under half.
  EXPECT_LT(saved_per_layer(titan), 0.5 * saved_per_layer(megatron));
  RecordProperty("bytes_per_token_layer_torchtitan", std::to_string(saved_per_layer(titan) / tokens));
  RecordProperty("bytes_per_token_layer_megatron", std::to_string(saved_per_layer(megatron) / tokens));
  // It re-runs the element-wise ops and half the matmuls: more than the attention core (nothing
  // with flash attention), less than the whole forward.
  ParallelPlan full = titan.plan;
  full.recompute = Recompute::Full;
  double full_s = 0;
  for (const Op& op : layer_ops(titan.model, full, Pass::Recompute)) full_s += op_time_s(op, titan.cluster.gpu);
  EXPECT_GT(recompute_time(titan), 0.3 * full_s);
  EXPECT_LT(recompute_time(titan), 0.8 * full_s);
  // End to end: the peak falls by what the layers no longer keep.
  const Report rt = run(kLlama8b, tt), rm = run(kLlama8b, fsdp);
  // (32 layers keep less; the layer being recomputed holds its whole activations either way. The
  // eager loss's 12 bytes per logit come at a moment of their own, where Megatron's 8 are held
  // beside the recomputation: model/memory.hpp head_loss_transient_bytes.)
  ParallelPlan none = titan.plan;
  none.recompute = Recompute::None;
  const double recomputed = saved_activation_bytes(titan.model, none) - saved_per_layer(titan);
  const double logits = tokens * 128256;
  EXPECT_NEAR(peak_memory(rt.memory).activations_bytes,
              peak_memory(rm.memory).activations_bytes - 31 * (saved_per_layer(megatron) - saved_per_layer(titan)) - recomputed -
                  8 * logits + std::max(recomputed, 12 * logits),
              1e3);
  RecordProperty("peak_torchtitan_GB", std::to_string(peak_memory(rt.memory).total_bytes / 1e9));
  RecordProperty("peak_megatron_policy_GB", std::to_string(peak_memory(rm.memory).total_bytes / 1e9));
}

TEST(SelectiveRecompute, ModulesAFrameworkOrModelLacksAreRefused) {
  expect_refused([] { load(kLlama8b, {{"parallel.recompute_modules", "[core_attn, mlpp]"}}); }, "parallel.recompute_modules[1]",
                 "unknown recompute module");
  expect_refused([] { load(kLlama8b, {{"parallel.recompute", "full"}, {"parallel.recompute_modules", "[mlp]"}}); },
                 "parallel.recompute_modules", "needs parallel.recompute: selective");
  expect_refused(
      [] {
        load(kLlama8b, {{"training.framework", "torchtitan"}, {"parallel.tp_comm_overlap", "false"}, {"parallel.recompute_modules", "[mlp]"}});
      },
      "parallel.recompute_modules", "op-level");
  expect_refused([] { load(kLlama8b, {{"parallel.recompute_modules", "[moe_act]"}}); }, "parallel.recompute_modules", "mixture-of-experts");
  expect_refused([] { load(kLlama8b, {{"parallel.recompute_modules", "[]"}}); }, "parallel.recompute_modules", "empty");
  expect_refused([] { load(kLlama8b, {{"parallel.recompute_modules", "[core_attn, mla_up_proj]"}}); }, "parallel.recompute_modules",
                 "needs model.mla");
}

// --- Memory as frameworks allocate it: the runtime's own memory and the allocator ----------------

TEST(RuntimeMemory, CudaContextAndNcclBuffersPerCommunicator) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const double ring = 16 * (4 + 0.5 + 4.69) * kMiB;
  // Llama 3 8B at t 4 (sequence parallel), d 128: the context and two communicators (tensor, data).
  const Scenario sc = load(kLlama8b, {});
  EXPECT_TRUE(sc.plan.gpu_runtime_memory);
  EXPECT_NEAR(runtime_memory_bytes(sc.plan), 287e6 + 2 * ring, 1.0);
  // A pipeline adds its neighbours' point-to-point buffers and the model-parallel group.
  const Scenario pp = load(kLlama8b, {{"parallel.pipeline", "4"}});
  EXPECT_NEAR(runtime_memory_bytes(pp.plan) - runtime_memory_bytes(sc.plan), ring + 16 * kMiB, 1.0);
  // Tensor-parallel all-reduces of 8 GPUs on NVLS nodes (dgx-h100) hold NVLS buffers too.
  const Scenario t8 = load(kLlama8b, {{"parallel.tensor", "8"}, {"parallel.sequence_parallel", "false"}, {"parallel.tp_comm_overlap", "false"}});
  EXPECT_NEAR(runtime_memory_bytes(t8.plan) - runtime_memory_bytes(sc.plan), 256 * kMiB, 1.0);
  // The report counts it on every rank; the CPU back end has none.
  const Report r = run(kLlama8b, {});
  EXPECT_NEAR(peak_memory(r.memory).runtime_bytes, runtime_memory_bytes(sc.plan), 1.0);
  EXPECT_EQ(runtime_memory_bytes(load("scenarios/tiny-gpt-cpu.yaml", {}).plan), 0);
}

TEST(RuntimeMemory, WithoutExpandableSegmentsTheAllocatorReservesWhatFragments) {
  const Report with = run(kLlama8b, {}), without = run(kLlama8b, {{"training.expandable_segments", "false"}});
  const MemoryBreakdown a = peak_memory(with.memory), b = peak_memory(without.memory);
  EXPECT_EQ(a.allocator_bytes, 0);
  // 34 % of the peak reserved memory (facts §8), on what the step allocates and frees.
  EXPECT_NEAR(b.allocator_bytes / (b.allocator_bytes + b.activations_bytes + b.buffers_bytes), 0.34, 1e-9);
  EXPECT_NEAR(b.total_bytes - a.total_bytes, b.allocator_bytes, 1.0);
  EXPECT_GT(without.peak_memory_bytes, with.peak_memory_bytes);
  expect_refused([] { load(kLlama8b, {{"training.expandable_segments", "sometimes"}}); }, "training.expandable_segments", "");
}

// --- Per-rank columns split by group ---------------------------------------------------------------

TEST(PerRankColumns, ContextAndExpertCollectivesHaveTheirOwnColumns) {
  for (const char* file : {"scenarios/moe/mixtral-8x7b.yaml", "scenarios/long-context/llama2-7b-128k.yaml"}) {
    const Report r = run(file, {});
    ASSERT_FALSE(r.ranks.empty()) << file;
    const double k = static_cast<double>(r.ranks.size());
    double tp = 0, cp = 0, ep = 0;
    for (const RankBreakdown& rb : r.ranks) tp += rb.exposed_tp_s / k, cp += rb.exposed_cp_s / k, ep += rb.exposed_ep_s / k;
    // The report's classes are the ranks' columns averaged.
    EXPECT_NEAR(r.exposed_comm_s.at("tp"), tp, 1e-12) << file;
    const bool moe = std::string(file).find("moe") != std::string::npos;
    const char* own = moe ? "ep" : "cp";
    EXPECT_NEAR(r.exposed_comm_s.at(own), moe ? ep : cp, 1e-12) << file;
    EXPECT_GT(moe ? ep : cp, 0) << file;
    EXPECT_EQ(moe ? cp : ep, 0) << file;
    // The JSON round trip keeps them.
    const Report back = report_from_json(report_to_json(r), "test");
    EXPECT_NEAR(back.ranks[0].exposed_ep_s + back.ranks[0].exposed_cp_s, r.ranks[0].exposed_ep_s + r.ranks[0].exposed_cp_s, 1e-12) << file;
  }
}

// --- Long context: the attention kernel the framework runs ----------------------------------------

TEST(CudnnAttention, ReproducesItsTableAndIsWhatMegatronRuns) {
  // modern-training-facts.md §3, cuDNN's fused attention on H100, d_h 128, s = 512 … 16k.
  const GpuSpec gpu = load(kLlama8b, {}).cluster.gpu;
  const int64_t seqs[] = {512, 1024, 2048, 4096, 8192, 16384};
  const double fwd[] = {497, 574, 617, 609, 600, 595}, causal[] = {315, 410, 484, 518, 529, 539}, bwd[] = {305, 408, 465, 499, 518, 516};
  for (int i = 0; i < 6; ++i) {
    auto tf = [&](bool c, bool b) { return attention_efficiency(gpu, seqs[i], 128, c, b, AttentionKernel::Cudnn) * gpu.peak_flops / 1e12; };
    EXPECT_NEAR(tf(false, false) / fwd[i], 1.0, 0.05) << seqs[i];
    EXPECT_NEAR(tf(true, false) / causal[i], 1.0, 0.05) << seqs[i];
    EXPECT_NEAR(tf(false, true) / bwd[i], 1.0, 0.05) << seqs[i];
  }
  // The flash curve (FlashAttention-3, training.attention_kernel flash): faster causal kernels
  // at long sequences (616 against 539 TFLOP/s at 16k).
  EXPECT_GT(attention_efficiency(gpu, 16384, 128, true, false, AttentionKernel::Flash),
            1.1 * attention_efficiency(gpu, 16384, 128, true, false, AttentionKernel::Cudnn));
  // Megatron's layer runs cuDNN's kernel (named by ptdp cost), torchtitan's FlashAttention-2.
  const Scenario megatron = load(kLlama8b, {});
  const std::vector<Op> megatron_ops = layer_ops(megatron.model, megatron.plan, Pass::Forward);
  const Op& flash = find_op(megatron_ops, "attn.flash");
  EXPECT_EQ(flash.attention_kernel, AttentionKernel::Cudnn);
  EXPECT_NE(flash.kernel.find("cuDNN"), std::string::npos);
  const Scenario titan = load(kLlama8b, {{"training.framework", "torchtitan_compiled"}});
  const std::vector<Op> titan_ops = layer_ops(titan.model, titan.plan, Pass::Forward);
  EXPECT_EQ(find_op(titan_ops, "attn.flash").attention_kernel, AttentionKernel::Flash2);
  EXPECT_NE(find_op(titan_ops, "attn.flash").kernel.find("FlashAttention-2"), std::string::npos);
  // A GPU without a cuDNN or FA2 table (dgx-a100: its flash curve is FlashAttention-2's) runs the
  // flash curve.
  const GpuSpec a100 = load(kLlama8b, {{"cluster.topology", "dgx-a100"}}).cluster.gpu;
  for (AttentionKernel k : {AttentionKernel::Cudnn, AttentionKernel::Flash2})
    EXPECT_EQ(attention_efficiency(a100, 8192, 128, true, true, k), attention_efficiency(a100, 8192, 128, true, true, AttentionKernel::Flash));
}

TEST(FlashAttention2, ReproducesItsH100TablesAndIsWhatThePyTorchFrameworksRun) {
  // kernel-and-framework-facts.md §7: FlashAttention-2 on H100, forward (d_h 64/128, causal and
  // not) and forward+backward (FA2 paper), s = 512 … 16k; the backward is 2.5× the forward's FLOPs.
  const GpuSpec gpu = load(kLlama8b, {}).cluster.gpu;
  const int64_t seqs[] = {512, 1024, 2048, 4096, 8192, 16384};
  struct Row { int64_t dh; bool causal; double fwd[6], both[6]; };
  const Row rows[] = {{64, false, {282, 306, 318, 321, 322, 324}, {215, 254, 274, 288, 294, 296}},
                      {64, true, {180, 229, 262, 284, 295, 299}, {141, 192, 232, 257, 273, 284}},
                      {128, false, {309, 350, 362, 366, 370, 370}, {248, 294, 320, 326, 335, 338}},
                      {128, true, {191, 260, 298, 319, 333, 335}, {163, 221, 265, 294, 308, 328}}};
  for (const Row& r : rows)
    for (int i = 0; i < 6; ++i) {
      auto tf = [&](bool b) { return attention_efficiency(gpu, seqs[i], r.dh, r.causal, b, AttentionKernel::Flash2) * gpu.peak_flops / 1e12; };
      EXPECT_NEAR(tf(false) / r.fwd[i], 1.0, 0.08) << r.dh << " " << r.causal << " " << seqs[i];
      EXPECT_NEAR(3.5 / (1 / tf(false) + 2.5 / tf(true)) / r.both[i], 1.0, 0.06) << r.dh << " " << r.causal << " " << seqs[i];
    }
  // About a third of H100's peak at long sequences ("FA2 only 35 %"), far below FlashAttention-3.
  EXPECT_NEAR(attention_efficiency(gpu, 16384, 128, false, false, AttentionKernel::Flash2), 0.36, 0.02);
  // The PyTorch frameworks run it by default: a torchtitan 8k layer (compiled: the preset's async TP)'s attention takes 1.5× or more
  // the time under FA2 as under the flash curve; the key picks another kernel and moves the
  // prediction (flash2 < cudnn < flash in time at 8k causal).
  auto iteration = [](const char* framework, const char* kernel) {
    return run(kLlama8b, {{"training.framework", framework}, {"training.attention_kernel", kernel}}).iteration_time_s;
  };
  EXPECT_EQ(iteration("torchtitan_compiled", "auto"), iteration("torchtitan_compiled", "flash2"));
  EXPECT_EQ(iteration("megatron", "auto"), iteration("megatron", "cudnn"));
  EXPECT_GT(iteration("torchtitan_compiled", "flash2"), 1.03 * iteration("torchtitan_compiled", "cudnn"));
  EXPECT_GT(iteration("torchtitan_compiled", "cudnn"), iteration("torchtitan_compiled", "flash"));
  EXPECT_GT(iteration("megatron", "flash2"), 1.03 * iteration("megatron", "auto"));
  const Scenario titan = load(kLlama8b, {{"training.framework", "torchtitan_compiled"}});
  const Op fa2 = find_op(layer_ops(titan.model, titan.plan, Pass::Forward), "attn.flash");
  Scenario fa3_plan = titan;
  fa3_plan.plan.attention_kernel = AttentionKernel::Flash;
  const Op fa3 = find_op(layer_ops(fa3_plan.model, fa3_plan.plan, Pass::Forward), "attn.flash");
  EXPECT_GT(op_time_s(fa2, titan.cluster.gpu), 1.5 * op_time_s(fa3, titan.cluster.gpu));
  // Blackwell runs FA2 through its older tensor-core instructions: Azure's 373.9 against H100's
  // 327.9 TFLOP/s at s 8192.
  const GpuSpec gb200 = load(kLlama8b, {{"cluster.topology", "gb200-nvl72"}}).cluster.gpu;
  EXPECT_NEAR(attention_efficiency(gb200, 8192, 128, false, false, AttentionKernel::Flash2) * gb200.peak_flops /
                  (attention_efficiency(gpu, 8192, 128, false, false, AttentionKernel::Flash2) * gpu.peak_flops),
              373.9 / 327.9, 0.01);
}

TEST(FlashAttention2, ABadKernelNameIsRefusedAtItsLine) {
  const std::string dir = testing::TempDir();
  const std::string file = dir + "/bad-kernel.yaml";
  {
    std::ifstream in(kRoot + "/" + kLlama8b);
    std::ofstream out(file);
    out << in.rdbuf() << "  attention_kernel: fa4\n";  // line 36, the training section's
  }
  try {
    load_scenario(file);
    FAIL() << "fa4 accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("bad-kernel.yaml:36:21"), std::string::npos) << what;
    EXPECT_NE(what.find("training.attention_kernel"), std::string::npos) << what;
    EXPECT_NE(what.find("flash2"), std::string::npos) << what;
  }
}

TEST(CudnnAttention, LongContextRunsSlowByWhatTheKernelLoses) {
  // NeMo's 128k row (TP 4, CP 4): attention dominates, so the kernel moves the iteration.
  const char* lc = "scenarios/long-context/llama2-7b-128k.yaml";
  const Report cudnn = run(lc, {});
  Scenario sc = load(lc, {});
  sc.cluster.gpu.cudnn_attention_fwd_max_efficiency = 0;  // the flash curve
  const Report flash = simulate(input_of(sc), make_schedule(sc.plan), Fidelity::Analytic, false).report;
  EXPECT_GT(cudnn.iteration_time_s, 1.08 * flash.iteration_time_s);
  RecordProperty("tflops_cudnn", std::to_string(cudnn.tflops_per_gpu));
  RecordProperty("tflops_flash", std::to_string(flash.tflops_per_gpu));
}


// --- Bad input of the issue: each exits 2 naming the key -----------------------------------------

TEST(BadInput, AnOddHeadWidthNamesTheKeyThatSetIt) {
  expect_refused([] { load(kLlama8b, {{"model.hidden_size", "4000"}}); }, "model.hidden_size", "odd width");
  expect_refused([] { load(kLlama8b, {{"model.head_dim", "127"}}); }, "model.head_dim", "even");
  expect_refused([] { load(kLlama8b, {{"cluster.gpu_power_w", "900W"}}); }, "cluster.gpu_power_w", "TDP");
  expect_refused([] { load(kLlama8b, {{"parallel.sequence_parallel", "false"}}); }, "parallel.tp_comm_overlap", "sequence_parallel");
  expect_refused([] { load(kLlama8b, {{"training.precision", "fp8"}, {"training.fp8_recipe", "rowwise"}}); }, "training.fp8_recipe", "rowwise");
}

}  // namespace
}  // namespace ptdp
