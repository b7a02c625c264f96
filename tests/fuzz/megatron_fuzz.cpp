// Fuzz target: the Megatron-LM importer — a launch script through the shell-word splitter and
// the argument mapping (issue 25). Any input must either import or be refused with a
// ConfigError; any other exception, a crash (SIGFPE on a zero divisor), a hang, an out-of-memory
// (a variable that doubles itself) or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "interop/interop.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto words = ptdp::shell_words(text, "fuzz.sh");
    ptdp::ImportOptions options;
    const ptdp::ImportResult r = ptdp::import_megatron(words, "fuzz.sh", options);
    PTDP_ASSERT(!r.yaml.empty(), "an import yields a scenario");
  } catch (const ptdp::ConfigError&) {
    // Refused with a message: the expected outcome for bad input.
  }
  return 0;
}
