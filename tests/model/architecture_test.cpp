// Architecture keys (GQA, SwiGLU, RMSNorm, untied embeddings) and uneven pipeline partitions in
// the model layer: parameter counts against published model sizes, FLOPs against a direct count
// of each GEMM, activation memory, costed operations, and the partition rules.
#include <gtest/gtest.h>

#include <numeric>

#include "core/error.hpp"
#include "model/cost.hpp"
#include "model/flops.hpp"
#include "model/memory.hpp"
#include "model/partition.hpp"
#include "model/plan.hpp"
#include "model/transformer.hpp"
#include "tests/model/models.hpp"

namespace ptdp {
namespace {

TransformerSpec llama(int64_t l, int64_t h, int64_t a, int64_t groups, int64_t ffn, int64_t V, int64_t s) {
  TransformerSpec m = test_models::gpt(l, h, a, s, V);
  m.num_query_groups = groups;
  m.ffn_hidden_size = ffn;
  m.mlp = MlpKind::SwiGLU;
  m.normalization = NormKind::RMSNorm;
  m.tie_embeddings = false;
  m.attention = AttentionKind::Flash;
  EXPECT_FALSE(m.has_bias());           // Llama-style: no biases ...
  EXPECT_EQ(m.dropout_rate(), 0.0);     // ... and no dropout by default
  m.bias = 0;                           // kept when a test switches the MLP to GELU
  return m;
}

// BLOOM-176B: GPT architecture, 70 layers, h 14336, 112 heads, 250 880-token vocabulary.
TransformerSpec bloom() { return test_models::gpt(70, 14336, 112, 2048, 250880); }

TEST(Architecture, PublishedModelSizesFromTheirShapes) {
  // Shapes from the Llama 2 and Llama 3 papers / model cards and BLOOM's; sizes as published.
  // (Llama-2 "7B" is 6.74B parameters: its name is rounded by 4%, so it is checked against 6.74B.)
  struct Row {
    const char* name;
    TransformerSpec spec;
    double billions;
  };
  const Row rows[] = {
      {"Llama-2 7B", llama(32, 4096, 32, 32, 11008, 32000, 4096), 6.74},
      {"Llama-2 13B", llama(40, 5120, 40, 40, 13824, 32000, 4096), 13},
      {"Llama-2 70B", llama(80, 8192, 64, 8, 28672, 32000, 4096), 70},
      {"Llama 3 8B", llama(32, 4096, 32, 8, 14336, 128256, 8192), 8},
      {"Llama 3 70B", llama(80, 8192, 64, 8, 28672, 128256, 8192), 70},
      {"Llama 3 405B", llama(126, 16384, 128, 8, 53248, 128256, 8192), 405},
      {"BLOOM-176B", bloom(), 176},
  };
  for (const Row& r : rows) {
    validate_model(r.spec);
    EXPECT_NEAR(parameter_count(r.spec) / 1e9 / r.billions, 1.0, 0.02) << r.name << ": " << parameter_count(r.spec) / 1e9;
  }
  // Without GQA, SwiGLU and untied embeddings Llama 3 8B would be another model: each key counts.
  TransformerSpec m = rows[3].spec;
  const double base = parameter_count(m);
  m.num_query_groups = 0;
  EXPECT_NEAR(parameter_count(m) - base, 32.0 * 2 * 4096 * (4096 - 1024), 1.0);
  m = rows[3].spec;
  m.tie_embeddings = true;
  EXPECT_NEAR(base - parameter_count(m), 128256.0 * 4096, 1.0);
  m = rows[3].spec;
  m.mlp = MlpKind::Gelu;
  m.position_embedding = PositionKind::Rope;  // a GELU model defaults to learned positions: keep rope, change the MLP only
  EXPECT_NEAR(base - parameter_count(m), 32.0 * (4096.0 * 14336), 1.0);
  m.position_embedding = PositionKind::Learned;  // learned positions add the [s, h] table
  EXPECT_NEAR(base - parameter_count(m), 32.0 * (4096.0 * 14336) - 8192.0 * 4096, 1.0);
  m = rows[3].spec;
  m.bias = 1;  // biases on QKV (h + 2kv), projection (h), gate and up (2 ffn), down (h)
  EXPECT_NEAR(parameter_count(m) - base, 32.0 * (4096 + 2 * 1024 + 4096 + 2 * 14336 + 4096), 1.0);
  m = rows[3].spec;
  m.normalization = NormKind::LayerNorm;
  EXPECT_NEAR(parameter_count(m) - base, (2 * 32 + 1) * 4096.0, 1.0);
}

TEST(Architecture, LayerFlopsCountEveryGemm) {
  const TransformerSpec m = llama(32, 4096, 32, 8, 14336, 128256, 8192);
  const double B = 2, s = 8192, h = 4096, kv = 1024, f = 14336;
  // Q h·h, K and V h·kv each, projection h·h, gate, up and down h·f each, QKᵀ and A·V s²h.
  const double want = 2 * B * s * (h * h + 2 * h * kv + h * h + 3 * h * f) + 4 * B * s * s * h;
  EXPECT_NEAR(layer_forward_flops(m, 2) / want, 1.0, 1e-12);
  // The costed operations of a layer carry the same FLOPs (t = 1).
  ParallelPlan plan;
  plan.micro_batch = 2;
  double ops = 0, executed = 0;
  for (const Op& op : layer_ops(m, plan, Pass::Forward)) {
    ops += op.model_flops;
    executed += op.flops;
  }
  EXPECT_NEAR(ops / want, 1.0, 1e-12);
  // The causal flash kernel executes half of QKᵀ and A·V (FlashAttention-2 §4.1).
  EXPECT_NEAR(executed / (want - 2 * B * s * s * h), 1.0, 1e-12);
  // ... and shrink with GQA, grow with SwiGLU: the what-if knobs move the cost.
  TransformerSpec mha = m;
  mha.num_query_groups = 0;
  EXPECT_GT(layer_forward_flops(mha, 2), layer_forward_flops(m, 2));
  TransformerSpec gelu = m;
  gelu.mlp = MlpKind::Gelu;
  EXPECT_LT(layer_forward_flops(gelu, 2), layer_forward_flops(m, 2));
  // The paper's models keep Eq. 3 and say so.
  const TransformerSpec gpt = test_models::gpt3();
  const double l = 96, hh = 12288, V = 51200, S = 2048, BB = 1536;
  EXPECT_NEAR(iteration_flops(gpt, 1536, true) / (96 * BB * S * l * hh * hh * (1 + S / (6 * hh) + V / (16 * l * hh))), 1.0, 1e-12);
  EXPECT_EQ(flops_formula(gpt), "Eq. 3 (Narayanan et al. SC'21)");
  EXPECT_NE(flops_formula(m).find("GQA with 8 query groups, SwiGLU MLP (3 GEMMs), ffn 14336 ≠ 4h, untied embeddings, RMSNorm"),
            std::string::npos)
      << flops_formula(m);
  // A model whose every layer routes to experts has no dense MLP: the formula names the experts'
  // width, not the (unused) dense one; one dense layer brings it back.
  TransformerSpec moe = m;
  moe.moe.num_experts = 128, moe.moe.top_k = 8, moe.moe.expert_ffn_hidden_size = 768;
  EXPECT_EQ(flops_formula(moe).find("ffn 14336"), std::string::npos) << flops_formula(moe);
  EXPECT_NE(flops_formula(moe).find("expert ffn 768"), std::string::npos) << flops_formula(moe);
  moe.moe.first_dense_layers = 1;
  EXPECT_NE(flops_formula(moe).find("ffn 14336 ≠ 4h"), std::string::npos) << flops_formula(moe);
}

TEST(Architecture, ActivationMemoryFollowsGqaAndSwiglu) {
  TransformerSpec m = llama(32, 4096, 32, 32, 4 * 4096, 32000, 4096);
  m.mlp = MlpKind::Gelu;
  m.attention = AttentionKind::Unfused;  // Korthikanti's formula: unfused attention with dropout
  m.dropout = 0.1;
  ParallelPlan plan;
  plan.tensor = 8;
  plan.precision = Precision::BF16;
  const double sbh = 4096.0 * 1 * 4096, t = 8, a = 32, s = 4096, h = 4096;
  // Multi-head GELU with ffn = 4h: Korthikanti's sbh(10 + 24/t + 5as/(ht)).
  EXPECT_NEAR(layer_activation_bytes(m, plan) / (sbh * (10 + 24 / t + 5 * a * s / (h * t))), 1.0, 1e-12);
  m.num_query_groups = 8;  // K and V a quarter the size: 24 → 4 + 4/4 + 16 = 21
  EXPECT_NEAR(layer_activation_bytes(m, plan) / (sbh * (10 + 21 / t + 5 * a * s / (h * t))), 1.0, 1e-12);
  m.mlp = MlpKind::SwiGLU;  // gate, up and their product: 6·ffn/h = 24 → 4 + 1 + 24 = 29
  EXPECT_NEAR(layer_activation_bytes(m, plan) / (sbh * (10 + 29 / t + 5 * a * s / (h * t))), 1.0, 1e-12);
}

TEST(Architecture, UntiedOutputLayerLivesOnTheLastStageAndIsNotAllReduced) {
  TransformerSpec m = llama(32, 4096, 32, 8, 14336, 128256, 8192);
  ParallelPlan plan;
  plan.tensor = 8;
  plan.pipeline = 4;
  const double shard = 129024.0 * 4096 / 8;  // 128256 padded to a multiple of 128·8
  const double mid = rank_parameter_count(m, plan, 1);
  EXPECT_NEAR(rank_parameter_count(m, plan, 3) - mid, shard + 4096, 1.0);                       // output layer + final norm
  EXPECT_NEAR(rank_parameter_count(m, plan, 0) - mid, shard, 1.0);  // the embedding; rope has no position table
  plan.pipeline = 1;  // one stage holds both the embedding and the untied output layer
  // Every TP rank holds the replicated parts (norms, row-parallel biases) whole.
  EXPECT_NEAR(rank_parameter_count(m, plan, 0) * 8, parameter_count(m) + 2 * 768.0 * 4096 + 7 * (32 * (2 * 4096) + 4096), 1e3);
  m.position_embedding = PositionKind::Learned;  // a learned table: on the first stage, replicated over TP
  plan.pipeline = 4;
  EXPECT_NEAR(rank_parameter_count(m, plan, 0) - rank_parameter_count(m, plan, 1), shard + 8192.0 * 4096, 1.0);
}

ParallelPlan pipeline_plan(int64_t p, int64_t v = 1) {
  ParallelPlan plan;
  plan.tensor = 8;
  plan.pipeline = p;
  plan.virtual_stages = v;
  plan.schedule = v > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
  plan.global_batch = 1024;
  plan.data = 1;
  return plan;
}

TEST(Partition, ExplicitAndMegatronFirstLastCounts) {
  const TransformerSpec m = bloom();
  ParallelPlan plan = pipeline_plan(12);
  plan.first_stage_layers = 4;
  plan.last_stage_layers = 6;
  validate_partition(m, plan);
  EXPECT_EQ(stage_layers(m, plan), (std::vector<int64_t>{4, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6}));
  plan.first_stage_layers = 0;
  plan.last_stage_layers = 4;  // 66 over 11 stages
  EXPECT_EQ(stage_layers(m, plan), (std::vector<int64_t>{6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 4}));
  plan.last_stage_layers = 0;
  plan.layers_per_stage = {5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5};
  validate_partition(m, plan);
  EXPECT_EQ(stage_layers(m, plan), plan.layers_per_stage);
  // Rank r of an interleaved plan holds stages r, r + p, …
  ParallelPlan inter = pipeline_plan(4, 2);
  inter.layers_per_stage = {8, 9, 9, 9, 9, 9, 9, 8};
  validate_partition(m, inter);
  EXPECT_EQ(rank_chunk_layers(inter, stage_layers(m, inter), 0), (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(rank_chunk_layers(inter, stage_layers(m, inter), 3), (std::vector<int64_t>{9, 8}));
}

TEST(Partition, MegatronAccountsForEmbeddingAndLossInTheSplit) {
  // 70 layers + embedding + loss = 72 over 12 stages: 6 each, the ends one fewer; the slowest
  // stage (the last, with the 250 880-word output layer) gets faster.
  const TransformerSpec m = bloom();
  GpuSpec gpu;
  ParallelPlan plan = pipeline_plan(12);
  plan.account_embedding_in_split = plan.account_loss_in_split = true;
  validate_partition(m, plan);
  const auto layers = stage_layers(m, plan);
  EXPECT_EQ(layers, (std::vector<int64_t>{5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5}));
  ParallelPlan plain = pipeline_plan(12);
  plain.layers_per_stage = {6, 6, 6, 6, 6, 6, 6, 6, 6, 5, 5, 6};  // the ends not accounted for
  const auto t_plain = stage_compute_times_s(m, plain, gpu, plain.layers_per_stage);
  const auto t_acc = stage_compute_times_s(m, plan, gpu, layers);
  EXPECT_LT(*std::max_element(t_acc.begin(), t_acc.end()), *std::max_element(t_plain.begin(), t_plain.end()));
  // Only the loss: 71 does not divide by 12, refused naming the key.
  plan.account_embedding_in_split = false;
  try {
    validate_partition(m, plan);
    FAIL() << "71 over 12 stages was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.account_for_loss_in_pipeline_split"), std::string::npos) << e.what();
  }
}

TEST(Partition, BalancedEqualisesCostedStageTimes) {
  const TransformerSpec m = bloom();
  GpuSpec gpu;  // A100 defaults
  ParallelPlan plan = pipeline_plan(12);
  plan.partition = Partition::Balanced;
  validate_partition(m, plan);
  resolve_partition(m, plan, gpu);
  const auto layers = stage_layers(m, plan);
  ASSERT_EQ(layers.size(), 12u);
  EXPECT_EQ(std::accumulate(layers.begin(), layers.end(), int64_t{0}), 70);
  for (int64_t n : layers) EXPECT_GE(n, 1);
  const auto times = stage_compute_times_s(m, plan, gpu, layers);
  const double slowest = *std::max_element(times.begin(), times.end());
  // No other placement of 70 layers has a faster slowest stage: moving any layer off the
  // bottleneck stage onto any other makes that stage at least as slow.
  const double layer_s = stage_compute_times_s(m, plan, gpu, std::vector<int64_t>(12, 1))[5];
  for (size_t s = 0; s < times.size(); ++s) EXPECT_GT(times[s] + layer_s, slowest - 1e-12) << "stage " << s;
  // A 250 880-word output layer and loss weigh more than a layer: the last stage gets fewer.
  EXPECT_LT(layers.back(), layers[5]);
  // ... and the bottleneck is lower than with the Megatron-style even split of the same counts.
  ParallelPlan even = pipeline_plan(12);
  even.layers_per_stage = {6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5, 5};
  const auto even_times = stage_compute_times_s(m, even, gpu, even.layers_per_stage);
  EXPECT_LT(slowest, *std::max_element(even_times.begin(), even_times.end()));
  // Uniform where it divides: balanced moves layers off the heavy last stage (96 layers, p 8).
  TransformerSpec gpt3 = m;
  gpt3.num_layers = 96;
  ParallelPlan p8 = pipeline_plan(8);
  p8.partition = Partition::Balanced;
  resolve_partition(gpt3, p8, gpu);
  EXPECT_LT(stage_layers(gpt3, p8).back(), 12);
}

TEST(Partition, BadPartitionsAreConfigErrorsNamingTheKey) {
  const TransformerSpec m = bloom();
  auto key_of = [&](const ParallelPlan& plan) {
    try {
      validate_partition(m, plan);
    } catch (const ConfigError& e) {
      return e.key_path() + ": " + e.message();
    }
    return std::string();
  };
  ParallelPlan plan = pipeline_plan(12);
  EXPECT_EQ(key_of(plan), "parallel.pipeline: 12 does not divide num_layers (70) with partition: uniform; give "
                          "parallel.layers_per_stage, parallel.first_stage_layers / last_stage_layers, or parallel.partition: balanced");
  plan.layers_per_stage = std::vector<int64_t>(11, 7);
  EXPECT_EQ(key_of(plan).rfind("parallel.layers_per_stage: has 11 entries, expected one per stage: pipeline (12)", 0), 0u);
  ParallelPlan inter = pipeline_plan(4, 3);
  inter.layers_per_stage = {35, 35};
  EXPECT_EQ(key_of(inter).rfind("parallel.layers_per_stage: has 2 entries, expected one per stage: pipeline × virtual_stages "
                                "(4 × 3 = 12)", 0),
            0u)
      << key_of(inter);
  plan.layers_per_stage = {5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5};
  plan.first_stage_layers = 5;
  EXPECT_EQ(key_of(plan), "parallel.layers_per_stage: give either layers_per_stage or first/last_stage_layers, not both");
  plan.first_stage_layers = 0;
  plan.partition = Partition::Balanced;
  EXPECT_EQ(key_of(plan).rfind("parallel.partition: balanced computes the layers of each stage", 0), 0u);
}

}  // namespace
}  // namespace ptdp
