// `ptdp checkpoint DIR`: what a checkpoint directory holds, with every file of its latest save
// read back and checked (shard checksums and headers, the Megatron-named state dict), before a
// run resumes from it or a user copies it away. Read-only: it never writes or removes anything.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/json_depth.hpp"
#include "exec/checkpoint.hpp"

namespace ptdp::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string megabytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

// A whole file of the save (bounded by its own size), or a ConfigError naming it.
std::string read_whole(const fs::path& path) {
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) throw ConfigError("checkpoint", path.string() + " is missing (" + ec.message() + ")");
  return exec::read_file(path.string(), size + 1);
}

int check_checkpoint(const std::string& dir) {
  const std::string name = exec::read_latest(dir);
  const fs::path where = fs::path(dir) / name;
  std::error_code ec;
  if (!fs::is_directory(where, ec))
    throw ConfigError("checkpoint", (fs::path(dir) / "latest").string() + " names " + name + ", which is not a directory of " + dir);
  json meta;
  try {
    const std::string text = read_whole(where / "meta.json");
    check_json_depth(text, (where / "meta.json").string());
    meta = json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError("checkpoint", (where / "meta.json").string() + " is corrupt: " + e.what());
  }
  if (!meta.is_object() || !meta.value("world_size", json()).is_number_unsigned() || !meta.value("step", json()).is_number_unsigned() ||
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
    std::string why;
    if (h.global_rank != r) why = "it is the shard of rank " + std::to_string(h.global_rank);
    else if (h.step != step) why = "it was saved at step " + std::to_string(h.step);
    else if (h.save_id != meta["save_id"].get<std::string>()) why = "it was written by save " + h.save_id;
    else if (h.fingerprint != meta["fingerprint"].get<std::string>()) why = "it belongs to another run (fingerprint " + h.fingerprint + ")";
    if (!why.empty()) throw ConfigError("checkpoint", path.string() + " does not belong to this save: " + why);
    shard_bytes += bytes.size();
  }
  std::printf("  shards:      %lld of %lld intact (checksums and headers checked), %llu entries, %s\n", static_cast<long long>(world),
              static_cast<long long>(world), static_cast<unsigned long long>(entries), megabytes(shard_bytes).c_str());
  // The Megatron-named state dict and the moments (saves of older ptdp versions have none).
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const fs::path path = where / file;
    if (!fs::exists(path, ec)) {
      std::printf("  %-12s absent (saved by a ptdp without Megatron-named state dicts)\n", (std::string(file).substr(0, std::string(file).find('.')) + ":").c_str());
      continue;
    }
    const std::string bytes = read_whole(path);
    std::vector<exec::NamedTensor> tensors;
    try {
      tensors = exec::decode_safetensors(bytes, path.string());
    } catch (const EnvironmentError& e) {
      throw ConfigError("checkpoint", e.what());
    }
    uint64_t elements = 0;
    for (const auto& t : tensors) elements += t.values.size();
    std::printf("  %-12s %s: %zu tensors, %.3f M values, %s\n", (std::string(file).substr(0, std::string(file).find('.')) + ":").c_str(), file,
                tensors.size(), static_cast<double>(elements) / 1e6, megabytes(bytes.size()).c_str());
  }
  // Other step directories (a user's own, or ptdp's that a failed clean-up left): listed, never touched.
  std::vector<std::string> others;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) == 0 && n != name) others.push_back(n);
  }
  std::printf("  other steps: %s\n", others.empty() ? "none" : "");
  for (const auto& o : others) std::printf("    %s\n", o.c_str());
  return 0;
}

}  // namespace

void add_checkpoint(CLI::App& app, Runner& run) {
  auto* cmd = app.add_subcommand("checkpoint", "check a checkpoint directory: read back every file of its latest save (shard checksums and "
                                               "headers, the Megatron-named state dict) and say what run it belongs to; read-only");
  static std::string dir;
  cmd->add_option("DIR", dir, "checkpoint directory (as given to train --checkpoint)")->required();
  cmd->callback([&run] { run = [] { return check_checkpoint(dir); }; });
}

}  // namespace ptdp::cli
