// Calibrating this machine, validating predictions against real training, comparing reports.
#include <nlohmann/json.hpp>

#include <map>

#include "run_ptdp.hpp"

namespace {
using namespace ptdp_cli_test;
namespace fs = std::filesystem;

const std::string kRoot = PTDP_SOURCE_DIR;

std::string mpirun(int ranks) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " + std::string(PTDP_MPIEXEC) +
         " --oversubscribe --bind-to none -np " + std::to_string(ranks) + " " + quoted(PTDP_BINARY);
}

TEST_F(Cli, CalibrateWritesAProfileTheSimulatorAccepts) {
  const std::string profile = file("profiles/local.yaml");
  const std::string cmd = mpirun(2) + " calibrate --backend cpu --out " + quoted(profile) + " >" + quoted(file("out")) + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(file("out"));
  const std::string yaml = slurp(profile);
  for (const char* key : {"peak_flops:", "hbm_bandwidth:", "gemm_max_efficiency:", "cores:", "wakeup_latency:", "intra_node_allreduce:",
                          "oversubscribed_allreduce:", "adam_step_time:", "context_attention_flops:",
                          "context_attention_backward_flops:", "busbw:", "speed_probe_gemm_time:"})
    EXPECT_TRUE(contains(yaml, key)) << key << "\n" << yaml;
  // The speed probe is sampled through the kernels (before them, after each round of GEMMs and
  // each group of other kernels), each group's figures set to the first sample's speed.
  const std::string out = slurp(file("out"));
  const size_t at = out.find(" groups of kernels set to that speed");
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_GE(std::stoi(out.substr(out.rfind("of ", at) + 3)), 10) << out;
  // The profile drives a simulation of the tiny CPU scenario.
  const auto r = ptdp({"simulate", kRoot + "/scenarios/tiny-gpt-cpu.yaml", "--set", "cluster.topology=" + profile,
                       "--fidelity", "reduced", "--json", file("p.json")});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(slurp(file("p.json")));
  EXPECT_GT(j["iteration_time_s"].get<double>(), 1e-4);
  EXPECT_LT(j["iteration_time_s"].get<double>(), 10.0);
}

TEST_F(Cli, ValidatePrintsPredictedAndMeasuredAndKeepsComparableReports) {
  const auto r = ptdp({"validate", kRoot + "/scenarios/tiny-gpt-cpu.yaml", "--set", "cluster.gpus=2", "--set",
                       "parallel.tensor=1", "--set", "parallel.pipeline=2", "--set", "parallel.data=1", "--steps", "3",
                       "--out-dir", file("v")});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "predicted")) << r.out;
  EXPECT_TRUE(contains(r.out, "measured")) << r.out;
  EXPECT_TRUE(contains(r.out, "iteration time")) << r.out;
  for (const char* f : {"predicted.json", "measured.json", "predicted-trace.json", "measured-trace.json"})
    EXPECT_TRUE(fs::exists(file("v/" + std::string(f)))) << f;
  const auto measured = nlohmann::json::parse(slurp(file("v/measured.json")));
  EXPECT_EQ(measured["fidelity"], "measured");
  EXPECT_EQ(measured["losses"].size(), 3u);
  // Both reports count the same actions of the same lowered schedule.
  const auto c = ptdp({"compare", file("v/predicted.json"), file("v/measured.json")});
  ASSERT_EQ(c.status, 0) << c.err;
  for (const char* cls : {"F ", "B ", "SEND/RECV", "REDUCE_GRAD", "OPTIM"}) EXPECT_TRUE(contains(c.out, cls)) << cls << c.out;
  const auto predicted = nlohmann::json::parse(slurp(file("v/predicted.json")));
  for (const char* cls : {"F", "B", "SEND/RECV"})
    EXPECT_EQ(predicted["ranks"][0]["actions"][cls]["count"], measured["ranks"][0]["actions"][cls]["count"]) << cls;
}

TEST_F(Cli, ValidateComparesComputationInCpuSecondsComposedOnTheSameSchedule) {
  // p 2, m 4: the executor reports each compute action's CPU seconds per kind and stage; validate
  // composes one iteration from them and one from the cost model, on the same schedule.
  const auto r = ptdp({"validate", kRoot + "/scenarios/tiny-gpt-cpu.yaml", "--set", "cluster.gpus=2", "--set",
                       "parallel.tensor=1", "--set", "parallel.pipeline=2", "--set", "parallel.data=1", "--steps", "3",
                       "--out-dir", file("cpu")});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "computation in CPU seconds")) << r.out;
  const auto measured = nlohmann::json::parse(slurp(file("cpu/measured.json")));
  const auto& extra = measured;  // the report's extra figures are top-level keys
  for (const char* key : {"compute_cpu_s.F.0", "compute_cpu_s.F.1", "compute_cpu_s.B.0", "compute_cpu_s.B.1", "compute_cpu_s.OPTIM.0",
                          "compute_cpu_s.OPTIM.1"})
    ASSERT_TRUE(extra.contains(key) && extra[key].get<double>() > 0) << key << "\n" << measured.dump(1);
  EXPECT_FALSE(extra.contains("compute_cpu_s.F.2")) << "two stages only";
  // A backward computes about twice what a forward does (its two GEMMs per forward GEMM).
  for (const char* st : {"0", "1"}) {
    const double f = extra[std::string("compute_cpu_s.F.") + st], b = extra[std::string("compute_cpu_s.B.") + st];
    EXPECT_GT(b, 1.2 * f) << "stage " << st;
    EXPECT_LT(b, 4.0 * f) << "stage " << st;
  }
  const auto c = nlohmann::json::parse(slurp(file("cpu/compute.json")));
  const double measured_s = c["measured_iteration_s"], predicted_s = c["predicted_iteration_s"];
  // The composition holds at least each stage's m forwards and backwards (4 microbatches).
  for (const char* st : {"0", "1"})
    EXPECT_GE(measured_s, 4 * (extra[std::string("compute_cpu_s.F.") + st].get<double>() +
                               extra[std::string("compute_cpu_s.B.") + st].get<double>()))
        << st;
  EXPECT_GT(predicted_s, 0.5 * measured_s);
  EXPECT_LT(predicted_s, 2.0 * measured_s);
  for (const char* kind : {"F", "B", "OPTIM"}) EXPECT_GT(c["actions"][kind]["measured_s"].get<double>(), 0) << kind;
  // The speed probe: timed by the run's ranks around the run, set against the profile's; the
  // prediction is the profile's computation scaled by it (slower now: more, faster: less).
  ASSERT_TRUE(extra.contains("speed_probe_gemm_s") && extra["speed_probe_gemm_s"].get<double>() > 0) << measured.dump(1);
  const double ratio = c["speed_probe_ratio"];
  EXPECT_GT(ratio, 0.05);
  EXPECT_LT(ratio, 20.0);
  const double unscaled = c["unscaled_predicted_iteration_s"];
  if (ratio > 1.02) { EXPECT_GT(predicted_s, unscaled) << ratio; }
  if (ratio < 0.98) { EXPECT_LT(predicted_s, unscaled) << ratio; }
  EXPECT_TRUE(contains(r.out, "speed probe")) << r.out;
  // How busy the machine was: the ranks' share of a core (thread CPU ÷ wall per iteration, MPI
  // waits polling) and their involuntary context switches per CPU second.
  ASSERT_TRUE(extra.contains("rank_cpu_share") && extra.contains("rank_preemptions_per_cpu_s")) << measured.dump(1);
  EXPECT_GT(extra["rank_cpu_share"].get<double>(), 0.0);
  EXPECT_LE(extra["rank_cpu_share"].get<double>(), 1.05);
  EXPECT_GE(extra["rank_preemptions_per_cpu_s"].get<double>(), 0.0);
}

TEST_F(Cli, SequenceParallelRecomputeIsTimedInBothEnginesAndCompared) {
  // t 2 with sequence parallelism: the simulator prices the recompute part of each B, the
  // executor times it (selective: the attention core; full: the layer forward), and compare puts
  // them side by side. Full recompute re-runs more than selective, in both engines.
  std::map<std::string, std::pair<double, double>> recompute;  // mode → (predicted, measured) of rank 0
  for (const char* mode : {"none", "selective", "full"}) {
    const std::string dir = std::string("sp-") + mode;
    const auto r = ptdp({"validate", kRoot + "/scenarios/tiny-gpt-cpu.yaml", "--set", "cluster.gpus=2", "--set",
                         "parallel.tensor=2", "--set", "parallel.pipeline=1", "--set", "parallel.data=1", "--set",
                         "parallel.sequence_parallel=true", "--set", std::string("parallel.recompute=") + mode, "--steps", "3",
                         "--out-dir", file(dir)});
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    const auto predicted = nlohmann::json::parse(slurp(file(dir + "/predicted.json")));
    const auto measured = nlohmann::json::parse(slurp(file(dir + "/measured.json")));
    EXPECT_EQ(measured["config"]["parallel"]["sequence_parallel"], true);
    recompute[mode] = {predicted["ranks"][0]["recompute_s"].get<double>(), measured["ranks"][0]["recompute_s"].get<double>()};
    const auto c = ptdp({"compare", file(dir + "/predicted.json"), file(dir + "/measured.json")});
    ASSERT_EQ(c.status, 0) << c.err;
    EXPECT_EQ(contains(c.out, "recompute"), std::string(mode) != "none") << c.out;
  }
  EXPECT_EQ(recompute["none"].first, 0.0);
  EXPECT_EQ(recompute["none"].second, 0.0);
  for (int engine = 0; engine < 2; ++engine) {
    auto of = [&](const char* m) { return engine == 0 ? recompute[m].first : recompute[m].second; };
    EXPECT_GT(of("selective"), 0.0) << engine;
    EXPECT_GT(of("full"), of("selective")) << engine;
  }
}

TEST_F(Cli, AZeroBubbleCsvWithIwSplitRunsInBothEnginesAndComparesLikeWithLike) {
  // The schedule is the program: a PyTorch-style CSV with I/W cells drives the simulator and
  // real training (p 2, m 4 of the tiny scenario at t 1); every action class matches in count.
  const std::string csv = write("zb.csv",
                                "0F0,0F1,0I0,0F2,0I1,0W0,0F3,0I2,0W1,0I3,0W2,0W3\n"
                                "1F0,1I0,1F1,1I1,1W0,1F2,1I2,1W1,1F3,1I3,1W2,1W3\n");
  const auto r = ptdp({"validate", kRoot + "/scenarios/tiny-gpt-cpu.yaml", "--set", "cluster.gpus=2", "--set",
                       "parallel.tensor=1", "--schedule", csv, "--steps", "3", "--out-dir", file("zb")});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const auto predicted = nlohmann::json::parse(slurp(file("zb/predicted.json")));
  const auto measured = nlohmann::json::parse(slurp(file("zb/measured.json")));
  EXPECT_EQ(measured["schedule"], csv);
  for (int rank = 0; rank < 2; ++rank) {
    const auto& p = predicted["ranks"][rank]["actions"];
    const auto& m = measured["ranks"][rank]["actions"];
    EXPECT_EQ(p["I/W"]["count"], 8) << rank;
    EXPECT_FALSE(p.contains("B")) << rank;
    for (const char* cls : {"F", "I/W", "SEND/RECV", "REDUCE_GRAD", "OPTIM"})
      EXPECT_EQ(p[cls]["count"], m[cls]["count"]) << cls << " rank " << rank;
  }
  // The same CSV trains to the same losses as the generated 1F1B schedule (the arithmetic of
  // I then W is that of B).
  const std::string cmd = mpirun(2) + " train " + kRoot + "/scenarios/tiny-gpt-cpu.yaml --set cluster.gpus=2 --set " +
                          "parallel.tensor=1 --steps 3 --json " + quoted(file("ref.json")) + " >" + quoted(file("ref.out")) +
                          " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(file("ref.out"));
  const auto ref = nlohmann::json::parse(slurp(file("ref.json")));
  EXPECT_EQ(ref["losses"], measured["losses"]);
  // With d = 1 REDUCE_GRAD holds only the tied-embedding all-reduce, in both engines.
  EXPECT_EQ(predicted["ranks"][0]["actions"]["REDUCE_GRAD"]["count"], 1);
}

TEST_F(Cli, CompareRejectsAFileThatIsNotAReport) {
  const auto r = ptdp({"compare", write("a.json", "{\"nope\": 1}"), write("b.json", "[")});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "a.json")) << r.err;
}

}  // namespace
