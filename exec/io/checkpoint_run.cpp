// The executor's checkpoints as a run uses them: the run's identity, saving every rank's shard
// with the state dict beside it, resuming (and cross-checking what was resumed), initial weights
// from a Megatron state dict, and FP8 amax histories.
#include "exec/io/checkpoint_run.hpp"

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include "core/error.hpp"
#include "core/input_file.hpp"
#include "core/json_depth.hpp"
#include "core/json_read.hpp"
#include "exec/io/checkpoint.hpp"
#include "exec/runtime/agree.hpp"
#include "model/partition.hpp"

namespace ptdp::exec {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Checkpoints written before the architecture keys and uneven stages existed were GPT models
// with uniform stages: their identity gets those values for the keys it lacks.
json with_former_defaults(json saved) {
  if (!saved.contains("model") || !saved.contains("parallel")) return saved;
  json& m = saved["model"];
  json& p = saved["parallel"];
  if (!m.contains("num_query_groups") && m.contains("num_attention_heads")) m["num_query_groups"] = m["num_attention_heads"];
  if (!m.contains("mlp")) m["mlp"] = "gelu";
  if (!m.contains("normalization")) m["normalization"] = "layernorm";
  if (!m.contains("tie_embeddings")) m["tie_embeddings"] = true;
  // Before rotary embeddings every model had learned positions.
  if (!m.contains("position_embedding")) m["position_embedding"] = "learned";
  if (!m.contains("rotary_base")) m["rotary_base"] = 10000.0;
  if (!m.contains("rotary_percent")) m["rotary_percent"] = 1.0;
  // Before the identity named multi-token prediction: a model with modules said so through its
  // tensors only (a resume with another count names the missing tensor).
  if (!m.contains("mtp_layers")) m["mtp_layers"] = 0;
  if (!p.contains("stage_layers") && m.contains("num_layers") && p.contains("pipeline") && p.contains("virtual_stages")) {
    const int64_t stages = p["pipeline"].get<int64_t>() * p["virtual_stages"].get<int64_t>();
    if (stages > 0 && m["num_layers"].get<int64_t>() % stages == 0)
      p["stage_layers"] = std::vector<int64_t>(static_cast<size_t>(stages), m["num_layers"].get<int64_t>() / stages);
  }
  return saved;
}

// Names the first difference between a checkpoint's identity and this run's.
void check_identity(const json& saved_as_written, const json& mine, const std::string& where) {
  const json saved = with_former_defaults(saved_as_written);
  auto fail = [&](const std::string& key, const json& a, const json& b, const std::string& hint) {
    throw ConfigError("checkpoint", where + " was saved with " + key + " = " + a.dump() + ", this run has " + b.dump() +
                                        hint);
  };
  if (saved.value("seed", json()) != mine["seed"]) fail("seed", saved.value("seed", json()), mine["seed"], " (pass the same --seed)");
  for (const char* group : {"parallel", "training", "model"})
    for (auto& [k, v] : mine[group].items()) {
      const json s = saved.contains(group) ? saved[group].value(k, json()) : json();
      if (s != v)
        fail(std::string(group) + "." + k, s, v,
             std::string(group) == "parallel" ? " (resuming needs the same parallel layout)" : "");
    }
  const json sd = saved.value("data", json::object());
  if (sd.value("fingerprint", json()) != mine["data"]["fingerprint"])
    throw ConfigError("checkpoint", where + " was trained on " + sd.value("description", std::string("other data")) +
                                        ", this run uses " + mine["data"]["description"].get<std::string>());
}

std::string shard_path(const std::string& dir, const std::string& name, int rank) {
  return (fs::path(dir) / name / shard_file_name(rank)).string();
}

// What this rank saves: each parameter with its Adam moments, whole ("NAME", "NAME#adam_m",
// "NAME#adam_v") without sharding; under sharding only the segments of its shard, named with
// their first element ("NAME@begin", "NAME#adam_m@begin", …), so that a run at another stage
// (or layout of the same d) can reassemble every parameter from the d shards of its (tp, pp).
std::vector<ShardEntry> shard_entries(ModelShard& model) {
  std::vector<ShardEntry> out;
  for (auto& st : model.stages()) {
    if (model.zero_stage() == 0) {
      for (const ParamInfo& p : st->params()) {
        ShardEntry v{p.name, std::vector<float>(p.count())}, m{p.name + "#adam_m", std::vector<float>(p.count())},
            a{p.name + "#adam_v", std::vector<float>(p.count())};
        model.read_values(*st, p, 0, p.count(), v.values.data());
        model.read_moments(*st, p.offset, p.count(), m.values.data(), a.values.data());
        out.push_back(std::move(v));
        out.push_back(std::move(m));
        out.push_back(std::move(a));
      }
      continue;
    }
    for (const ShardSegment& g : st->segments()) {
      const ParamInfo& p = st->params()[static_cast<size_t>(g.param)];
      const std::string at = "@" + std::to_string(g.begin);
      ShardEntry v{p.name + at, std::vector<float>(g.count)}, m{p.name + "#adam_m" + at, std::vector<float>(g.count)},
          a{p.name + "#adam_v" + at, std::vector<float>(g.count)};
      model.read_values(*st, p, g.begin, g.count, v.values.data());
      model.read_moments(*st, g.shard_offset, g.count, m.values.data(), a.values.data());
      out.push_back(std::move(v));
      out.push_back(std::move(m));
      out.push_back(std::move(a));
    }
  }
  return out;
}

// A parameter (or moment) reassembled from checkpoint entries: values and which are present.
struct Assembled {
  std::vector<float> values;
  std::vector<char> present;
  size_t missing = 0;
};

// Adds the entries of one shard file to `parts` (by "NAME" / "NAME#adam_m" / "NAME#adam_v").
// Entries of unknown names or out of range are an error naming `path`.
void add_entries(const std::vector<ShardEntry>& entries, const std::string& path, std::map<std::string, Assembled>& parts) {
  for (const ShardEntry& e : entries) {
    std::string key = e.name;
    size_t begin = 0;
    if (const size_t at = e.name.rfind('@'); at != std::string::npos) {
      key = e.name.substr(0, at);
      const std::string b = e.name.substr(at + 1);
      if (b.empty() || b.find_first_not_of("0123456789") != std::string::npos || b.size() > 15)
        throw ConfigError("checkpoint", path + " has a malformed entry name (" + e.name + ")");
      begin = std::stoull(b);
    }
    auto it = parts.find(key);
    if (it == parts.end()) continue;  // another stage's parameter of a peer: not ours
    Assembled& a = it->second;
    if (begin > a.values.size() || e.values.size() > a.values.size() - begin)
      throw ConfigError("checkpoint", path + " does not match this rank's model shard (" + e.name + " has another size)");
    for (size_t i = 0; i < e.values.size(); ++i) {
      a.values[begin + i] = e.values[i];
      if (!a.present[begin + i]) {
        a.present[begin + i] = 1;
        --a.missing;
      }
    }
  }
}

ShardHeader shard_header(const Communicator& world, const RankCoordinates& c, int64_t step, const std::string& save_id,
                         const json& identity) {
  ShardHeader h;
  h.global_rank = world.rank();
  h.tp = c.tp;
  h.pp = c.pp;
  h.dp = c.dp;
  h.step = step;
  h.save_id = save_id;
  h.fingerprint = fingerprint_of(identity.dump());
  return h;
}

// The Adam moments as optimizer.safetensors holds them: Megatron's names + ".exp_avg" / ".exp_avg_sq".
std::vector<NamedTensor> megatron_moments(const TransformerSpec& spec, int64_t padded_vocab, const FullStates& full) {
  std::vector<NamedTensor> moments;
  for (auto [set, suffix] : {std::pair{&full.adam_m, ".exp_avg"}, std::pair{&full.adam_v, ".exp_avg_sq"}})
    for (NamedTensor& t : to_megatron_state(spec, padded_vocab, *set)) {
      t.name += suffix;
      moments.push_back(std::move(t));
    }
  return moments;
}

// The manifest of a step directory, with its meta.json checked against it; none for a save of a
// ptdp before manifests (meta.json format < 3), ConfigError when a newer save lacks it.
std::optional<Manifest> checked_manifest(const std::string& step_dir) {
  const std::string meta_path = step_dir + "/meta.json";
  if (!has_manifest(step_dir)) {
    const json meta = read_checkpoint_meta(step_dir);
    if (!meta.contains("format") || (meta["format"].is_number() && meta["format"].get<double>() < 3)) return std::nullopt;
    throw ConfigError("checkpoint", step_dir + "/manifest.json is missing: the save's files cannot be checked (restore it, or "
                                               "resume from another checkpoint)");
  }
  Manifest m = read_manifest(step_dir);
  verify_file(m, step_dir, "meta.json", read_file(meta_path));
  return m;
}

}  // namespace

json run_identity(const TransformerSpec& spec, const ParallelPlan& plan, const TrainOptions& o, const TokenCorpus& data) {
  return json{{"seed", o.seed},
              {"parallel",
               {{"tensor", plan.tensor}, {"pipeline", plan.pipeline}, {"data", plan.data},
                {"virtual_stages", plan.virtual_stages}, {"stage_layers", stage_layers(spec, plan)}}},
              {"training", {{"global_batch", plan.global_batch}}},
              {"model",
               {{"num_layers", spec.num_layers}, {"hidden_size", spec.hidden_size},
                {"num_attention_heads", spec.num_attention_heads}, {"ffn_hidden_size", spec.ffn()},
                {"seq_length", spec.seq_length}, {"vocab_size", spec.vocab_size},
                {"num_query_groups", spec.query_groups()}, {"mlp", to_string(spec.mlp)},
                {"normalization", to_string(spec.normalization)}, {"tie_embeddings", spec.tie_embeddings},
                {"position_embedding", to_string(spec.position_kind())}, {"rotary_base", spec.rotary_base},
                {"rotary_percent", spec.rotary_percent}, {"mtp_layers", spec.mtp_layers}}},
              {"data", {{"description", data.description()}, {"fingerprint", data.fingerprint()}}}};
}

// Before any rank saves: refuse another run's checkpoints (unless overwriting) and contradictory
// options; creates the directory of a new run (rank 0, behind agree's barrier).
void prepare_checkpoint_dir(Communicator& world, const TrainOptions& o) {
  if (o.checkpoint_dir.empty()) return;
  agree(world, [&] {
    if (!o.resume && !o.overwrite && has_checkpoint(o.checkpoint_dir)) {
      std::string latest;
      try {
        latest = " (latest: " + read_latest(o.checkpoint_dir) + ")";
      } catch (const std::exception&) {
      }
      throw ConfigError("checkpoint", o.checkpoint_dir + " holds the checkpoint of another run" + latest +
                                          ": continue it with --resume, or replace it with --overwrite");
    }
    if (o.resume && o.overwrite)
      throw ConfigError("--overwrite", "replaces the checkpoint of another run; --resume continues it (give one of them)");
    // Nothing is removed here, whatever the directory holds: a killed save's leftovers go at the
    // rotation of the next save that completes (remove_other_checkpoints), a resume only reads.
    if (world.rank() == 0 && !o.resume) make_directories(o.checkpoint_dir);
  });
}

// Starts from the weights of a Megatron-named state dict (TrainOptions::init_path): every rank
// reads the file and writes its parts of each parameter.
void load_initial_weights(ModelShard& model, const TrainOptions& o) {
  if (o.resume)
    throw ConfigError("--init", "starts a new run from a state dict; --resume continues a checkpoint (give one of them)");
  const TransformerSpec& spec = model.spec();
  // Bounded by the model: its parameters in F32 and their header, with room for another padding
  // of the vocabulary.
  const uint64_t expected = (uint64_t{1} << 20) + 2 * 4 * megatron_state_elements(spec, model.padded_vocab());
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> md;
  const std::string bytes = read_input_file(o.init_path, "--init weights", expected);
  // A state dict of a ptdp checkpoint: checked against its save's manifest.
  const fs::path init(o.init_path);
  const std::string step_dir = init.has_parent_path() ? init.parent_path().string() : ".";
  if (has_manifest(step_dir) && init.filename().string().find("safetensors") != std::string::npos) {
    const Manifest manifest = read_manifest(step_dir);
    if (manifest.files.count(init.filename().string()) != 0) verify_file(manifest, step_dir, init.filename().string(), bytes);
  }
  try {
    tensors = decode_safetensors(bytes, o.init_path, &md);
  } catch (const EnvironmentError& e) {
    throw ConfigError("--init", e.what());
  }
  if (is_hf_state(tensors)) tensors = from_hf(spec, tensors, o.init_path, "--init");  // Hugging Face's names (GPT-2, Llama/Mistral)
  const ParameterSet full = from_megatron_state(spec, model.padded_vocab(), tensors, o.init_path, "--init", &md);
  // Every tensor fits (names and shapes, above); the fused QKV columns follow the head layout the
  // file was written with: another head count of the same hidden size has the same shapes but
  // other columns.
  for (const auto& [key, mine] : {std::pair<std::string, int64_t>{"ptdp_num_attention_heads", spec.num_attention_heads},
                                  std::pair<std::string, int64_t>{"ptdp_num_query_groups", spec.query_groups()},
                                  std::pair<std::string, int64_t>{"ptdp_hidden_size", spec.hidden_size}})
    if (md.count(key) != 0 && md[key] != std::to_string(mine))
      throw ConfigError("--init", o.init_path + " was written for " + key.substr(5) + " = " + printable(md[key], 40) + ", the model has " +
                                      std::to_string(mine) + " (its QKV columns would be read in another order)");
  for (auto& st : model.stages())
    for (const ParamInfo& p : st->params()) {
      const std::vector<float>& f = full.at(p.name);
      std::vector<float> local(p.count());
      for (size_t i = 0; i < local.size(); ++i) local[i] = f[p.global_index(i)];
      model.write_values(*st, p, 0, p.count(), local.data());
    }
}

// Every rank sends what it holds of each parameter (whole, or under stage 3 the segments of its
// shard) and, with `moments`, of its Adam moments (whole at stage 0, else its shard's segments),
// each as [begin, begin + count) of its tensor-parallel part; rank 0 places them. Collective.
void gather_states(Communicator& world, ModelShard& model, bool moments, FullStates* out) {
  json shapes = json::array();
  std::vector<ShardEntry> entries;
  auto add = [&](int kind, const ParamInfo& p, size_t begin, std::vector<float> values) {
    shapes.push_back({p.name, kind, p.global_rows, p.global_cols, p.row_offset, p.col_offset, p.rows, p.cols, begin});
    entries.push_back(ShardEntry{std::to_string(entries.size()), std::move(values)});  // unique: the header is a JSON object
  };
  for (auto& st : model.stages()) {
    if (st->slice().copy()) continue;  // DualPipe's second lane: the same values as the first's
    auto values = [&](const ParamInfo& p, size_t begin, size_t count) {
      std::vector<float> v(count);
      model.read_values(*st, p, begin, count, v.data());
      add(0, p, begin, std::move(v));
    };
    auto adam = [&](const ParamInfo& p, size_t offset, size_t begin, size_t count) {
      std::vector<float> m(count), v(count);
      model.read_moments(*st, offset, count, m.data(), v.data());
      add(1, p, begin, std::move(m));
      add(2, p, begin, std::move(v));
    };
    if (model.zero_stage() < 3)
      for (const ParamInfo& p : st->params()) values(p, 0, p.count());
    if (model.zero_stage() == 3)
      for (const ShardSegment& g : st->segments()) values(st->params()[static_cast<size_t>(g.param)], g.begin, g.count);
    if (moments && model.zero_stage() == 0)
      for (const ParamInfo& p : st->params()) adam(p, p.offset, 0, p.count());
    if (moments && model.zero_stage() > 0)
      for (const ShardSegment& g : st->segments()) adam(st->params()[static_cast<size_t>(g.param)], g.shard_offset, g.begin, g.count);
  }
  const std::string mine = encode_shard(shapes.dump(), entries);
  const auto all = world.gather_bytes(std::vector<char>(mine.begin(), mine.end()), 0);
  if (world.rank() != 0) return;
  *out = FullStates{};
  for (size_t r = 0; r < all.size(); ++r) {
    std::string meta;
    const std::vector<ShardEntry> got = decode_shard(std::string(all[r].begin(), all[r].end()), "rank " + std::to_string(r), &meta);
    const json sh = json::parse(meta);
    for (size_t i = 0; i < got.size(); ++i) {
      const json& s = sh[i];
      const int kind = s[1];
      ParamInfo p;  // the sender's layout of the parameter
      p.global_rows = s[2], p.global_cols = s[3], p.row_offset = s[4], p.col_offset = s[5], p.rows = s[6], p.cols = s[7];
      const size_t begin = s[8];
      ParameterSet& set = kind == 0 ? out->values : kind == 1 ? out->adam_m : out->adam_v;
      auto& full = set[s[0].get<std::string>()];
      full.resize(static_cast<size_t>(p.global_rows * p.global_cols));
      for (size_t e = 0; e < got[i].values.size(); ++e) full[p.global_index(begin + e)] = got[i].values[e];
    }
  }
}

// FP8 delayed scaling's amax histories (training.precision fp8, tensorwise recipe) are per rank:
// each rank's shard holds them as "NAME#fp8_amax_ROLE" (ROLE: input, weight, output_grad; the
// amaxes oldest first), NAME the weight of the linear layer; meta.json's "fp8_amax_history" says
// the save has them. Histories of weights not gathered at the save (ZeRO stage 3) are not saved.
constexpr const char* kFp8AmaxTag = "#fp8_amax_";

std::vector<ShardEntry> fp8_entries(ModelShard& model, const Fp8Emulation& fp8) {
  const std::map<const float*, std::string> names = model.value_names();
  std::vector<ShardEntry> out;
  for (const Fp8Emulation::History& h : fp8.histories())
    if (auto it = names.find(static_cast<const float*>(h.key)); it != names.end())
      out.push_back({it->second + kFp8AmaxTag + to_string(h.role), h.amaxes});
  return out;
}

json fp8_meta(const Fp8Emulation& fp8) {
  return {{"length", fp8.history_length()}, {"algorithm", fp8.most_recent() ? "most_recent" : "max"}};
}

// Restores the amax histories saved with a checkpoint (`saved`: this rank's entries); a checkpoint
// saved before ptdp kept them resumes with empty histories (the first use of each tensor scales by
// its own amax, as at the start of a run), and says so.
void restore_fp8(ModelShard& model, Fp8Emulation& fp8, const std::vector<ShardEntry>& saved, const std::string& dir,
                 const TrainOptions& options, int rank) {
  const std::string where = latest_checkpoint_dir(dir), path = where + "/meta.json";
  const json meta = read_checkpoint_meta(where);
  if (!meta.contains("fp8_amax_history")) {
    if (rank == 0 && options.progress)
      options.progress("warning: " + path + " has no FP8 amax history (saved by a ptdp that did not keep it): the first step "
                       "after resuming scales each tensor by its own amax, so it can differ slightly from an uninterrupted run");
    return;
  }
  if (meta["fp8_amax_history"] != fp8_meta(fp8))
    throw ConfigError("checkpoint", path + ": fp8_amax_history " + meta["fp8_amax_history"].dump() + " differs from this run's " +
                                        fp8_meta(fp8).dump());
  std::map<std::string, const float*> where_is;
  for (const auto& [at, name] : model.value_names()) where_is.emplace(name, at);
  for (const ShardEntry& e : saved) {
    const size_t tag = e.name.find(kFp8AmaxTag);
    const std::string name = e.name.substr(0, tag), role = e.name.substr(tag + std::strlen(kFp8AmaxTag));
    std::optional<Fp8Emulation::Role> r;
    for (auto k : {Fp8Emulation::Role::Input, Fp8Emulation::Role::Weight, Fp8Emulation::Role::OutputGrad})
      if (role == to_string(k)) r = k;
    if (!r || e.values.empty() || static_cast<int>(e.values.size()) > fp8.history_length())
      throw ConfigError("checkpoint", where + ": malformed FP8 amax history entry " + e.name);
    auto it = where_is.find(name);
    if (it == where_is.end()) {
      if (model.zero_stage() == 3) continue;  // not gathered now: its history starts afresh
      throw ConfigError("checkpoint", where + ": FP8 amax history of " + name + ", which this rank does not hold");
    }
    fp8.restore(it->second, *r, e.values);
  }
}

void save_checkpoint(Communicator& world, ModelShard& model, const RankCoordinates& c, const std::string& dir,
                     int64_t step, json identity, const json& state, const std::vector<ShardEntry>& rank_state) {
  // A fresh directory per save: nothing of a published checkpoint is ever written over.
  std::string save_id = world.rank() == 0 ? new_save_id() : std::string(16, '0');
  world.broadcast(save_id.data(), save_id.size(), 0);
  const std::string name = checkpoint_dir_name(step, save_id);
  agree(world, [&] {
    if (world.rank() != 0) return;
    make_directories((fs::path(dir) / name).string());
    mark_checkpoint_dir((fs::path(dir) / name).string());
    checkpoint_fault_point("after mkdir");
  });
  // Each rank writes its shard and reads it back; rank 0 collects their digests for the manifest.
  std::string shard_digest;
  agree(world, [&] {
    const ShardHeader h = shard_header(world, c, step, save_id, identity);
    std::vector<ShardEntry> entries = shard_entries(model);
    entries.insert(entries.end(), rank_state.begin(), rank_state.end());
    const std::string bytes = encode_shard(h.to_json(), entries);
    const std::string path = shard_path(dir, name, world.rank());
    write_file_atomically(path, bytes);
    if (read_file(path, bytes.size() + 1) != bytes) throw EnvironmentError("checkpoint: " + path + " reads back other bytes than were written");
    shard_digest = std::to_string(bytes.size()) + " " + file_digest(bytes);
  });
  const auto digests = world.gather_bytes(std::vector<char>(shard_digest.begin(), shard_digest.end()), 0);
  // Beside the shards, the whole model as Megatron names and shapes it (exec/io/megatron_state.hpp):
  // model.safetensors, a state dict PyTorch loads, and optimizer.safetensors, its Adam moments.
  FullStates full;
  agree(world, [&] { gather_states(world, model, true, &full); });
  // agree() above is the barrier: every rank's shard is complete before `latest` moves.
  agree(world, [&] {
    if (world.rank() != 0) return;
    const std::string step_dir = (fs::path(dir) / name).string();
    Manifest manifest;
    auto write_listed = [&](const std::string& file, const std::string& bytes) {
      const std::string path = step_dir + "/" + file;
      write_file_atomically(path, bytes);
      if (read_file(path, bytes.size() + 1) != bytes) throw EnvironmentError("checkpoint: " + path + " reads back other bytes than were written");
      manifest.files[file] = Manifest::Entry{bytes.size(), file_digest(bytes)};
    };
    for (size_t r = 0; r < digests.size(); ++r) {
      const std::string d(digests[r].begin(), digests[r].end());
      const size_t space = d.find(' ');
      manifest.files[shard_file_name(static_cast<int>(r))] = Manifest::Entry{std::stoull(d.substr(0, space)), d.substr(space + 1)};
    }
    const TransformerSpec& spec = model.spec();
    // The head layout the state dict's fused QKV columns follow: --hf and --init check it.
    std::map<std::string, std::string> md{{"format", "pt"},
                                          {"ptdp_step", std::to_string(step)},
                                          {"ptdp_num_attention_heads", std::to_string(spec.num_attention_heads)},
                                          {"ptdp_num_query_groups", std::to_string(spec.query_groups())},
                                          {"ptdp_hidden_size", std::to_string(spec.hidden_size)},
                                          {"ptdp_position_embedding", to_string(spec.position_kind())},
                                          {"ptdp_layout", "Megatron Core GPTModel, local layer spec (exec/io/megatron_state.hpp)"}};
    write_listed("model.safetensors", encode_safetensors(to_megatron_state(spec, model.padded_vocab(), full.values), md));
    const std::vector<NamedTensor> moments = megatron_moments(spec, model.padded_vocab(), full);
    write_listed("optimizer.safetensors", encode_safetensors(moments, md));
    const std::string fingerprint = fingerprint_of(identity.dump());  // what each shard records
    identity["format"] = 3;  // 3: with manifest.json
    identity["step"] = step;
    identity["save_id"] = save_id;
    identity["fingerprint"] = fingerprint;
  for (auto& [key, value] : state.items()) identity[key] = value;  // the run's state besides the tensors (loss scaler)
    identity["world_size"] = world.size();
    // How the states were split (informational: a run at another stage of the same layout
    // resumes from it, reassembling the shards).
    const ShardingOptions& z = model.sharding();
    identity["sharding"] = {{"zero_stage", z.zero_stage},
                            {"group_size", z.zero_stage > 0 ? z.group->size() : 1},
                            {"replicas", z.replicas != nullptr ? z.replicas->size() : 1},
                            {"offload", z.offload_params ? "optimizer_and_params" : z.offload_optimizer ? "optimizer" : "none"}};
    write_listed("meta.json", identity.dump(2) + "\n");
    write_file_atomically(step_dir + "/manifest.json", manifest.to_json());  // written last
    // Read back against the manifest before publishing: every file of the save, as on disk.
    const Manifest back = read_manifest(step_dir);
    for (const auto& [file, entry] : back.files) verify_file(manifest, step_dir, file, read_file(step_dir + "/" + file, entry.bytes + 1));
    if (back.files.size() != manifest.files.size()) throw EnvironmentError("checkpoint: " + step_dir + "/manifest.json reads back other entries");
    write_file_atomically((fs::path(dir) / "latest").string(), name + "\n");  // the commit point
    checkpoint_fault_point("after commit");
    if (read_latest(dir) != name) throw EnvironmentError("checkpoint: " + dir + "/latest reads back another step than was written");
    remove_other_checkpoints(dir, {name});  // rotation: only after a save that completed and read back
  });
}

// After resuming: the state dict and moments beside the shards (model.safetensors,
// optimizer.safetensors) must hold exactly what the shards just loaded hold — every value of
// every tensor compared (a full check, not a sample), so that an edited head count or a file of
// another save is refused before the run writes anything. Collective.
void cross_check_state_dict(Communicator& world, ModelShard& model, const std::string& dir) {
  FullStates full;
  agree(world, [&] { gather_states(world, model, true, &full); });
  agree(world, [&] {
    if (world.rank() != 0) return;
    const std::string where = latest_checkpoint_dir(dir);
    if (!fs::exists(where + "/model.safetensors")) return;  // a save of a ptdp before state dicts
    const std::optional<Manifest> manifest = checked_manifest(where);
    const TransformerSpec& spec = model.spec();
    const std::vector<NamedTensor> moments = megatron_moments(spec, model.padded_vocab(), full);
    const std::pair<const char*, std::vector<NamedTensor>> expected[] = {
        {"model.safetensors", to_megatron_state(spec, model.padded_vocab(), full.values)}, {"optimizer.safetensors", moments}};
    for (const auto& [file, mine] : expected) {
      const std::string path = where + "/" + file;
      uint64_t bound = uint64_t{1} << 20;
      for (const NamedTensor& t : mine) bound += t.values.size() * sizeof(float) + t.name.size() + 128;
      const std::string bytes = read_file(path, bound);
      if (manifest) verify_file(*manifest, where, file, bytes);
      std::vector<NamedTensor> saved;
      try {
        saved = decode_safetensors(bytes, path);
      } catch (const EnvironmentError& e) {
        throw ConfigError("checkpoint", e.what());
      }
      if (saved.size() != mine.size())
        throw ConfigError("checkpoint", path + " holds " + std::to_string(saved.size()) + " tensors, the shards " + std::to_string(mine.size()));
      std::map<std::string, const NamedTensor*> by_name;
      for (const NamedTensor& t : saved) by_name[t.name] = &t;
      for (const NamedTensor& t : mine) {
        const auto it = by_name.find(t.name);
        if (it == by_name.end()) throw ConfigError("checkpoint", path + " lacks " + t.name + ", which the shards hold");
        const NamedTensor& o = *it->second;
        if (o.shape != t.shape || o.values.size() != t.values.size())
          throw ConfigError("checkpoint", path + ": " + t.name + " has another shape than the shards give it");
        for (size_t i = 0; i < t.values.size(); ++i)
          if (std::memcmp(&o.values[i], &t.values[i], sizeof(float)) != 0)
            throw ConfigError("checkpoint", path + " disagrees with the shards at " + t.name + "[" + std::to_string(i) + "] (" +
                                                std::to_string(o.values[i]) + " against " + std::to_string(t.values[i]) +
                                                "): the checkpoint's files are not of one save");
      }
    }
  });
}

// Loads this rank's part of the latest checkpoint; returns its step. The parameters and moments
// come from this rank's shard file and, when it holds only a shard (a sharded save, or a save at
// another zero stage), from the files of the other data-parallel ranks of its (tp, pp).
int64_t load_checkpoint(Communicator& world, ModelShard& model, const RankCoordinates& c, const std::string& dir,
                        const json& identity, std::vector<ShardEntry>* fp8_state) {
  const std::string where = latest_checkpoint_dir(dir);
  const std::string name = fs::path(where).filename().string();
  const std::optional<Manifest> manifest = checked_manifest(where);
  const json meta = read_checkpoint_meta(where);
  check_identity(meta, identity, where);
  const std::string meta_path = where + "/meta.json";
  const int64_t step = json_get<int64_t>(json_at(meta, "step", meta_path), meta_path, "step");
  if (step < 0) throw ConfigError("checkpoint", meta_path + " has step " + std::to_string(step));
  const std::string save_id = json_get<std::string>(json_at(meta, "save_id", meta_path), meta_path, "save_id");
  // A shard's size is bounded by the model: refuse anything much larger before reading it.
  uint64_t expected = 1 << 16;
  std::map<std::string, Assembled> parts;
  for (auto& st : model.stages())
    for (const ParamInfo& p : st->params()) {
      expected += 3 * (p.count() * sizeof(float) + p.name.size() + 128);  // + its safetensors header entry
      for (const char* suffix : {"", "#adam_m", "#adam_v"})
        parts[p.name + suffix] = Assembled{std::vector<float>(p.count()), std::vector<char>(p.count(), 0), p.count()};
    }
  auto read_shard = [&](int dp) {
    RankCoordinates rc = c;
    rc.dp = dp;
    const int rank = rc.global_rank();
    const std::string path = shard_path(dir, name, rank);
    std::string shard_meta;
    std::vector<ShardEntry> entries;
    const std::string bytes = read_file(path, expected);
    try {
      entries = decode_shard(bytes, path, &shard_meta);
    } catch (const EnvironmentError& e) {
      throw ConfigError("checkpoint", e.what());  // a corrupt shard is a bad checkpoint: exit 2
    }
    const ShardHeader saved = ShardHeader::from_json(shard_meta, path);
    ShardHeader mine = shard_header(world, c, step, save_id, identity);
    // The shards carry the fingerprint of the identity they were saved with, which meta.json
    // records; check_identity has compared that identity with this run's key by key (an older
    // save lacks keys added since, whose former values it assumes), so the shards must carry
    // the save's fingerprint, not one of this run's identity.
    if (const auto f = meta.find("fingerprint"); f != meta.end() && f->is_string()) mine.fingerprint = f->get<std::string>();
    mine.global_rank = rank;
    mine.dp = dp;
    if (const std::string diff = shard_mismatch(saved, mine); !diff.empty())
      throw ConfigError("checkpoint", path + " does not belong here: " + diff);
    // The shard's own checks first (they say what is wrong: another rank, another save), then
    // the manifest's size and digest.
    if (manifest) verify_file(*manifest, where, shard_file_name(rank), bytes);
    add_entries(entries, path, parts);
    if (fp8_state != nullptr && dp == c.dp)
      for (ShardEntry& e : entries)
        if (e.name.find(kFp8AmaxTag) != std::string::npos) fp8_state->push_back(std::move(e));
  };
  read_shard(c.dp);
  auto complete = [&] {
    return std::all_of(parts.begin(), parts.end(), [](const auto& kv) { return kv.second.missing == 0; });
  };
  for (int dp = 0; dp < c.d && !complete(); ++dp)
    if (dp != c.dp) read_shard(dp);
  for (auto& st : model.stages())
    for (const ParamInfo& p : st->params()) {
      for (const char* suffix : {"", "#adam_m", "#adam_v"})
        if (parts[p.name + suffix].missing > 0)
          throw ConfigError("checkpoint", where + " does not match this rank's model shard (" + p.name + suffix +
                                              " missing)");
      const Assembled& v = parts[p.name];
      const Assembled& m = parts[p.name + "#adam_m"];
      const Assembled& a = parts[p.name + "#adam_v"];
      model.write_values(*st, p, 0, p.count(), v.values.data());
      if (model.zero_stage() == 0) model.write_moments(*st, p.offset, p.count(), m.values.data(), a.values.data());
    }
  if (model.zero_stage() > 0)
    for (auto& st : model.stages())
      for (const ShardSegment& g : st->segments()) {
        const std::string& n = st->params()[static_cast<size_t>(g.param)].name;
        model.write_moments(*st, g.shard_offset, g.count, parts[n + "#adam_m"].values.data() + g.begin,
                            parts[n + "#adam_v"].values.data() + g.begin);
      }
  return step;
}

}  // namespace ptdp::exec
