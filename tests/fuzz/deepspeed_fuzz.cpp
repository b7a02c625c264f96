// Fuzz target: the DeepSpeed config importer (issue 25). Any input must either import onto the
// base scenario or be refused with a ConfigError naming the file or the JSON path; a JSON library
// exception leaking out, a crash (deep nesting), a hang or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "interop/interop.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    ptdp::ImportOptions options;
    options.base_scenario = PTDP_FUZZ_BASE_SCENARIO;
    const ptdp::ImportResult r = ptdp::import_deepspeed(text, "fuzz.json", options);
    PTDP_ASSERT(!r.yaml.empty(), "an import yields a scenario");
  } catch (const ptdp::ConfigError&) {
  }
  return 0;
}
