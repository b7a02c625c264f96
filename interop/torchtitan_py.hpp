// torchtitan 0.3's Python configs, read as text (never run): a config_registry module's function
//   def llama3_8b() -> Trainer.Config:
//       model_spec = model_registry("8B", converters=[Float8LinearConverter.Config(...)])
//       return Trainer.Config(model_spec=model_spec, training=TrainingConfig(seq_len=8192, ...),
//                             parallelism=ParallelismConfig(...), activation_checkpoint=FullAC.Config(),
//                             compile=CompileConfig(enable=True, ...), ...)
// is turned into the keys of the TOML form import_torchtitan reads (training.seq_len,
// parallelism.tensor_parallel_degree, activation_checkpoint.mode, compile.enable, model.flavor,
// model.converters, float8.recipe_name), so that both forms have one meaning.
// Read: literals (numbers, strings, True/False/None, lists, dicts), calls with keyword arguments,
// local names assigned earlier in the function; anything else (arithmetic, comprehensions,
// attribute assignments, a config derived from another function) is kept as "not a literal" and
// refused by name only where the import needs its value. Bounded: nesting 64, 1 M tokens.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "interop/toml.hpp"

namespace ptdp {

/// True when `text` looks like a torchtitan 0.3 config module (a function returning
/// Trainer.Config(...)), not a TOML file.
bool is_torchtitan_python(const std::string& text);

/// The TOML-form keys of the config function `function` of `text` (read from `source`); "" picks
/// the only one. ConfigError at FILE:LINE:COL for a syntax error, a function that is not there
/// (listing those that are), several functions and no choice, a config derived from another
/// function, or a value the import needs that is not a literal (naming its key).
std::map<std::string, TomlValue> parse_torchtitan_python(const std::string& text, const std::string& source, const std::string& function);

/// The names of the functions of `text` that return a Trainer.Config(...) directly.
std::vector<std::string> torchtitan_python_configs(const std::string& text, const std::string& source);

}  // namespace ptdp
