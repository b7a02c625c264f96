// Fuzz target: the Nsight Systems JSON export reader (`nsys export --type json`, one JSON object
// per line) of `ptdp compare` and `ptdp plot timeline`. Any input must either read as a kernel
// trace or be refused with a ConfigError naming the file; a JSON library exception leaking out,
// a crash, a hang or a sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "interop/nsight.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)ptdp::is_nsight_json(text);
    (void)ptdp::looks_like_trace(text);
    const ptdp::KernelTrace k = ptdp::read_nsight_json(text, "fuzz.json");
    PTDP_ASSERT(k.kernels > 0 && k.busy_s >= 0 && k.span_s >= 0 && k.world_size >= 1, "a trace read has kernels and non-negative times");
    (void)ptdp::kernel_trace_json(k, 0);
  } catch (const ptdp::ConfigError&) {
  }
  return 0;
}
