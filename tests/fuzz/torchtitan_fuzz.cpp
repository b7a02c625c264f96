// Fuzz target: the TOML reader and the torchtitan importer (issue 23). Any input must either
// import as a scenario that loads or be refused with a ConfigError (file:line:col and the key);
// anything else escaping, a crash, a hang or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "interop/interop.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ptdp::ImportOptions options;
  options.gpus = 64;
  try {
    const ptdp::ImportResult r = ptdp::import_torchtitan(text, "fuzz.toml", options);
    PTDP_ASSERT(!r.yaml.empty(), "an import yields a scenario");
  } catch (const ptdp::ConfigError&) {
  }
  return 0;
}
