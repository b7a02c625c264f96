// Multi-rank executor tests: running the training driver under mpirun and comparing runs (shared
// by the tests/exec/mpi_*_test.cpp files of the exec_mpi_train_test program).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>
#include <nlohmann/json.hpp>
#include "exec/io/data.hpp"
#include "tests/support/temp_dir.hpp"

namespace mpi_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct MpiRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr of every rank and of mpirun
  json result;         // the driver's --out file (empty when it failed)
};

inline std::string temp_dir(const std::string& name) {
  const fs::path dir = ptdp::testing::scratch_dir("ptdp-exec-test") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

inline std::string command(int np, const std::string& args, const std::string& mpi_options = "") {
  // `timeout` bounds a run that would hang: a hang then fails the test instead of blocking ctest.
  return std::string("timeout 150 ") + PTDP_MPIEXEC + " --allow-run-as-root --oversubscribe " + mpi_options + " -np " +
         std::to_string(np) + " " + PTDP_TRAIN_DRIVER + " " + args + " 2>&1";
}

inline int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

inline MpiRun run_ranks(int np, const std::string& args, const std::string& mpi_options = "") {
  static int counter = 0;
  const std::string out = temp_dir("runs") + "/" + std::to_string(counter++) + ".json";
  MpiRun r;
  FILE* pipe = ::popen(command(np, args + " --out " + out, mpi_options).c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) r.output += buf;
  r.exit_code = exit_code_of(::pclose(pipe));
  std::ifstream in(out);
  if (in) r.result = json::parse(in);
  return r;
}

// `ptdp checkpoint DIR --hf DIR/hf`: its exit code and output (result empty).
inline MpiRun hf_export_of(const std::string& dir) {
  MpiRun r;
  const std::string out = dir + "/hf.out";
  r.exit_code = exit_code_of(std::system(("timeout 60 " + std::string(PTDP_BINARY) + " checkpoint " + dir + " --hf " + dir + "/hf > " + out +
                                          " 2>&1").c_str()));
  std::ifstream in(out);
  r.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return r;
}

// Memoised: several tests compare against the same reference runs.
inline const MpiRun& run_cached(int np, const std::string& args) {
  static std::map<std::string, MpiRun> cache;
  const std::string key = std::to_string(np) + " " + args;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, run_ranks(np, args)).first;
  return it->second;
}

inline size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + 1)) ++n;
  return n;
}

// Relative loss difference and largest absolute parameter difference of b against a.
inline void expect_same_training(const MpiRun& a, const MpiRun& b, const std::string& what, double loss_rel_tol, double param_tol) {
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << what << ":\n" << b.output;
  const auto la = a.result["losses"].get<std::vector<double>>(), lb = b.result["losses"].get<std::vector<double>>();
  ASSERT_EQ(la.size(), lb.size()) << what;
  for (size_t i = 0; i < la.size(); ++i)
    EXPECT_LE(std::fabs(la[i] - lb[i]), loss_rel_tol * std::fabs(la[i])) << what << " loss of step " << i + 1;
  // The global gradient norm (TP-replicated parameters and the tied embedding counted once).
  // Adam hardly reacts to a uniform gradient scale, so the clipping norm is checked directly.
  const double na = a.result["grad_norm"].get<double>(), nb = b.result["grad_norm"].get<double>();
  EXPECT_NEAR(nb, na, 1e-5 * na) << what << ": gradient norm of the last iteration";
  const json& pa = a.result["params"];
  const json& pb = b.result["params"];
  ASSERT_EQ(pa.size(), pb.size()) << what;
  ASSERT_GT(pa.size(), 0u);
  double worst = 0;
  std::string worst_name;
  for (auto& [name, values] : pa.items()) {
    ASSERT_TRUE(pb.contains(name)) << what << ": no parameter " << name;
    const auto va = values.get<std::vector<float>>(), vb = pb[name].get<std::vector<float>>();
    ASSERT_EQ(va.size(), vb.size()) << what << ": " << name;
    for (size_t i = 0; i < va.size(); ++i) {
      const double d = std::fabs(static_cast<double>(va[i]) - vb[i]);
      if (d > worst) worst = d, worst_name = name;
    }
  }
  EXPECT_LE(worst, param_tol) << what << ": parameters differ by up to " << worst << " in " << worst_name;
}

inline void expect_identical(const MpiRun& a, const MpiRun& b, const std::string& what) {
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << what << ":\n" << b.output;
  EXPECT_EQ(a.result["losses"], b.result["losses"]) << what;
  EXPECT_TRUE(a.result["params"] == b.result["params"]) << what << ": parameters are not bit-for-bit identical";
}

// A tiny GPT: 4 layers, h 32, 4 heads, s 16, vocabulary 256; b 2, B 8; 3 iterations, seed 7.
inline const std::string kTiny = "--layers 4 --hidden 32 --heads 4 --seq 16 --vocab 256 --micro 2 --global 8 --seed 7";

}  // namespace mpi_test
