// `ptdp checkpoint DIR [--hf OUT]`: what a checkpoint directory holds, with every file of its
// latest save read back and checked (manifest.json's sizes and digests, shard checksums and
// headers, the Megatron-named state dict and its head layout against meta.json),
// before a run resumes from it or a user copies it away. It never writes or removes anything in
// DIR; --hf writes a Hugging Face GPT-2 model into a new directory.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/json_read.hpp"
#include "exec/io/checkpoint.hpp"

namespace ptdp::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string megabytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

// A whole shard or state-dict file of the save (bounded by its own size), or a ConfigError naming it.
std::string read_whole(const fs::path& path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) throw ConfigError("checkpoint", path.string() + " is missing (" + ec.message() + ")");
  return exec::read_file(path.string(), size + 1);
}

// What a Llama-style export reads from meta.json's model (ConfigError naming the file when a key
// is missing or of another type).
exec::HfLlamaConfig llama_config(const fs::path& where, const json& model) {
  const std::string meta = (where / "meta.json").string();
  auto integer = [&](const char* k) {
    if (!model.contains(k)) throw ConfigError("--hf", meta + " lacks model." + k);
    return json_get<int64_t>(model[k], meta, std::string("model.") + k);
  };
  auto number = [&](const char* k, double fallback) { return model.contains(k) ? json_get<double>(model[k], meta, std::string("model.") + k) : fallback; };
  auto text = [&](const char* k, const char* fallback) {
    return model.contains(k) ? json_get<std::string>(model[k], meta, std::string("model.") + k) : std::string(fallback);
  };
  exec::HfLlamaConfig c;
  c.vocab_size = integer("vocab_size");
  c.num_heads = integer("num_attention_heads");
  c.num_query_groups = model.contains("num_query_groups") ? integer("num_query_groups") : c.num_heads;
  c.seq_length = integer("seq_length");
  c.rotary_base = number("rotary_base", 10000);
  c.rotary_percent = number("rotary_percent", 1);
  c.normalization = text("normalization", "layernorm");
  c.position_embedding = text("position_embedding", "learned");
  return c;
}

// The latest save's state dict as a Hugging Face model directory (model.safetensors and
// config.json): GPT2LMHeadModel, or LlamaForCausalLM for a SwiGLU model; never over existing files.
void write_hf(const fs::path& where, const json& meta, const std::vector<exec::NamedTensor>& state_dict, const std::string& out) {
  if (state_dict.empty())
    throw ConfigError("--hf", (where / "model.safetensors").string() + " is missing: this save has no state dict to convert");
  const json model = meta.contains("model") && meta["model"].is_object() ? meta["model"] : json::object();
  if (!model.value("vocab_size", json()).is_number_unsigned() || !model.value("num_attention_heads", json()).is_number_unsigned())
    throw ConfigError("--hf", (where / "meta.json").string() + " lacks model.vocab_size or model.num_attention_heads");
  for (const exec::NamedTensor& t : state_dict)
    if (t.name.find(".self_attention.linear_kv_down_proj.") != std::string::npos)
      throw ConfigError("--hf", "the model has multi-head latent attention (" + t.name + "): ptdp writes GPT2LMHeadModel and "
                                "LlamaForCausalLM only; model.safetensors is Megatron-Core's state dict");
  const bool llama = model.value("mlp", json()) == "swiglu";
  const exec::HfExport hf = llama ? exec::to_hf_llama(state_dict, llama_config(where, model), "--hf")
                                  : exec::to_hf_gpt2(state_dict, model["vocab_size"].get<int64_t>(),
                                                     static_cast<int>(std::min<int64_t>(model["num_attention_heads"].get<int64_t>(), 1 << 20)), "--hf");
  std::error_code ec;
  for (const char* f : {"model.safetensors", "config.json"})
    if (fs::exists(fs::path(out) / f, ec))
      throw ConfigError("--hf", (fs::path(out) / f).string() + " exists: give a new or empty directory (nothing is written over)");
  exec::make_directories(out);
  exec::write_file_atomically((fs::path(out) / "model.safetensors").string(), exec::encode_safetensors(hf.tensors, {{"format", "pt"}}));
  exec::write_file_atomically((fs::path(out) / "config.json").string(), hf.config_json);
  std::printf("  hugging face: %s/model.safetensors (%zu tensors) and config.json: %s.from_pretrained(\"%s\")\n",
              out.c_str(), hf.tensors.size(), llama ? "LlamaForCausalLM" : "GPT2LMHeadModel", out.c_str());
}

int check_checkpoint(const std::string& dir, const std::string& hf_dir) {
  const fs::path where = exec::latest_checkpoint_dir(dir);
  const std::string name = where.filename().string();
  std::error_code ec;
  // manifest.json (written last by a save): every file below is checked against its size and digest.
  std::optional<exec::Manifest> manifest;
  if (exec::has_manifest(where.string())) {
    manifest = exec::read_manifest(where.string());
    exec::verify_file(*manifest, where.string(), "meta.json", read_whole(where / "meta.json"));
  }
  const json meta = exec::read_checkpoint_meta(where.string());
  if (!manifest && meta.value("format", json(0)).is_number() && meta.value("format", json(0)).get<double>() >= 3)
    throw ConfigError("checkpoint", (where / "manifest.json").string() + " is missing: the save's files cannot be checked");
  if (!meta.value("world_size", json()).is_number_unsigned() || !meta.value("step", json()).is_number_unsigned() ||
      !meta.value("save_id", json()).is_string() || !meta.value("fingerprint", json()).is_string())
    throw ConfigError("checkpoint", (where / "meta.json").string() + " lacks world_size, step, save_id or fingerprint (not a ptdp checkpoint?)");
  const int64_t world = meta["world_size"].get<int64_t>(), step = meta["step"].get<int64_t>();
  if (world < 1 || world > 1'000'000) throw ConfigError("checkpoint", (where / "meta.json").string() + " has world_size " + std::to_string(world));
  std::printf("checkpoint %s: latest %s (step %lld)\n", dir.c_str(), name.c_str(), static_cast<long long>(step));
  // The run's description: informational, so a field of an unexpected type shows as "?".
  auto field = [&](const char* group, const char* key) -> std::string {
    const json g = meta.contains(group) && meta[group].is_object() ? meta[group] : json::object();
    if (!g.contains(key)) return "?";
    return g[key].is_string() ? printable(g[key].get<std::string>(), 200) : g[key].dump();
  };
  std::printf("  run:         %s layers, hidden %s; t %s · p %s · d %s on %lld ranks; ZeRO stage %s; seed %s\n",
              field("model", "num_layers").c_str(), field("model", "hidden_size").c_str(), field("parallel", "tensor").c_str(),
              field("parallel", "pipeline").c_str(), field("parallel", "data").c_str(), static_cast<long long>(world),
              field("sharding", "zero_stage").c_str(), meta.contains("seed") ? meta["seed"].dump().c_str() : "?");
  if (meta.contains("data")) std::printf("  data:        %s\n", field("data", "description").c_str());
  // Every shard: readable, its checksum right, and written for this rank by this save of this run.
  uint64_t shard_bytes = 0, entries = 0;
  for (int64_t r = 0; r < world; ++r) {
    const fs::path path = where / exec::shard_file_name(static_cast<int>(r));
    const std::string bytes = read_whole(path);
    std::string shard_meta;
    try {
      entries += exec::decode_shard(bytes, path.string(), &shard_meta).size();
    } catch (const EnvironmentError& e) {
      throw ConfigError("checkpoint", e.what());
    }
    const exec::ShardHeader h = exec::ShardHeader::from_json(shard_meta, path.string());
    // What this file should be: rank r's shard of this save (its tp/pp/dp coordinates are not in
    // meta.json, so they are taken as written).
    exec::ShardHeader expected = h;
    expected.global_rank = static_cast<int>(r);
    expected.step = step;
    expected.save_id = meta["save_id"].get<std::string>();
    expected.fingerprint = meta["fingerprint"].get<std::string>();
    if (const std::string why = exec::shard_mismatch(h, expected); !why.empty())
      throw ConfigError("checkpoint", path.string() + " does not belong to this save: " + why);
    // The shard's own checks first (they say what is wrong), then the manifest's size and digest.
    if (manifest) exec::verify_file(*manifest, where.string(), path.filename().string(), bytes);
    shard_bytes += bytes.size();
  }
  std::printf("  shards:      %lld of %lld intact (checksums and headers checked), %llu entries, %s\n", static_cast<long long>(world),
              static_cast<long long>(world), static_cast<unsigned long long>(entries), megabytes(shard_bytes).c_str());
  // The Megatron-named state dict and the moments (saves of older ptdp versions have none).
  std::vector<exec::NamedTensor> state_dict;
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const fs::path path = where / file;
    if (!fs::exists(path, ec) && manifest && manifest->files.count(file) != 0)
      throw ConfigError("checkpoint", path.string() + " is missing (manifest.json lists it)");
    if (!fs::exists(path, ec)) {
      std::printf("  %-12s absent (saved by a ptdp without Megatron-named state dicts)\n", (std::string(file).substr(0, std::string(file).find('.')) + ":").c_str());
      continue;
    }
    const std::string bytes = read_whole(path);
    if (manifest) exec::verify_file(*manifest, where.string(), file, bytes);
    std::vector<exec::NamedTensor> tensors;
    std::map<std::string, std::string> md;
    try {
      tensors = exec::decode_safetensors(bytes, path.string(), &md);
    } catch (const EnvironmentError& e) {
      throw ConfigError("checkpoint", e.what());
    }
    uint64_t elements = 0;
    for (const auto& t : tensors) elements += t.values.size();
    if (std::string(file) == "model.safetensors") state_dict = tensors;
    // The head layout the fused QKV columns were written with, against meta.json's (an edited
    // head count would reorder them in --hf).
    for (const char* key : {"num_attention_heads", "num_query_groups", "hidden_size"}) {
      const auto it = md.find(std::string("ptdp_") + key);
      const json model = meta.contains("model") && meta["model"].is_object() ? meta["model"] : json::object();
      if (it != md.end() && model.contains(key) && model[key].dump() != it->second)
        throw ConfigError("checkpoint", path.string() + " was written with " + key + " = " + printable(it->second, 40) + ", " +
                                            (where / "meta.json").string() + " says " + printable(model[key].dump(), 40));
    }
    std::printf("  %-12s %s: %zu tensors, %.3f M values, %s\n", (std::string(file).substr(0, std::string(file).find('.')) + ":").c_str(), file,
                tensors.size(), static_cast<double>(elements) / 1e6, megabytes(bytes.size()).c_str());
  }
  // Other step directories (a user's own, or ptdp's that a failed clean-up left): listed, never touched.
  std::vector<std::string> others;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) == 0 && n != name) others.push_back(n);
  }
  if (manifest)
    std::printf("  manifest:    %zu files, sizes and digests match\n", manifest->files.size());
  std::printf("  other steps: %s\n", others.empty() ? "none" : "");
  for (const auto& o : others) std::printf("    %s\n", o.c_str());
  if (!hf_dir.empty()) write_hf(where, meta, state_dict, hf_dir);
  return 0;
}

}  // namespace

void add_checkpoint(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("checkpoint", "check a checkpoint directory: read back every file of its latest save (shard checksums and "
                                               "headers, the Megatron-named state dict) and say what run it belongs to; read-only");
  static std::string dir, hf;
  cmd->add_option("DIR", dir, "checkpoint directory (as given to train --checkpoint)")->required();
  cmd->add_option("--hf", hf,
                  "also write the latest save as a Hugging Face GPT-2 model (model.safetensors + config.json) into this new "
                  "directory: GPT-2's architecture only (LayerNorm, GELU, biases, multi-head attention)")
      ->type_name("OUT_DIR");
  cmd->callback([&run] { run = [] { return check_checkpoint(dir, hf); }; });
}

}  // namespace ptdp::cli
