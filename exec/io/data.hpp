// Training data: a token corpus and a deterministic sampler of (input, target) sequences.
//
// Files (`--data FILE`):
//   * a ptdp token file, recognised by its 8-byte magic "PTDPTOK1":
//       offset  0  char[8]   "PTDPTOK1"
//       offset  8  uint32    bytes per token: 2 (uint16) or 4 (uint32)
//       offset 12  uint32    reserved, 0
//       offset 16  uint64    vocabulary size V (every token id < V)
//       offset 24  uint64    number of tokens N
//       offset 32  N tokens, little-endian
//     (write_token_file() writes one);
//   * a Megatron-LM indexed dataset, as its tools/preprocess_data.py writes it: PREFIX.bin (the
//     token ids of every sequence, back to back) and PREFIX.idx ("MMIDIDX\0\0", uint64 version 1,
//     uint8 dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16), uint64 sequence
//     count S, uint64 document count D, int32 lengths[S], int64 byte offsets[S] into .bin,
//     int64 document indices[D]); `--data` names PREFIX, PREFIX.bin or PREFIX.idx. The sequences
//     are read in index order and concatenated (as Megatron's GPT dataset samples across
//     documents); the vocabulary is the largest id + 1 (the .idx does not record it);
//   * any other file: its bytes are the tokens (vocabulary 256).
// Without a file, a built-in synthetic corpus with learnable structure is used.
//
// Sample i of iteration k is the window starting at hash(seed, k, i) mod (N − s): the global
// batch of an iteration does not depend on (t, p, d), and data-parallel rank r takes samples
// [r·B/d, (r+1)·B/d). Resuming at iteration k continues exactly where the run left off.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ptdp::exec {

class TokenCorpus {
 public:
  /// Reads a token file, a Megatron indexed dataset or a byte file. Throws EnvironmentError when
  /// the file cannot be read, ConfigError (key "data") when a token file or index is malformed.
  static TokenCorpus from_file(const std::string& path);
  /// Reads a Megatron indexed dataset (PREFIX.bin + PREFIX.idx). Errors as from_file, naming
  /// the file and the field.
  static TokenCorpus from_megatron(const std::string& prefix);
  /// The built-in corpus: a sparse order-1 Markov chain over min(vocab_size, 256) tokens (four
  /// successors per token with probabilities 0.6, 0.25, 0.1, 0.05: entropy ≈ 1.03 nats/token).
  static TokenCorpus synthetic(int64_t vocab_size, size_t num_tokens = size_t{1} << 20);

  int64_t vocab_size() const { return vocab_size_; }
  size_t size() const { return count_; }
  int32_t at(size_t i) const;
  /// Human-readable origin, e.g. "bytes of /usr/share/common-licenses/GPL-3 (35149 tokens)".
  const std::string& description() const { return description_; }
  /// Content hash (identifies the data in checkpoints).
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  std::string raw_;  // bytes or token ids, little-endian
  int width_ = 1;  // bytes per token
  size_t count_ = 0;
  int64_t vocab_size_ = 256;
  std::string description_;
  uint64_t fingerprint_ = 0;
};

/// Writes a Megatron indexed dataset PREFIX.bin / PREFIX.idx of `documents` (one sequence per
/// document) with dtype uint16 (width 2) or int32 (width 4), the layout preprocess_data.py writes.
void write_megatron_dataset(const std::string& prefix, const std::vector<std::vector<int32_t>>& documents, int width);

/// Writes a ptdp token file (width 2 or 4 bytes). Throws EnvironmentError on I/O failure and
/// ConfigError when a token does not fit the width or the vocabulary.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size, int width);

class BatchSampler {
 public:
  /// Throws ConfigError (key "data") when the corpus is shorter than seq + 1 tokens.
  BatchSampler(const TokenCorpus& corpus, int seq, uint64_t seed);
  /// Sample `index` of iteration `step`: inputs[0..seq) and the next tokens targets[0..seq).
  void sample(int64_t step, int64_t index, int32_t* inputs, int32_t* targets) const;

 private:
  const TokenCorpus& corpus_;
  int seq_;
  uint64_t seed_;
};

}  // namespace ptdp::exec
