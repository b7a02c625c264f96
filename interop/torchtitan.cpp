// torchtitan's train.toml in (import_torchtitan) and out (export_torchtitan): the model flavour,
// parallel degrees (FSDP shard/replicate, TP, PP with its schedule, CP), batch, activation
// checkpointing, precision and Float8.
#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "core/checked.hpp"
#include "core/error.hpp"
#include "interop/common.hpp"
#include "interop/interop.hpp"
#include "interop/toml.hpp"
#include "interop/torchtitan_py.hpp"
#include "model/partition.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp {
namespace {

// torchtitan's model flavours (its models/llama3 and llama2 registries).
struct Flavor {
  const char* model;
  const char* flavor;
  int64_t layers, dim, heads, kv_heads, ffn, vocab;
};
const std::vector<Flavor>& flavors() {
  static const std::vector<Flavor> f = {
      {"llama3", "8B", 32, 4096, 32, 8, 14336, 128256},     {"llama3", "70B", 80, 8192, 64, 8, 28672, 128256},
      {"llama3", "405B", 126, 16384, 128, 8, 53248, 128256}, {"llama2", "7B", 32, 4096, 32, 32, 11008, 32000},
      {"llama2", "13B", 40, 5120, 40, 40, 13824, 32000},     {"llama2", "70B", 80, 8192, 64, 8, 28672, 32000},
  };
  return f;
}

struct Toml {
  const std::map<std::string, TomlValue>& doc;
  const std::string& source;
  std::set<std::string> used;

  const TomlValue* find(const std::string& key) {
    const auto it = doc.find(key);
    if (it == doc.end()) return nullptr;
    used.insert(key);
    return &it->second;
  }
  // The first of `keys` present (torchtitan moved keys between sections across versions).
  const TomlValue* first(std::initializer_list<const char*> keys, std::string* which = nullptr) {
    for (const char* k : keys)
      if (const TomlValue* v = find(k)) {
        if (which) *which = k;
        return v;
      }
    return nullptr;
  }
  [[noreturn]] void fail(const std::string& key, const TomlValue& v, const std::string& what) const {
    throw ConfigError(key, what + " (got " + printable(v.kind == TomlValue::String ? "\"" + v.text + "\"" : v.text, 60) + ")", v.where);
  }
  int64_t integer(std::initializer_list<const char*> keys, int64_t fallback, int64_t lo, int64_t hi) {
    std::string key;
    const TomlValue* v = first(keys, &key);
    if (!v) return fallback;
    if (v->kind != TomlValue::Integer) fail(key, *v, std::string("expected an integer, not ") + toml_kind_name(v->kind));
    if (v->integer < lo || v->integer > hi) fail(key, *v, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v->integer;
  }
  std::string text(std::initializer_list<const char*> keys, const std::string& fallback) {
    std::string key;
    const TomlValue* v = first(keys, &key);
    if (!v) return fallback;
    if (v->kind != TomlValue::String) fail(key, *v, std::string("expected a string, not ") + toml_kind_name(v->kind));
    return v->text;
  }
  bool boolean(std::initializer_list<const char*> keys, bool fallback) {
    std::string key;
    const TomlValue* v = first(keys, &key);
    if (!v) return fallback;
    if (v->kind != TomlValue::Boolean) fail(key, *v, std::string("expected true or false, not ") + toml_kind_name(v->kind));
    return v->boolean;
  }
};

std::string shown(const std::string& key, const TomlValue& v) {
  std::string value = v.text;
  if (v.kind == TomlValue::String) value = "\"" + v.text + "\"";
  if (v.kind == TomlValue::Array) {
    value = "[";
    for (size_t k = 0; k < v.items.size() && k < 8; ++k) value += (k ? ", " : "") + v.items[k].text;
    value += "]";
  }
  return key + " = " + printable(value, 60);
}

// The transformer layers of each pipeline stage as torchtitan places them. Given: 0.2/0.3's
// module_fqns_per_model_part (the modules of each stage: tok_embeddings, layers.N, norm, output
// or lm_head) or 0.1's pipeline_parallel_split_points (the first layer of each stage after the
// first). Else torchtitan's own split: the embedding and the output layer count as
// first/last_stage_less_layers layers (1 each by default; 0.1 always 1), the effective layers
// are shared evenly over the stages, the first stages one more, and layers_per_stage (when
// given) sets the number of stages; without it a rank holds `default_per_rank` stages.
std::vector<int64_t> titan_stage_layers(Toml& t, int64_t layers, int64_t pp, int64_t default_per_rank, const SourceLocation& file) {
  auto layer_index = [&](const std::string& key, const TomlValue& v) -> int64_t {
    if (v.kind != TomlValue::String) t.fail(key, v, "expected module names (\"layers.N\")");
    if (v.text.rfind("layers.", 0) != 0) return -1;
    const std::string digits = v.text.substr(7);
    if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
      t.fail(key, v, "expected layers.N");
    return std::stoll(digits);
  };
  std::vector<int64_t> counts;
  if (const TomlValue* parts = t.first({"parallelism.module_fqns_per_model_part"})) {
    const std::string key = "parallelism.module_fqns_per_model_part";
    if (parts->kind != TomlValue::Array || parts->items.empty()) t.fail(key, *parts, "expected a list of module lists, one per stage");
    int64_t next = 0;
    for (const auto& part : parts->items) {
      if (part.kind != TomlValue::Array) t.fail(key, part, "expected a list of module names");
      int64_t n = 0;
      for (const auto& module : part.items)
        if (const int64_t l = layer_index(key, module); l >= 0) {
          if (l != next) t.fail(key, module, "expected layers." + std::to_string(next) + " (each layer once, in order)");
          ++next, ++n;
        }
      counts.push_back(n);
    }
    if (next != layers) t.fail(key, *parts, "places " + std::to_string(next) + " of the model's " + std::to_string(layers) + " layers");
  } else if (const TomlValue* points = t.first({"parallelism.pipeline_parallel_split_points", "experimental.pipeline_parallel_split_points"})) {
    const std::string key = "parallelism.pipeline_parallel_split_points";
    if (points->kind != TomlValue::Array) t.fail(key, *points, "expected a list of layer names (\"layers.N\")");
    int64_t start = 0;
    for (const auto& point : points->items) {
      const int64_t l = layer_index(key, point);
      if (l <= start || l >= layers) t.fail(key, point, "expected layers.N with N increasing in (" + std::to_string(start) + ", " + std::to_string(layers) + ")");
      counts.push_back(l - start);
      start = l;
    }
    counts.push_back(layers - start);
  } else {
    const int64_t in = t.integer({"parallelism.pipeline_parallel_first_stage_less_layers"}, 1, 0, 1'000'000);
    const int64_t out = t.integer({"parallelism.pipeline_parallel_last_stage_less_layers"}, 1, 0, 1'000'000);
    const int64_t effective = layers + in + out;
    const int64_t per_stage = t.integer({"parallelism.pipeline_parallel_layers_per_stage"}, 0, 1, 1'000'000);
    const int64_t stages = per_stage > 0 ? (effective + per_stage - 1) / per_stage : pp * default_per_rank;
    const int64_t even = effective / stages, extra = effective % stages;
    if (even < std::max<int64_t>(1, std::max(in, out)))
      throw ConfigError("parallelism.pipeline_parallel_degree", std::to_string(stages) + " stages over " + std::to_string(layers) +
                                                                    " layers and the embedding and output layer weighted " + std::to_string(in) +
                                                                    " and " + std::to_string(out) + " leave a stage without a layer",
                        file);
    for (int64_t i = 0; i < stages; ++i) counts.push_back(even + (i < extra ? 1 : 0) - (i == 0 ? in : 0) - (i == stages - 1 ? out : 0));
  }
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] < 1)
      throw ConfigError("parallelism.module_fqns_per_model_part", "stage " + std::to_string(i) + " holds no transformer layer (ptdp's stages hold at least one)", file);
  if (static_cast<int64_t>(counts.size()) % pp != 0)
    throw ConfigError("parallelism.pipeline_parallel_degree", std::to_string(counts.size()) + " pipeline stages do not divide over " + std::to_string(pp) + " ranks", file);
  return counts;
}

using KeyValues = std::vector<std::pair<std::string, std::string>>;

// The model: a flavour torchtitan registers.
const Flavor& titan_flavor(Toml& t, const SourceLocation& file) {
  const std::string name = t.text({"model.name"}, "llama3");
  const std::string flavor = t.text({"model.flavor"}, "debugmodel");
  for (const auto& candidate : flavors())
    if (name == candidate.model && flavor == candidate.flavor) return candidate;
  std::string known;
  for (const auto& c : flavors()) known += (known.empty() ? "" : ", ") + std::string(c.model) + " " + c.flavor;
  const TomlValue* at = t.find("model.flavor");
  throw ConfigError("model.flavor", "no shape known for " + printable(name, 30) + " " + printable(flavor, 30) + " (known: " + known +
                                        "); give the model with ptdp import hf or a scenario's model keys",
                    at ? at->where : file);
}

// The parallel degrees and the GPU count they imply (or are given).
struct TitanDegrees {
  int64_t tp = 1, pp = 1, cp = 1, replicate = 1, shard = 1, d = 1, gpus = 0;
};

// Degrees: [parallelism] (current torchtitan), else [training] / [experimental] (2024).
TitanDegrees titan_degrees(Toml& t, const std::string& model, int64_t gpus_given, ImportResult& r, const SourceLocation& file) {
  auto degree = [&](const char* key, int64_t fallback, int64_t lo) {
    const std::string a = std::string("parallelism.") + key, b = std::string("training.") + key, c = std::string("experimental.") + key;
    return t.integer({a.c_str(), b.c_str(), c.c_str()}, fallback, lo, 10'000'000);
  };
  TitanDegrees g;
  g.tp = degree("tensor_parallel_degree", 1, 1);
  g.pp = degree("pipeline_parallel_degree", 1, 1);
  g.cp = degree("context_parallel_degree", 1, 1);
  const int64_t ep = degree("expert_parallel_degree", 1, 1);
  g.replicate = degree("data_parallel_replicate_degree", 1, 1);
  g.shard = degree("data_parallel_shard_degree", -1, -1);
  if (ep > 1) throw ConfigError("parallelism.expert_parallel_degree", "expert parallelism with a dense " + model + " model", file);
  if (g.shard == 0) throw ConfigError("parallelism.data_parallel_shard_degree", "must be -1 (the rest of the GPUs) or at least 1 (got 0)", file);
  g.gpus = gpus_given;
  // Each degree is at most 10⁷: their product is checked (8 388 608³ wraps 64 bits to 0).
  const int64_t fixed = checked_mul(checked_mul(checked_mul(g.tp, g.pp, "parallelism", file), g.cp, "parallelism", file), g.replicate,
                                    "parallelism", file);
  if (g.shard == -1) {
    if (g.gpus == 0)
      throw ConfigError("parallelism.data_parallel_shard_degree", "-1 takes the rest of the GPUs: give their number with --gpus N", file);
    if (g.gpus % fixed != 0)
      throw ConfigError("--gpus", std::to_string(g.gpus) + " GPUs are not a multiple of tp × pp × cp × replicate = " + std::to_string(fixed), file);
    g.shard = g.gpus / fixed;
    r.notes.push_back("data_parallel_shard_degree -1: " + std::to_string(g.shard) + " (the rest of " + std::to_string(g.gpus) + " GPUs)");
  } else if (g.gpus == 0) {
    g.gpus = checked_mul(fixed, g.shard, "parallelism.data_parallel_shard_degree", file);
  } else if (g.gpus != checked_mul(fixed, g.shard, "parallelism.data_parallel_shard_degree", file)) {
    throw ConfigError("--gpus", std::to_string(g.gpus) + " GPUs, but the degrees multiply to " + std::to_string(fixed * g.shard), file);
  }
  g.d = checked_mul(g.replicate, g.shard, "parallelism.data_parallel_shard_degree", file);
  return g;
}

// Context and tensor parallelism, and FSDP: sharded over the shard dimension, replicated over
// the replicate one (HSDP).
KeyValues titan_layout(Toml& t, const TitanDegrees& g, const ImportOptions& options, ImportResult& r, const SourceLocation& file) {
  KeyValues parallel = {{"tensor", std::to_string(g.tp)}, {"pipeline", std::to_string(g.pp)}, {"data", std::to_string(g.d)}};
  if (g.cp > 1) {
    parallel.emplace_back("context", std::to_string(g.cp));
    const std::string rotate = t.text({"parallelism.context_parallel_rotate_method", "experimental.context_parallel_rotate_method"}, "allgather");
    if (rotate != "allgather" && rotate != "alltoall")
      throw ConfigError("parallelism.context_parallel_rotate_method", "expected allgather or alltoall (got '" + printable(rotate) + "')", file);
    parallel.emplace_back("context_comm", rotate == "allgather" ? "allgather" : "ring");
  }
  if (g.tp > 1) {
    parallel.emplace_back("sequence_parallel", "true");  // torchtitan's TP plan shards norms and dropout by sequence
    r.notes.push_back("tensor parallelism with sequence parallelism, as torchtitan's TP plan runs it");
  }
  if (t.boolean({"parallelism.enable_async_tensor_parallel", "experimental.enable_async_tensor_parallel"}, false) && g.tp > 1)
    parallel.emplace_back("tp_comm_overlap", "true");
  const std::string reshard = t.text({"parallelism.fsdp_reshard_after_forward"}, "default");
  if (reshard != "default" && reshard != "always" && reshard != "never")
    throw ConfigError("parallelism.fsdp_reshard_after_forward", "expected default, always or never (got '" + printable(reshard) + "')", file);
  if (g.shard > 1) {
    // Parameters gathered per layer and freed after the forward (ZeRO-3), or kept (ZeRO-2)
    // without pipelines. With pipelines torchtitan's FSDP reduces the gradients once per step
    // (stage 3 under training.framework torchtitan), keeping the parameters whole by default.
    const bool keeps = reshard == "never" || (reshard == "default" && g.pp > 1);
    parallel.emplace_back("zero_stage", keeps && g.pp == 1 ? "2" : "3");
    if (g.pp > 1 && reshard != "default") parallel.emplace_back("reshard_after_forward", reshard == "never" ? "false" : "true");
    if (g.replicate > 1) {
      ParallelPlan node;
      node.tensor = g.tp;
      node.data = g.d;
      node.context = g.cp;
      node.zero_stage = 3;
      node.sharding_group = ShardingGroup::Node;
      const ClusterSpec cluster = load_topology(options.topology);
      node.node_gpus = cluster.gpus_per_node;
      if (node.sharding_degree() == g.shard) {
        parallel.emplace_back("sharding_group", "node");
      } else {
        r.unsupported.push_back("HSDP over groups of " + std::to_string(g.shard) + " ranks (not a node's " + std::to_string(node.sharding_degree()) +
                                "): sharded over all " + std::to_string(g.d) + " data-parallel ranks instead");
      }
    }
  }
  if (t.boolean({"training.enable_cpu_offload"}, false)) parallel.emplace_back("offload", "optimizer_and_params");
  return parallel;
}

// The pipeline schedule and its split of the layers into stages.
void titan_pipeline(Toml& t, const Flavor& f, int64_t pp, KeyValues& parallel, ImportResult& r, const SourceLocation& file) {
  const std::string sched = t.text({"parallelism.pipeline_parallel_schedule", "experimental.pipeline_parallel_schedule"}, "1F1B");
  std::string lowered = sched;
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const bool looped = lowered == "interleaved1f1b" || lowered == "zbvzerobubble" || lowered == "dualpipev";
  const bool known = looped || lowered == "1f1b" || lowered == "gpipe";
  // Stages per rank: 1 for 1F1B and GPipe, else 2 (torchtitan's default) unless the split says.
  const std::vector<int64_t> counts = titan_stage_layers(t, f.layers, pp, looped ? 2 : 1, file);
  const int64_t v = static_cast<int64_t>(counts.size()) / pp;
  if (known && !looped && v != 1)
    throw ConfigError("parallelism.pipeline_parallel_schedule", sched + " runs one stage per rank, but the split has " + std::to_string(v), file);
  if (looped && v < 2)
    throw ConfigError("parallelism.pipeline_parallel_schedule", sched + " runs two or more stages per rank, but the split has one", file);
  if (known && std::any_of(counts.begin(), counts.end(), [&](int64_t c) { return c != counts.front(); })) {
    std::string list;
    for (const int64_t c : counts) list += (list.empty() ? "" : ", ") + std::to_string(c);
    parallel.emplace_back("layers_per_stage", "[" + list + "]");
  }
  // PyTorch's pipelining waits for 1F1B's batched send/recv of each step before its next compute
  // (overlap_p2p false, the default); GPipe and the multi-stage schedules post their sends and
  // wait for them at the end of the step.
  if (lowered == "1f1b") {
    parallel.emplace_back("schedule", "1f1b");
  } else if (lowered == "gpipe") {
    parallel.emplace_back("schedule", "gpipe");
    parallel.emplace_back("overlap_p2p", "true");
  } else if (looped) {
    parallel.emplace_back("overlap_p2p", "true");
    if (lowered == "interleaved1f1b") {
      parallel.emplace_back("schedule", "interleaved");
      parallel.emplace_back("virtual_stages", std::to_string(v));
    } else {
      parallel.emplace_back("schedule", lowered == "dualpipev" ? "dualpipev" : "zb-v");
      parallel.emplace_back("virtual_stages", "2");
      if (v != 2) r.unsupported.push_back("pipeline_parallel_schedule " + sched + " with " + std::to_string(v) + " stages per rank: the V shape has 2");
    }
  } else {
    r.unsupported.push_back("pipeline_parallel_schedule = \"" + printable(sched) + "\": not modelled (1F1B, GPipe, Interleaved1F1B, "
                            "ZBVZeroBubble and DualPipeV are); the plan runs 1F1B");
    parallel.emplace_back("schedule", "1f1b");
  }
}

// Activation checkpointing: the plan's `recompute` from activation_checkpoint.mode (returned).
std::string titan_recompute(Toml& t, const std::string& ac, ImportResult& r, const SourceLocation& file) {
  if (ac == "none") return "none";
  if (ac == "full") return "full";
  if (ac == "selective") {
    const std::string option = t.text({"activation_checkpoint.selective_ac_option"}, "2");
    if (option != "op")
      r.unsupported.push_back("activation_checkpoint.selective_ac_option = \"" + printable(option) + "\": every " + printable(option) +
                              "th layer fully recomputed (layer-level selection is not modelled; the plan uses selective recomputation)");
    return "selective";
  }
  if (ac == "memory_budget") {
    // 0.2's compiler-chosen recomputation (0.3's MemoryBudgetAC): what it keeps depends on the graph.
    const TomlValue* at = t.find("activation_checkpoint.mode");
    throw ConfigError("activation_checkpoint.mode",
                      "memory_budget (torch.compile chooses what to recompute within activation_checkpoint.memory_budget) is not "
                      "modelled: give none, selective or full",
                      at ? at->where : file);
  }
  throw ConfigError("activation_checkpoint.mode", "expected none, selective or full (got '" + printable(ac) + "')", file);
}

// Batch: local_batch_size per data-parallel rank (older: batch_size), global_batch_size for
// gradient accumulation, pipeline microbatches of pipeline_parallel_microbatch_size; precision
// (FSDP's param dtype; Float8 through [float8] or model.converters); steps; the framework.
KeyValues titan_training(Toml& t, const TitanDegrees& g, int64_t seq, bool compiled, ImportResult& r, const SourceLocation& file) {
  const int64_t d = g.d;
  const int64_t local = t.integer({"training.local_batch_size", "training.batch_size"}, 8, 1, 1'000'000'000);
  const int64_t global_given = t.integer({"training.global_batch_size"}, -1, -1, 1'000'000'000);
  const int64_t global = global_given > 0 ? global_given : checked_mul(local, d, "training.local_batch_size", file);
  const int64_t micro = g.pp > 1 ? t.integer({"parallelism.pipeline_parallel_microbatch_size", "experimental.pipeline_parallel_microbatch_size"}, 1, 1,
                                             1'000'000'000)
                                 : local;
  if (global % checked_mul(micro, d, "training.global_batch_size", file) != 0)
    throw ConfigError("training.global_batch_size", std::to_string(global) + " is not a multiple of the microbatch (" + std::to_string(micro) +
                                                        ") × data-parallel size (" + std::to_string(d) + ")",
                      file);
  if (g.pp > 1 && local % micro != 0)
    throw ConfigError("parallelism.pipeline_parallel_microbatch_size", std::to_string(micro) + " does not divide local_batch_size " + std::to_string(local), file);

  std::string precision = "bf16";
  const std::string param_dtype = t.text({"training.mixed_precision_param"}, "bfloat16");
  if (param_dtype == "float32") precision = "fp32";
  else if (param_dtype == "float16") precision = "fp16";
  else if (param_dtype != "bfloat16")
    throw ConfigError("training.mixed_precision_param", "expected bfloat16, float16 or float32 (got '" + printable(param_dtype) + "')", file);
  // 0.1 names the Float8 table [float8], 0.2 [quantize.linear.float8] (the converter likewise).
  bool float8 = t.boolean({"float8.enable_float8_linear", "quantize.linear.float8.enable_float8_linear"}, false);
  if (const TomlValue* conv = t.find("model.converters")) {
    if (conv->kind != TomlValue::Array) t.fail("model.converters", *conv, "expected an array of strings");
    for (const auto& item : conv->items) {
      if (item.kind != TomlValue::String) t.fail("model.converters", item, "expected a string");
      if (item.text == "float8" || item.text == "quantize.linear.float8") float8 = true;
      else r.unsupported.push_back("model.converters \"" + printable(item.text) + "\": not modelled");
    }
  }
  KeyValues training;
  if (float8) {
    precision = "fp8";
    training.emplace_back("fp8_format", "hybrid");
    // torchao's Float8Linear recipes: tensorwise (default), rowwise, rowwise_with_gw_hp (rowwise
    // with the weight gradient in high precision: priced as rowwise).
    const std::string recipe = t.text({"float8.recipe_name", "quantize.linear.float8.recipe_name"}, "tensorwise");
    if (recipe == "rowwise" || recipe == "rowwise_with_gw_hp") training.emplace_back("fp8_recipe", "rowwise");
    else if (recipe != "tensorwise")
      throw ConfigError("float8.recipe_name", "expected tensorwise, rowwise or rowwise_with_gw_hp (got '" + printable(recipe) + "')", file);
    r.notes.push_back("Float8 linear layers (torchao): priced as FP8 GEMMs with dynamic scaling");
    if (t.boolean({"float8.enable_fsdp_float8_all_gather", "quantize.linear.float8.enable_fsdp_float8_all_gather"}, false))
      training.emplace_back("fp8_param_gather", "true");
  }
  training.insert(training.begin(), {{"global_batch", std::to_string(global)}, {"micro_batch", std::to_string(micro)}, {"precision", precision}});
  if (const int64_t steps = t.integer({"training.steps"}, 0, 1, 1'000'000'000); steps > 0) {
    // steps × global batch × sequence: checked, and within the scenario's bound (10¹⁸ tokens).
    const int64_t tokens = checked_mul(checked_mul(steps, global, "training.steps", file), seq, "training.steps", file);
    if (tokens > 1'000'000'000'000'000'000)
      throw ConfigError("training.steps", std::to_string(steps) + " steps × " + std::to_string(global) + " sequences × " + std::to_string(seq) +
                                              " tokens exceed 10¹⁸ training tokens", file);
    training.emplace_back("train_tokens", std::to_string(tokens));
  }
  training.emplace_back("framework", compiled ? "torchtitan_compiled" : "torchtitan");
  return training;
}

// Everything not read: what is known to have no effect on time or memory, and the unknown.
void titan_leftovers(Toml& t, const TitanDegrees& g, const std::string& ac, bool compiled, ImportResult& r) {
  static const std::set<std::string> quiet_sections = {"job", "profiling", "metrics", "optimizer", "lr_scheduler", "checkpoint", "comm",
                                                       "validation", "fault_tolerance", "memory_estimation", "model", "training", "float8",
                                                       "quantize", "mx",
                                                       // 0.3's Trainer.Config fields of the same kind
                                                       "loss", "dataloader", "validator", "profiler", "hf_assets_path", "debug"};
  // Loss parallelism (the vocabulary-parallel cross entropy the plan prices with TP) and custom
  // modules (code that may change anything): read when they change the job.
  if (t.boolean({"parallelism.disable_loss_parallel"}, false) && g.tp > 1)
    r.unsupported.push_back("parallelism.disable_loss_parallel = true: the loss on gathered logits is not modelled (the plan's loss is "
                            "vocabulary-parallel)");
  if (t.boolean({"parallelism.enable_compiled_autograd"}, false))  // 0.1
    r.unsupported.push_back("parallelism.enable_compiled_autograd = true: the backward under compiled autograd is not modelled");
  for (const char* key : {"experimental.custom_import", "experimental.custom_args_module", "job.custom_config_module"})
    if (const TomlValue* v = t.find(key); v && !(v->kind == TomlValue::String && v->text.empty()))
      r.unsupported.push_back(shown(key, *v) + ": what a custom module changes is not read");
  // A release's own keys for a feature the job does not use (a degree of 1, compile off, a
  // recomputation mode without a budget): no effect, said why.
  const KeyValues idle = {
      {"parallelism.context_parallel_", g.cp == 1 ? "context_parallel_degree 1" : ""},
      {"parallelism.pipeline_parallel_", g.pp == 1 ? "pipeline_parallel_degree 1" : ""},
      {"parallelism.expert_", "a dense model"},
      {"activation_checkpoint.", "activation_checkpoint.mode " + ac},
      {"compile.", compiled ? "" : "compile.enable false"},
  };
  // With a pipeline, a schedule of its own: not modelled.
  static const std::set<std::string> layout_keys = {"parallelism.pipeline_parallel_schedule_csv"};
  for (const auto& [key, value] : t.doc) {
    if (t.used.count(key)) continue;
    if (g.pp > 1 && layout_keys.count(key)) {
      r.unsupported.push_back(shown(key, value) + ": not modelled (the plan runs the schedule named by pipeline_parallel_schedule)");
      continue;
    }
    const std::string& name = key;  // (a structured binding cannot be captured before C++20's P1091 in clang)
    const auto why = std::find_if(idle.begin(), idle.end(), [&](const auto& i) { return !i.second.empty() && name.rfind(i.first, 0) == 0; });
    const std::string section = key.substr(0, key.find('.'));
    if (why != idle.end()) r.no_effect.push_back(shown(key, value) + " (" + why->second + ")");
    else if (quiet_sections.count(section)) r.no_effect.push_back(shown(key, value));
    else r.unknown.push_back(shown(key, value));
  }
}

}  // namespace

ImportResult import_torchtitan(const std::string& text, const std::string& source, const ImportOptions& options) {
  // 0.3's Python config_registry module, read as the TOML form's keys; else 0.1/0.2's TOML.
  const bool python = is_torchtitan_python(text);
  if (!python && !options.config_function.empty())
    throw ConfigError("--config", "names a function of a torchtitan 0.3 Python config; " + source + " is a TOML file", SourceLocation{source, 0, 0});
  const auto doc = python ? parse_torchtitan_python(text, source, options.config_function) : parse_toml(text, source);
  Toml t{doc, source, {}};
  ImportResult r;
  const SourceLocation file{source, 0, 0};

  const Flavor& f = titan_flavor(t, file);
  const int64_t seq = t.integer({"training.seq_len"}, 2048, 1, 10'000'000);
  const TitanDegrees g = titan_degrees(t, f.model, options.gpus, r, file);
  KeyValues parallel = titan_layout(t, g, options, r, file);
  if (g.pp > 1) titan_pipeline(t, f, g.pp, parallel, r, file);
  const std::string ac = t.text({"activation_checkpoint.mode"}, "selective");
  // The framework: eager torchtitan, or under torch.compile (Inductor fuses the element-wise chains).
  // Async tensor parallelism runs only under torch.compile (torchtitan refuses it otherwise).
  const bool compiled = t.boolean({"compile.enable", "training.compile"}, false) ||
                        t.boolean({"parallelism.enable_async_tensor_parallel", "experimental.enable_async_tensor_parallel"}, false);
  parallel.emplace_back("recompute", titan_recompute(t, ac, r, file));
  const KeyValues training = titan_training(t, g, seq, compiled, r, file);
  titan_leftovers(t, g, ac, compiled, r);

  std::ostringstream y;
  y << "# imported from torchtitan's " << source << " by ptdp import torchtitan (" << f.model << " " << f.flavor << ")\n";
  y << "model:    "
    << yaml_list({{"name", std::string(f.model) + "-" + f.flavor}, {"num_layers", std::to_string(f.layers)}, {"hidden_size", std::to_string(f.dim)},
                  {"num_attention_heads", std::to_string(f.heads)}, {"num_query_groups", std::to_string(f.kv_heads)},
                  {"ffn_hidden_size", std::to_string(f.ffn)}, {"seq_length", std::to_string(seq)}, {"vocab_size", std::to_string(f.vocab)},
                  {"mlp", "swiglu"}, {"normalization", "rmsnorm"}, {"tie_embeddings", "false"}, {"bias", "false"}, {"dropout", "0"},
                  {"attention", "flash"}})
    << "\n";
  y << "cluster:  " << yaml_list({{"topology", scalar_yaml(options.topology)}, {"gpus", std::to_string(g.gpus)}}) << "\n";
  y << "parallel: " << yaml_list(parallel) << "\n";
  y << "training: " << yaml_list(training) << "\n";
  finish_import(r, y.str(), source);
  return r;
}

namespace {

// What an export says, whatever torchtitan version's form it is written in.
struct TitanJob {
  const Flavor* flavor = nullptr;
  int64_t local = 0, global = 0, seq = 0, steps = 0;  // steps 0: FILL IN
  std::string param_dtype;
  bool offload = false;
  int64_t replicate = 1, shard = 1, tp = 1, pp = 1, cp = 1;
  std::string rotate;                    // CP rotate method ("" without CP)
  bool async_tp = false;
  bool compiled = false;                 // torch.compile: the plan's framework, or async TP (which needs it)
  std::string reshard;                   // "" when not sharded
  std::string schedule;                  // "" without PP
  int64_t microbatch = 1;
  std::vector<int64_t> stage_layers;     // layers of each stage, in stage order (with PP)
  std::string ac;                        // none | selective | full
  bool float8 = false, fp8_gather = false;
  std::string fp8_recipe;                // tensorwise | rowwise
};

TitanJob titan_job(const Scenario& sc, std::vector<std::string>& notes) {
  TitanJob j;
  const auto& m = sc.model;
  const auto& plan = sc.plan;
  for (const auto& c : flavors())
    if (c.layers == m.num_layers && c.dim == m.hidden_size && c.heads == m.num_attention_heads && c.kv_heads == m.query_groups() &&
        c.ffn == m.ffn() && c.vocab == m.vocab_size && m.mlp == MlpKind::SwiGLU)
      j.flavor = &c;
  if (!j.flavor)
    notes.push_back("no torchtitan flavour has this model's shape (layers " + std::to_string(m.num_layers) + ", dim " + std::to_string(m.hidden_size) +
                    ", heads " + std::to_string(m.num_attention_heads) + ", kv heads " + std::to_string(m.query_groups()) + ", ffn " +
                    std::to_string(m.ffn()) + ", vocabulary " + std::to_string(m.vocab_size) +
                    "): register one in torchtitan's model args and put its name in model.flavor (FILL IN)");
  if (m.has_moe()) notes.push_back("mixture of experts: the file describes the dense Llama flavour only");
  const int64_t d = plan.data;
  j.replicate = d;
  if (plan.zero_stage >= 2 || (plan.zero_stage == 1 && d > 1)) {
    // torchtitan folds context-parallel ranks into the shard dimension itself: the degree is d's.
    j.shard = plan.sharding_group == ShardingGroup::Node ? std::min(plan.node_data_ranks(), d) : d;
    j.replicate = d / j.shard;
    if (plan.zero_stage == 1) notes.push_back("zero_stage 1: FSDP has no optimizer-only sharding; the file shards parameters too (FSDP)");
  }
  j.global = plan.global_batch;
  j.local = plan.pipeline > 1 ? j.global / d : plan.micro_batch;
  j.seq = m.seq_length;
  if (sc.train_tokens) j.steps = static_cast<int64_t>(std::ceil(*sc.train_tokens / (static_cast<double>(j.global) * static_cast<double>(m.seq_length))));
  j.param_dtype = plan.precision == Precision::FP32 ? "float32" : plan.precision == Precision::FP16 ? "float16" : "bfloat16";
  if (plan.offload != Offload::None) {
    j.offload = true;
    if (plan.offload == Offload::Optimizer) notes.push_back("offload optimizer: torchtitan's CPU offload moves parameters and gradients too");
  }
  j.tp = plan.tensor, j.pp = plan.pipeline, j.cp = plan.context;
  if (plan.context > 1) j.rotate = plan.context_comm == ContextComm::AllGather ? "allgather" : "alltoall";
  if (plan.context > 1 && plan.context_comm == ContextComm::AllToAll)
    notes.push_back("context_comm alltoall: torchtitan has no Ulysses context parallelism; the config runs its ring attention "
                    "(rotate alltoall passes K/V around the ring)");
  j.async_tp = plan.tensor > 1 && plan.tp_comm_overlap;
  j.compiled = j.async_tp || plan.framework == Framework::TorchtitanCompiled;
  if (plan.tensor > 1 && !plan.sequence_parallel) notes.push_back("tensor parallelism without sequence parallelism: torchtitan's TP plan always uses it");
  if (j.shard > 1) {
    // Stage 3 at the framework's default (torchtitan: keep with pipelines, reshard without) is
    // torchtitan's "default"; stage 2 keeps the parameters gathered.
    const int64_t g = reshard_group(plan);
    if (plan.zero_stage < 3 || g == 1) j.reshard = plan.zero_stage == 3 && plan.pipeline > 1 && plan.reshard_after_forward == ParallelPlan::kReshardDefault ? "default" : "never";
    else j.reshard = "always";
    if (plan.zero_stage == 3 && g > 1 && g < plan.sharding_degree())
      notes.push_back("reshard_after_forward " + std::to_string(g) + ": torchtitan's policy has no group size; the file reshards over the whole group (always)");
  }
  if (plan.pipeline > 1) {
    j.schedule = "1F1B";
    switch (plan.schedule) {
      case ScheduleKind::GPipe: j.schedule = "GPipe"; break;
      case ScheduleKind::Interleaved: j.schedule = "Interleaved1F1B"; break;
      case ScheduleKind::ZeroBubbleV: j.schedule = "ZBVZeroBubble"; break;
      case ScheduleKind::DualPipeV: j.schedule = "DualPipeV"; break;
      case ScheduleKind::OneFOneB: break;
      default: notes.push_back("schedule " + to_string(plan.schedule) + ": torchtitan has no such schedule; the file runs 1F1B"); break;
    }
    j.microbatch = plan.micro_batch;
    // The plan's split, written out: torchtitan's own would count the embedding and the output
    // layer as a layer each (and 0.1 requires a rigid fit of them with layers_per_stage).
    j.stage_layers = stage_layers(m, plan);
    const bool looped = j.schedule == "Interleaved1F1B" || j.schedule == "ZBVZeroBubble" || j.schedule == "DualPipeV";
    if (!looped && static_cast<int64_t>(j.stage_layers.size()) != plan.pipeline) {
      j.stage_layers.assign(static_cast<size_t>(plan.pipeline), m.num_layers / plan.pipeline);
      for (int64_t i = 0; i < m.num_layers % plan.pipeline; ++i) ++j.stage_layers[static_cast<size_t>(i)];
      notes.push_back("the file runs one stage per rank: the layers are split over " + std::to_string(plan.pipeline) + " stages");
    }
  }
  j.ac = to_string(plan.recompute);
  j.float8 = plan.precision == Precision::FP8;
  j.fp8_gather = plan.fp8_param_gather;
  if (j.float8 && plan.fp8_recipe == Fp8Recipe::Rowwise) j.fp8_recipe = "rowwise";
  return j;
}

// 0.1/0.2's train.toml.
// The stages' layers as torchtitan names them: 0.1's pipeline_parallel_split_points (the first
// layer of each stage after the first), or module_fqns_per_model_part (each stage's modules; the
// output layer is `output` in 0.2, `lm_head` in 0.3).
enum class TitanSplit { SplitPoints, ModulesOutput, ModulesLmHead };
std::string titan_split(const std::vector<int64_t>& layers, TitanSplit form, const char* assign) {
  std::ostringstream o;
  int64_t next = 0;
  if (form == TitanSplit::SplitPoints) {
    o << "pipeline_parallel_split_points" << assign << "[";
    for (size_t s = 0; s + 1 < layers.size(); ++s) o << (s ? ", " : "") << "\"layers." << (next += layers[s]) << "\"";
    o << "]";
    return o.str();
  }
  o << "module_fqns_per_model_part" << assign << "[";
  for (size_t s = 0; s < layers.size(); ++s) {
    o << (s ? ", " : "") << "[";
    bool first = true;
    auto put = [&](const std::string& name) { o << (first ? "" : ", ") << "\"" << name << "\"", first = false; };
    if (s == 0) put("tok_embeddings");
    for (int64_t l = 0; l < layers[s]; ++l) put("layers." + std::to_string(next++));
    if (s + 1 == layers.size()) put("norm"), put(form == TitanSplit::ModulesLmHead ? "lm_head" : "output");
    o << "]";
  }
  o << "]";
  return o.str();
}

std::string titan_toml(const Scenario& sc, const TitanJob& j, bool v01) {
  const std::string float8_table = v01 ? "float8" : "quantize.linear.float8";
  const auto& m = sc.model;
  std::ostringstream o;
  o << "# torchtitan train.toml for " << m.name << " on " << sc.gpus << " GPUs: the plan of "
    << (sc.source.empty() ? "the default scenario" : sc.source) << ", written by ptdp export torchtitan.\n"
    << "# Run: NGPU=" << launch_layout(sc).first << " CONFIG_FILE=train.toml ./run_train.sh (per node).\n"
    << "# FILL IN marks placeholders: dataset, tokenizer/assets, learning rate, checkpoint folder.\n\n";
  o << "[job]\ndump_folder = \"./outputs\"                      # FILL IN\ndescription = \"" << m.name << " (ptdp export)\"\n\n";
  o << "[model]\nname = \"" << (j.flavor ? j.flavor->model : "llama3") << "\"\nflavor = \"" << (j.flavor ? j.flavor->flavor : "FILL_IN") << "\"\n"
    // 0.1's [model] names the tokenizer file (tokenizer_path) and ignores keys it does not know;
    // 0.2 names the folder of the model's Hugging Face assets (tokenizer_path is deprecated there).
    << (v01 ? "tokenizer_path = \"./assets/tokenizer/FILL_IN\"   # FILL IN: the tokenizer file\n"
            : "hf_assets_path = \"./assets/hf/FILL_IN\"            # FILL IN: the tokenizer's folder\n");
  if (j.float8) o << "converters = [\"" << float8_table << "\"]\n";
  o << "\n[optimizer]\nname = \"AdamW\"\nlr = 3e-4                                     # FILL IN\neps = 1e-8\n\n";
  o << "[lr_scheduler]\nwarmup_steps = 200                            # FILL IN\n\n";
  o << "[training]\nlocal_batch_size = " << j.local << "\nglobal_batch_size = " << j.global << "\nseq_len = " << j.seq << "\n";
  if (j.steps > 0) o << "steps = " << j.steps << "\n";
  else o << "steps = 1000                                  # FILL IN\n";
  o << "max_norm = 1.0\ndataset = \"c4\"                               # FILL IN\n";
  o << "mixed_precision_param = \"" << j.param_dtype << "\"\n";
  if (j.offload) o << "enable_cpu_offload = true\n";
  // torch.compile: 0.1's training.compile, 0.2's [compile] table (its components default to model
  // and loss). Both refuse async TP without it.
  if (j.compiled && v01) o << "compile = true\n";
  if (j.compiled && !v01) o << "\n[compile]\nenable = true\n";
  o << "\n[parallelism]\ndata_parallel_replicate_degree = " << j.replicate << "\ndata_parallel_shard_degree = " << j.shard
    << "\ntensor_parallel_degree = " << j.tp << "\npipeline_parallel_degree = " << j.pp << "\ncontext_parallel_degree = " << j.cp << "\n";
  if (!j.rotate.empty()) o << "context_parallel_rotate_method = \"" << j.rotate << "\"\n";
  if (j.async_tp) o << "enable_async_tensor_parallel = true\n";
  if (!j.reshard.empty()) o << "fsdp_reshard_after_forward = \"" << j.reshard << "\"\n";
  if (!j.schedule.empty()) {
    o << "pipeline_parallel_schedule = \"" << j.schedule << "\"\npipeline_parallel_microbatch_size = " << j.microbatch << "\n";
    o << titan_split(j.stage_layers, v01 ? TitanSplit::SplitPoints : TitanSplit::ModulesOutput, " = ") << "\n";
  }
  o << "\n[activation_checkpoint]\nmode = \"" << j.ac << "\"\n";
  if (j.ac == "selective") o << "selective_ac_option = \"op\"\n";
  if (j.float8) {
    o << "\n[" << float8_table << "]\nenable_fsdp_float8_all_gather = " << (j.fp8_gather ? "true" : "false") << "\n";
    if (!j.fp8_recipe.empty()) o << "recipe_name = \"" << j.fp8_recipe << "\"\n";  // unset: tensorwise
  }
  o << "\n[checkpoint]\n" << (v01 ? "enable_checkpoint" : "enable") << " = true\nfolder = \"checkpoint\"                        # FILL IN\ninterval = 500\n";
  return o.str();
}

// 0.3's Python config: one config_registry-style function returning Trainer.Config(...), in the
// names of torchtitan 0.3's classes (TrainingConfig, ParallelismConfig, CompileConfig,
// SelectiveAC/FullAC, Float8LinearConverter, model_registry), which ptdp import torchtitan reads back.
std::string titan_python(const Scenario& sc, const TitanJob& j, std::vector<std::string>& notes) {
  const auto& m = sc.model;
  const std::string model = j.flavor ? j.flavor->model : "llama3";
  const std::string function = model + "_ptdp";
  if (j.param_dtype == "float16") notes.push_back("fp16: torchtitan 0.3's mixed_precision_param is bfloat16 or float32; the file says bfloat16");
  if (j.float8 && j.fp8_gather) notes.push_back("FP8 parameter all-gather: torchtitan 0.3's Float8LinearConverter has no enable_fsdp_float8_all_gather");
  if (!j.rotate.empty()) notes.push_back("context_parallel_rotate_method: torchtitan 0.3 has no such option (its CP rotates as it chooses)");
  std::ostringstream o;
  o << "# torchtitan 0.3 config for " << m.name << " on " << sc.gpus << " GPUs: the plan of "
    << (sc.source.empty() ? "the default scenario" : sc.source) << ", written by ptdp export torchtitan.\n"
    << "# Run it as a config_registry function: save as ptdp_job.py on PYTHONPATH, then (per node)\n"
    << "#   torchrun --nproc_per_node=" << launch_layout(sc).first << " -m torchtitan.train --module ptdp_job --config " << function << "\n"
    << "# FILL IN marks placeholders: dataset, tokenizer/assets, learning rate, checkpoint folder.\n\n";
  o << "from torchtitan.components.checkpoint import CheckpointManager\n"
    << "from torchtitan.components.optimizer import default_adamw, LRSchedulersContainer\n";
  if (j.float8) o << "from torchtitan.components.quantization import Float8LinearConverter\n";
  o << "from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig\n";
  if (j.ac != "none") o << "from torchtitan.distributed.activation_checkpoint import " << (j.ac == "full" ? "FullAC" : "SelectiveAC") << "\n";
  o << "from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader\n"
    << "from torchtitan.models." << model << " import model_registry\n"
    << "from torchtitan.trainer import Trainer\n\n\n";
  o << "def " << function << "() -> Trainer.Config:\n";
  o << "    model_spec = model_registry(\"" << (j.flavor ? j.flavor->flavor : "FILL_IN") << "\"";
  if (j.float8) {
    o << ", converters=[Float8LinearConverter.Config(";
    if (!j.fp8_recipe.empty()) o << "recipe_name=\"" << j.fp8_recipe << "\", ";
    o << "model_compile_enabled=" << (j.compiled ? "True" : "False") << ")]";
  }
  o << ")\n    return Trainer.Config(\n";
  o << "        hf_assets_path=\"./assets/hf/FILL_IN\",  # FILL IN: the tokenizer's folder\n";
  o << "        model_spec=model_spec,\n";
  o << "        optimizer=default_adamw(lr=3e-4),  # FILL IN\n";
  o << "        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=200),  # FILL IN\n";
  o << "        training=TrainingConfig(\n            local_batch_size=" << j.local << ",\n            global_batch_size=" << j.global
    << ",\n            seq_len=" << j.seq << ",\n            steps=" << (j.steps > 0 ? j.steps : 1000) << "," << (j.steps > 0 ? "" : "  # FILL IN")
    << "\n            max_norm=1.0,\n            mixed_precision_param=\"" << (j.param_dtype == "float32" ? "float32" : "bfloat16") << "\",\n";
  if (j.offload) o << "            enable_cpu_offload=True,\n";
  o << "        ),\n        dataloader=HuggingFaceTextDataLoader.Config(dataset=\"c4\"),  # FILL IN\n";
  o << "        parallelism=ParallelismConfig(\n            data_parallel_replicate_degree=" << j.replicate
    << ",\n            data_parallel_shard_degree=" << j.shard << ",\n            tensor_parallel_degree=" << j.tp
    << ",\n            pipeline_parallel_degree=" << j.pp << ",\n            context_parallel_degree=" << j.cp << ",\n";
  if (!j.reshard.empty()) o << "            fsdp_reshard_after_forward=\"" << j.reshard << "\",\n";
  if (!j.schedule.empty()) {
    o << "            pipeline_parallel_schedule=\"" << j.schedule << "\",\n            pipeline_parallel_microbatch_size=" << j.microbatch << ",\n";
    o << "            " << titan_split(j.stage_layers, TitanSplit::ModulesLmHead, "=") << ",\n";
  }
  o << "        ),\n        checkpoint=CheckpointManager.Config(enable=True, folder=\"checkpoint\", interval=500),  # FILL IN\n";
  o << "        activation_checkpoint=" << (j.ac == "none" ? "None" : j.ac == "full" ? "FullAC.Config()" : "SelectiveAC.Config()") << ",\n";
  // Async TP runs under torch.compile only.
  o << "        compile=CompileConfig(enable=" << (j.compiled ? "True" : "False")
    << ", enable_async_tensor_parallel=" << (j.async_tp ? "True" : "False") << "),\n";
  o << "    )\n";
  return o.str();
}

}  // namespace

std::string export_torchtitan(const Scenario& sc, std::vector<std::string>* caveats, const std::string& version) {
  if (version != "0.1" && version != "0.2" && version != "0.3")
    throw ConfigError("--torchtitan-version", "expected 0.1, 0.2 or 0.3 (got '" + printable(version) + "')");
  std::vector<std::string> notes;
  TitanJob j = titan_job(sc, notes);
  std::string text;
  if (version == "0.3") {
    // 0.3's Float8 recipes are rowwise (its default) and rowwise_with_gw_hp: tensorwise is gone.
    if (j.float8 && sc.plan.fp8_recipe != Fp8Recipe::Rowwise)
      notes.push_back("FP8 recipe " + to_string(sc.plan.fp8_recipe) + ": torchtitan 0.3's Float8 converter is rowwise (its default)");
    text = titan_python(sc, j, notes);
  } else {
    // torchao's Float8Linear in 0.1/0.2: tensorwise (recipe_name unset) or rowwise.
    if (j.float8 && sc.plan.fp8_recipe != Fp8Recipe::Tensorwise && sc.plan.fp8_recipe != Fp8Recipe::Rowwise)
      notes.push_back("FP8 recipe " + to_string(sc.plan.fp8_recipe) + ": torchtitan " + version +
                      "'s Float8 converter is tensorwise or rowwise; the file says tensorwise");
    text = titan_toml(sc, j, version == "0.1");
  }
  if (caveats) caveats->insert(caveats->end(), notes.begin(), notes.end());
  return text;
}

}  // namespace ptdp
