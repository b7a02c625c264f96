// Fuzz target: the PyTorch profiler (Kineto) trace reader of `ptdp compare` and `ptdp plot
// timeline` (issue 23). Any input must either read as a trace of kernels or be refused with a
// ConfigError naming the file; a JSON library exception leaking out, a crash, a hang or a
// sanitizer report is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.hpp"
#include "interop/kineto.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    (void)ptdp::is_kineto_trace(text);
    const ptdp::KernelTrace k = ptdp::read_kineto_trace(text, "fuzz.json");
    PTDP_ASSERT(k.kernels > 0 && k.busy_s >= 0 && k.span_s >= 0, "a trace read has kernels and non-negative times");
    (void)ptdp::kernel_trace_json(k, 0);
  } catch (const ptdp::ConfigError&) {
  }
  return 0;
}
