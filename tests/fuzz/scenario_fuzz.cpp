// Fuzz target: the scenario loader (YAML parsing, schema, overrides-free building, topology
// resolution, plan validation). Any input must either load or be refused with a ConfigError;
// every other exception (an InternalError from an assertion, a std:: exception leaking out of
// yaml-cpp or the standard library), a crash, a hang or a sanitizer report is a finding.
// Built with libFuzzer (scripts/fuzz.sh) or, in normal builds, as a replay of the seed corpus.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "scenarios/scenario.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ptdp::Scenario sc = ptdp::load_scenario_text(text, "fuzz.yaml");
    // A scenario that loads has a valid plan: its derived sizes must be usable.
    PTDP_ASSERT(sc.plan.gpus() == sc.gpus, "a loaded scenario's plan uses every GPU");
    PTDP_ASSERT(sc.plan.num_microbatches() >= 1, "a loaded scenario has microbatches");
  } catch (const ptdp::ConfigError&) {
    // Refused with a message: the expected outcome for bad input.
  }
  return 0;
}
