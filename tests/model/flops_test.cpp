// FLOP counts of paper Eq. 3 (with full recompute) and its no-recompute variant.
#include "model/flops.hpp"

#include <gtest/gtest.h>

#include "models.hpp"

namespace ptdp {
namespace {

TransformerSpec gpt3_175b() { return test_models::gpt3(); }

double eq3_recompute(double B, double s, double l, double h, double V) {
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}
double eq3_no_recompute(double B, double s, double l, double h, double V) {
  return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
}

TEST(IterationFlops, Gpt3WithRecomputeIsEquation3) {
  const TransformerSpec m = gpt3_175b();
  const double want = eq3_recompute(1536, 2048, 96, 12288, 51200);
  EXPECT_NEAR(iteration_flops(m, 1536, true) / want, 1.0, 1e-12);
  // Order of magnitude users know: ~4.5 EFLOP per iteration of 1536 × 2048 tokens.
  EXPECT_NEAR(want / 1e18, 4.5, 0.1);
}

TEST(IterationFlops, Gpt3WithoutRecomputeIsThreeQuartersOfTheLayerWork) {
  const TransformerSpec m = gpt3_175b();
  EXPECT_NEAR(iteration_flops(m, 1536, false) / eq3_no_recompute(1536, 2048, 96, 12288, 51200), 1.0, 1e-12);
}

TEST(IterationFlops, MatchesTheFormulasAcrossModelShapesAndBatches) {
  struct Case {
    int64_t l, h, a, s, V, B;
  };
  for (const Case& c : {Case{24, 2304, 24, 2048, 51200, 512}, Case{4, 4096, 128, 2048, 51200, 1},
                        Case{128, 25600, 160, 2048, 51200, 3072}, Case{12, 768, 12, 1024, 50257, 7}}) {
    TransformerSpec m;
    m.num_layers = c.l;
    m.hidden_size = c.h;
    m.num_attention_heads = c.a;
    m.seq_length = c.s;
    m.vocab_size = c.V;
    const double B = static_cast<double>(c.B), s = static_cast<double>(c.s), l = static_cast<double>(c.l),
                 h = static_cast<double>(c.h), V = static_cast<double>(c.V);
    EXPECT_NEAR(iteration_flops(m, c.B, true) / eq3_recompute(B, s, l, h, V), 1.0, 1e-12) << "h " << c.h;
    EXPECT_NEAR(iteration_flops(m, c.B, false) / eq3_no_recompute(B, s, l, h, V), 1.0, 1e-12) << "h " << c.h;
  }
}

TEST(LayerForwardFlops, Is24BshSquaredPlus4BsSquaredh) {
  const TransformerSpec m = gpt3_175b();
  const double B = 4, s = 2048, h = 12288;
  EXPECT_DOUBLE_EQ(layer_forward_flops(m, 4), 24 * B * s * h * h + 4 * B * s * s * h);
  EXPECT_DOUBLE_EQ(logits_flops(m, 4), 6 * B * s * h * 51200);
}

TEST(ReportedFlops, CountsRecomputationOnlyWhenItIsFull) {
  // The paper's TFLOP/s figures use Eq. 3 with full recompute; selective recompute is not credited.
  const TransformerSpec m = gpt3_175b();
  ParallelPlan plan;
  plan.global_batch = 1536;
  plan.recompute = Recompute::Full;
  EXPECT_DOUBLE_EQ(reported_iteration_flops(m, plan), iteration_flops(m, 1536, true));
  plan.recompute = Recompute::Selective;
  EXPECT_DOUBLE_EQ(reported_iteration_flops(m, plan), iteration_flops(m, 1536, false));
  plan.recompute = Recompute::None;
  EXPECT_DOUBLE_EQ(reported_iteration_flops(m, plan), iteration_flops(m, 1536, false));
}

TEST(ReportedFlops, CountTheLogitsOverThePaddedVocabulary) {
  // Megatron's TFLOP/s counts padded_vocab_size: Llama 3's 128 256 at t 8 pads to 129 024
  // (a multiple of 128 · 8); GPT-3's 51 200 is already padded.
  TransformerSpec m = gpt3_175b();
  m.vocab_size = 128256;
  ParallelPlan plan;
  plan.global_batch = 1536;
  plan.tensor = 8;
  const double B = 1536, s = 2048, h = 12288;
  EXPECT_DOUBLE_EQ(reported_iteration_flops(m, plan) - iteration_flops(m, 1536, false), 6 * B * s * h * (129024 - 128256));
  plan.tensor = 1;  // 128 256 = 1002 · 128: no padding
  EXPECT_DOUBLE_EQ(reported_iteration_flops(m, plan), iteration_flops(m, 1536, false));
  EXPECT_DOUBLE_EQ(reported_iteration_flops(gpt3_175b(), plan), iteration_flops(gpt3_175b(), 1536, false));
}

}  // namespace
}  // namespace ptdp
