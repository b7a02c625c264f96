// Reading input files safely: every file ptdp reads (scenario, topology, schedule CSV, report
// JSON, training data, checkpoint files) goes through read_input_file, which refuses anything
// that is not a regular file (directories, /dev/zero, FIFOs) and files above a size limit, so
// an endless or huge input is an error instead of a memory exhaustion.
#pragma once

#include <cstdint>
#include <string>

namespace ptdp {

/// Size limit of text inputs: scenario and topology YAML, schedule CSV, report JSON (64 MiB).
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{64} << 20;
/// Size limit of training data files (`--data`), which are held in memory whole (4 GiB).
inline constexpr uint64_t kMaxDataFileBytes = uint64_t{4} << 30;

/// Reads the whole file at `path`. `what` names it in messages ("scenario file").
/// Throws ConfigError located at the path when it does not exist, is not a regular file, or is
/// larger than `max_bytes` (the message gives the limit); EnvironmentError with the system's
/// message when it exists but cannot be read.
std::string read_input_file(const std::string& path, const std::string& what, uint64_t max_bytes = kMaxTextFileBytes);

/// True when something exists at `path`. Never throws: a path that cannot be examined (a name
/// too long for the system, a component that is not a directory, no permission) counts as
/// missing, and reading it later reports why.
bool path_exists(const std::string& path) noexcept;

/// "64 MiB", "4 GiB", "1.5 KiB": a byte count for messages.
std::string format_bytes(uint64_t bytes);

}  // namespace ptdp
