// Errors with source locations and always-on assertions: the three kinds of failure of ptdp.
//   1. ConfigError   — bad user input (YAML, CLI, impossible plans); exit code 2.
//   2. EnvironmentError — the environment failed (files, MPI, CUDA, NCCL); exit code 1.
//   3. PTDP_ASSERT   — a bug in ptdp; throws InternalError carrying file:line; exit code 1.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ptdp {

/// Where a value came from: a file and a 1-based line and column (0 = unknown).
struct SourceLocation {
  std::string file;
  int line = 0;
  int column = 0;

  bool known() const { return !file.empty(); }
  /// "file:line:col", "file" or "" depending on what is known.
  std::string str() const;
};

/// A user-input error: reads "FILE:LINE:COL: key.path: what is wrong (got X)".
/// Libraries that do not know the file (e.g. plan validation) throw it with only a key path;
/// the scenario loader adds the location of that key.
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string key_path, std::string message, SourceLocation where = {});

  const std::string& key_path() const { return key_path_; }
  const std::string& message() const { return message_; }
  const SourceLocation& where() const { return where_; }
  /// The same error, located at `where` (used by the loader to attach file:line:col).
  ConfigError located(SourceLocation where) const;

  /// A well-formed value that breaks a rule of plans or clusters (e.g. t does not divide the
  /// heads), as opposed to a malformed one (wrong type, unknown key). Sweeps skip the former
  /// and stop on the latter.
  static ConfigError rule(std::string key_path, std::string message);
  bool is_rule_violation() const { return rule_; }

 private:
  bool rule_ = false;
  static std::string format(const std::string& key, const std::string& msg, const SourceLocation& at);
  std::string key_path_;
  std::string message_;
  SourceLocation where_;
};

/// A failure of the environment: files, MPI, CUDA, cuBLAS, NCCL. Carries the library's text.
class EnvironmentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A broken invariant inside ptdp (a bug). Thrown by PTDP_ASSERT.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void assertion_failed(const char* expr, const char* file, int line, const std::string& detail);

/// `text` for quoting in a message: control bytes and bytes outside printable ASCII/UTF-8 are
/// written as \xNN, and text longer than `max_chars` is cut with "…" (garbage input stays readable).
std::string printable(std::string_view text, size_t max_chars = 80);

/// True when `text` is well-formed UTF-8 (no stray or overlong bytes, no surrogates).
bool is_valid_utf8(std::string_view text);

/// The candidate closest to `word` by edit distance, or "" when none is reasonably close.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

/// " (did you mean 'x'?)" or "" — for unknown keys and values.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace ptdp

/// Always-on assertion (also in release builds): a failure is a bug in ptdp, never bad input.
#define PTDP_ASSERT(cond, detail)                                              \
  do {                                                                         \
    if (!(cond)) ::ptdp::assertion_failed(#cond, __FILE__, __LINE__, (detail)); \
  } while (0)
