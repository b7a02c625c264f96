// The `ptdp` executable as users run it: exit codes, tables with units, the stable JSON report,
// located error messages on stderr, schedule CSV export/import.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_ptdp.hpp"

namespace {
using namespace ptdp_cli_test;
namespace fs = std::filesystem;

constexpr const char* kSmall =
    "model:\n"
    "  name: gpt-1.7B\n"
    "  num_layers: 24\n"
    "  hidden_size: 2304\n"
    "  num_attention_heads: 24\n"
    "  seq_length: 2048\n"
    "  vocab_size: 51200\n"
    "cluster:\n"
    "  topology: dgx-a100\n"
    "  gpus: 32\n"
    "parallel:\n"
    "  tensor: 1\n"
    "  pipeline: 1\n"
    "  schedule: 1f1b\n"
    "  recompute: full\n"
    "training:\n"
    "  global_batch: 512\n"
    "  micro_batch: 16\n"
    "  precision: fp16\n";

TEST_F(Cli, SimulateWithoutScenarioPrintsATableWithUnits) {
  const Outcome r = ptdp({"simulate"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "gpt3-175b on 1024")) << r.out;
  for (const char* row : {"iteration time", "throughput", "TFLOP/s per GPU", "MFU", "tokens/s", "pipeline bubble",
                          "peak memory", " GB of 80.0 GB per GPU", "training time", "days", "parameters", "174.6 B"})
    EXPECT_TRUE(contains(r.out, row)) << "missing '" << row << "' in\n" << r.out;
  // The iteration time carries a unit.
  const auto at = r.out.find("iteration time");
  ASSERT_NE(at, std::string::npos);
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_TRUE(contains(line, " s") || contains(line, " ms")) << line;
  EXPECT_EQ(r.err, "") << "the default plan fits and needs no warning";
}

TEST_F(Cli, JsonReportHasEveryStableKey) {
  const Outcome r = ptdp({"simulate", "--json", file("report.json")});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(slurp(file("report.json")));
  for (const char* key : {"iteration_time_s", "tflops_per_gpu", "mfu", "bubble_fraction", "peak_memory_bytes", "tokens_per_s",
                          "training_days", "parameters", "gpus", "fits_in_memory", "fidelity", "config"})
    EXPECT_TRUE(j.contains(key)) << "missing key " << key;
  EXPECT_TRUE(j["iteration_time_s"].is_number());
  EXPECT_TRUE(j["fits_in_memory"].is_boolean());
  EXPECT_TRUE(j["config"].is_object());
  EXPECT_EQ(j["fidelity"], "analytic");
  EXPECT_EQ(j["gpus"], 1024);
  EXPECT_TRUE(j["fits_in_memory"].get<bool>());
  const double T = j["iteration_time_s"];
  EXPECT_NEAR(j["tokens_per_s"].get<double>() * T, 1536.0 * 2048, 1e-6 * 1536 * 2048);
  EXPECT_NEAR(j["training_days"].get<double>(), 300e9 / j["tokens_per_s"].get<double>() / 86400, 1e-6);
  EXPECT_NEAR(j["parameters"].get<double>() / 1e9, 174.6, 0.05);
  EXPECT_GT(j["mfu"].get<double>(), 0);
  EXPECT_LT(j["mfu"].get<double>(), j["tflops_per_gpu"].get<double>() * 1e12 / 312e12);
  EXPECT_GT(j["peak_memory_bytes"].get<double>(), 1e9);
  // The resolved scenario: data parallel size filled in.
  EXPECT_EQ(j["config"]["parallel"]["data"], 8);
  EXPECT_EQ(j["config"]["model"]["num_layers"], 96);
  // Without train_tokens the key stays, as null.
  ASSERT_EQ(ptdp({"simulate", write("s.yaml", kSmall), "--json", file("small.json")}).status, 0);
  const auto small = nlohmann::json::parse(slurp(file("small.json")));
  EXPECT_TRUE(small.contains("training_days"));
  EXPECT_TRUE(small["training_days"].is_null());
}

// The report says what each overlap the plan turns on buys: the same plan without it, less the
// plan with it (both analytic); none on a plan without overlaps.
TEST_F(Cli, ReportShowsEachOverlapsNetGain) {
  const std::string mixtral = std::string(PTDP_SOURCE_DIR) + "/scenarios/moe/mixtral-8x7b.yaml";
  auto iteration = [&](std::vector<std::string> sets, const std::string& out) {
    std::vector<std::string> argv = {"simulate", mixtral, "--json", file(out)};
    for (const auto& kv : sets) argv.push_back("--set"), argv.push_back(kv);
    const Outcome r = ptdp(argv);
    EXPECT_EQ(r.status, 0) << r.err;
    return nlohmann::json::parse(slurp(file(out)));
  };
  // The preset overlaps the gradient reduction and the parameter gather; the EP overlap on top
  // (with pipelining, in the interleaved schedule).
  const std::string v1 = "parallel.schedule=interleaved", v2 = "parallel.virtual_stages=2";
  const std::vector<std::string> on = {"parallel.moe_comm_overlap=true", v1, v2};
  const auto j = iteration(on, "on.json");
  ASSERT_TRUE(j.contains("overlap_gain_s"));
  ASSERT_EQ(j["overlap_gain_s"].size(), 3u);
  const double with = j["iteration_time_s"];
  const double no_moe = iteration({"parallel.moe_comm_overlap=false", v1, v2}, "no-moe.json")["iteration_time_s"];
  // The parameter gather needs the overlapped reduction: both go.
  const double no_grad =
      iteration({on[0], v1, v2, "parallel.overlap_grad_reduce=false", "parallel.overlap_param_gather=false"}, "no-grad.json")["iteration_time_s"];
  EXPECT_NEAR(j["overlap_gain_s"]["moe_comm_overlap"].get<double>(), no_moe - with, 1e-9);
  EXPECT_NEAR(j["overlap_gain_s"]["overlap_grad_reduce"].get<double>(), no_grad - with, 1e-9);
  EXPECT_GT(no_moe - with, 0.0);  // the all-to-alls hide under the other microbatch's compute
  // Without overlaps: no entry.
  EXPECT_FALSE(iteration({"parallel.overlap_grad_reduce=false", "parallel.overlap_param_gather=false"}, "off.json").contains("overlap_gain_s"));
  const Outcome text = ptdp({"simulate", mixtral, "--set", on[0], "--set", v1, "--set", v2});
  EXPECT_NE(text.out.find("moe_comm_overlap saves"), std::string::npos) << text.out;
  // Pipeline sends beside compute: what waiting for each of them (the plan above) costs.
  const auto p2p = iteration({on[0], v1, v2, "parallel.overlap_p2p=true"}, "p2p.json");
  ASSERT_TRUE(p2p["overlap_gain_s"].contains("overlap_p2p")) << p2p["overlap_gain_s"];
  EXPECT_NEAR(p2p["overlap_gain_s"]["overlap_p2p"].get<double>(), with - p2p["iteration_time_s"].get<double>(), 1e-9);
  EXPECT_GT(p2p["overlap_gain_s"]["overlap_p2p"].get<double>(), 0.0);
}

TEST_F(Cli, OverridesChangeTheResult) {
  ASSERT_EQ(ptdp({"simulate", "--json", file("a.json")}).status, 0);
  ASSERT_EQ(ptdp({"simulate", "--set", "training.global_batch=3072", "--json", file("b.json")}).status, 0);
  const auto a = nlohmann::json::parse(slurp(file("a.json"))), b = nlohmann::json::parse(slurp(file("b.json")));
  EXPECT_GT(b["iteration_time_s"].get<double>(), 1.5 * a["iteration_time_s"].get<double>());
  EXPECT_LT(b["bubble_fraction"].get<double>(), a["bubble_fraction"].get<double>());
  EXPECT_EQ(b["config"]["training"]["global_batch"], 3072);
}

TEST_F(Cli, BadScenarioExitsTwoWithTheLocatedMessageOnStderr) {
  std::string text = kSmall;
  text.replace(text.find("tensor: 1"), 9, "tensor: abc");
  const std::string path = write("bad.yaml", text);
  const Outcome r = ptdp({"simulate", path});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "ptdp: error: " + path + ":12:11: parallel.tensor: expected an integer (got 'abc')\n");
  EXPECT_EQ(r.out, "");
}

TEST_F(Cli, BadCommandLineExitsTwo) {
  Outcome r = ptdp({"simulate", "--set", "parallel.tensr=2"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "--set parallel.tensr=2: parallel.tensr: unknown key (did you mean 'parallel.tensor'?)")) << r.err;
  r = ptdp({"simulate", "--set", "parallel.tensor"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "key=value")) << r.err;
  r = ptdp({"simulate", file("missing.yaml")});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, file("missing.yaml") + ": scenario file not found")) << r.err;
  r = ptdp({"simulate", "--set", "cluster.topology.node.nvlink.bandwidth=0GBps"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "cluster.topology.node.nvlink.bandwidth: must be positive")) << r.err;
  r = ptdp({"simulate", "--fidelity", "analytc"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "did you mean 'analytic'")) << r.err;
  r = ptdp({"simulat"});
  EXPECT_EQ(r.status, 2);
  r = ptdp({});
  EXPECT_EQ(r.status, 2);
}

TEST_F(Cli, AbsurdSizesExitTwoQuickly) {
  for (const char* set : {"training.global_batch=1000000000000", "cluster.gpus=1000000000", "model.num_layers=-4"}) {
    const Outcome r = ptdp({"simulate", "--set", set});
    EXPECT_EQ(r.status, 2) << set << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "ptdp: error: --set ")) << r.err;
  }
}

TEST_F(Cli, OverflowingParallelSizesExitTwoNotCrash) {
  const Outcome r = ptdp({"simulate", "--set", "parallel.tensor=4294967296", "--set", "parallel.pipeline=4294967296"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "parallel.")) << r.err;
}

TEST_F(Cli, APlanThatDoesNotFitWarnsButStillReports) {
  const Outcome r = ptdp({"simulate", "--set", "cluster.gpus=8", "--set", "parallel.pipeline=1", "--set", "parallel.schedule=1f1b",
                      "--set", "parallel.virtual_stages=1", "--set", "training.global_batch=8", "--json", file("big.json")});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "ptdp: warning: the plan does not fit in GPU memory")) << r.err;
  EXPECT_TRUE(contains(r.out, "DOES NOT FIT")) << r.out;
  const auto j = nlohmann::json::parse(slurp(file("big.json")));
  EXPECT_FALSE(j["fits_in_memory"].get<bool>());
  EXPECT_GT(j["iteration_time_s"].get<double>(), 0);
  EXPECT_GT(j["peak_memory_bytes"].get<double>(), 80e9);
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(text);
  while (std::getline(in, cur, sep))
    if (!cur.empty()) out.push_back(cur);
  return out;
}

TEST_F(Cli, ScheduleExportThenImportRoundTrips) {
  const std::string scenario = write("s.yaml", kSmall);
  const std::vector<std::string> plan = {"--set", "cluster.gpus=4",           "--set", "parallel.pipeline=4",
                                         "--set", "parallel.schedule=interleaved", "--set", "parallel.virtual_stages=2",
                                         "--set", "training.global_batch=8", "--set", "training.micro_batch=1"};
  std::vector<std::string> args = {"schedule", "export", scenario, "--csv", file("s.csv"), "--format", "lowered"};
  args.insert(args.end(), plan.begin(), plan.end());
  Outcome r = ptdp(args);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string csv = slurp(file("s.csv"));
  const auto rows = split(csv, '\n');
  ASSERT_EQ(rows.size(), 4u) << csv;
  EXPECT_EQ(rows[0].rfind("0F0,0SEND_F0,", 0), 0u) << rows[0];
  r = ptdp({"schedule", "import", file("s.csv")});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "schedule: p 4, v 2, m 8, 8 stages")) << r.out;
  // The printed grid lists each row's actions in the file's order, then the implied OPTIM
  // (PyTorch's CSV has no optimizer action).
  EXPECT_FALSE(contains(csv, "OPTIM")) << csv;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string head = "rank " + std::to_string(rank) + " |";
    const auto at = r.out.find(head);
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string line = r.out.substr(at + head.size(), r.out.find('\n', at) - at - head.size());
    auto want = split(rows[rank], ',');
    want.push_back("OPTIM");
    EXPECT_EQ(split(line, ' '), want) << "rank " << rank;
  }
  // Export is deterministic: the same plan gives the same file.
  r = ptdp(args);
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(slurp(file("s.csv")), csv);
}

TEST_F(Cli, PyTorchExportWaitsHandsOverLocallyAndRefusesDualPipe) {
  const std::string scenario = write("s.yaml", kSmall);
  auto plan = [&](const std::string& schedule) {
    return std::vector<std::string>{"schedule", "export", scenario, "--csv", file(schedule + ".csv"), "--set",
                                    "cluster.gpus=4", "--set", "parallel.pipeline=4", "--set",
                                    "parallel.schedule=" + schedule, "--set", "parallel.virtual_stages=2", "--set",
                                    "training.global_batch=8", "--set", "training.micro_batch=1"};
  };
  // The default is PyTorch's current form: waits, and no transfer between zb-v's two stages of a rank.
  Outcome r = ptdp(plan("zb-v"));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string csv = slurp(file("zb-v.csv"));
  EXPECT_TRUE(contains(csv, "WAIT_RECV_F")) << csv;
  EXPECT_TRUE(contains(csv, "WAIT_SEND_B")) << csv;
  EXPECT_TRUE(contains(csv, "WAIT_REDUCE_GRAD")) << csv;
  EXPECT_FALSE(contains(csv, "3SEND_F")) << csv;  // stages 3 and 4 share the last rank
  r = ptdp({"schedule", "import", file("zb-v.csv")});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "3SEND_F0")) << r.out;  // ptdp's IR names the local hand-over
  // DualPipe: refused in PyTorch's form (exit 2, nothing written), ptdp's own form with a note.
  r = ptdp(plan("dualpipe"));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "no PyTorch equivalent")) << r.err;
  EXPECT_FALSE(std::filesystem::exists(file("dualpipe.csv")));
  auto lowered = plan("dualpipe");
  lowered.insert(lowered.end(), {"--format", "lowered"});
  r = ptdp(lowered);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "torch.distributed.pipelining cannot run it")) << r.err;
}

TEST_F(Cli, ImportingADeadlockingScheduleExitsTwoNamingTheActions) {
  const std::string path = write("broken.csv", "0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n");
  const Outcome r = ptdp({"schedule", "import", path});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "ptdp: error: " + path + ":1:")) << r.err;  // row 1 holds a stuck action
  EXPECT_TRUE(contains(r.err, "deadlock")) << r.err;
  EXPECT_TRUE(contains(r.err, "0RECV_B0")) << r.err;
  EXPECT_TRUE(contains(r.err, "1RECV_F1")) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(Cli, SimulateRunsAScheduleCsvAtEveryFidelityAndNamesItsDefects) {
  // kSmall on 2 pipeline ranks: d 16, b 16, B 512 → m 2.
  const std::string scenario = write("s.yaml", kSmall);
  const std::vector<std::string> plan = {"--set", "parallel.pipeline=2"};
  const std::string csv = write("zb.csv", "0F0,0F1,0I0,0I1,0W0,0W1\n1F0,1I0,1F1,1I1,1W0,1W1\n");
  double analytic = 0;
  for (const char* fidelity : {"analytic", "reduced", "full"}) {
    std::vector<std::string> args = {"simulate", scenario, "--schedule", csv, "--fidelity", fidelity, "--json", file("r.json")};
    args.insert(args.end(), plan.begin(), plan.end());
    const Outcome r = ptdp(args);
    ASSERT_EQ(r.status, 0) << fidelity << ": " << r.err;
    EXPECT_TRUE(contains(r.out, "schedule           " + csv)) << r.out;
    const auto j = nlohmann::json::parse(slurp(file("r.json")));
    EXPECT_EQ(j["schedule"], csv);
    EXPECT_EQ(j["ranks"][1]["actions"]["I/W"]["count"], 4) << fidelity;
    const double t = j["iteration_time_s"].get<double>();
    if (analytic == 0) analytic = t;
    EXPECT_NEAR(t / analytic, 1.0, 0.05) << fidelity;
  }
  auto error_of = [&](const std::string& name, const std::string& text) {
    const std::string path = write(name, text);
    std::vector<std::string> args = {"simulate", scenario, "--schedule", path};
    args.insert(args.end(), plan.begin(), plan.end());
    const Outcome r = ptdp(args);
    EXPECT_EQ(r.status, 2) << name << ": " << r.err;
    EXPECT_EQ(r.out, "") << name;
    return r.err;
  };
  // Another p, another m: the file and what differs.
  std::string e = error_of("p3.csv", "0F0,0B0,0F1,0B1\n1F0,1B0,1F1,1B1\n2F0,2B0,2F1,2B1\n");
  EXPECT_TRUE(contains(e, file("p3.csv") + ": ")) << e;
  EXPECT_TRUE(contains(e, "pipeline ranks (rows) 3 but the scenario has 2")) << e;
  e = error_of("m3.csv", "0F0,0F1,0F2,0B0,0B1,0B2\n1F0,1B0,1F1,1B1,1F2,1B2\n");
  EXPECT_TRUE(contains(e, "microbatches 3 but the scenario has 2")) << e;
  // A missing backward: the row of the stage.
  e = error_of("nob.csv", "0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n");
  EXPECT_TRUE(contains(e, file("nob.csv") + ":1:")) << e;
  EXPECT_TRUE(contains(e, "never runs 0B1")) << e;
  // A deadlock: the row and cell of a stuck action.
  e = error_of("dead.csv", "0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n");
  EXPECT_TRUE(contains(e, file("dead.csv") + ":1:")) << e;
  EXPECT_TRUE(contains(e, "deadlock")) << e;
}

TEST_F(Cli, ZeroBubbleBadInputExitsTwoNamingWhy) {
  // ZB-V with another number of chunks than two.
  Outcome r = ptdp({"simulate", "--set", "parallel.schedule=zb-v", "--set", "parallel.virtual_stages=3"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "parallel.virtual_stages: zb-v places two chunks per pipeline rank")) << r.err;
  // zb-auto on GPUs whose memory holds the model states but not one microbatch's activations.
  r = ptdp({"simulate", "--set", "parallel.schedule=zb-auto", "--set", "parallel.virtual_stages=1", "--set",
            "parallel.recompute=none", "--set", "training.micro_batch=8", "--set", "training.global_batch=512", "--set",
            "cluster.topology.gpu.memory=36GB"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "no schedule fits the memory limit")) << r.err;
  // The zero-bubble schedules are drawn by `schedule show`, with I and W cells.
  r = ptdp({"schedule", "show", std::string(PTDP_SOURCE_DIR) + "/scenarios/gpt3-175b.yaml", "--set", "parallel.schedule=zb-h1", "--set", "parallel.virtual_stages=1", "--set",
            "training.global_batch=256"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "0I0")) << r.out;
  EXPECT_TRUE(contains(r.out, "0W0")) << r.out;
}

TEST_F(Cli, ImportingABadActionGivesFileLineColumn) {
  const std::string path = write("bad.csv", "0F0,0F1,0B0,0B1\n1F0,0X1,1B0\n");
  const Outcome r = ptdp({"schedule", "import", path});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "ptdp: error: " + path + ":2:5: bad action '0X1'")) << r.err;
  const Outcome missing = ptdp({"schedule", "import", file("nope.csv")});
  EXPECT_EQ(missing.status, 2);
  EXPECT_TRUE(contains(missing.err, file("nope.csv"))) << missing.err;
}

TEST_F(Cli, ScheduleShowPrintsEachRanksComputeActions) {
  const Outcome r = ptdp({"schedule", "show", write("s.yaml", kSmall), "--set", "cluster.gpus=4", "--set", "parallel.pipeline=4",
                      "--set", "training.global_batch=8", "--set", "training.micro_batch=1"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "schedule: p 4, v 1, m 8")) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 3 | 3F0 3B0 3F1 3B1")) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 0 | 0F0 0F1 0F2 0F3 0B0 0F4")) << r.out;
  EXPECT_FALSE(contains(r.out, "SEND")) << "send/recv only with --comm";
}

}  // namespace

namespace {
using namespace ptdp_cli_test;

// BLOOM-176B's 70 layers on 12 stages, and the bad inputs of issue 16 at the command line.
TEST_F(Cli, BadPartitionsAndQueryGroupsExitTwoNamingKeyAndNumbers) {
  const std::string bloom = std::string(PTDP_SOURCE_DIR) + "/scenarios/bloom-176b.yaml";
  int pipeline_line = 0;  // the error points at the file's `pipeline: 12`
  {
    std::ifstream in(bloom);
    std::string text;
    for (int n = 1; std::getline(in, text); ++n)
      if (text == "  pipeline: 12") pipeline_line = n;
  }
  ASSERT_GT(pipeline_line, 0);
  struct Case {
    std::vector<std::string> sets;
    std::string message;
  };
  const Case cases[] = {
      {{"parallel.partition=uniform"},
       "bloom-176b.yaml:" + std::to_string(pipeline_line) + ":13: parallel.pipeline: 12 does not divide num_layers (70) with partition: uniform; give "
       "parallel.layers_per_stage, parallel.first_stage_layers / last_stage_layers, or parallel.partition: balanced"},
      {{"parallel.partition=uniform", "parallel.layers_per_stage=[35,35]"},
       "parallel.layers_per_stage: has 2 entries, expected one per stage: pipeline (12) (got [35, 35])"},
      {{"parallel.partition=uniform", "parallel.layers_per_stage=[6,6,6,6,6,6,6,6,6,6,6,6]"},
       "parallel.layers_per_stage: sums to 72 layers but num_layers is 70"},
      {{"model.num_layers=8"}, "parallel.partition: balanced needs at least one layer per stage: num_layers (8) < pipeline (12)"},
      {{"model.num_query_groups=5"}, "model.num_query_groups: 5 does not divide num_attention_heads (112)"},
      {{"model.num_query_groups=2"},
       "parallel.tensor: 4 does not divide model.num_query_groups (2): each tensor-parallel rank needs whole key/value groups"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"simulate", bloom};
    for (const auto& s : c.sets) args.insert(args.end(), {"--set", s});
    const Outcome r = ptdp(args);
    EXPECT_EQ(r.status, 2) << c.message;
    EXPECT_TRUE(contains(r.err, c.message)) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(Cli, EveryModelPresetSimulatesAndReportsItsFormulaAndStages) {
  for (const char* name : {"llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "bloom-176b"}) {
    for (const char* topology : {"dgx-a100", "dgx-h100"}) {
      const std::string path = std::string(PTDP_SOURCE_DIR) + "/scenarios/" + name + ".yaml";
      const Outcome r = ptdp({"simulate", path, "--set", std::string("cluster.topology=") + topology, "--json", file("r.json")});
      ASSERT_EQ(r.status, 0) << name << " on " << topology << ": " << r.err;
      const auto j = nlohmann::json::parse(slurp(file("r.json")));
      EXPECT_GT(j["tflops_per_gpu"].get<double>(), 0) << name;
      const bool llama = std::string(name).rfind("llama", 0) == 0;
      EXPECT_EQ(j["config"]["model"]["flops_formula"].get<std::string>().rfind("Eq. 3", 0) == 0, !llama) << name;
      EXPECT_TRUE(contains(r.out, "FLOPs counted by")) << r.out;
    }
  }
  const Outcome bloom = ptdp({"simulate", std::string(PTDP_SOURCE_DIR) + "/scenarios/bloom-176b.yaml"});
  EXPECT_TRUE(contains(bloom.out, "layers per stage   [")) << bloom.out;
  EXPECT_TRUE(contains(bloom.out, "(balanced)")) << bloom.out;
  const Outcome meta = ptdp({"simulate", std::string(PTDP_SOURCE_DIR) + "/scenarios/llama3-405b.yaml"});
  EXPECT_TRUE(contains(meta.out, "layers per stage   [7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 7] (given)")) << meta.out;
}

TEST_F(Cli, PartitionKnobMovesThePrediction) {
  // Same model and plan, only the partition differs: the heavy last stage costs time.
  const std::string bloom = std::string(PTDP_SOURCE_DIR) + "/scenarios/bloom-176b.yaml";
  ASSERT_EQ(ptdp({"simulate", bloom, "--json", file("balanced.json")}).status, 0);
  ASSERT_EQ(ptdp({"simulate", bloom, "--set", "parallel.partition=uniform", "--set",
                  "parallel.layers_per_stage=[5,5,6,6,6,6,6,6,6,6,6,6]", "--json", file("heavy.json")})
                .status,
            0);
  const auto a = nlohmann::json::parse(slurp(file("balanced.json"))), b = nlohmann::json::parse(slurp(file("heavy.json")));
  EXPECT_LT(a["iteration_time_s"].get<double>(), b["iteration_time_s"].get<double>());
  EXPECT_EQ(b["config"]["parallel"]["layers_per_stage"], nlohmann::json::parse("[5,5,6,6,6,6,6,6,6,6,6,6]"));
}

}  // namespace
