// Fuzz target: the Hugging Face config importer (issue 23). Any input must either import as a
// scenario that loads or be refused with a ConfigError naming the file and the key; a JSON
// library exception leaking out, a crash, a hang or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "interop/interop.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ptdp::ImportResult r = ptdp::import_hf(text, "fuzz.json", ptdp::ImportOptions{});
    PTDP_ASSERT(!r.yaml.empty(), "an import yields a scenario");
  } catch (const ptdp::ConfigError&) {
  }
  return 0;
}
