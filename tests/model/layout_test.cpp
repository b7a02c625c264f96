// Megatron-Core's pipeline layouts (model/layout.hpp): the syntax as Megatron documents it, the
// errors (each naming its position in the string), and what a layout does to the partition: the
// layers of each stage, the MTP modules on a stage of their own with their parameters, and the
// costed stage times.
#include <gtest/gtest.h>

#include <numeric>

#include "core/error.hpp"
#include "model/cost.hpp"
#include "model/layout.hpp"
#include "model/memory.hpp"
#include "model/partition.hpp"
#include "model/units.hpp"

namespace ptdp {
namespace {

std::vector<int64_t> layers_of(const std::vector<LayoutStage>& stages) {
  std::vector<int64_t> out;
  for (const LayoutStage& s : stages) out.push_back(s.layers);
  return out;
}
std::vector<int64_t> mtp_of(const std::vector<LayoutStage>& stages) {
  std::vector<int64_t> out;
  for (const LayoutStage& s : stages) out.push_back(s.mtp);
  return out;
}

std::string refusal(const std::string& text) {
  try {
    parse_pipeline_layout(text, "parallel.pipeline_layout");
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.pipeline_layout"), std::string::npos) << e.what();
    return e.what();
  }
  ADD_FAILURE() << text << ": accepted";
  return "";
}

TEST(PipelineLayout, ReadsMegatronsSyntax) {
  // Megatron's example for DeepSeek-V3 (61 layers, PP 16 × VP 2): the MTP layer and the loss on
  // stages of their own; commas are ignored.
  const auto a = parse_pipeline_layout("Et*3|(tt|)*29,m|L", "k");
  ASSERT_EQ(a.size(), 32u);
  EXPECT_TRUE(a[0].embedding);
  EXPECT_EQ(a[0].layers, 3);
  for (size_t s = 1; s <= 29; ++s) EXPECT_EQ(a[s].layers, 2) << s;
  EXPECT_EQ(a[30].layers, 0);
  EXPECT_EQ(a[30].mtp, 1);
  EXPECT_FALSE(a[30].loss);
  EXPECT_TRUE(a[31].loss);
  EXPECT_EQ(a[31].layers + a[31].mtp, 0);
  const auto l = layers_of(a);
  EXPECT_EQ(std::accumulate(l.begin(), l.end(), int64_t{0}), 61);
  // Megatron-Bridge's recipe: MTP with the loss on the last stage.
  const auto b = parse_pipeline_layout("Et|(tt|)*30mL", "k");
  ASSERT_EQ(b.size(), 32u);
  EXPECT_EQ(b[0].layers, 1);
  EXPECT_EQ(b[31].mtp, 1);
  EXPECT_TRUE(b[31].loss);
  // Written back in the same syntax (repeated stages grouped), and read again to the same stages.
  EXPECT_EQ(format_pipeline_layout(layers_of(b), mtp_of(b)), "Et|(tt|)*30mL");
  const std::string a_text = format_pipeline_layout(layers_of(a), mtp_of(a));
  EXPECT_EQ(a_text, "Et*3|(tt|)*29m|L");
  EXPECT_EQ(layers_of(parse_pipeline_layout(a_text, "k")), layers_of(a));
  EXPECT_EQ(mtp_of(parse_pipeline_layout(a_text, "k")), mtp_of(a));
  // One stage holding everything.
  const auto one = parse_pipeline_layout("Et*4mL", "k");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(format_pipeline_layout(layers_of(one), mtp_of(one)), "Et*4mL");
}

TEST(PipelineLayout, EachMistakeNamesItsPositionInTheString) {
  EXPECT_NE(refusal("Et|tx|L").find("position 5 of \"Et|tx|L\": 'x' is not a layout symbol"), std::string::npos);
  EXPECT_NE(refusal("Et|(tt|*2|L").find("position 4 of \"Et|(tt|*2|L\": '(' is not closed"), std::string::npos);
  EXPECT_NE(refusal("Et|(tt|)|L").find("position 4 of \"Et|(tt|)|L\": a group (…) must be followed by *N"), std::string::npos);
  EXPECT_NE(refusal("Et|((t|)*2|)*2|L").find("position 5 of"), std::string::npos);
  EXPECT_NE(refusal("Et|t*|L").find("position 5 of \"Et|t*|L\": '*' must be followed by a repeat count"), std::string::npos);
  EXPECT_NE(refusal("*3Et|L").find("position 1 of \"*3Et|L\": '*' repeats nothing"), std::string::npos);
  EXPECT_NE(refusal("Et|t)|L").find("position 5 of \"Et|t)|L\": ')' closes no group"), std::string::npos);
  EXPECT_NE(refusal("Et|tE|L").find("position 5 of \"Et|tE|L\": E (the embedding) appears twice (first at position 1)"), std::string::npos);
  EXPECT_NE(refusal("t|Et|L").find("position 3 of \"t|Et|L\": E (the embedding) must open the first stage"), std::string::npos);
  EXPECT_NE(refusal("tE|L").find("position 2 of \"tE|L\": E (the embedding) must open the first stage"), std::string::npos);
  EXPECT_NE(refusal("Et|mt|L").find("position 5 of \"Et|mt|L\": a decoder layer after the multi-token-prediction layer at position 4"),
            std::string::npos);
  EXPECT_NE(refusal("Et|m|m|L").find("position 6 of \"Et|m|m|L\": multi-token-prediction layers in two stages (1 and 2)"),
            std::string::npos);
  EXPECT_NE(refusal("Et||tL").find("position 4 of \"Et||tL\": stage 1 holds nothing"), std::string::npos);
  EXPECT_NE(refusal("Et|tL|t").find("position 6 of \"Et|tL|t\": a stage after L"), std::string::npos);
  EXPECT_NE(refusal("Et|Lt").find("position 5 of \"Et|Lt\": 't' after L"), std::string::npos);
  EXPECT_NE(refusal("Et|t").find("no L: the loss must close the last stage"), std::string::npos);
  EXPECT_NE(refusal("t|tL").find("no E: the embedding must open the first stage"), std::string::npos);
  EXPECT_NE(refusal("Et|t|").find("stage 2 holds nothing"), std::string::npos);
  EXPECT_NE(refusal("Et|(t*1000|)*1000|L").find("position 4 of \"Et|(t*1000|)*1000|L\": expands to more than 100000 symbols"),
            std::string::npos);
  EXPECT_NE(refusal("Et*99999999|L").find("position 3 of \"Et*99999999|L\": repeat count too large"), std::string::npos);
  EXPECT_NE(refusal("").find("is empty"), std::string::npos);
}

// A small dense model with one MTP module, on p 4 × v 2 stages.
TransformerSpec mtp_model() {
  TransformerSpec m;
  m.num_layers = 6;
  m.hidden_size = 256;
  m.num_attention_heads = 4;
  m.ffn_hidden_size = 512;
  m.seq_length = 128;
  m.vocab_size = 1000;
  m.mlp = MlpKind::SwiGLU;
  m.normalization = NormKind::RMSNorm;
  m.tie_embeddings = false;
  m.mtp_layers = 1;
  return m;
}

ParallelPlan layout_plan(const std::string& text) {
  ParallelPlan plan;
  plan.pipeline = 4;
  plan.virtual_stages = 2;
  plan.schedule = ScheduleKind::Interleaved;
  plan.global_batch = 8;
  for (const LayoutStage& s : parse_pipeline_layout(text, "parallel.pipeline_layout")) {
    plan.layout_layers.push_back(s.layers);
    plan.layout_mtp.push_back(s.mtp);
  }
  return plan;
}

std::string partition_refusal(const TransformerSpec& m, const ParallelPlan& plan) {
  try {
    validate_partition(m, plan);
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.pipeline_layout"), std::string::npos) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

double flops_of(const std::vector<Op>& ops) {
  double f = 0;
  for (const Op& op : ops) f += op.flops;
  return f;
}

TEST(PipelineLayout, PlacesTheMtpModuleOnAStageOfItsOwn) {
  const TransformerSpec m = mtp_model();
  // The MTP layer and the loss alone: stages 6 and 7 hold no decoder layer.
  const ParallelPlan apart = layout_plan("Et|t|t|t|t|t|m|L");
  validate_partition(m, apart);
  EXPECT_EQ(stage_layers(m, apart), (std::vector<int64_t>{1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(apart.mtp_stage(), 6);
  EXPECT_TRUE(apart.mtp_apart());
  // The usual place: with the loss on the last stage.
  const ParallelPlan together = layout_plan("E|t|t|t|t|t|t|mL");
  validate_partition(m, together);
  EXPECT_EQ(stage_layers(m, together), (std::vector<int64_t>{0, 1, 1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(together.mtp_stage(), 7);
  EXPECT_FALSE(together.mtp_apart());

  // Parameters: the MTP stage holds the module (its norms, 2h → h projection and layer: one
  // TP rank = all of it here), the last stage the final norm (h) and the untied output layer
  // (the vocabulary padded to 1024 × h); every parameter is on exactly one stage (the stages hold the
  // padded vocabulary, parameter_count the model's).
  const auto sp = stage_parameters_all(m, apart);
  EXPECT_TRUE(sp[6].has_mtp);
  EXPECT_FALSE(sp[6].has_head);
  EXPECT_DOUBLE_EQ(sp[6].total, mtp_parameter_count(m));
  EXPECT_DOUBLE_EQ(sp[7].total, 256.0 + 1024.0 * 256.0);
  double sum = 0;
  for (const auto& s : sp) sum += s.total;
  EXPECT_DOUBLE_EQ(sum, parameter_count(m) + 2 * 24.0 * 256.0);  // + the padding (1000 → 1024) of the embedding and output layer
  const auto sp_together = stage_parameters_all(m, together);
  EXPECT_FALSE(sp_together[7].has_mtp);
  // Together on the last stage the modules read the word embedding there: a copy of it too
  // (Megatron-Core's), summed with the first stage's at REDUCE_GRAD.
  EXPECT_DOUBLE_EQ(sp_together[7].total, mtp_parameter_count(m) + 256.0 + 2 * 1024.0 * 256.0);
  EXPECT_EQ(sp_together[7].tied_with_stage, 0);
  EXPECT_EQ(sp[7].tied_with_stage, -1);
  EXPECT_DOUBLE_EQ(sp_together[0].total, 1024.0 * 256.0);  // the embedding alone

  // Work: the MTP stage runs the module's lookup, projection, layer and norm; its logits and loss
  // stay with the output layer on the last stage. Split or not, the same FLOPs and time.
  for (Pass pass : {Pass::Forward, Pass::Backward}) {
    EXPECT_GT(flops_of(mtp_ops(m, apart, pass)), 0);
    EXPECT_TRUE(mtp_ops(m, together, pass).empty());
    EXPECT_NEAR(flops_of(mtp_ops(m, apart, pass)) + flops_of(head_ops(m, apart, pass)), flops_of(head_ops(m, together, pass)),
                1e-9 * flops_of(head_ops(m, together, pass)));
  }
  // The MTP module's logits: 2·b·s·h·V forward on the last stage in both placements.
  const double logits = 2.0 * 1 * 128 * 256 * 1024;
  double head_only = 0;
  for (const Op& op : head_ops(m, apart, Pass::Forward)) head_only += op.flops;
  EXPECT_NEAR(head_only, 2 * logits, 0.05 * logits);  // the main model's and the MTP module's (+ the softmax's few flops)
  GpuSpec gpu;
  const auto t_apart = stage_compute_times_s(m, apart, gpu, stage_layers(m, apart));
  const auto t_together = stage_compute_times_s(m, together, gpu, stage_layers(m, together));
  const double sum_apart = std::accumulate(t_apart.begin(), t_apart.end(), 0.0);
  EXPECT_NEAR(sum_apart, std::accumulate(t_together.begin(), t_together.end(), 0.0), 1e-9 * sum_apart);
  EXPECT_LT(t_apart[7], t_together[7]);  // the last stage sheds the module's layer
  EXPECT_GT(t_apart[6], 0);
  // Memory: the rank holding the MTP stage (stage 6 on rank 2) keeps the module's activations.
  EXPECT_GT(mtp_activation_bytes(m, apart), 0);
  EXPECT_EQ(mtp_activation_bytes(m, together), 0);
}

TEST(PipelineLayout, ALayoutThatDoesNotFitThePlanIsOneErrorNamingTheKey) {
  const TransformerSpec m = mtp_model();
  EXPECT_NE(partition_refusal(m, layout_plan("Et|t|t|t|t|t|mL")).find("has 7 stages, expected one per stage: pipeline × virtual_stages (4 × 2 = 8)"),
            std::string::npos);
  EXPECT_NE(partition_refusal(m, layout_plan("Et|t|t|t|t|t|t|mL")).find("places 7 decoder layers (t) but num_layers is 6"),
            std::string::npos);
  EXPECT_NE(partition_refusal(m, layout_plan("E|t|t|t|t|t|t|L")).find("places 0 multi-token-prediction layers (m) but model.mtp_layers is 1"),
            std::string::npos);
  ParallelPlan both = layout_plan("Et|t|t|t|t|t|m|L");
  both.layers_per_stage = {1, 1, 1, 1, 1, 1, 0, 0};
  EXPECT_NE(partition_refusal(m, both).find("places every layer already; remove parallel.layers_per_stage"), std::string::npos);
  ParallelPlan balanced = layout_plan("Et|t|t|t|t|t|m|L");
  balanced.partition = Partition::Balanced;
  EXPECT_NE(partition_refusal(m, balanced).find("remove parallel.partition: balanced"), std::string::npos);
}

}  // namespace
}  // namespace ptdp
