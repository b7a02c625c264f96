// `ptdp sweep` as users run it: ranking, CSV, chart, bad input, and MPI-distributed sweeps.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "run_ptdp.hpp"

namespace {
using namespace ptdp_cli_test;
namespace fs = std::filesystem;

const std::string kRoot = PTDP_SOURCE_DIR;

std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::string cell;
    bool quoted = false;
    for (char c : line) {
      if (c == '"') quoted = !quoted;
      else if (c == ',' && !quoted) {
        cells.push_back(cell);
        cell.clear();
      } else cell += c;
    }
    cells.push_back(cell);
    rows.push_back(cells);
  }
  return rows;
}

size_t column(const std::vector<std::string>& header, const std::string& name) {
  const auto it = std::find(header.begin(), header.end(), name);
  EXPECT_NE(it, header.end()) << name;
  return static_cast<size_t>(it - header.begin());
}

TEST_F(Cli, SweepRanksValidConfigurationsAndWritesEveryReportKey) {
  const auto r = ptdp({"sweep", kRoot + "/scenarios/paper/gpt-18.4b.yaml", "--vary", "parallel.pipeline=1,2,3,4",
                       "--vary", "training.micro_batch=1,2", "--top", "2", "--csv", file("s.csv")});
  ASSERT_EQ(r.status, 0) << r.err;
  // t 8 × p 3 does not divide 256 GPUs: 2 of 8 combinations are skipped, counted by reason.
  EXPECT_TRUE(contains(r.out, "6 valid configurations")) << r.out;
  EXPECT_TRUE(contains(r.out, "skipped      2, e.g. parallel.tensor: tensor × pipeline (8 × 3 = 24) must divide cluster.gpus (256)")) << r.out;
  const auto rows = read_csv(file("s.csv"));
  ASSERT_EQ(rows.size(), 7u);  // header + 6
  const auto& h = rows[0];
  for (const char* key : {"iteration_time_s", "tflops_per_gpu", "mfu", "bubble_fraction", "peak_memory_bytes",
                          "tokens_per_s", "parameters", "gpus", "fits_in_memory", "fidelity", "refined_tflops_per_gpu"})
    column(h, key);
  // Ranked rows come first, best analytic throughput first; the top 2 carry refined figures.
  const size_t rank = column(h, "rank"), tok = column(h, "tokens_per_s"), refined = column(h, "refined_tokens_per_s"),
               status = column(h, "status");
  double previous = 1e300;
  int refined_rows = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[i][status] != "ok") continue;
    EXPECT_EQ(rows[i][rank], std::to_string(i));
    if (!rows[i][refined].empty()) ++refined_rows;
  }
  EXPECT_EQ(refined_rows, 2);
  // Beyond the refined top 2, the order is by analytic throughput.
  for (size_t i = 3; i < rows.size(); ++i) {
    if (rows[i][status] != "ok") continue;
    const double t = std::stod(rows[i][tok]);
    EXPECT_LE(t, previous * (1 + 1e-12));
    previous = t;
  }
}

TEST_F(Cli, SweepRejectsUnknownKeysAndMalformedValuesNamingTheKey) {
  auto r = ptdp({"sweep", kRoot + "/scenarios/gpt3-175b.yaml", "--vary", "parallel.tensr=1,2"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "parallel.tensr")) << r.err;
  EXPECT_TRUE(contains(r.err, "did you mean 'parallel.tensor'")) << r.err;
  r = ptdp({"sweep", kRoot + "/scenarios/gpt3-175b.yaml", "--vary", "parallel.tensor=1,abc"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "parallel.tensor: expected an integer (got 'abc')")) << r.err;
  r = ptdp({"sweep", kRoot + "/scenarios/gpt3-175b.yaml", "--vary", "parallel.schedule=1f1b,zerobubble"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "parallel.schedule")) << r.err;
}

TEST_F(Cli, SweepWithNoValidConfigurationSaysWhyAndExits2) {
  const auto r = ptdp({"sweep", kRoot + "/scenarios/gpt3-175b.yaml", "--vary", "parallel.tensor=5,7,9"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "no valid configuration among 3")) << r.err;
  EXPECT_TRUE(contains(r.err, "3 × parallel.tensor")) << r.err;
}

TEST_F(Cli, SweepAutoDrawsAChartOfThroughputByTensorAndPipeline) {
  // scripts/setup.sh installs python3-matplotlib: plots are part of the product.
  ASSERT_TRUE(fs::exists("/usr/bin/python3")) << "no /usr/bin/python3 (run ./scripts/setup.sh)";
  const auto r = ptdp({"sweep", kRoot + "/scenarios/paper/gpt-3.6b.yaml", "--auto", "--top", "1", "--csv", file("a.csv"),
                       "--plot", file("a.png")});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "invalid skipped")) << r.out;
  std::ifstream png(file("a.png"), std::ios::binary);
  char sig[8] = {};
  png.read(sig, 8);
  EXPECT_EQ(std::string(sig + 1, 3), "PNG");
  EXPECT_GT(fs::file_size(file("a.png")), 10000u);
}

TEST_F(Cli, DistributedSweepUnderMpirunGivesTheSameCsvAsOneProcess) {
  const std::string scenario = kRoot + "/scenarios/paper/gpt-18.4b.yaml";
  const std::vector<std::string> args = {"sweep", scenario, "--vary", "parallel.pipeline=1,2,4,8", "--vary",
                                         "training.micro_batch=1,2,4", "--top", "3", "--jobs", "1"};
  auto one = args;
  one.insert(one.end(), {"--csv", file("one.csv")});
  ASSERT_EQ(ptdp(one).status, 0);
  std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(PTDP_MPIEXEC) +
                    " --oversubscribe -np 2 " + quoted(PTDP_BINARY);
  for (const auto& a : args) cmd += " " + quoted(a);
  cmd += " --csv " + quoted(file("two.csv")) + " >" + quoted(file("out")) + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(file("out"));
  EXPECT_EQ(slurp(file("one.csv")), slurp(file("two.csv")));
  EXPECT_TRUE(contains(slurp(file("out")), "all ranks")) << slurp(file("out"));
}


// The lines of a sweep's output from the table's header to the end (the ranked rows, refinement,
// rank stability, the FP8 note), and the CSV's first ranked rows.
std::string table_of(const std::string& out) {
  size_t at = out.find("\n  rank ");
  const size_t end = out.find("\n  total ");
  if (at == std::string::npos) return {};
  return out.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1);
}
std::string ranked_rows(const std::string& csv, int first) {
  std::istringstream in(csv);
  std::string line, out;
  while (std::getline(in, line) && first > 0)
    if (!line.empty() && std::isdigit(static_cast<unsigned char>(line[0]))) {
      out += line + "\n";
      --first;
    }
  return out;
}

TEST_F(Cli, AutoSweepUnderMpirunSplitsTheEnumerationAndRanksAsOneProcess) {
  // Each rank enumerates its share of the layouts and refines its share of the top ten; rank 0
  // gathers. The ranking, the refined figures, the skip summary and the candidates' count are one
  // process's (how many plans each rank's own pruning evaluated differs).
  const std::string scenario = kRoot + "/scenarios/paper/gpt-3.6b.yaml";
  const std::vector<std::string> args = {"sweep", scenario, "--auto", "--vary", "training.precision=fp16,bf16", "--jobs", "1"};
  auto one_args = args;
  one_args.insert(one_args.end(), {"--csv", file("one.csv")});
  const auto one = ptdp(one_args);
  ASSERT_EQ(one.status, 0) << one.err;
  std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(PTDP_MPIEXEC) +
                    " --oversubscribe -np 2 " + quoted(PTDP_BINARY);
  for (const auto& a : args) cmd += " " + quoted(a);
  cmd += " --csv " + quoted(file("two.csv")) + " >" + quoted(file("out")) + " 2>" + quoted(file("err"));
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(file("err"));
  const std::string two = slurp(file("out"));
  EXPECT_TRUE(contains(two, "all ranks")) << two;
  ASSERT_FALSE(table_of(one.out).empty()) << one.out;
  EXPECT_EQ(table_of(one.out), table_of(two));
  EXPECT_EQ(ranked_rows(slurp(file("one.csv")), 10), ranked_rows(slurp(file("two.csv")), 10));  // the top K
  auto count_line = [](const std::string& out) {
    const size_t at = out.find(" valid configurations");
    const size_t from = out.rfind("— ", at);
    return at == std::string::npos || from == std::string::npos ? std::string() : out.substr(from, at - from);
  };
  EXPECT_EQ(count_line(one.out), count_line(two));
  EXPECT_TRUE(contains(two, "invalid skipped")) << two;
}

}  // namespace

namespace {
std::string values(int n) {
  std::string s;
  for (int i = 1; i <= n; ++i) s += (i > 1 ? "," : "") + std::to_string(i);
  return s;
}
}  // namespace

TEST_F(Cli, AutoSweepSaysWhatItsFrameworkDoesNotRun) {
  // --auto builds only what training.framework runs, and says what it left out and why.
  const auto ds = ptdp({"sweep", kRoot + "/scenarios/paper/gpt-3.6b.yaml", "--auto", "--fidelity", "analytic", "--jobs", "1", "--set",
                        "training.framework=deepspeed", "--set", "parallel.tp_comm_overlap=false"});
  ASSERT_EQ(ds.status, 0) << ds.err;
  EXPECT_TRUE(contains(ds.out, "framework: deepspeed (training.framework): --auto built only plans it runs, none with ZeRO-2 with "
                               "pipeline stages (DeepSpeed's pipeline engine refuses it); ZeRO-3 with pipeline stages")) << ds.out;
  EXPECT_TRUE(contains(ds.out, "pipeline schedules other than 1F1B; the TP communication overlap;")) << ds.out;
  EXPECT_TRUE(contains(ds.out, " 0 invalid skipped")) << ds.out;  // none generated to be refused
  const auto titan = ptdp({"sweep", kRoot + "/scenarios/paper/gpt-3.6b.yaml", "--auto", "--fidelity", "analytic", "--jobs", "1",
                           "--set", "training.framework=torchtitan_compiled"});
  ASSERT_EQ(titan.status, 0) << titan.err;
  EXPECT_TRUE(contains(titan.out, "none with ZeRO-1 (PyTorch's FSDP shards gradients and parameters: stage 2 or 3); ZeRO-2 with "
                                  "pipeline stages (no framework reduce-scatters its gradients after every microbatch); the "
                                  "bidirectional DualPipe")) << titan.out;
  EXPECT_FALSE(contains(titan.out, "ZeRO-3 with pipeline")) << titan.out;
}

TEST_F(Cli, AutoSweepUnderMpirunKeepsTheKeysItDoesNotVary) {
  // A plan another rank ranked is re-simulated on rank 0 from its family's input and the plan it
  // sent: every field of the plan travels (model/plan_fields.hpp). The framework did not — rank 0
  // refined torchtitan's plans as Megatron's (383k against 413k tokens/s for rank 1).
  const std::vector<std::string> args = {"sweep", kRoot + "/scenarios/paper/gpt-3.6b.yaml", "--auto", "--jobs", "1",
                                         "--set", "training.framework=torchtitan"};
  const auto one = ptdp(args);
  ASSERT_EQ(one.status, 0) << one.err;
  std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(PTDP_MPIEXEC) +
                    " --oversubscribe -np 2 " + quoted(PTDP_BINARY);
  for (const auto& a : args) cmd += " " + quoted(a);
  cmd += " >" + quoted(file("out")) + " 2>" + quoted(file("err"));
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(file("err"));
  ASSERT_FALSE(table_of(one.out).empty()) << one.out;
  EXPECT_EQ(table_of(one.out), table_of(slurp(file("out"))));
}

TEST_F(Cli, SweepCountsAndCapsConfigurationsBeforeBuildingThem) {
  const auto start = std::chrono::steady_clock::now();
  const auto r = ptdp({"sweep", kRoot + "/scenarios/gpt3-175b.yaml", "--vary", "parallel.tensor=" + values(300), "--vary",
                       "parallel.pipeline=" + values(300), "--vary", "training.micro_batch=" + values(300)});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--vary: the values give 27000000 configurations (300 × 300 × 300), above the limit of 100000"))
      << r.err;
  EXPECT_LT(seconds, 10.0) << "the configurations were built before the size check";

  // The cap is a knob: 3 × 3 = 9 is refused under 8 and runs at 9.
  const std::vector<std::string> nine = {"sweep", kRoot + "/scenarios/paper/gpt-18.4b.yaml", "--vary", "parallel.pipeline=1,2,4",
                                         "--vary", "training.micro_batch=1,2,4", "--top", "0"};
  auto capped = nine;
  capped.insert(capped.end(), {"--max-configurations", "8"});
  const auto refused = ptdp(capped);
  EXPECT_EQ(refused.status, 2) << refused.err;
  EXPECT_TRUE(contains(refused.err, "the values give 9 configurations (3 × 3), above the limit of 8")) << refused.err;
  auto enough = nine;
  enough.insert(enough.end(), {"--max-configurations", "9"});
  const auto ran = ptdp(enough);
  EXPECT_EQ(ran.status, 0) << ran.err;
  // Progress while the configurations are built (stderr is not a terminal: a line per quarter).
  EXPECT_TRUE(contains(ran.err, "building  9/9")) << ran.err;
}

namespace {
using namespace ptdp_cli_test;

TEST_F(Cli, SweepAutoChoosesThePartitionToo) {
  // BLOOM's 70 layers: pipelines that do not divide them are only possible balanced; the CSV
  // names the partition of each configuration.
  const auto r = ptdp({"sweep", PTDP_SOURCE_DIR + std::string("/scenarios/bloom-176b.yaml"), "--auto", "--top", "1",
                       "--set", "cluster.gpus=48", "--jobs", "1", "--csv", file("b.csv")});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = read_csv(file("b.csv"));
  ASSERT_GT(rows.size(), 2u);
  const size_t pipe = column(rows[0], "pipeline"), sets = column(rows[0], "overrides");
  size_t balanced_uneven = 0, uniform_uneven = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    const int p = std::stoi(rows[i][pipe]);
    if (70 % p == 0) continue;
    if (contains(rows[i][sets], "parallel.partition=balanced")) ++balanced_uneven;
    if (contains(rows[i][sets], "parallel.partition=uniform")) ++uniform_uneven;
  }
  EXPECT_GT(balanced_uneven, 0u);
  EXPECT_EQ(uniform_uneven, 0u);
}

TEST_F(Cli, SweepAutoExploresShardingAndVaryTakesTheZeroStage) {
  const auto r = ptdp({"sweep", kRoot + "/scenarios/paper/gpt-3.6b.yaml", "--auto", "--top", "1", "--fidelity", "analytic",
                       "--csv", file("z.csv")});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto rows = read_csv(file("z.csv"));
  ASSERT_GT(rows.size(), 2u);
  const size_t z = column(rows[0], "zero_stage"), g = column(rows[0], "sharding_group"), pipe = column(rows[0], "pipeline"),
               data = column(rows[0], "data");
  std::set<std::string> stages, groups;
  for (size_t i = 1; i < rows.size(); ++i) {
    stages.insert(rows[i][z]);
    groups.insert(rows[i][g]);
    if (rows[i][z] == "3") {
      EXPECT_EQ(rows[i][pipe], "1") << "stage 3 only without pipelining";
    }
    if (rows[i][z] != "0") {
      EXPECT_NE(rows[i][data], "1") << "sharding needs data > 1";
    }
  }
  EXPECT_EQ(stages, (std::set<std::string>{"0", "1", "2", "3"}));
  EXPECT_EQ(groups, (std::set<std::string>{"data", "node"}));

  // --vary over the stage: memory falls stage by stage.
  const auto v = ptdp({"sweep", kRoot + "/scenarios/paper/gpt-3.6b.yaml", "--vary", "parallel.zero_stage=0,1,2,3", "--set",
                       "parallel.pipeline=1", "--fidelity", "analytic", "--csv", file("v.csv")});
  ASSERT_EQ(v.status, 0) << v.err;
  const auto vr = read_csv(file("v.csv"));
  ASSERT_EQ(vr.size(), 5u);
  const size_t zc = column(vr[0], "zero_stage"), mem = column(vr[0], "peak_memory_bytes");
  std::map<std::string, double> memory;
  for (size_t i = 1; i < vr.size(); ++i) memory[vr[i][zc]] = std::stod(vr[i][mem]);
  EXPECT_GT(memory["0"], memory["1"]);
  EXPECT_GT(memory["1"], memory["2"]);
  EXPECT_GT(memory["2"], memory["3"]);
}

TEST_F(Cli, CompareStrategiesShowsTheBestOfEachFamilySideBySide) {
  const auto r = ptdp({"compare-strategies", kRoot + "/scenarios/paper/gpt-3.6b.yaml", "--json", file("s.json")});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* s : {"Megatron PTD-P", "ZeRO-3 / FSDP", "hybrid", "optimizer", "exposed shard"}) EXPECT_TRUE(contains(r.out, s)) << s;
  const auto j = nlohmann::json::parse(std::ifstream(file("s.json")));
  const auto& megatron = j.at("megatron");
  const auto& fsdp = j.at("fsdp");
  ASSERT_FALSE(fsdp.is_null());
  EXPECT_EQ(fsdp["config"]["parallel"]["zero_stage"], 3);
  EXPECT_EQ(fsdp["config"]["parallel"]["tensor"], 1);
  EXPECT_LE(megatron["config"]["parallel"]["zero_stage"].get<int>(), 1);
  // Fully sharded states take far less memory than Megatron's replicated weights and gradients.
  EXPECT_LT(fsdp["memory_breakdown"]["weights"].get<double>(), megatron["memory_breakdown"]["weights"].get<double>() / 10);
}

}  // namespace

namespace {
using namespace ptdp_cli_test;

TEST_F(Cli, SweepAutoWeighsSequenceParallelismAndEveryRecomputeMode) {
  // The 22B of Korthikanti et al. on 8 A100s, B 8: --auto tries sequence parallelism (t > 1
  // only) with none, selective and full recompute; plans that do not fit are counted as such,
  // never as failures.
  const auto r = ptdp({"sweep", PTDP_SOURCE_DIR + std::string("/scenarios/paper/gpt-22b-layer.yaml"), "--auto", "--top", "3",
                       "--set", "training.global_batch=8", "--csv", file("sp.csv"), "--exhaustive"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, " 0 failed)")) << r.out;
  const auto rows = read_csv(file("sp.csv"));
  ASSERT_GT(rows.size(), 2u);
  const size_t status = column(rows[0], "status"), t = column(rows[0], "tensor"), rc = column(rows[0], "recompute"),
               sp = column(rows[0], "sequence_parallel"), time = column(rows[0], "iteration_time_s"),
               pipe = column(rows[0], "pipeline"), mb = column(rows[0], "micro_batch"), sched = column(rows[0], "schedule");
  std::map<std::string, int> seen;  // "recompute sp status"
  std::map<std::string, double> time_of;  // same layout, by recompute + sp
  for (size_t i = 1; i < rows.size(); ++i) {
    const auto& row = rows[i];
    EXPECT_NE(row[status], "error") << row.back();
    if (row[sp] == "true") {
      EXPECT_NE(row[t], "1") << "sequence parallelism needs t > 1";
    }
    ++seen[row[rc] + " " + row[sp] + " " + row[status]];
    if (row[status] == "ok" && row[t] == "8" && row[pipe] == "1" && row[mb] == "1" && row[sched] == "1f1b")
      time_of[row[rc] + " " + row[sp]] = std::stod(row[time]);
  }
  for (const char* mode : {"none", "selective", "full"}) {
    EXPECT_GT(seen[std::string(mode) + " true ok"], 0) << mode << " with sequence parallelism";
    EXPECT_GT(seen[std::string(mode) + " false ok"], 0) << mode;
  }
  // Some plans do not fit in 80 GB (no recompute, large micro batches, t 1).
  EXPECT_GT(seen["none false oom"], 0);
  // At t 8, b 1: sequence parallel + selective recompute beats full recompute.
  ASSERT_TRUE(time_of.count("selective true") && time_of.count("full false")) << r.out;
  EXPECT_LT(time_of["selective true"], time_of["full false"]);
  EXPECT_LT(time_of["none true"], time_of["none false"]);
}

}  // namespace

namespace {
using namespace ptdp_cli_test;

// The rows of a sweep table: "rank label … tokens/s …" lines, label and the ranked figure.
std::vector<std::string> top_rows(const std::string& out, size_t k) {
  std::vector<std::string> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line) && rows.size() < k;) {
    std::istringstream words(line);
    std::string rank;
    words >> rank;
    if (rank.empty() || rank.find_first_not_of("0123456789") != std::string::npos) continue;
    rows.push_back(line.substr(line.find(rank) + rank.size()));
  }
  return rows;
}

TEST_F(Cli, PrunedSweepFindsTheSameTopTenAsTheExhaustiveOne) {
  // Issue 22: plans whose lower bound cannot enter the top K are skipped; the top K must be the
  // exhaustive search's, plan for plan and figure for figure (a small model, every dimension).
  // Experts and context parallelism too (the sweep shares costs between plans: the keys must
  // tell ep, etp and cp apart), on 32 GPUs so that the exhaustive search stays quick.
  const std::vector<std::pair<const char*, std::vector<std::string>>> cases = {
      {"/scenarios/paper/gpt-3.6b.yaml", {}},
      {"/scenarios/tiny-gpt-cpu.yaml", {}},
      {"/scenarios/moe/mixtral-8x7b.yaml", {"--set", "cluster.gpus=32", "--set", "training.global_batch=64"}},
      {"/scenarios/long-context/llama2-7b-128k.yaml", {"--set", "cluster.gpus=32", "--set", "training.global_batch=16"}}};
  for (const auto& [scenario, sets] : cases) {
    std::vector<std::string> common = {"sweep", kRoot + scenario, "--auto", "--fidelity", "analytic", "--top", "10"};
    common.insert(common.end(), sets.begin(), sets.end());
    std::vector<std::string> exhaustive = common;
    exhaustive.push_back("--exhaustive");
    const auto pruned = ptdp(common), full = ptdp(exhaustive);
    ASSERT_EQ(pruned.status, 0) << pruned.err;
    ASSERT_EQ(full.status, 0) << full.err;
    const auto a = top_rows(pruned.out, 10), b = top_rows(full.out, 10);
    ASSERT_EQ(a.size(), 10u) << pruned.out;
    EXPECT_EQ(a, b) << scenario;
    EXPECT_TRUE(contains(pruned.out, "skipped by their lower bound")) << pruned.out;
    EXPECT_TRUE(contains(full.out, ", 0 skipped by their lower bound")) << "--exhaustive skips nothing:\n" << full.out;
  }
}

TEST_F(Cli, TopRowsThatHideMostOfTheirCommunicationShowTheirTimeAtHalfTheNicBandwidth) {
  // Issue 22 item 4: the shown rows carry the share of their data-parallel/sharding communication
  // hidden behind compute; those above half get their iteration time with the NICs at half
  // bandwidth, which is longer (table and CSV).
  const auto r = ptdp({"sweep", kRoot + "/scenarios/paper/gpt-3.6b.yaml", "--auto", "--fidelity", "analytic", "--csv", file("h.csv")});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "half NIC")) << r.out;
  EXPECT_TRUE(contains(r.out, "hide more than half of their data-parallel/sharding communication")) << r.out;
  const auto rows = read_csv(file("h.csv"));
  ASSERT_GT(rows.size(), 20u);
  const auto& h = rows[0];
  const size_t rank = column(h, "rank"), hidden = column(h, "hidden_comm_fraction"), half = column(h, "half_nic_iteration_s"),
               time = column(h, "iteration_time_s"), zero = column(h, "zero_stage");
  size_t flagged = 0, sharded = 0;
  for (size_t i = 1; i < rows.size(); ++i) {
    const auto& row = rows[i];
    if (row[rank].empty() || std::stoi(row[rank]) > 10) {
      EXPECT_TRUE(row[hidden].empty() && row[half].empty()) << "row " << i << " is not shown";
      continue;
    }
    ASSERT_FALSE(row[hidden].empty()) << "rank " << row[rank];
    const double f = std::stod(row[hidden]);
    EXPECT_GE(f, 0.0);
    EXPECT_LE(f, 1.0);
    EXPECT_EQ(!row[half].empty(), f > 0.5) << "rank " << row[rank];
    if (row[half].empty()) continue;
    ++flagged;
    EXPECT_GT(std::stod(row[half]), std::stod(row[time])) << "rank " << row[rank] << ": half the NIC bandwidth is slower";
    sharded += row[zero] == "2" || row[zero] == "3";
  }
  EXPECT_GT(flagged, 0u);
  EXPECT_GT(sharded, 0u) << "a sharded (ZeRO-2/3) plan in the top 10 leans on hiding its reduce-scatters and gathers";
}

TEST_F(Cli, SweepMegatronNamesTheFrameworkRankOneNeedsAndTheBestPlanMegatronRuns) {
  // GPT-3 175B on 1024 GPUs at a global batch of 512: rank 1 is a zero-bubble (zb-v) plan, which
  // Megatron-LM does not run as such (its fork does).
  const auto r = ptdp({"sweep", kRoot + "/scenarios/gpt3-175b.yaml", "--auto", "--fidelity", "analytic", "--megatron", "--set",
                       "training.global_batch=512"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "needs the zero-bubble pipeline fork of Megatron-LM (sail-sg/zero-bubble-pipeline-parallelism): "
                              "Megatron-LM cannot run it as such")) << r.out;
  const size_t at = r.out.find("Megatron-LM launch line of rank ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_TRUE(contains(r.out.substr(at), ", the best plan Megatron-LM can run:")) << r.out;
  const std::string line = r.out.substr(at);
  EXPECT_TRUE(contains(line, "pretrain_gpt.py")) << line;
  EXPECT_FALSE(contains(line, " z3")) << line;
  EXPECT_FALSE(contains(line, " z2")) << line;
  EXPECT_FALSE(contains(line.substr(0, line.find('\n')), " zb-")) << line;
}

TEST_F(Cli, SweepJobsZeroIsRefusedNamingTheFlag) {
  const auto r = ptdp({"sweep", kRoot + "/scenarios/tiny-gpt-cpu.yaml", "--auto", "--jobs", "0"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "--jobs")) << r.err;
}

}  // namespace

namespace {
using namespace ptdp_cli_test;

TEST_F(Cli, SweepAutoChoosesExpertAndContextParallelismWhereTheyApply) {
  // Mixtral on 16 GPUs: expert-parallel plans are in the space (and a plan with EP ranks first);
  // Llama 2 7B at 32k tokens on 8 GPUs: context-parallel plans are in the space.
  const auto moe = ptdp({"sweep", PTDP_SOURCE_DIR + std::string("/scenarios/moe/mixtral-8x7b.yaml"), "--auto", "--top", "1",
                         "--fidelity", "analytic", "--set", "cluster.gpus=16", "--set", "parallel.pipeline=2", "--set", "training.global_batch=32", "--jobs", "1",
                         "--exhaustive", "--csv", file("moe.csv")});
  ASSERT_EQ(moe.status, 0) << moe.err;
  const auto rows = read_csv(file("moe.csv"));
  const size_t sets = column(rows[0], "overrides");
  size_t ep = 0;
  const size_t expert_col = column(rows[0], "expert"), etp_col = column(rows[0], "expert_tensor");
  for (size_t i = 1; i < rows.size(); ++i) {
    const bool ep8 = contains(rows[i][sets], "parallel.expert=8");
    ep += ep8 ? 1 : 0;
    // The layout has columns of its own, as tensor/pipeline/data do.
    EXPECT_EQ(rows[i][expert_col] == "8", ep8) << "row " << i;
    EXPECT_TRUE(contains(rows[i][sets], "parallel.expert_tensor=" + rows[i][etp_col])) << "row " << i;
  }
  EXPECT_GT(ep, 0u);
  // The expert all-to-all time has its own column: positive on expert-parallel rows that were costed.
  const size_t ep_col = column(rows[0], "exposed_ep_s");
  bool ep_time = false;
  for (size_t i = 1; i < rows.size(); ++i)
    if (contains(rows[i][sets], "parallel.expert=8") && !rows[i][ep_col].empty() && std::stod(rows[i][ep_col]) > 0) ep_time = true;
  EXPECT_TRUE(ep_time);
  const auto cp = ptdp({"sweep", PTDP_SOURCE_DIR + std::string("/scenarios/long-context/llama2-7b-128k.yaml"), "--auto", "--top", "1",
                        "--fidelity", "analytic", "--set", "cluster.gpus=8", "--set", "parallel.tensor=2", "--set", "parallel.context=2", "--set", "model.seq_length=32768", "--set",
                        "training.global_batch=8", "--jobs", "1", "--csv", file("cp.csv")});
  ASSERT_EQ(cp.status, 0) << cp.err;
  const auto cp_rows = read_csv(file("cp.csv"));
  size_t with_cp = 0;
  for (size_t i = 1; i < cp_rows.size(); ++i) {
    const bool cp2 = contains(cp_rows[i][column(cp_rows[0], "overrides")], "parallel.context=2");
    with_cp += cp2 ? 1 : 0;
    EXPECT_EQ(cp_rows[i][column(cp_rows[0], "context")] == "2", cp2) << "row " << i;
  }
  EXPECT_GT(with_cp, 0u);
}

}  // namespace

TEST_F(Cli, SweepAutoTriesDualPipeVWhereItsPairsHideDearAllToAlls) {
  // Mixtral 8×22B on its 256 H100s: with the NVLink at 100 GB/s instead of NVLink 4 the expert
  // all-to-alls cost more and DualPipeV's OVERLAP_F_B pairs hide them, so its best plan gains on
  // the best plan of any other schedule, and DualPipeV plans are among the ten best.
  auto sweep = [&](const std::vector<std::string>& sets, const std::string& csv) {
    std::vector<std::string> args = {"sweep", PTDP_SOURCE_DIR + std::string("/scenarios/moe/mixtral-8x22b.yaml"), "--auto", "--top", "0",
                                     "--csv", file(csv)};
    for (const std::string& s : sets) args.insert(args.end(), {"--set", s});
    const auto r = ptdp(args);
    EXPECT_EQ(r.status, 0) << r.err;
    return read_csv(file(csv));
  };
  // Best DualPipeV tokens/s over the best tokens/s of the other schedules (DualPipe's lanes apart).
  auto dualpipev_share = [](const std::vector<std::vector<std::string>>& rows) {
    const size_t sets_col = column(rows[0], "overrides"), tokens_col = column(rows[0], "tokens_per_s");
    double dualpipev = 0, other = 0;
    for (size_t i = 1; i < rows.size(); ++i) {
      if (rows[i][tokens_col].empty()) continue;
      const double x = std::stod(rows[i][tokens_col]);
      if (contains(rows[i][sets_col], "parallel.schedule=dualpipev")) dualpipev = std::max(dualpipev, x);
      else if (!contains(rows[i][sets_col], "parallel.schedule=dualpipe")) other = std::max(other, x);
    }
    return other > 0 ? dualpipev / other : 0.0;
  };
  const auto fast = sweep({}, "nvlink4.csv");
  const auto slow = sweep({"cluster.topology.node.nvlink.bandwidth=100GBps"}, "nvlink100.csv");
  EXPECT_GT(dualpipev_share(slow), dualpipev_share(fast));
  const size_t sets_col = column(slow[0], "overrides");
  size_t in_top = 0;
  for (size_t i = 1; i < slow.size() && i <= 10; ++i) {
    const std::string& o = slow[i][sets_col];
    if (!contains(o, "parallel.schedule=dualpipev")) continue;
    ++in_top;
    EXPECT_TRUE(contains(o, "parallel.virtual_stages=2")) << o;
  }
  EXPECT_GE(in_top, 1u);
}

namespace {
using namespace ptdp_cli_test;

const std::vector<std::string> kSmallLlama = {"sweep", PTDP_SOURCE_DIR + std::string("/scenarios/llama3-70b.yaml"), "--auto",
                                              "--set", "cluster.gpus=64", "--set", "training.global_batch=16",
                                              "--fidelity", "analytic", "--top", "3"};

TEST_F(Cli, SweepAutoBuildsOnlyValidPlansAndKeepsThePrecision) {
  // Issue 35: t over the divisors of the heads and key/value groups, p over the splits a partition
  // allows, b over the divisors of the per-replica batch …: nothing is generated to be refused.
  auto args = kSmallLlama;
  args.insert(args.end(), {"--csv", file("l.csv")});
  const auto r = ptdp(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, ", 0 invalid skipped")) << r.out;
  // The plans that do not fit are counted with one of them and its numbers.
  EXPECT_TRUE(contains(r.out, "GB per GPU of 80.0 GB (the closest to fitting)")) << r.out;
  // bf16 stays bf16 (FP8 changes the arithmetic); the table says what FP8 would give.
  EXPECT_TRUE(contains(r.out, "precision: kept at bf16")) << r.out;
  EXPECT_TRUE(contains(r.out, "FP8 would run rank 1's plan")) << r.out;
  const auto rows = read_csv(file("l.csv"));
  ASSERT_GT(rows.size(), 100u);
  const size_t sets = column(rows[0], "overrides");
  for (size_t i = 1; i < rows.size(); ++i) ASSERT_FALSE(contains(rows[i][sets], "training.precision")) << rows[i][sets];

  // Asked for, FP8 is swept beside bf16, each precision's layouts enumerated alike.
  auto both = kSmallLlama;
  both.insert(both.end(), {"--vary", "training.precision=bf16,fp8", "--csv", file("p.csv")});
  const auto v = ptdp(both);
  ASSERT_EQ(v.status, 0) << v.err;
  EXPECT_FALSE(contains(v.out, "FP8 would run")) << v.out;
  const auto prows = read_csv(file("p.csv"));
  size_t bf16 = 0, fp8 = 0;
  for (size_t i = 1; i < prows.size(); ++i) {
    bf16 += contains(prows[i][sets], "training.precision=bf16");
    fp8 += contains(prows[i][sets], "training.precision=fp8");
  }
  EXPECT_EQ(bf16, rows.size() - 1);  // the same plans as without --vary
  EXPECT_GT(fp8, 0u);                // (FP8 keeps FP8 weight copies: more plans want offloading)
  EXPECT_EQ(bf16 + fp8, prows.size() - 1);
  // The layout keys stay --auto's.
  auto layout = kSmallLlama;
  layout.insert(layout.end(), {"--vary", "parallel.tensor=2,4"});
  const auto refused = ptdp(layout);
  EXPECT_EQ(refused.status, 2);
  EXPECT_TRUE(contains(refused.err, "--auto chooses parallel.tensor itself")) << refused.err;
}

TEST_F(Cli, SweepAutoCountsWhatTheScenariosOwnKeysRefuseWithRealNumbers) {
  // vocab_parallel_pipeline (the scenario's key, not --auto's) needs pipeline > 1 and one stage
  // per rank: the layouts it refuses are counted by reason, each with the numbers of one plan.
  auto args = kSmallLlama;
  args.insert(args.end(), {"--set", "parallel.vocab_parallel_pipeline=true"});
  const auto r = ptdp(args);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "e.g. parallel.vocab_parallel_pipeline: splits the output layer over the pipeline ranks: it needs "
                              "pipeline > 1 (got 1)")) << r.out;
  EXPECT_TRUE(contains(r.out, "e.g. parallel.vocab_parallel_pipeline: is modelled with one stage per pipeline rank (virtual_stages 1, got "))
      << r.out;
  EXPECT_FALSE(contains(r.out, "(N")) << r.out;
}

TEST_F(Cli, SweepReportsRankStabilityOfTheRefinedTopThree) {
  const auto r = ptdp({"sweep", PTDP_SOURCE_DIR + std::string("/scenarios/paper/gpt-3.6b.yaml"), "--auto", "--top", "3", "--jobs", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "rank stability: the top 3 ")) << r.out;
  EXPECT_FALSE(contains(r.out, "not re-simulated")) << r.out;
  // A budget the user gives applies to every plan: none fits in a microsecond, and each row says so.
  const auto b = ptdp({"sweep", PTDP_SOURCE_DIR + std::string("/scenarios/paper/gpt-3.6b.yaml"), "--auto", "--top", "3", "--jobs", "1",
                       "--refine-budget", "0.000000001"});
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_TRUE(contains(b.out, "not re-simulated: the refinement budget (--refine-budget 1e-09 s) was spent")) << b.out;
  EXPECT_TRUE(contains(b.out, "rank stability: unknown")) << b.out;
}

}  // namespace
