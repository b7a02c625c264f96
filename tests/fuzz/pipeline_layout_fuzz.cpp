// Fuzz target: Megatron's pipeline layouts (parallel.pipeline_layout, import megatron's
// --pipeline-model-parallel-layout; model/layout.hpp). Any input must either parse or be refused
// with a ConfigError; a parsed layout written back (format_pipeline_layout) must parse to the
// same stages. A crash, a hang, a blow-up in memory or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/layout.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const std::vector<ptdp::LayoutStage> stages = ptdp::parse_pipeline_layout(text, "parallel.pipeline_layout");
    std::vector<int64_t> layers, mtp;
    for (const ptdp::LayoutStage& s : stages) layers.push_back(s.layers), mtp.push_back(s.mtp);
    const std::vector<ptdp::LayoutStage> back = ptdp::parse_pipeline_layout(ptdp::format_pipeline_layout(layers, mtp), "again");
    PTDP_ASSERT(back.size() == stages.size(), "a written layout reads back to as many stages");
    for (size_t s = 0; s < back.size(); ++s)
      PTDP_ASSERT(back[s].layers == layers[s] && back[s].mtp == mtp[s] && back[s].embedding == stages[s].embedding &&
                      back[s].loss == stages[s].loss,
                  "a written layout reads back to the same stages");
  } catch (const ptdp::ConfigError&) {
  }
  return 0;
}
