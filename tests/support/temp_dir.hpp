// A scratch folder per test process: /tmp/<prefix>-<pid>, created on first use and removed when
// the process's tests have all passed (kept after a failure, for looking at what went wrong).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace ptdp::testing {

inline std::filesystem::path scratch_dir(const std::string& prefix) {
  struct Cleanup : ::testing::Environment {
    explicit Cleanup(std::filesystem::path d) : dir(std::move(d)) {}
    void TearDown() override {
      if (!::testing::UnitTest::GetInstance()->Passed()) return;
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    std::filesystem::path dir;
  };
  static const std::filesystem::path dir = [&] {
    const std::filesystem::path d = std::filesystem::temp_directory_path() / (prefix + "-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    ::testing::AddGlobalTestEnvironment(new Cleanup(d));  // gtest owns and runs it at the end
    return d;
  }();
  return dir;
}

}  // namespace ptdp::testing
