// Checkpoint files. A checkpoint directory holds
//   DIR/latest                   the name of the newest complete checkpoint ("step-00000012-9f3a…")
//   DIR/step-00000012-9f3a…/meta.json   step, save id, seed, parallel layout, model sizes, data
//                                        fingerprint, scenario fingerprint
//   DIR/step-00000012-9f3a…/rank-00003.safetensors   one shard per global rank, a safetensors
//                                        file (readable by the `safetensors` library): the
//                                        parameters and Adam moments ("NAME", "NAME#adam_m",
//                                        "NAME#adam_v", F32), FP8 runs' amax histories
//                                        ("NAME#fp8_amax_ROLE", oldest first; meta.json's
//                                        "fp8_amax_history" marks saves that have them) and, in
//                                        its __metadata__, the header
//                                        (rank, tp/pp/dp coordinates, step, save id, scenario
//                                        fingerprint) and a checksum; what resuming reads
//   DIR/step-…/model.safetensors        the whole model as Megatron-LM names and shapes it
//                                        (exec/io/megatron_state.hpp): a state dict that
//                                        `safetensors.torch.load_file` gives PyTorch, for any t/p/d
//                                        and ZeRO stage of the run that saved it
//   DIR/step-…/optimizer.safetensors    its Adam moments, same names + ".exp_avg" / ".exp_avg_sq"
//   DIR/step-…/manifest.json            written last: the size and digest (FNV-1a 64) of every other
//                                        file of the save (meta.json, the state dicts, each shard)
// Each save goes to a directory that did not exist before (the step and a fresh save id), every
// file is written to a temporary name, fsync'ed and renamed, and only after a barrier (every
// rank's shard complete) does rank 0 write meta.json, then manifest.json, and replace `latest`
// (the commit point). A kill at any point leaves `latest` on the previous complete checkpoint.
// Nothing is removed when a run starts or resumes, whatever it finds: only a save that completed
// and read back its files against its manifest removes ptdp's older step directories and its
// temporaries (rotation, remove_other_checkpoints). Reading a checkpoint (resume, --init, `ptdp
// checkpoint`, --hf) checks every file it reads against the manifest.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "exec/io/megatron_state.hpp"

namespace ptdp::exec {

/// One named array of a shard (a parameter, or its Adam moments: "NAME#adam_m", "NAME#adam_v").
struct ShardEntry {
  std::string name;
  std::vector<float> values;
};

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync of the directory).
/// Throws EnvironmentError with the system's message on failure (the old file stays intact).
void write_file_atomically(const std::string& path, const std::string& bytes);

/// Test hook: fault injection into checkpoint writes, from the environment variable
/// PTDP_CHECKPOINT_FAULT = "kill:N[@R]" (the process SIGKILLs itself at its N-th fault point:
/// before or after each write, fsync, rename or directory step of a save) or "enospc:N[@R]"
/// (its N-th write fails with ENOSPC, as on a full disk); "@R" limits it to world rank R.
/// Call once per process with the world rank; without the variable nothing happens.
void configure_checkpoint_faults(int world_rank);
/// A fault point (see configure_checkpoint_faults); `what` is for debugging only.
void checkpoint_fault_point(const char* what);

/// What each shard records about where it belongs; compared on resume.
struct ShardHeader {
  int global_rank = -1;
  int tp = -1, pp = -1, dp = -1;
  int64_t step = -1;
  std::string save_id;       // the save (unique per saved step) the shard was written by
  std::string fingerprint;   // the run's identity: scenario, layout, seed, data
  std::string to_json() const;
  /// Throws ConfigError naming `source` when a field is missing or malformed.
  static ShardHeader from_json(const std::string& text, const std::string& source);
};
/// "" when `saved` matches `expected`, else what differs ("rank 3 (tp 1, pp 1, dp 0), this is rank 1 …").
std::string shard_mismatch(const ShardHeader& saved, const ShardHeader& expected);

/// "step-00000012-<save_id>": a new directory name for a save.
std::string checkpoint_dir_name(int64_t step, const std::string& save_id);
/// A fresh random save id (16 hex digits).
std::string new_save_id();

/// Records that ptdp created the step directory `step_dir` (its owner file), right after creating it.
void mark_checkpoint_dir(const std::string& step_dir);
/// A short hex digest of `text` (FNV-1a 64): the run fingerprint of an identity JSON.
std::string fingerprint_of(const std::string& text);

/// True when `dir` holds a published checkpoint (a `latest` file).
bool has_checkpoint(const std::string& dir);

/// Creates `path` and missing parents; EnvironmentError when impossible.
void make_directories(const std::string& path);

/// "rank-00003.safetensors": the shard file of a global rank in a step directory.
std::string shard_file_name(int rank);

/// "step-00000012".
std::string checkpoint_step_name(int64_t step);

/// Serialises a shard as safetensors: the entries as 1-D F32 tensors, the JSON description of the
/// rank (`meta_json`) and a checksum in the header's __metadata__ ("ptdp_shard", "ptdp_checksum").
std::string encode_shard(const std::string& meta_json, const std::vector<ShardEntry>& entries);
/// Parses a shard; throws EnvironmentError naming `source` when it is truncated or corrupt.
std::vector<ShardEntry> decode_shard(const std::string& bytes, const std::string& source, std::string* meta_json);

/// A safetensors file of `tensors` (F32, with their shapes, in order) and `metadata` (string
/// values) in its header's __metadata__: what `safetensors.torch.load_file` reads.
std::string encode_safetensors(const std::vector<NamedTensor>& tensors, const std::map<std::string, std::string>& metadata);
/// Parses a safetensors file (F32, F16 and BF16 tensors of any shape, returned as F32 in the
/// file's order); `metadata` (optional) receives the string values of __metadata__. Throws
/// EnvironmentError naming `source` (and the tensor) when it is truncated or malformed.
std::vector<NamedTensor> decode_safetensors(const std::string& bytes, const std::string& source,
                                            std::map<std::string, std::string>* metadata = nullptr);

/// Reads a whole checkpoint file of at most `max_bytes` (read_input_file: a regular file,
/// ConfigError when missing or too large).
std::string read_file(const std::string& path, uint64_t max_bytes = uint64_t{1} << 20);

/// The step directory `latest` names; EnvironmentError (no checkpoint) when it is missing or malformed.
std::string read_latest(const std::string& dir);

/// The step directory `latest` names in `dir` (its path); ConfigError when `latest` is missing or
/// malformed (read_latest) or names no directory of `dir`.
std::string latest_checkpoint_dir(const std::string& dir);
/// The meta.json of a step directory, parsed; ConfigError naming it when missing, corrupt or not
/// a JSON object.
nlohmann::json read_checkpoint_meta(const std::string& step_dir);

/// Rotation, after a new checkpoint was published and read back: removes ptdp's other step
/// directories (those it proves it created: its owner file, or a ptdp meta.json), whole or left
/// by a killed save, and `latest.tmp.<pid>` files holding a step name; never a user's own step-*
/// directories or files, never a directory in `keep` (best effort, never throws). The only
/// place ptdp removes anything from a checkpoint directory.
void remove_other_checkpoints(const std::string& dir, const std::vector<std::string>& keep);

/// "fnv1a64:<16 hex digits>" over `bytes`: the digest manifest.json records per file (detects
/// any change of a single byte and almost all others; not a defence against deliberate edits).
std::string file_digest(const std::string& bytes);

/// manifest.json of a save: file name → size and digest.
struct Manifest {
  struct Entry {
    uint64_t bytes = 0;
    std::string digest;
  };
  std::map<std::string, Entry> files;
  std::string to_json() const;
};
/// The manifest.json of a step directory; ConfigError naming the file (and the key) when it is
/// missing, malformed, or lists a file name with a '/'.
Manifest read_manifest(const std::string& step_dir);
/// True when `step_dir` has a manifest.json (saves of ptdp before manifests have none).
bool has_manifest(const std::string& step_dir);
/// Checks `bytes`, read from `step_dir`/`file`, against `manifest`: ConfigError naming the file
/// when the manifest does not list it, or its size or digest differs.
void verify_file(const Manifest& manifest, const std::string& step_dir, const std::string& file, const std::string& bytes);
}  // namespace ptdp::exec
