// A guard for every JSON text read from users (DeepSpeed configs, reports, traces, checkpoint
// metadata): the JSON library's parser recurses once per nesting level, so a deeply nested input
// would overflow the stack. Checked on the raw text before any parse.
#pragma once

#include <string>

namespace ptdp {

/// Throws ConfigError naming `source` (and the line) when `text` nests arrays or objects deeper
/// than `max_depth` levels (brackets inside strings do not count).
void check_json_depth(const std::string& text, const std::string& source, int max_depth = 128);

}  // namespace ptdp
