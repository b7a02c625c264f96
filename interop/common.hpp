// What the importers of interop/ share: the scenario YAML they write is checked by the same
// loader and key table that YAML files go through.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace ptdp {

struct ImportResult;
struct Scenario;

/// Which Megatron a launch line is for: current Megatron-LM, or Megatron-DeepSpeed (its older
/// spellings, ZeRO through --zero-stage and a DeepSpeed config, none of Megatron-LM's overlaps).
enum class MegatronDialect { MegatronLM, MegatronDeepSpeed };

/// The pretrain_gpt.py arguments of the scenario's plan (`--num-layers 96`, …, each one string);
/// what the dialect cannot express is appended to `notes`.
std::vector<std::string> megatron_arguments(const Scenario& sc, MegatronDialect dialect, std::vector<std::string>& notes);

/// GPUs per node and nodes of the scenario's cluster, as a launcher's flags give them.
std::pair<int64_t, int64_t> launch_layout(const Scenario& sc);

/// A launch script: a header naming the scenario and the FILL IN convention, the placeholder
/// lines (DATA_ARGS=(…), TRAINING_ARGS=(…)), `preamble` (e.g. a here-document writing a config),
/// then `launcher` with `arguments` and the two placeholder arrays, one per continued line.
std::string launch_script(const Scenario& sc, const std::string& tool, const std::string& preamble, const std::string& launcher,
                          std::vector<std::string> arguments, const std::vector<std::string>& placeholders);

/// DeepSpeed's one meaning of bf16 at ZeRO stage 0, for every importer that reads a DeepSpeed run
/// (a DeepSpeed config, a Megatron-DeepSpeed line with --deepspeed): its BF16 optimizer shards the
/// fp32 master weights and Adam moments over the data-parallel ranks, ZeRO-1's memory. Returns
/// the stage to import (1 for bf16 at stage 0, else `stage`), with a note saying why.
int64_t deepspeed_zero_stage(int64_t stage, bool bf16, std::vector<std::string>& notes);

/// True when the scenario loader knows `key` (e.g. "parallel.zero_stage").
bool has_key(const std::string& key);

/// `{k1: v1, k2: v2}`: one YAML flow mapping; values are written as given.
std::string yaml_list(const std::vector<std::pair<std::string, std::string>>& kv);

/// `s` as a YAML scalar: plain when it is a simple word, else a quoted string.
std::string scalar_yaml(const std::string& s);

/// `not_modelled:` with r.unsupported as its items (nothing when it is empty): the scenario
/// carries what the prediction leaves out, and `simulate` prints it.
/// `kept`: the base scenario's own items, written first.
std::string not_modelled_yaml(const ImportResult& r, const std::vector<std::string>& kept = {});

/// Loads `r.yaml`; a plan the other tool accepts but ptdp refuses is a ConfigError at `source`
/// naming the key.
void check_loads(const ImportResult& r, const std::string& source);
/// The last step of every importer: the scenario YAML `body` plus the not_modelled: list (the
/// result's unsupported items after `kept`) as r.yaml, checked to load (check_loads).
void finish_import(ImportResult& r, const std::string& body, const std::string& source, const std::vector<std::string>& kept = {});

/// A JSON configuration file (DeepSpeed, Hugging Face): nesting depth checked, a duplicate key
/// refused (JSON keeps one of them silently), syntax errors located at file:line:col, numbers out
/// of range named — each a ConfigError at `source`.
nlohmann::json parse_config_json(const std::string& text, const std::string& source);

/// A ConfigError naming the JSON path of a value and what was expected (and what it got).
[[noreturn]] void json_fail(const std::string& source, const std::string& path, const std::string& msg, const nlohmann::json& got);

}  // namespace ptdp
