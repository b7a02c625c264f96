// Fuzz target: the Nsight Systems SQLite reader (issue 23). The input is written to a file and
// read as an export: any input must either read as a kernel trace or be refused with a
// ConfigError naming the file; anything else escaping, a crash, a hang or a sanitizer report is a
// finding. (SQLite itself is not instrumented: the target covers ptdp's queries and checks.)
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "interop/nsight.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    char name[] = "/tmp/ptdp-fuzz-nsight-XXXXXX";
    const int fd = mkstemp(name);
    if (fd >= 0) close(fd);
    return std::string(name);
  }();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    if (ptdp::looks_like_trace(bytes)) (void)ptdp::read_measured_trace(bytes, path);
  } catch (const ptdp::ConfigError&) {
  }
  return 0;
}
