// The shell interpreter of launch scripts: a Megatron-LM launch script (bash) becomes the words
// of the command it runs, for import_megatron.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ptdp {

/// Splits a launch script into shell words: comments, quotes, backslash-newlines and
/// `$VAR` / `${VAR}` of variables the script assigns (`NAME=value`, `export NAME=value`) handled;
/// `if/elif/else/fi` on `[ ]`, `[[ ]]` or `test` keep only the branch bash takes; `env` holds the
/// environment variables the user gave (--env NAME=VALUE). `source` names the script in errors;
/// throws ConfigError naming the line for a condition on a variable neither sets.
std::vector<std::string> shell_words(const std::string& script, const std::string& source,
                                     const std::map<std::string, std::string>& env = {});

}  // namespace ptdp
