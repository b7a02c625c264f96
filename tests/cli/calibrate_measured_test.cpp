// `ptdp calibrate --measured RUNS.csv --topology NAME --out PROFILE.yaml`: fitting a topology to
// measured runs, and the errors a user sees for a bad RUNS.csv (exit 2, row and column named).
#include "run_ptdp.hpp"

namespace {
using namespace ptdp_cli_test;

const std::string kRoot = PTDP_SOURCE_DIR;

class Measured : public Cli {
 protected:
  // Scenario paths are relative to the CSV: give them as absolute paths to the repository's.
  std::string csv(const std::string& rows) const {
    return write("runs.csv", "scenario,set,tflops_per_gpu\n" + rows);
  }
  Outcome calibrate(const std::string& path, std::vector<std::string> extra = {}) const {
    std::vector<std::string> args = {"calibrate", "--measured", path, "--topology", "dgx-a100", "--out", file("fit.yaml")};
    args.insert(args.end(), extra.begin(), extra.end());
    return ptdp(args);
  }
  std::string single_gpu() const { return kRoot + "/scenarios/paper/gpt-1b-single-gpu.yaml"; }
  std::string curve_rows() const {
    std::string rows;
    const int b[] = {1, 2, 4, 8, 16};
    const int tf[] = {68, 78, 86, 89, 91};
    for (int i = 0; i < 5; ++i)
      rows += single_gpu() + ",training.micro_batch=" + std::to_string(b[i]) + ";training.global_batch=" + std::to_string(b[i]) +
              "," + std::to_string(tf[i]) + "\n";
    return rows;
  }
};

TEST_F(Measured, FitsTheTopologyPrintsResidualsAndLeaveOneOutAndWritesAProfile) {
  const auto r = calibrate(csv(curve_rows()), {"--fit", "gemm_max_efficiency,elementwise_efficiency,iteration_overhead"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "leave-one-out rms")) << r.out;
  EXPECT_TRUE(contains(r.out, "loo error")) << r.out;
  EXPECT_TRUE(contains(r.out, "gemm_max_efficiency")) << r.out;
  const std::string yaml = slurp(file("fit.yaml"));
  EXPECT_TRUE(contains(yaml, "Fitted by `ptdp calibrate --measured")) << yaml;
  EXPECT_TRUE(contains(yaml, "measured_on:")) << yaml;  // the curves keep their links
  // The fitted profile reproduces the measurements it was fitted to (figure 7, within 3%).
  const auto s = ptdp({"simulate", single_gpu(), "--set", "cluster.topology=" + file("fit.yaml"), "--set",
                       "training.micro_batch=16", "--set", "training.global_batch=16", "--json", file("s.json")});
  ASSERT_EQ(s.status, 0) << s.err;
  const std::string json = slurp(file("s.json"));
  const auto at = json.find("\"tflops_per_gpu\":");
  ASSERT_NE(at, std::string::npos);
  EXPECT_NEAR(std::stod(json.substr(at + 17)), 91.0, 0.03 * 91);
}

TEST_F(Measured, AnUnknownKeyInSetNamesTheRowAndColumn) {
  const auto r = calibrate(csv(curve_rows() + single_gpu() + ",training.micro_bach=2,70\n"));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "runs.csv:7:")) << r.err;  // header is line 1, the bad row line 7
  EXPECT_TRUE(contains(r.err, "micro_bach")) << r.err;
  EXPECT_TRUE(contains(r.err, "micro_batch")) << r.err;  // did you mean
}

TEST_F(Measured, ANonNumericMeasurementNamesTheRowAndColumn) {
  const std::string row = single_gpu() + ",,fast\n";
  const auto r = calibrate(csv(row));
  EXPECT_EQ(r.status, 2) << r.err;
  const std::string col = std::to_string(single_gpu().size() + 3);  // after "scenario,,"
  EXPECT_TRUE(contains(r.err, "runs.csv:2:" + col + ": tflops_per_gpu: 'fast' is not a number")) << r.err;
}

TEST_F(Measured, FewerRowsThanParametersFitWhatTheyDetermineAndSaySo) {
  const std::string rows = single_gpu() + ",,68\n" + single_gpu() + ",training.micro_batch=2;training.global_batch=2,78\n";
  const auto r = calibrate(csv(rows));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "warning:")) << r.err;
  EXPECT_TRUE(contains(r.out, "not fitted (kept at the preset's values)")) << r.out;
  EXPECT_TRUE(contains(r.err, "determine at most 1 parameter(s) with their scatter measured")) << r.err;  // two rows: one parameter
  EXPECT_TRUE(contains(r.out, "wrote fitted profile 'fit (fitted from dgx-a100)'")) << r.out;
  const std::string yaml = slurp(file("fit.yaml"));
  EXPECT_TRUE(contains(yaml, "host_link:")) << yaml;  // preset fields it did not fit are kept
  // One row fits one parameter exactly: said, never a bare "rms error 0.00%".
  const auto one = calibrate(csv(single_gpu() + ",,68\n"));
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_TRUE(contains(one.out, "exactly determined")) << one.out;
  EXPECT_TRUE(contains(slurp(file("fit.yaml")), "(exactly determined)"));
}

TEST_F(Measured, TokensPerSecondPerGpuAndMfuAreMeasurementsToo) {
  const std::string tok = write("tok.csv", "scenario,set,tokens_per_s_per_gpu\n" + single_gpu() + ",,9000\n" + single_gpu() +
                                               ",training.micro_batch=2;training.global_batch=2,10000\n");
  const auto a = calibrate(tok, {"--fit", "gemm_max_efficiency"});
  EXPECT_EQ(a.status, 0) << a.err;
  EXPECT_TRUE(contains(a.out, "tokens_per_s_per_gpu")) << a.out;
  const std::string mfu = write("mfu.csv", "scenario,set,mfu\n" + single_gpu() + ",,45\n");
  const auto b = calibrate(mfu, {"--fit", "gemm_max_efficiency"});
  EXPECT_EQ(b.status, 2) << b.err;
  EXPECT_TRUE(contains(b.err, "mfu: is a fraction of peak")) << b.err;
}

TEST_F(Measured, AnUnknownColumnIsNamed) {
  const auto r = calibrate(write("runs.csv", "scenario,set,tflops\n" + single_gpu() + ",,68\n"));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "runs.csv:1:14: tflops: unknown column 'tflops'")) << r.err;
}

}  // namespace

// Issue 36: measurements no run produces, a parameter named twice, a scenario that is no scenario.
namespace {
using namespace ptdp_cli_test;

TEST_F(Measured, NonsenseIsRefusedNamingTheRowOrParameter) {
  // 5000 TFLOP/s on an A100 (peak 312): the fit would push every parameter to its bound.
  const auto fast = calibrate(csv(curve_rows() + single_gpu() + ",,5000\n"));
  EXPECT_EQ(fast.status, 2) << fast.err;
  EXPECT_TRUE(contains(fast.err, "row 7: 5000 TFLOP/s per GPU exceeds the GPU's peak of 312 TFLOP/s")) << fast.err;
  // An iteration time of 1e-300 s: its throughput is beyond any peak (its residual was inf%).
  write("time.csv", "scenario,set,iteration_time_s\n" + single_gpu() + ",,1.5\n" + single_gpu() + ",,1e-300\n");
  const auto tiny = calibrate(file("time.csv"));
  EXPECT_EQ(tiny.status, 2) << tiny.err;
  EXPECT_TRUE(contains(tiny.err, "time.csv:3:")) << tiny.err;
  EXPECT_TRUE(contains(tiny.err, "row 3:")) << tiny.err;
  // An iteration time whose throughput beats the peak (a 1.3 B model at 1 ms per batch).
  write("quick.csv", "scenario,set,iteration_time_s\n" + single_gpu() + ",,0.001\n");
  const auto quick = calibrate(file("quick.csv"));
  EXPECT_EQ(quick.status, 2) << quick.err;
  EXPECT_TRUE(contains(quick.err, "exceeds the GPU's peak")) << quick.err;
  // A parameter named twice in --fit.
  const auto twice = calibrate(csv(curve_rows()), {"--fit", "gemm_max_efficiency,iteration_overhead,gemm_max_efficiency"});
  EXPECT_EQ(twice.status, 2) << twice.err;
  EXPECT_TRUE(contains(twice.err, "parameter 'gemm_max_efficiency' is named twice")) << twice.err;
  // The CSV as its own scenario.
  write("self.csv", "scenario,set,tflops_per_gpu\nself.csv,,80\n");
  const auto self = calibrate(file("self.csv"));
  EXPECT_EQ(self.status, 2) << self.err;
  EXPECT_TRUE(contains(self.err, "self.csv:2:")) << self.err;
  EXPECT_FALSE(fs::exists(file("fit.yaml")));
}

}  // namespace
