// Runs the `ptdp` executable (PTDP_BINARY) as a user would, in a fresh temporary folder.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace ptdp_cli_test {
namespace fs = std::filesystem;

struct Outcome {
  int status = -1;  // exit code, or 128 + signal when the process was killed
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ptdp-cli-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    // `ptdp validate` without --profile calibrates this machine once and caches the profile:
    // one cache for the whole test run, next to the binary (never the user's home).
    if (!std::getenv("PTDP_CACHE_DIR"))
      ::setenv("PTDP_CACHE_DIR", (fs::path(PTDP_BINARY).parent_path() / "test-cache").c_str(), 1);
  }
  // A failed test keeps its folder (the commands' outputs, profiles and reports) and says where.
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "kept the test's files in %s\n", dir_.c_str());
    else fs::remove_all(dir_);
  }

  std::string file(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name)) << text;
    return file(name);
  }

  // Runs `ptdp ARGS…` and captures stdout, stderr and the exit status.
  Outcome ptdp(const std::vector<std::string>& args) const {
    std::string cmd = quoted(PTDP_BINARY);
    for (const auto& a : args) cmd += " " + quoted(a);
    cmd += " >" + quoted(file("stdout")) + " 2>" + quoted(file("stderr"));
    Outcome r;
    const int raw = std::system(cmd.c_str());
    if (WIFEXITED(raw)) r.status = WEXITSTATUS(raw);  // sh reports a killed child as 128 + signal
    if (WIFSIGNALED(raw)) r.status = 128 + WTERMSIG(raw);
    r.out = slurp(file("stdout"));
    r.err = slurp(file("stderr"));
    return r;
  }

  std::string dir_;
};

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace ptdp_cli_test
