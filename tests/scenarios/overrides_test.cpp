// `--set key=value` overrides: parsing, application to any scenario or topology key, and errors
// that name the override instead of a file position.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/error.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp {
namespace {

constexpr const char* kScenario =
    "model: {name: gpt-1.7B, num_layers: 24, hidden_size: 2304, num_attention_heads: 24, seq_length: 2048, vocab_size: 51200}\n"
    "cluster: {topology: dgx-a100, gpus: 32}\n"
    "parallel: {tensor: 1, pipeline: 1, schedule: 1f1b, recompute: full}\n"
    "training: {global_batch: 512, micro_batch: 16, precision: fp16}\n";

Scenario load(const std::vector<std::string>& sets) {
  return load_scenario_text(kScenario, "o.yaml", parse_overrides(sets));
}

std::string error_of(const std::vector<std::string>& sets) {
  try {
    load(sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ParseOverride, SplitsAtTheFirstEquals) {
  const Override o = parse_override("parallel.tensor=4");
  EXPECT_EQ(o.key, "parallel.tensor");
  EXPECT_EQ(o.value, "4");
  EXPECT_EQ(parse_override("model.name=a=b").value, "a=b");
  EXPECT_EQ(parse_override("model.name=").value, "");
  for (const char* bad : {"parallel.tensor", "=4", ""}) {
    try {
      parse_override(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("key=value"), std::string::npos) << e.what();
    }
  }
}

TEST(Overrides, ApplyToAnyScenarioKeyAndRecomputeData) {
  const Scenario sc = load({"parallel.tensor=2", "parallel.pipeline=4", "training.micro_batch=1", "model.ffn_hidden_size=4608"});
  EXPECT_EQ(sc.plan.tensor, 2);
  EXPECT_EQ(sc.plan.pipeline, 4);
  EXPECT_EQ(sc.plan.data, 4);  // 32 / (2·4)
  EXPECT_EQ(sc.plan.num_microbatches(), 128);
  EXPECT_EQ(sc.model.ffn(), 4608);
  const auto j = nlohmann::json::parse(sc.config_json);
  EXPECT_EQ(j["overrides"]["parallel.tensor"], "2");
  EXPECT_EQ(j["parallel"]["data"], 4);
  // Later overrides of the same key win.
  EXPECT_EQ(load({"parallel.tensor=2", "parallel.tensor=4"}).plan.tensor, 4);
}

TEST(Overrides, UnknownKeySuggestsTheClosest) {
  EXPECT_EQ(error_of({"parallel.tensr=2"}), "--set parallel.tensr=2: parallel.tensr: unknown key (did you mean 'parallel.tensor'?)");
  EXPECT_NE(error_of({"training.microbatch=2"}).find("did you mean 'training.micro_batch'"), std::string::npos);
}

TEST(Overrides, BadValuesNameTheOverride) {
  EXPECT_EQ(error_of({"parallel.tensor=abc"}), "--set parallel.tensor=abc: parallel.tensor: expected an integer (got 'abc')");
  EXPECT_EQ(error_of({"parallel.tensor=5", "cluster.gpus=40"}),
            "--set parallel.tensor=5: parallel.tensor: 5 does not divide num_attention_heads (24)");
  EXPECT_NE(error_of({"parallel.schedule=interleave"}).find("--set parallel.schedule=interleave: parallel.schedule: "),
            std::string::npos);
}

TEST(Overrides, TopologyKeysCanBeOverridden) {
  const Scenario sc = load({"cluster.topology.network.nic.bandwidth=50GBps", "cluster.topology.gpu.memory=40GB"});
  EXPECT_DOUBLE_EQ(sc.cluster.nic.bw_Bps, 50e9);
  EXPECT_DOUBLE_EQ(sc.cluster.gpu.memory_bytes, 40e9);
  EXPECT_DOUBLE_EQ(sc.cluster.nvlink.bw_Bps, 300e9);  // the rest of the preset is kept
  EXPECT_EQ(load({"cluster.topology=dgx-h100"}).cluster.gpu.peak_flops, 989e12);
}

TEST(Overrides, BadTopologyValueNamesTheKeyAndTheOverride) {
  EXPECT_EQ(error_of({"cluster.topology.node.nvlink.bandwidth=0GBps"}),
            "--set cluster.topology.node.nvlink.bandwidth=0GBps: cluster.topology.node.nvlink.bandwidth: must be positive (got 0)");
  EXPECT_NE(error_of({"cluster.topology.node.nvlink.bandwidth=fast"}).find("cluster.topology.node.nvlink.bandwidth: "),
            std::string::npos);
}

TEST(Overrides, UnknownTopologyKeyNamesTheOverride) {
  const std::string e = error_of({"cluster.topology.node.nvlnk.bandwidth=1GBps"});
  EXPECT_NE(e.find("cluster.topology.node.nvlnk: unknown key (did you mean 'nvlink'?)"), std::string::npos) << e;
  EXPECT_EQ(e.rfind("--set cluster.topology.node.nvlnk.bandwidth=1GBps: ", 0), 0u) << e;
}

TEST(Overrides, EveryScenarioKeyIsAcceptedBySet) {
  const auto& keys = scenario_keys();
  for (const char* k : {"parallel.tensor", "parallel.data", "parallel.virtual_stages", "parallel.microbatch_group",
                        "training.train_tokens", "model.ffn_hidden_size", "cluster.topology.node.nvlink.bandwidth"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

TEST(Overrides, VocabularyPaddingKeysMoveThePaddedSizeAndAreChecked) {
  EXPECT_EQ(load({}).model.padded_vocab(4), 51200);
  EXPECT_EQ(load({"model.vocab_size=50257"}).model.padded_vocab(4), 50688);  // a multiple of 128 × 4
  EXPECT_EQ(load({"model.vocab_size=50257", "model.vocab_divisible_by=64"}).model.padded_vocab(4), 50432);
  EXPECT_EQ(load({"model.padded_vocab_size=65536"}).model.padded_vocab(4), 65536);
  EXPECT_NE(error_of({"model.padded_vocab_size=1000"}).find("model.padded_vocab_size: must be 0 (computed) or at least model.vocab_size (51200)"),
            std::string::npos);
  EXPECT_NE(error_of({"model.vocab_divisible_by=0"}).find("model.vocab_divisible_by: must be in [1, 1000000]"), std::string::npos);
  EXPECT_NE(error_of({"model.padded_vocab_size=65537", "parallel.tensor=4"}).find("model.padded_vocab_size: 65537 is not divisible by parallel.tensor (4)"),
            std::string::npos);
}

}  // namespace
}  // namespace ptdp
