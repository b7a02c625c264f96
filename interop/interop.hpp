// Megatron-LM and DeepSpeed configurations in and out: a Megatron-LM command line or launch
// script, or a DeepSpeed JSON config, becomes a scenario (YAML text); a scenario becomes the
// Megatron-LM launch line of its plan. Arguments ptdp does not use are listed, never dropped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "interop/shell.hpp"

namespace ptdp {

struct Scenario;

/// An imported configuration: the scenario YAML and what was not carried over.
struct ImportResult {
  std::string yaml;                    // a complete scenario file
  std::vector<std::string> unsupported;  // affects training but ptdp does not model it (why)
  std::vector<std::string> no_effect;    // recognised, no effect on the plan (optimizer, data, logging, …)
  std::vector<std::string> unknown;      // not recognised
  std::vector<std::string> notes;        // values ptdp chose (defaults it had to assume)
};

struct ImportOptions {
  std::string topology = "dgx-a100";  // cluster.topology of the scenario
  int64_t gpus = 0;                   // 0: from the launcher (--nproc_per_node × --nnodes) or t·p
  std::string base_scenario;          // DeepSpeed: the model and plan it configures ("" = default)
  std::string config_function;        // torchtitan 0.3: the config_registry function ("" = the only one)
};

/// `args` are Megatron-LM arguments (`--num-layers 24 …`, `--x=v` accepted, other words such as
/// torchrun and pretrain_gpt.py skipped); `source` names them in errors. A value missing, or not
/// a number where one is needed → ConfigError naming the argument. The result loads as a scenario.
ImportResult import_megatron(const std::vector<std::string>& args, const std::string& source, const ImportOptions& options);

/// A DeepSpeed JSON config (`text` read from `source`): batch sizes, zero_optimization.stage,
/// offload_optimizer/offload_param, fp16/bf16. A wrong type → ConfigError naming the JSON path.
ImportResult import_deepspeed(const std::string& text, const std::string& source, const ImportOptions& options);

/// A Hugging Face model config.json (`text` read from `source`): the architecture (model_type:
/// llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, gpt2, bloom; other families refused by name)
/// and its sizes become the model keys; the cluster, tensor/pipeline sizes and batch come from
/// options.base_scenario when given, else data parallelism over options.gpus (8) GPUs of
/// options.topology. A wrong type → ConfigError naming the JSON key.
ImportResult import_hf(const std::string& text, const std::string& source, const ImportOptions& options);

/// torchtitan's train.toml (`text` read from `source`): model.name/flavor (llama3 8B/70B/405B,
/// llama2 7B/13B/70B; others refused by name), [parallelism] degrees (FSDP shard/replicate →
/// zero_stage 3, or 2 when parameters stay gathered after the forward; HSDP over a node →
/// sharding_group node; TP with its sequence parallelism and async TP; PP with its schedule and
/// microbatch size; CP with its rotate method), batch sizes, seq_len, steps, activation
/// checkpointing, mixed precision, Float8, CPU offload; torch.compile listed as not modelled.
/// `data_parallel_shard_degree = -1` needs options.gpus. Errors name the key at file:line:col.
/// torchtitan 0.3's Python config_registry module (interop/torchtitan_py.hpp) is read as the same
/// keys: the function options.config_function, or the file's only config.
ImportResult import_torchtitan(const std::string& text, const std::string& source, const ImportOptions& options);

/// The scenario's plan as a torchtitan job (FSDP plans: zero_stage 2/3 as shard degree and
/// reshard_after_forward, node sharding as HSDP); FILL IN marks placeholders; what torchtitan
/// cannot express goes to `caveats`. `version` picks the release: "0.3", the default and newest
/// (a Python config_registry function returning Trainer.Config(...) in 0.3's classes), or a
/// train.toml in "0.2"'s names (`[quantize.linear.float8]`, converters
/// ["quantize.linear.float8"], `checkpoint.enable`) or "0.1"'s (`[float8]`, converters
/// ["float8"], `checkpoint.enable_checkpoint`); another value is a ConfigError.
std::string export_torchtitan(const Scenario& sc, std::vector<std::string>* caveats = nullptr, const std::string& version = "0.3");

/// A Megatron-LM argument that current Megatron-LM no longer accepts: `ptdp import megatron`
/// still reads it (older scripts), `ptdp export megatron` never writes it.
struct RemovedMegatronFlag {
  const char* flag;         // without the leading "--"
  const char* removed;      // when (approximate release)
  const char* replacement;  // what to write instead
};
const std::vector<RemovedMegatronFlag>& removed_megatron_flags();

/// The Megatron-LM launch line (torchrun … pretrain_gpt.py --num-layers …) of the scenario's
/// plan; what Megatron-LM cannot express (gpipe, zero-bubble schedules, balanced partitions) is
/// appended to `caveats`.
std::string export_megatron(const Scenario& sc, std::vector<std::string>* caveats = nullptr);

/// A ZeRO / sharded plan for Megatron-DeepSpeed: a launch script that writes the DeepSpeed JSON
/// config (batch sizes, zero_optimization with its stage, overlap, bucket, offload and MiCS
/// shard size for node sharding, precision) with a here-document and runs `deepspeed …
/// pretrain_gpt.py` with the Megatron-DeepSpeed arguments; what it cannot express goes to
/// `caveats`. `ptdp import deepspeed` reads the JSON back, `ptdp import megatron` the script.
std::string export_deepspeed(const Scenario& sc, std::vector<std::string>* caveats = nullptr);
/// The DeepSpeed JSON config of the plan alone (what export_deepspeed's script writes).
std::string deepspeed_config_json(const Scenario& sc, std::vector<std::string>* caveats = nullptr);

/// The import's report: the lists above as YAML comments (also printed on stderr by the CLI).
std::string import_report(const ImportResult& r);

}  // namespace ptdp
