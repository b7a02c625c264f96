// Scenario files: the model, cluster, parallel plan and training settings of one run.
// The loader is the only code that sees yaml-cpp; every error names file:line:col and the key.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/plan.hpp"
#include "model/transformer.hpp"
#include "topologies/cluster.hpp"

namespace ptdp {

/// A `--set key=value` override, e.g. {"parallel.tensor", "4"}.
struct Override {
  std::string key;
  std::string value;
};
/// Splits "key=value"; throws ConfigError when there is no '=' or the key is empty.
Override parse_override(const std::string& text);
/// parse_override of each "key=value", in order.
std::vector<Override> parse_overrides(const std::vector<std::string>& texts);

struct Scenario {
  std::string source;          // scenario file ("" for the built-in default: its path)
  TransformerSpec model;
  ParallelPlan plan;
  ClusterSpec cluster;
  int64_t gpus = 0;
  std::string topology_ref;    // preset name, path, or "inline"
  std::optional<double> train_tokens;
  std::optional<double> gpu_hour_usd;   // cost.gpu_hour_price: US dollars per GPU-hour
  double energy_usd_per_kwh = 0;        // cost.energy_price: US dollars per kWh (added to the GPU-hours)
  /// What the run does that the prediction leaves out (`not_modelled:`, written by the importers
  /// from the arguments they could not map); `simulate` prints it beside the prediction.
  std::vector<std::string> not_modelled;
  /// The resolved scenario (every key, overrides applied, data filled in) as JSON.
  std::string config_json;
};

/// Loads a scenario file (empty path: the built-in default, scenarios/gpt3-175b.yaml), applies
/// overrides, resolves the topology and validates the plan. Throws ConfigError with location.
Scenario load_scenario(const std::string& path, const std::vector<Override>& overrides = {});
/// Same, from text; `source` names it in messages.
Scenario load_scenario_text(const std::string& text, const std::string& source, const std::vector<Override>& overrides = {});

/// The resolved scenario as JSON (every key, data filled in, the overrides listed): what
/// Scenario::config_json holds. Call it again after changing a loaded scenario's plan.
std::string scenario_config_json(const Scenario& sc, const std::vector<Override>& overrides);

/// Loads a topology file (or preset name) alone.
ClusterSpec load_topology(const std::string& name_or_path);

/// The folder holding topologies/ and scenarios/ ($PTDP_HOME, else the source tree).
std::string data_dir();
std::string default_scenario_path();
/// Names of the topology presets (files in data_dir()/topologies).
std::vector<std::string> topology_presets();

/// One scenario key: its full path, value type, accepted range, default and meaning.
struct KeyInfo {
  std::string key;       // "parallel.tensor", "cluster.topology.gpu.memory"
  std::string type;      // integer, number, bool, choice, text, bytes, time, bandwidth, …
  std::string range;
  std::string fallback;  // the default when the key is absent
  std::string meaning;
};
/// Every key a scenario file or `--set` accepts, in file order (scenarios/keys.cpp); the
/// loader's schema is derived from it and `ptdp keys` prints it.
const std::vector<KeyInfo>& scenario_key_table();

/// Every scenario key the loader accepts ("parallel.tensor", …), for --set and --vary checks.
const std::vector<std::string>& scenario_keys();

}  // namespace ptdp
