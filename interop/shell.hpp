// The shell interpreter of launch scripts: a Megatron-LM launch script (bash) becomes the words
// of the command it runs, for import_megatron.
#pragma once

#include <string>
#include <vector>

namespace ptdp {

/// Splits a launch script into shell words: comments, quotes, backslash-newlines and
/// `$VAR` / `${VAR}` of variables the script assigns (`NAME=value`, `export NAME=value`) handled;
/// `source` names the script in errors.
std::vector<std::string> shell_words(const std::string& script, const std::string& source);

}  // namespace ptdp
