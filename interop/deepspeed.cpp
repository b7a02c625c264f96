// DeepSpeed JSON configs in (import_deepspeed): batch sizes, ZeRO stage and offload, precision,
// on a base scenario's model and tensor/pipeline layout.
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/checked.hpp"
#include "core/error.hpp"
#include "core/json_depth.hpp"
#include "interop/common.hpp"
#include "interop/interop.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp {

// ---------------------------------------------------------------------------------------------
// DeepSpeed.

namespace {

using nlohmann::json;

bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

// A positive integer at `path`, or nothing when absent or "auto".
std::optional<int64_t> ds_int(const json& obj, const char* key, const std::string& path, const std::string& source, ImportResult& r,
                              int64_t lo, int64_t hi) {
  if (!obj.contains(key)) return std::nullopt;
  const json& v = obj.at(key);
  if (is_auto(v)) {
    r.notes.push_back(path + ": \"auto\" (kept the base scenario's value)");
    return std::nullopt;
  }
  if (!v.is_number_integer() && !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()))
    json_fail(source, path, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", v);
  const double x = v.get<double>();
  if (x < static_cast<double>(lo) || x > static_cast<double>(hi))
    json_fail(source, path, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", v);
  return static_cast<int64_t>(x);
}

std::optional<bool> ds_bool(const json& obj, const char* key, const std::string& path, const std::string& source, ImportResult& r) {
  if (!obj.contains(key)) return std::nullopt;
  const json& v = obj.at(key);
  if (is_auto(v)) {
    r.notes.push_back(path + ": \"auto\" (kept the base scenario's value)");
    return std::nullopt;
  }
  if (!v.is_boolean()) json_fail(source, path, "expected true or false", v);
  return v.get<bool>();
}

const json& ds_object(const json& obj, const char* key, const std::string& path, const std::string& source) {
  static const json empty = json::object();
  if (!obj.contains(key)) return empty;
  const json& v = obj.at(key);
  if (!v.is_object()) json_fail(source, path, "expected an object", v);
  return v;
}

std::string ds_device(const json& obj, const std::string& path, const std::string& source) {
  if (!obj.contains("device")) return "none";
  const json& v = obj.at("device");
  if (!v.is_string() || (v != "cpu" && v != "nvme" && v != "none")) json_fail(source, path + ".device", "expected \"cpu\", \"nvme\" or \"none\"", v);
  return v.get<std::string>();
}

}  // namespace

namespace {
ImportResult import_deepspeed_config(const nlohmann::json& cfg, const std::string& source, const ImportOptions& options);
}  // namespace

ImportResult import_deepspeed(const std::string& text, const std::string& source, const ImportOptions& options) {
  const json cfg = parse_config_json(text, source);
  try {
    return import_deepspeed_config(cfg, source, options);
  } catch (const json::exception& e) {
    // Whatever the JSON library refuses deeper down (a type it cannot convert, a number out of
    // range) is bad input in this file, not an internal error.
    throw ConfigError("", std::string("unexpected JSON value: ") + e.what(), SourceLocation{source, 0, 0});
  }
}

namespace {

// Batch sizes: train_batch_size = micro × accumulation × d; the base scenario's where not given.
std::pair<int64_t, int64_t> ds_batch(const json& cfg, const Scenario& base, int64_t d, const std::string& source, ImportResult& r) {
  auto tbs = ds_int(cfg, "train_batch_size", "train_batch_size", source, r, 1, 1'000'000'000);
  auto micro = ds_int(cfg, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu", source, r, 1, 1'000'000'000);
  auto gas = ds_int(cfg, "gradient_accumulation_steps", "gradient_accumulation_steps", source, r, 1, 1'000'000'000);
  int64_t global = base.plan.global_batch, mb = base.plan.micro_batch;
  if (tbs && micro && gas && *tbs != *micro * *gas * d)
    throw ConfigError("train_batch_size",
                      "must equal train_micro_batch_size_per_gpu × gradient_accumulation_steps × data-parallel size (" + std::to_string(*micro) +
                          " × " + std::to_string(*gas) + " × " + std::to_string(d) + " = " + std::to_string(*micro * *gas * d) + ", got " +
                          std::to_string(*tbs) + ")",
                      SourceLocation{source, 0, 0});
  if (micro) mb = *micro;
  if (tbs) global = *tbs;
  else if (micro) global = *micro * (gas ? *gas : 1) * d;
  else if (gas) global = mb * *gas * d;
  if (tbs && !micro) {
    const int64_t per_gpu = *tbs / ((gas ? *gas : 1) * d);
    if (per_gpu < 1 || per_gpu * (gas ? *gas : 1) * d != *tbs)
      throw ConfigError("train_batch_size", "is not divisible by gradient_accumulation_steps × data-parallel size (" +
                                                std::to_string((gas ? *gas : 1) * d) + ", got " + std::to_string(*tbs) + ")",
                        SourceLocation{source, 0, 0});
    mb = per_gpu;
  }

  return {global, mb};
}

// ZeRO: the stage, node-local sharding (ZeRO++ / MiCS) and offload, as plan keys.
std::vector<std::pair<std::string, std::string>> ds_zero(const json& cfg, const Scenario& base, int64_t d, bool bf16_on, const std::string& source,
                                                         ImportResult& r) {
  std::vector<std::pair<std::string, std::string>> sharding;
  const json& zero = ds_object(cfg, "zero_optimization", "zero_optimization", source);
  const auto stage = ds_int(zero, "stage", "zero_optimization.stage", source, r, 0, 3);
  const std::string off_opt = ds_device(ds_object(zero, "offload_optimizer", "zero_optimization.offload_optimizer", source),
                                        "zero_optimization.offload_optimizer", source);
  const std::string off_par = ds_device(ds_object(zero, "offload_param", "zero_optimization.offload_param", source),
                                        "zero_optimization.offload_param", source);
  // Node-local sharding: DeepSpeed 0.19's zero_hpz_partition_size (ZeRO++'s hierarchical
  // partition), or MiCS's mics_shard_size, which 0.19 removed (read with a note).
  auto mics = ds_int(zero, "zero_hpz_partition_size", "zero_optimization.zero_hpz_partition_size", source, r, -1, 1'000'000);
  const auto old_mics = ds_int(zero, "mics_shard_size", "zero_optimization.mics_shard_size", source, r, -1, 1'000'000);
  if (old_mics && *old_mics > 0) {
    if (mics && *mics > 0)
      json_fail(source, "zero_optimization.mics_shard_size", "together with zero_hpz_partition_size: give one of them", zero.at("mics_shard_size"));
    r.notes.push_back("zero_optimization.mics_shard_size: removed in DeepSpeed 0.19; its spelling there is zero_hpz_partition_size");
    mics = old_mics;
  }
  for (const auto& [key, value] : zero.items())
    if (key != "stage" && key != "offload_optimizer" && key != "offload_param" && key != "mics_shard_size" &&
        key != "zero_hpz_partition_size")
      r.no_effect.push_back("zero_optimization." + key + ": " + printable(value.dump(), 60));
  int64_t zero_stage = stage.value_or(0);
  if (bf16_on && zero_stage == 0 && d == 1) {
    r.notes.push_back("bf16 at ZeRO stage 0 with one data-parallel rank: DeepSpeed's BF16 optimizer has nothing to shard (zero_stage 0)");
  } else {
    zero_stage = deepspeed_zero_stage(zero_stage, bf16_on, r.notes);
  }
  if (zero_stage > 0) sharding.emplace_back("zero_stage", std::to_string(zero_stage));
  if (mics && *mics > 0 && zero_stage > 0) {
    // MiCS: shards within groups of mics_shard_size ranks, replicated across groups.
    ParallelPlan node = base.plan;
    node.data = d;
    node.zero_stage = static_cast<int>(zero_stage);
    node.sharding_group = ShardingGroup::Node;
    if (*mics == node.sharding_degree()) {
      sharding.emplace_back("sharding_group", "node");
    } else {
      r.unsupported.push_back("zero_optimization node shard group " + std::to_string(*mics) + ": shard groups other than a node's " +
                              std::to_string(node.sharding_degree()) + " data-parallel ranks are not modelled (sharded over all)");
    }
  }
  if (off_opt != "none" || off_par != "none") {
    const std::string what = off_par != "none" ? "optimizer_and_params" : "optimizer";
    if (has_key("parallel.offload")) sharding.emplace_back("offload", what);
    else r.unsupported.push_back("zero_optimization.offload_" + std::string(off_par != "none" ? "param" : "optimizer") + " (" +
                                 (off_par != "none" ? off_par : off_opt) + "): offload is not yet supported by this ptdp (no key parallel.offload)");
  }

  return sharding;
}

ImportResult import_deepspeed_config(const json& cfg, const std::string& source, const ImportOptions& options) {
  if (!cfg.is_object()) json_fail(source, "(top level)", "expected a JSON object", cfg);
  ImportResult r;
  const Scenario base = load_scenario(options.base_scenario);
  const int64_t gpus = options.gpus > 0 ? options.gpus : base.gpus;
  const int64_t t = base.plan.tensor, p = base.plan.pipeline;
  if (gpus % (t * p) != 0)
    throw ConfigError("cluster.gpus", "must be a multiple of tensor × pipeline of the base scenario (" + std::to_string(t * p) + ", got " + std::to_string(gpus) + ")",
                      SourceLocation{source, 0, 0});
  const int64_t d = gpus / (t * p);
  r.notes.push_back("model and tensor/pipeline layout from " + base.source + " (t " + std::to_string(t) + ", p " + std::to_string(p) +
                    "); data-parallel size " + std::to_string(d) + " of " + std::to_string(gpus) + " GPUs");

  static const std::set<std::string> understood = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                                   "zero_optimization", "fp16", "bf16"};
  static const std::set<std::string> no_effect = {"optimizer", "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
                                                  "prescale_gradients", "gradient_predivide_factor", "zero_allow_untested_optimizer",
                                                  "communication_data_type", "flops_profiler", "tensorboard", "wandb", "csv_monitor",
                                                  "comms_logger", "dump_state", "data_types", "checkpoint", "seed", "memory_breakdown"};
  for (const auto& [key, value] : cfg.items()) {
    if (understood.count(key)) continue;
    const std::string shown = key + ": " + printable(value.dump(), 60);
    if (no_effect.count(key)) r.no_effect.push_back(shown);
    else if (key == "activation_checkpointing")
      r.unsupported.push_back(shown + ": DeepSpeed's activation checkpointing options (set parallel.recompute)");
    else if (key == "pipeline" || key == "sparse_attention" || key == "amp" || key == "compression_training")
      r.unsupported.push_back(shown + ": not modelled");
    else r.unknown.push_back(shown);
  }

  const auto [global, mb] = ds_batch(cfg, base, d, source, r);

  // Precision.
  const json& fp16 = ds_object(cfg, "fp16", "fp16", source);
  const json& bf16 = ds_object(cfg, "bf16", "bf16", source);
  // "enabled": "auto" (Hugging Face's configs) keeps the base scenario's precision; a section
  // without "enabled" means enabled, as DeepSpeed reads it.
  auto enabled = [&](const json& section, const char* name, Precision base_precision) {
    const std::string path = std::string(name) + ".enabled";
    if (section.contains("enabled") && is_auto(section.at("enabled"))) {
      r.notes.push_back(path + ": \"auto\" (kept the base scenario's precision, " + to_string(base.plan.precision) + ")");
      return base.plan.precision == base_precision;
    }
    return ds_bool(section, "enabled", path, source, r).value_or(cfg.contains(name));
  };
  const bool fp16_on = enabled(fp16, "fp16", Precision::FP16);
  const bool bf16_on = enabled(bf16, "bf16", Precision::BF16);
  if (fp16_on && bf16_on) json_fail(source, "bf16.enabled", "fp16 and bf16 both enabled (DeepSpeed refuses them too)", bf16.value("enabled", json(true)));
  for (const auto& [key, value] : fp16.items())
    if (key != "enabled") r.no_effect.push_back("fp16." + key + ": " + value.dump());
  std::string precision = fp16_on ? "fp16" : bf16_on ? "bf16" : "fp32";
  if (!fp16_on && !bf16_on) r.notes.push_back("precision fp32: neither fp16 nor bf16 enabled");

  const auto sharding = ds_zero(cfg, base, d, bf16_on, source, r);

  std::ostringstream y;
  y << "# imported from the DeepSpeed config " << source << " by ptdp import deepspeed (model and layout: " << base.source << ")\n";
  const auto& m = base.model;
  y << "model:    {name: " << scalar_yaml(m.name) << ", num_layers: " << m.num_layers << ", hidden_size: " << m.hidden_size
    << ", num_attention_heads: " << m.num_attention_heads << ", num_query_groups: " << m.query_groups() << ", ffn_hidden_size: " << m.ffn()
    << ", seq_length: " << m.seq_length << ", vocab_size: " << m.vocab_size << ", mlp: " << to_string(m.mlp)
    << ", normalization: " << to_string(m.normalization) << ", tie_embeddings: " << (m.tie_embeddings ? "true" : "false")
    << ", attention: " << to_string(m.attention) << ", dropout: " << m.dropout_rate() << ", bias: " << (m.has_bias() ? "true" : "false")
    << "}\n";
  const std::string topo = base.topology_ref == "inline" || base.topology_ref.find('/') != std::string::npos ||
                                   base.topology_ref.find(".yaml") != std::string::npos
                               ? base.cluster.source
                               : base.topology_ref;
  y << "cluster:  {topology: " << scalar_yaml(topo) << ", gpus: " << gpus << "}\n";
  // DeepSpeed's pipeline engine runs one schedule (its TrainSchedule, 1F1B; framework_mechanisms).
  ScheduleKind schedule = base.plan.schedule;
  int64_t v = base.plan.virtual_stages;
  if (p > 1 && !framework_mechanisms(Framework::DeepSpeed).runs(schedule)) {
    r.notes.push_back("schedule 1f1b: DeepSpeed's pipeline engine runs its TrainSchedule (1F1B) only, not the base scenario's " +
                      to_string(schedule));
    schedule = ScheduleKind::OneFOneB;
    v = 1;
  }
  y << "parallel: {tensor: " << t << ", pipeline: " << p << ", data: " << d << ", virtual_stages: " << v
    << ", schedule: " << to_string(schedule) << ", recompute: " << to_string(base.plan.recompute);
  for (const auto& [k, v] : sharding) y << ", " << k << ": " << v;
  // Every other layout key of the base that DeepSpeed's config does not set stays as the base
  // has it (its partition, uneven first/last stage, sequence parallelism, overlaps, …).
  const json base_parallel = json::parse(base.config_json).at("parallel");
  for (const char* key : {"partition", "first_stage_layers", "last_stage_layers", "microbatch_group", "sequence_parallel", "scatter_gather",
                          "overlap_p2p", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "bucket_size", "max_inflight_gathers"}) {
    if (!has_key(std::string("parallel.") + key) || !base_parallel.contains(key)) continue;
    const json& v = base_parallel.at(key);
    if (v.is_boolean() || v.is_number_integer() || v.is_string()) y << ", " << key << ": " << (v.is_string() ? scalar_yaml(v.get<std::string>()) : v.dump());
  }
  y << "}\n";
  y << "training: {global_batch: " << global << ", micro_batch: " << mb << ", precision: " << precision << ", framework: deepspeed";
  if (base.train_tokens) y << ", train_tokens: " << static_cast<int64_t>(*base.train_tokens);
  y << "}\n";
  finish_import(r, y.str(), source, base.not_modelled);
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Export: the DeepSpeed config and the Megatron-DeepSpeed launch script of a plan.

std::string deepspeed_config_json(const Scenario& sc, std::vector<std::string>* caveats) {
  const auto& plan = sc.plan;
  std::vector<std::string> notes;
  json cfg;
  cfg["train_batch_size"] = plan.global_batch;
  cfg["train_micro_batch_size_per_gpu"] = plan.micro_batch;
  cfg["gradient_accumulation_steps"] = plan.num_microbatches();
  cfg["gradient_clipping"] = 1.0;
  cfg["steps_per_print"] = 10;
  json zero = {{"stage", plan.zero_stage}};
  if (plan.zero_stage >= 1) {
    zero["overlap_comm"] = plan.overlap_grad_reduce || plan.zero_stage == 3;
    zero["contiguous_gradients"] = true;
    if (plan.bucket_size > 0) zero["reduce_bucket_size"] = plan.bucket_size;
  }
  if (plan.zero_stage == 3) zero["stage3_max_live_parameters"] = 1'000'000'000;
  if (plan.offload != Offload::None) zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (plan.offload == Offload::OptimizerAndParams) zero["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (plan.sharding_group == ShardingGroup::Node && plan.zero_stage > 0) {
    // Shard within a node, replicate across nodes: DeepSpeed 0.19 spells the node-sized
    // partition group zero_hpz_partition_size (MiCS's mics_shard_size is gone).
    zero["zero_hpz_partition_size"] = plan.sharding_degree();
  }
  cfg["zero_optimization"] = zero;
  if (plan.precision == Precision::FP16) cfg["fp16"] = {{"enabled", true}, {"loss_scale", 0}, {"initial_scale_power", 16}};
  if (plan.precision == Precision::BF16 || plan.precision == Precision::FP8) cfg["bf16"] = {{"enabled", true}};
  if (plan.precision == Precision::BF16 && plan.zero_stage == 0)
    notes.push_back("bf16 at ZeRO stage 0: DeepSpeed's BF16 optimizer shards the fp32 optimizer state (as ZeRO-1); the plan has it unsharded");
  if (plan.precision == Precision::FP8) notes.push_back("fp8: DeepSpeed's config has no FP8 training; the config trains in bf16");
  if (caveats) caveats->insert(caveats->end(), notes.begin(), notes.end());
  return cfg.dump(2) + "\n";
}

std::string export_deepspeed(const Scenario& sc, std::vector<std::string>* caveats) {
  std::vector<std::string> notes;
  const std::string config = deepspeed_config_json(sc, &notes);
  if (sc.plan.pipeline > 1 && sc.plan.zero_stage >= 2)
    notes.push_back("ZeRO-" + std::to_string(sc.plan.zero_stage) + " with pipeline parallelism: DeepSpeed runs ZeRO-2/3 without pipeline stages only");
  if (sc.plan.schedule != ScheduleKind::OneFOneB && sc.plan.pipeline > 1)
    notes.push_back("schedule " + to_string(sc.plan.schedule) + ": Megatron-DeepSpeed runs 1F1B");
  std::vector<std::string> a = megatron_arguments(sc, MegatronDialect::MegatronDeepSpeed, notes);
  if (sc.plan.pipeline == 1) a.push_back("--no-pipeline-parallel");
  a.push_back("--deepspeed");
  a.push_back("--deepspeed_config ds_config.json");
  const auto [per_node, nodes] = launch_layout(sc);
  const std::string text = launch_script(
      sc, "deepspeed", "cat > ds_config.json <<'EOF'\n" + config + "EOF\n",
      "deepspeed --num_nodes " + std::to_string(nodes) + " --num_gpus " + std::to_string(per_node) + " pretrain_gpt.py", a,
      {"DATA_ARGS=(--data-path FILL_IN_my-corpus_text_document --split 949,50,1)    # FILL IN: your preprocessed data (and tokenizer)",
       "TRAINING_ARGS=(--lr 1.0e-4 --min-lr 1.0e-5 --lr-decay-style cosine --lr-warmup-fraction 0.01 --weight-decay 0.1 "
       "--save checkpoints --load checkpoints --save-interval 1000 --log-interval 10)    # FILL IN"});
  if (caveats) caveats->insert(caveats->end(), notes.begin(), notes.end());
  return text;
}

}  // namespace ptdp
