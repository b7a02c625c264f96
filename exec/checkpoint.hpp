// Checkpoint files. A checkpoint directory holds
//   DIR/latest                   the name of the newest complete checkpoint ("step-00000012")
//   DIR/step-00000012/meta.json  step, seed, parallel layout, model sizes, data fingerprint
//   DIR/step-00000012/rank-00003.bin   one shard per global rank: parameters, Adam moments
// Every file is written to a temporary name, fsync'ed and renamed, and `latest` is replaced only
// after every shard and meta.json are in place: a crash or a failed save leaves the previous
// checkpoint untouched and `latest` pointing at it. Shards carry a checksum.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptdp::exec {

/// One named array of a shard (a parameter, or its Adam moments: "NAME#adam_m", "NAME#adam_v").
struct ShardEntry {
  std::string name;
  std::vector<float> values;
};

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename, fsync of the directory).
/// Throws EnvironmentError with the system's message on failure (the old file stays intact).
void write_file_atomically(const std::string& path, const std::string& bytes);

/// Creates `path` and missing parents; EnvironmentError when impossible.
void make_directories(const std::string& path);

/// "step-00000012".
std::string checkpoint_step_name(int64_t step);

/// Serialises a shard with a header, a JSON description of the rank (`meta_json`) and a checksum.
std::string encode_shard(const std::string& meta_json, const std::vector<ShardEntry>& entries);
/// Parses a shard; throws EnvironmentError naming `source` when it is truncated or corrupt.
std::vector<ShardEntry> decode_shard(const std::string& bytes, const std::string& source, std::string* meta_json);

/// Reads a whole file; EnvironmentError when it cannot.
std::string read_file(const std::string& path);

/// The step directory `latest` names; EnvironmentError (no checkpoint) when it is missing or malformed.
std::string read_latest(const std::string& dir);

/// Removes step directories of `dir` other than the `keep` names (best effort, never throws).
void remove_other_checkpoints(const std::string& dir, const std::vector<std::string>& keep);

}  // namespace ptdp::exec
