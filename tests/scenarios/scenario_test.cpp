// Scenario loader: shipped scenarios load; every bad input is a ConfigError reading
// FILE:LINE:COL: key.path: what is wrong.
#include "scenarios/scenario.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.hpp"
#include "core/input_file.hpp"
#include "model/transformer.hpp"

namespace ptdp {
namespace {
namespace fs = std::filesystem;

// Line numbers below refer to this text (1-based): tensor is on line 12, its value at column 11.
constexpr const char* kBase =
    "model:\n"                      // 1
    "  name: gpt-1.7B\n"            // 2
    "  num_layers: 24\n"            // 3
    "  hidden_size: 2304\n"         // 4
    "  num_attention_heads: 24\n"   // 5
    "  seq_length: 2048\n"          // 6
    "  vocab_size: 51200\n"         // 7
    "cluster:\n"                    // 8
    "  topology: dgx-a100\n"        // 9
    "  gpus: 32\n"                  // 10
    "parallel:\n"                   // 11
    "  tensor: 1\n"                 // 12
    "  pipeline: 1\n"               // 13
    "  schedule: 1f1b\n"            // 14
    "  recompute: full\n"           // 15
    "training:\n"                   // 16
    "  global_batch: 512\n"         // 17
    "  micro_batch: 16\n"           // 18
    "  precision: fp16\n";          // 19

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

class ScenarioFile : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ptdp-scenario-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = (fs::path(dir_) / "s.yaml").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& text, const std::string& name = "s.yaml") {
    const std::string path = (fs::path(dir_) / name).string();
    std::ofstream(path) << text;
    return path;
  }
  // Loads `text` from a file and returns the error's full message ("" when it loads).
  std::string error_of(const std::string& text, const std::vector<Override>& overrides = {}) {
    write(text);
    try {
      load_scenario(path_, overrides);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  std::string path_;
  std::string dir_;
};

// ---- shipped scenarios ----

TEST(ShippedScenarios, EveryFileLoads) {
  int n = 0;
  for (const char* folder : {"scenarios", "scenarios/paper"}) {
    for (const auto& e : fs::directory_iterator(fs::path(PTDP_SOURCE_DIR) / folder)) {
      if (e.path().extension() != ".yaml") continue;
      SCOPED_TRACE(e.path().string());
      Scenario sc;
      EXPECT_NO_THROW(sc = load_scenario(e.path().string()));
      EXPECT_EQ(sc.plan.gpus(), sc.gpus);
      ++n;
    }
  }
  EXPECT_GE(n, 7);
}

TEST(ShippedScenarios, DefaultIsGpt3On1024A100s) {
  const Scenario sc = load_scenario("");
  EXPECT_EQ(sc.model.num_layers, 96);
  EXPECT_EQ(sc.model.hidden_size, 12288);
  EXPECT_EQ(sc.model.num_attention_heads, 96);
  EXPECT_EQ(sc.model.seq_length, 2048);
  EXPECT_EQ(sc.model.vocab_size, 51200);
  EXPECT_EQ(sc.gpus, 1024);
  EXPECT_EQ(sc.plan.global_batch, 1536);
  EXPECT_EQ(sc.plan.micro_batch, 1);
  EXPECT_EQ(sc.plan.tensor * sc.plan.pipeline * sc.plan.data, 1024);
  EXPECT_DOUBLE_EQ(sc.cluster.gpu.peak_flops, 312e12);
  ASSERT_TRUE(sc.train_tokens.has_value());
  EXPECT_DOUBLE_EQ(*sc.train_tokens, 300e9);
}

TEST(ShippedScenarios, PaperRowsMatchTable1) {
  struct Row {
    const char* file;
    double billions;
    int64_t t, gpus, B, b;
  };
  for (const Row& r : {Row{"gpt-1.7b.yaml", 1.7, 1, 32, 512, 16}, Row{"gpt-3.6b.yaml", 3.6, 2, 64, 512, 16},
                       Row{"gpt-7.5b.yaml", 7.5, 4, 128, 512, 16}, Row{"gpt-18.4b.yaml", 18.4, 8, 256, 1024, 8}}) {
    SCOPED_TRACE(r.file);
    const Scenario sc = load_scenario((fs::path(PTDP_SOURCE_DIR) / "scenarios/paper" / r.file).string());
    EXPECT_NEAR(parameter_count(sc.model) / 1e9, r.billions, 0.05);
    EXPECT_EQ(sc.plan.tensor, r.t);
    EXPECT_EQ(sc.plan.pipeline, 1);
    EXPECT_EQ(sc.gpus, r.gpus);
    EXPECT_EQ(sc.plan.global_batch, r.B);
    EXPECT_EQ(sc.plan.micro_batch, r.b);
    EXPECT_EQ(sc.plan.recompute, Recompute::Full);
  }
}

// ---- data parallel size ----

TEST_F(ScenarioFile, DataOmittedIsGpusOverTensorTimesPipeline) {
  Scenario sc = load_scenario(write(kBase));
  EXPECT_EQ(sc.plan.data, 32);
  EXPECT_EQ(sc.plan.num_microbatches(), 1);
  sc = load_scenario(write(replaced(replaced(kBase, "tensor: 1", "tensor: 2"), "pipeline: 1", "pipeline: 4")));
  EXPECT_EQ(sc.plan.data, 4);
  EXPECT_EQ(nlohmann::json::parse(sc.config_json)["parallel"]["data"], 4);
}

TEST_F(ScenarioFile, DataGivenAndDisagreeingIsAnError) {
  EXPECT_EQ(error_of(replaced(kBase, "  pipeline: 1\n", "  pipeline: 1\n  data: 32\n")), "");
  const std::string e = error_of(replaced(kBase, "  pipeline: 1\n", "  pipeline: 1\n  data: 16\n"));
  EXPECT_EQ(e.rfind(path_ + ":14:9: parallel.data: ", 0), 0u) << e;
  EXPECT_NE(e.find("expected data 32 (got 16)"), std::string::npos) << e;
}

// ---- located errors ----

TEST_F(ScenarioFile, WrongTypedValue) {
  EXPECT_EQ(error_of(replaced(kBase, "tensor: 1", "tensor: abc")),
            path_ + ":12:11: parallel.tensor: expected an integer (got 'abc')");
  EXPECT_NE(error_of(replaced(kBase, "tensor: 1", "tensor: 2.5")).find(":12:11: parallel.tensor: expected an integer"),
            std::string::npos);
  EXPECT_NE(error_of(replaced(kBase, "tensor: 1", "tensor: [1, 2]")).find(":12:11: parallel.tensor: "), std::string::npos);
  EXPECT_NE(error_of(replaced(kBase, "recompute: full", "recompute: ful")).find(":15:14: parallel.recompute: "),
            std::string::npos);
  const std::string e = error_of(replaced(kBase, "recompute: full", "recompute: ful"));
  EXPECT_NE(e.find("did you mean 'full'"), std::string::npos) << e;
}

TEST_F(ScenarioFile, UnknownKeySuggestsTheClosest) {
  const std::string e = error_of(replaced(kBase, "pipeline: 1", "pipelin: 1"));
  EXPECT_EQ(e.rfind(path_ + ":13:3: parallel.pipelin: unknown key (did you mean 'pipeline'?)", 0), 0u) << e;
  const std::string top = error_of(replaced(kBase, "training:", "trainig:"));
  EXPECT_EQ(top.rfind(path_ + ":16:1: trainig: unknown key (did you mean 'training'?)", 0), 0u) << top;
}

TEST_F(ScenarioFile, TensorMustDivideHeads) {
  EXPECT_EQ(error_of(replaced(replaced(kBase, "tensor: 1", "tensor: 5"), "gpus: 32", "gpus: 40")),
            path_ + ":12:11: parallel.tensor: 5 does not divide num_attention_heads (24)");
}

TEST_F(ScenarioFile, PipelineMustDivideLayers) {
  EXPECT_EQ(error_of(replaced(replaced(kBase, "pipeline: 1", "pipeline: 5"), "gpus: 32", "gpus: 40")),
            path_ + ":13:13: parallel.pipeline: 5 does not divide num_layers (24) with partition: uniform; give "
                    "parallel.layers_per_stage, parallel.first_stage_layers / last_stage_layers, or parallel.partition: balanced");
}

// BLOOM-176B's layout: 70 layers on 12 pipeline stages.
std::string seventy_on_twelve(const std::string& parallel_extra) {
  std::string text = replaced(replaced(replaced(kBase, "num_layers: 24", "num_layers: 70"), "gpus: 32", "gpus: 48"),
                              "pipeline: 1", "pipeline: 12");
  return replaced(text, "  schedule: 1f1b\n", "  schedule: 1f1b\n" + parallel_extra);
}

TEST_F(ScenarioFile, UnevenStagesAreAcceptedWhenAPartitionIsGiven) {
  // Balanced: every layer placed, no stage empty, and the first and last stages (embedding;
  // output layer + loss) hold fewer layers than the middle ones.
  write(seventy_on_twelve("  partition: balanced\n"));
  const Scenario sc = load_scenario(path_);
  const auto layers = nlohmann::json::parse(sc.config_json)["parallel"]["layers_per_stage"].get<std::vector<int64_t>>();
  ASSERT_EQ(layers.size(), 12u);
  int64_t sum = 0;
  for (int64_t n : layers) {
    EXPECT_GE(n, 1);
    sum += n;
  }
  EXPECT_EQ(sum, 70);
  EXPECT_LE(layers.front(), layers[5]);
  EXPECT_LT(layers.back(), layers[5]);  // a 51 200-word output layer and loss cost more than the embedding

  write(seventy_on_twelve("  layers_per_stage: [5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5]\n"));
  EXPECT_EQ(nlohmann::json::parse(load_scenario(path_).config_json)["parallel"]["layers_per_stage"],
            nlohmann::json::parse("[5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5]"));
  write(seventy_on_twelve("  first_stage_layers: 5\n  last_stage_layers: 5\n"));
  EXPECT_EQ(nlohmann::json::parse(load_scenario(path_).config_json)["parallel"]["layers_per_stage"],
            nlohmann::json::parse("[5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5]"));
  // Uniform (the default) keeps Megatron's rule and names the options.
  const std::string e = error_of(seventy_on_twelve(""));
  EXPECT_NE(e.find("parallel.pipeline: 12 does not divide num_layers (70) with partition: uniform; give parallel.layers_per_stage"),
            std::string::npos)
      << e;
}

// Megatron's layout: the embedding and the loss on stages of their own, each of the 10 stages
// between them 7 layers; the report's config holds the layers of each stage and the layout.
TEST_F(ScenarioFile, APipelineLayoutPlacesTheStagesAndItsMistakesAreLocated) {
  write(seventy_on_twelve("  pipeline_layout: \"E|(t*7|)*10L\"\n"));
  const auto config = nlohmann::json::parse(load_scenario(path_).config_json)["parallel"];
  EXPECT_EQ(config["layers_per_stage"], nlohmann::json::parse("[0, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0]"));
  EXPECT_EQ(config["pipeline_layout"], "E|(t*7|)*10L");
  EXPECT_EQ(error_of(seventy_on_twelve("  pipeline_layout: \"E|(t*7|)*10Lt\"\n")),
            path_ + ":15:20: parallel.pipeline_layout: position 13 of \"E|(t*7|)*10Lt\": 't' after L: L (the loss) closes the last stage");
  EXPECT_EQ(error_of(seventy_on_twelve("  pipeline_layout: \"E|(t*7|)*9,t*6|L\"\n")),
            path_ + ":15:20: parallel.pipeline_layout: places 69 decoder layers (t) but num_layers is 70 (\"E|(t*7|)*9t*6|L\")");
}

TEST_F(ScenarioFile, BadPartitionsNameTheKeyAndTheNumbers) {
  // Line 15 holds the partition keys (after schedule on line 14).
  EXPECT_EQ(error_of(seventy_on_twelve("  layers_per_stage: [35, 35]\n")),
            path_ + ":15:21: parallel.layers_per_stage: has 2 entries, expected one per stage: pipeline (12) (got [35, 35])");
  EXPECT_EQ(error_of(seventy_on_twelve("  layers_per_stage: [5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6]\n")),
            path_ + ":15:21: parallel.layers_per_stage: sums to 71 layers but num_layers is 70 (got [5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6])");
  EXPECT_EQ(error_of(seventy_on_twelve("  layers_per_stage: [10, 6, 0, 6, 6, 6, 6, 6, 6, 6, 6, 6]\n")),
            path_ + ":15:21: parallel.layers_per_stage: stage 2 has 0 layers; every stage needs at least one (got [10, 6, 0, 6, "
                    "6, 6, 6, 6, 6, 6, 6, 6])");
  EXPECT_EQ(error_of(seventy_on_twelve("  first_stage_layers: 4\n  last_stage_layers: 5\n")),
            path_ + ":16:22: parallel.last_stage_layers: leaves 61 of num_layers (70) for the other 10 stages, which must be a "
                    "positive multiple of 10 (every stage at least one layer, shared evenly)");
  EXPECT_EQ(error_of(seventy_on_twelve("  first_stage_layers: 65\n")),
            path_ + ":15:23: parallel.first_stage_layers: leaves 5 of num_layers (70) for the other 11 stages, which must be a "
                    "positive multiple of 11 (every stage at least one layer, shared evenly)");
  // Balanced with more stages than layers leaves a stage empty.
  const std::string few = replaced(replaced(kBase, "num_layers: 24", "num_layers: 8"), "pipeline: 1", "pipeline: 16\n  partition: balanced");
  EXPECT_EQ(error_of(few), path_ + ":14:14: parallel.partition: balanced needs at least one layer per stage: num_layers (8) < "
                                   "pipeline (16)");
  EXPECT_NE(error_of(seventy_on_twelve("  partition: even\n")).find("parallel.partition: unknown partition 'even', expected uniform or balanced"),
            std::string::npos);
  EXPECT_NE(error_of(seventy_on_twelve("  layers_per_stage: 6\n")).find("parallel.layers_per_stage: expected a list of layer counts"),
            std::string::npos);
}

TEST_F(ScenarioFile, ArchitectureKeysAreReadAndChecked) {
  const std::string llama = replaced(kBase, "  vocab_size: 51200\n",
                                     "  vocab_size: 51200\n  num_query_groups: 8\n  mlp: swiglu\n  normalization: rmsnorm\n"
                                     "  tie_embeddings: false\n");
  write(llama);
  const Scenario sc = load_scenario(path_);
  EXPECT_EQ(sc.model.query_groups(), 8);
  EXPECT_EQ(sc.model.mlp, MlpKind::SwiGLU);
  EXPECT_EQ(sc.model.normalization, NormKind::RMSNorm);
  EXPECT_FALSE(sc.model.tie_embeddings);
  const auto cfg = nlohmann::json::parse(sc.config_json)["model"];
  EXPECT_EQ(cfg["flops_formula"].get<std::string>().rfind("per-layer GEMM count (Eq. 3 generalised: GQA with 8 query groups, SwiGLU", 0), 0u)
      << cfg["flops_formula"];
  write(kBase);
  EXPECT_EQ(nlohmann::json::parse(load_scenario(path_).config_json)["model"]["flops_formula"], "Eq. 3 (Narayanan et al. SC'21)");

  // Line 8 holds the new key.
  EXPECT_EQ(error_of(replaced(kBase, "  vocab_size: 51200\n", "  vocab_size: 51200\n  num_query_groups: 5\n")),
            path_ + ":8:21: model.num_query_groups: 5 does not divide num_attention_heads (24)");
  EXPECT_EQ(error_of(replaced(replaced(replaced(kBase, "  vocab_size: 51200\n", "  vocab_size: 51200\n  num_query_groups: 4\n"),
                                       "tensor: 1", "tensor: 8"), "gpus: 32", "gpus: 64")),
            path_ + ":13:11: parallel.tensor: 8 does not divide model.num_query_groups (4): each tensor-parallel rank needs whole "
                    "key/value groups");
  EXPECT_EQ(error_of(replaced(kBase, "  vocab_size: 51200\n", "  vocab_size: 51200\n  mlp: relu\n")),
            path_ + ":8:8: model.mlp: unknown mlp 'relu', expected gelu or swiglu (did you mean 'gelu'?)");
  EXPECT_EQ(error_of(replaced(kBase, "  vocab_size: 51200\n", "  vocab_size: 51200\n  normalization: rms\n")),
            path_ + ":8:18: model.normalization: unknown normalization 'rms', expected layernorm or rmsnorm");
  EXPECT_EQ(error_of(replaced(kBase, "  vocab_size: 51200\n", "  vocab_size: 51200\n  tie_embeddings: maybe\n")),
            path_ + ":8:19: model.tie_embeddings: expected true or false (got 'maybe')");
}

TEST_F(ScenarioFile, GlobalBatchMustBeDivisibleByMicroBatchTimesData) {
  const std::string e = error_of(replaced(kBase, "global_batch: 512", "global_batch: 500"));
  EXPECT_EQ(e.rfind(path_ + ":17:17: training.global_batch: must be divisible by micro_batch × data", 0), 0u) << e;
  EXPECT_NE(e.find("(got 500)"), std::string::npos) << e;
}

TEST_F(ScenarioFile, InterleavingRules) {
  const std::string two = replaced(replaced(replaced(kBase, "pipeline: 1", "pipeline: 2\n  virtual_stages: 2"), "1f1b", "interleaved"),
                                   "micro_batch: 16", "micro_batch: 1");
  // p = 2 needs overlapped p2p.
  const std::string e = error_of(two);
  EXPECT_EQ(e.rfind(path_ + ":13:13: parallel.pipeline: interleaving needs pipeline > 2", 0), 0u) << e;
  EXPECT_EQ(error_of(replaced(two, "virtual_stages: 2", "virtual_stages: 2\n  overlap_p2p: true")), "");
  // l divisible by p·v: 24 layers, p 4, v 4.
  const std::string four = replaced(replaced(replaced(kBase, "pipeline: 1", "pipeline: 4\n  virtual_stages: 4"), "1f1b", "interleaved"),
                                    "micro_batch: 16", "micro_batch: 1");
  const std::string e4 = error_of(four);
  EXPECT_EQ(e4.rfind(path_ + ":14:19: parallel.virtual_stages: pipeline × virtual_stages (16) must divide num_layers (24)", 0),
            0u)
      << e4;
  EXPECT_EQ(error_of(replaced(four, "virtual_stages: 4", "virtual_stages: 3")), "");  // 12 | 24
}

TEST_F(ScenarioFile, NegativeSizesAreRejectedAtTheirKey) {
  EXPECT_EQ(error_of(replaced(kBase, "micro_batch: 16", "micro_batch: -16")),
            path_ + ":18:16: training.micro_batch: must be a positive integer (got -16)");
  EXPECT_NE(error_of(replaced(kBase, "tensor: 1", "tensor: -1")).find(":12:11: parallel.tensor: must be a positive integer"),
            std::string::npos);
  EXPECT_NE(error_of(replaced(kBase, "num_layers: 24", "num_layers: -24")).find(":3:15: model.num_layers: "), std::string::npos);
  EXPECT_NE(error_of(replaced(kBase, "gpus: 32", "gpus: -32")).find(":10:9: cluster.gpus: "), std::string::npos);
  EXPECT_NE(error_of(replaced(kBase, "global_batch: 512", "global_batch: 0")).find(":17:17: training.global_batch: "),
            std::string::npos);
}

TEST_F(ScenarioFile, AbsurdSizesAreRejectedQuickly) {
  const auto start = std::chrono::steady_clock::now();
  // 10^12 microbatches (B = 10^12 · b · d).
  std::string e = error_of(replaced(replaced(kBase, "global_batch: 512", "global_batch: 1000000000000"), "micro_batch: 16",
                                    "micro_batch: 1"));
  EXPECT_NE(e.find(":17:17: training.global_batch: "), std::string::npos) << e;
  e = error_of(replaced(kBase, "global_batch: 512", "global_batch: 1e12"));
  EXPECT_NE(e.find("training.global_batch: "), std::string::npos) << e;
  // 10^9 GPUs.
  e = error_of(replaced(kBase, "gpus: 32", "gpus: 1000000000"));
  EXPECT_NE(e.find(":10:9: cluster.gpus: "), std::string::npos) << e;
  // Beyond int64.
  e = error_of(replaced(kBase, "gpus: 32", "gpus: 1e30"));
  EXPECT_NE(e.find(":10:9: cluster.gpus: "), std::string::npos) << e;
  e = error_of(replaced(kBase, "hidden_size: 2304", "hidden_size: 2304000000000"));
  EXPECT_NE(e.find("model.hidden_size: "), std::string::npos) << e;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);  // guards against a hang, not a benchmark
}

// Runs `load` in a child process so that a crash is observed rather than suffered; returns the
// wait status (exit 2: it threw ConfigError).
int status_of_child(const std::function<void()>& load) {
  const pid_t pid = fork();
  if (pid == 0) {
    try {
      load();
      _exit(0);
    } catch (const ConfigError&) {
      _exit(2);
    } catch (...) {
      _exit(3);
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST_F(ScenarioFile, HugeParallelSizesAreAConfigErrorNotACrash) {
  // tensor × pipeline = 2^64 wraps to 0 in int64 arithmetic.
  const std::string path = write(replaced(replaced(kBase, "tensor: 1", "tensor: 4294967296"), "pipeline: 1", "pipeline: 4294967296"));
  const int status = status_of_child([&] { load_scenario(path); });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << "wait status " << status;
}

TEST_F(ScenarioFile, HugeMicroBatchIsAConfigErrorNotACrash) {
  // micro_batch × data = 2^62 × 4 wraps to 0.
  const std::string path = write(replaced(replaced(kBase, "gpus: 32", "gpus: 4"), "micro_batch: 16", "micro_batch: 4611686018427387904"));
  const int status = status_of_child([&] { load_scenario(path); });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << "wait status " << status;
}

TEST_F(ScenarioFile, MissingRequiredKeyOrSection) {
  std::string e = error_of(replaced(kBase, "  num_layers: 24\n", ""));
  EXPECT_NE(e.find("model.num_layers: missing"), std::string::npos) << e;
  EXPECT_EQ(e.rfind(path_ + ":", 0), 0u) << e;
  e = error_of(replaced(kBase, "  global_batch: 512\n", ""));
  EXPECT_NE(e.find("training.global_batch: missing"), std::string::npos) << e;
  e = error_of("model: {num_layers: 24, hidden_size: 2304, num_attention_heads: 24, seq_length: 2048, vocab_size: 51200}\n");
  EXPECT_NE(e.find("cluster: missing section"), std::string::npos) << e;
}

TEST_F(ScenarioFile, MissingFileIsNamed) {
  const std::string missing = dir_ + "/nope.yaml";
  try {
    load_scenario(missing);
    FAIL() << "loaded a file that does not exist";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), missing + ": scenario file not found");
  }
  try {
    load_scenario(dir_);
    FAIL() << "loaded a directory";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
}

TEST_F(ScenarioFile, InvalidYamlSyntaxGivesLineAndColumn) {
  // yaml-cpp reports where it detected the error: the bad line or the one after it.
  auto located_line = [&](const std::string& e) {
    int line = 0, col = 0;
    if (e.rfind(path_ + ":", 0) != 0 || std::sscanf(e.c_str() + path_.size(), ":%d:%d:", &line, &col) != 2) return -1;
    return col > 0 ? line : -1;
  };
  std::string e = error_of(replaced(kBase, "  tensor: 1\n", "  tensor: 1\n   bad indent: [\n"));
  EXPECT_NE(e.find("invalid YAML"), std::string::npos) << e;
  EXPECT_EQ(located_line(e), 13) << e;
  e = error_of(replaced(kBase, "schedule: 1f1b", "schedule: [1f1b"));
  EXPECT_NE(e.find("invalid YAML"), std::string::npos) << e;
  EXPECT_GE(located_line(e), 14) << e;
  EXPECT_LE(located_line(e), 15) << e;
}

TEST_F(ScenarioFile, UnknownTopologyPresetSuggestsTheClosest) {
  const std::string e = error_of(replaced(kBase, "topology: dgx-a100", "topology: dgx-a10"));
  EXPECT_EQ(e.rfind(path_ + ":9:13: cluster.topology: no topology preset or file 'dgx-a10' (did you mean 'dgx-a100'?)", 0), 0u)
      << e;
  EXPECT_NE(e.find("dgx-h100"), std::string::npos) << "lists the presets: " << e;
}

TEST_F(ScenarioFile, TopologyPathTooLongForTheSystemIsRefusedNotThrown) {
  // Found by fuzzing: std::filesystem::exists threw filesystem_error (ENAMETOOLONG) out of the
  // loader. A name the system cannot take is an unknown topology, located like any other.
  const std::string name = "/" + std::string(5000, 'a') + ".yaml";
  const std::string e = error_of(replaced(kBase, "topology: dgx-a100", "topology: " + name));
  EXPECT_EQ(e.rfind(path_ + ":9:13: cluster.topology: no topology preset or file '/aaa", 0), 0u) << e.substr(0, 200);
  try {
    read_input_file(name, "topology file");
    FAIL() << "read a file whose name is too long";
  } catch (const ConfigError& err) {
    EXPECT_NE(std::string(err.what()).find("File name too long"), std::string::npos) << err.what();
  }
  EXPECT_FALSE(path_exists(name));
  EXPECT_FALSE(path_exists(""));
  EXPECT_TRUE(path_exists(PTDP_SOURCE_DIR));
}

TEST_F(ScenarioFile, TopologyCanBeInlineOrAFileNextToTheScenario) {
  const std::string inline_topo = replaced(kBase, "  topology: dgx-a100\n",
                                           "  topology:\n"
                                           "    name: tiny\n"
                                           "    gpu: {memory: 40GB, peak_flops: 100TFLOPS}\n"
                                           "    node: {gpus: 4, nvlink: {bandwidth: 100GBps, latency: 1us}}\n"
                                           "    network: {nic: {bandwidth: 10GBps, latency: 5us}}\n");
  Scenario sc = load_scenario(write(inline_topo));
  EXPECT_EQ(sc.topology_ref, "inline");
  EXPECT_EQ(sc.cluster.gpus_per_node, 4);
  EXPECT_DOUBLE_EQ(sc.cluster.gpu.memory_bytes, 40e9);
  EXPECT_DOUBLE_EQ(sc.cluster.nic.bw_Bps, 10e9);
  // A bad value inside an inline topology is located in the scenario file.
  const std::string e = error_of(replaced(inline_topo, "bandwidth: 10GBps", "bandwidth: 10GHz"));
  EXPECT_EQ(e.rfind(path_ + ":13:", 0), 0u) << e;
  EXPECT_NE(e.find("cluster.topology.network.nic.bandwidth: unknown unit 'GHz'"), std::string::npos) << e;
  // A topology file next to the scenario, by relative path.
  std::ifstream preset(fs::path(PTDP_SOURCE_DIR) / "topologies/dgx-a100.yaml");
  std::string text((std::istreambuf_iterator<char>(preset)), std::istreambuf_iterator<char>());
  write(replaced(text, "memory: 80GB", "memory: 40GB"), "mine.yaml");
  sc = load_scenario(write(replaced(kBase, "topology: dgx-a100", "topology: mine.yaml")));
  EXPECT_DOUBLE_EQ(sc.cluster.gpu.memory_bytes, 40e9);
}

TEST_F(ScenarioFile, TrainTokensTakeCountSuffixes) {
  Scenario sc = load_scenario(write(std::string(kBase) + "  train_tokens: 300B\n"));
  ASSERT_TRUE(sc.train_tokens.has_value());
  EXPECT_DOUBLE_EQ(*sc.train_tokens, 300e9);
  EXPECT_FALSE(load_scenario(write(kBase)).train_tokens.has_value());
  const std::string e = error_of(std::string(kBase) + "  train_tokens: -5B\n");
  EXPECT_NE(e.find(":20:17: training.train_tokens: "), std::string::npos) << e;
}

TEST_F(ScenarioFile, ConfigJsonIsTheResolvedScenario) {
  const Scenario sc = load_scenario(write(kBase));
  const auto j = nlohmann::json::parse(sc.config_json);
  EXPECT_EQ(j["model"]["ffn_hidden_size"], 4 * 2304);
  EXPECT_EQ(j["parallel"]["data"], 32);
  EXPECT_EQ(j["parallel"]["schedule"], "1f1b");
  EXPECT_EQ(j["training"]["num_microbatches"], 1);
  EXPECT_EQ(j["cluster"]["gpus"], 32);
  EXPECT_EQ(j["cluster"]["resolved_topology"]["gpus_per_node"], 8);
}

}  // namespace
}  // namespace ptdp
