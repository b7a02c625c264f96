#include "exec/io/data.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "core/input_file.hpp"

namespace ptdp::exec {
namespace {

constexpr char kMagic[8] = {'P', 'T', 'D', 'P', 'T', 'O', 'K', '1'};
constexpr size_t kHeaderBytes = 32;

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t read_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void write_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

int32_t TokenCorpus::at(size_t i) const {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(raw_.data()) + i * static_cast<size_t>(width_);
  return static_cast<int32_t>(width_ == 1 ? p[0] : read_le(p, width_));
}

namespace {

constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};

// Megatron's dtype codes: bytes per element and whether it is signed (0: not a token type).
struct DType {
  int bytes = 0;
  bool is_signed = false;
  const char* name = "";
};
DType megatron_dtype(int code) {
  switch (code) {
    case 1: return {1, false, "uint8"};
    case 2: return {1, true, "int8"};
    case 3: return {2, true, "int16"};
    case 4: return {4, true, "int32"};
    case 5: return {8, true, "int64"};
    case 8: return {2, false, "uint16"};
    default: return {};
  }
}

bool is_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TokenCorpus TokenCorpus::from_megatron(const std::string& prefix) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  const std::string idx = read_input_file(idx_path, "Megatron index file", kMaxDataFileBytes);
  auto bad = [&](const std::string& what) { return ConfigError("data", idx_path + ": " + what); };
  size_t at = 0;
  auto need = [&](size_t n, const char* field) {
    if (idx.size() - at < n) throw bad(std::string("truncated at ") + field + " (offset " + std::to_string(at) + ", file " + std::to_string(idx.size()) + " bytes)");
  };
  auto take = [&](int bytes, const char* field) {
    need(static_cast<size_t>(bytes), field);
    const uint64_t v = read_le(reinterpret_cast<const unsigned char*>(idx.data()) + at, bytes);
    at += static_cast<size_t>(bytes);
    return v;
  };
  need(sizeof kMegatronMagic, "the magic");
  if (std::memcmp(idx.data(), kMegatronMagic, sizeof kMegatronMagic) != 0)
    throw bad("not a Megatron indexed dataset index (no MMIDIDX magic)");
  at = sizeof kMegatronMagic;
  if (const uint64_t version = take(8, "the version"); version != 1)
    throw bad("index version " + std::to_string(version) + " is not supported (expected 1)");
  const int code = static_cast<int>(take(1, "the dtype"));
  const DType dtype = megatron_dtype(code);
  if (dtype.bytes == 0) throw bad("dtype code " + std::to_string(code) + " is not an integer token type (expected 1-5 or 8)");
  const uint64_t sequences = take(8, "the sequence count");
  const uint64_t documents = take(8, "the document count");
  if (sequences > idx.size() / 12 || documents > idx.size() / 8)
    throw bad("sequence count " + std::to_string(sequences) + " / document count " + std::to_string(documents) +
              " do not fit a " + std::to_string(idx.size()) + "-byte index");
  need(sequences * 12 + documents * 8, "the sequence lengths, offsets and document indices");
  std::vector<uint64_t> lengths(sequences), offsets(sequences);
  for (auto& l : lengths) {
    const auto v = static_cast<int32_t>(static_cast<uint32_t>(take(4, "a sequence length")));
    if (v < 0) throw bad("sequence length " + std::to_string(v) + " is negative");
    l = static_cast<uint64_t>(v);
  }
  for (auto& o : offsets) o = take(8, "a sequence offset");
  uint64_t previous = 0;
  for (uint64_t d = 0; d < documents; ++d) {
    const uint64_t v = take(8, "a document index");
    if (v > sequences || v < previous) throw bad("document index " + std::to_string(d) + " is " + std::to_string(v) + ", not in order within 0 … " + std::to_string(sequences));
    previous = v;
  }

  TokenCorpus c;
  const std::string bin = read_input_file(bin_path, "Megatron data file", kMaxDataFileBytes);
  uint64_t total = 0;
  for (uint64_t i = 0; i < sequences; ++i) {
    const uint64_t bytes = lengths[i] * static_cast<uint64_t>(dtype.bytes);
    if (offsets[i] > bin.size() || bytes > bin.size() - offsets[i])
      throw bad("sequence " + std::to_string(i) + " (offset " + std::to_string(offsets[i]) + ", " + std::to_string(lengths[i]) +
                " tokens) runs past the end of " + bin_path + " (" + std::to_string(bin.size()) + " bytes)");
    total += lengths[i];
  }
  // Stored as uint32 ids (the width the sampler reads), in index order.
  c.raw_.reserve(total * 4);
  int64_t max_id = -1;
  for (uint64_t i = 0; i < sequences; ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(bin.data()) + offsets[i];
    for (uint64_t k = 0; k < lengths[i]; ++k, p += dtype.bytes) {
      uint64_t raw = read_le(p, dtype.bytes);
      int64_t id = static_cast<int64_t>(raw);
      if (dtype.is_signed && dtype.bytes < 8 && (raw >> (8 * dtype.bytes - 1)) != 0) id = -1;  // negative
      if (id < 0 || id >= (int64_t{1} << 31))
        throw ConfigError("data", bin_path + ": sequence " + std::to_string(i) + ", token " + std::to_string(k) +
                                      " is not a token id in [0, 2^31) (" + dtype.name + ")");
      max_id = std::max(max_id, id);
      write_le(c.raw_, static_cast<uint64_t>(id), 4);
    }
  }
  c.width_ = 4;
  c.count_ = static_cast<size_t>(total);
  c.vocab_size_ = std::max<int64_t>(1, max_id + 1);
  c.description_ = "Megatron indexed dataset " + prefix + " (" + std::to_string(documents > 0 ? documents - 1 : 0) + " documents, " +
                   std::to_string(sequences) + " sequences, " + std::to_string(total) + " " + dtype.name + " tokens, ids < " +
                   std::to_string(c.vocab_size_) + ")";
  c.fingerprint_ = fnv1a(c.raw_.data(), c.raw_.size()) ^ mix(4);
  return c;
}

void write_megatron_dataset(const std::string& prefix, const std::vector<std::vector<int32_t>>& documents, int width) {
  if (width != 2 && width != 4) throw ConfigError("data", "token width must be 2 or 4 bytes (got " + std::to_string(width) + ")");
  std::string bin, idx(kMegatronMagic, sizeof kMegatronMagic);
  write_le(idx, 1, 8);
  write_le(idx, width == 2 ? 8 : 4, 1);
  write_le(idx, documents.size(), 8);
  write_le(idx, documents.size() + 1, 8);
  for (const auto& d : documents) write_le(idx, d.size(), 4);
  for (const auto& d : documents) {
    write_le(idx, bin.size(), 8);
    for (int32_t t : d) {
      if (t < 0 || (width == 2 && t > 65535)) throw ConfigError("data", "token " + std::to_string(t) + " does not fit " + std::to_string(width) + " bytes");
      write_le(bin, static_cast<uint64_t>(t), width);
    }
  }
  for (size_t i = 0; i <= documents.size(); ++i) write_le(idx, i, 8);
  for (const auto& [path, text] : {std::pair{prefix + ".bin", &bin}, std::pair{prefix + ".idx", &idx}}) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) throw EnvironmentError("data: cannot create '" + path + "': " + std::strerror(errno));
    f.write(text->data(), static_cast<std::streamsize>(text->size()));
    f.close();
    if (!f) throw EnvironmentError("data: error writing '" + path + "'");
  }
}

TokenCorpus TokenCorpus::from_file(const std::string& path) {
  // A Megatron indexed dataset: PREFIX, PREFIX.bin or PREFIX.idx with both files present.
  for (const char* ext : {".idx", ".bin"})
    if (ends_with(path, ext) && is_file(path.substr(0, path.size() - 4) + ".idx") && is_file(path.substr(0, path.size() - 4) + ".bin"))
      return from_megatron(path.substr(0, path.size() - 4));
  if (!is_file(path) && is_file(path + ".idx") && is_file(path + ".bin")) return from_megatron(path);
  // A Megatron index without its data file: never train on the index's bytes as text.
  if (ends_with(path, ".idx") && !is_file(path.substr(0, path.size() - 4) + ".bin"))
    throw ConfigError("data", path + " is the index of a Megatron indexed dataset, but its data file " + path.substr(0, path.size() - 4) +
                                  ".bin is missing");
  TokenCorpus c;
  std::string bytes = read_input_file(path, "training data file", kMaxDataFileBytes);
  c.raw_ = std::move(bytes);
  const bool token_file = c.raw_.size() >= sizeof kMagic && std::memcmp(c.raw_.data(), kMagic, sizeof kMagic) == 0;
  if (!token_file) {
    c.width_ = 1;
    c.count_ = c.raw_.size();
    c.vocab_size_ = 256;
    c.description_ = "bytes of " + path + " (" + std::to_string(c.count_) + " tokens)";
  } else {
    if (c.raw_.size() < kHeaderBytes)
      throw ConfigError("data", path + ": truncated ptdp token file header (" + std::to_string(c.raw_.size()) + " bytes)");
    const unsigned char* h = reinterpret_cast<const unsigned char*>(c.raw_.data());
    const uint64_t width = read_le(h + 8, 4), vocab = read_le(h + 16, 8), count = read_le(h + 24, 8);
    if (width != 2 && width != 4)
      throw ConfigError("data", path + ": token width must be 2 or 4 bytes (got " + std::to_string(width) + ")");
    if (vocab == 0 || vocab > (uint64_t{1} << 31))
      throw ConfigError("data", path + ": vocabulary size out of range (got " + std::to_string(vocab) + ")");
    if (count > (c.raw_.size() - kHeaderBytes) / width || c.raw_.size() - kHeaderBytes != count * width)
      throw ConfigError("data", path + ": header says " + std::to_string(count) + " tokens of " + std::to_string(width) +
                                    " bytes but the file holds " + std::to_string(c.raw_.size() - kHeaderBytes) +
                                    " bytes of tokens");
    c.raw_.erase(c.raw_.begin(), c.raw_.begin() + kHeaderBytes);
    c.width_ = static_cast<int>(width);
    c.count_ = static_cast<size_t>(count);
    c.vocab_size_ = static_cast<int64_t>(vocab);
    for (size_t i = 0; i < c.count_; ++i)
      if (static_cast<uint64_t>(static_cast<uint32_t>(c.at(i))) >= vocab)
        throw ConfigError("data", path + ": token " + std::to_string(i) + " is " + std::to_string(c.at(i)) +
                                      ", not below the vocabulary size " + std::to_string(vocab));
    c.description_ = "tokens of " + path + " (" + std::to_string(c.count_) + " tokens, vocabulary " +
                     std::to_string(vocab) + ")";
  }
  c.fingerprint_ = fnv1a(c.raw_.data(), c.raw_.size()) ^ mix(static_cast<uint64_t>(c.width_));
  return c;
}

TokenCorpus TokenCorpus::synthetic(int64_t vocab_size, size_t num_tokens) {
  TokenCorpus c;
  const int64_t v = std::clamp<int64_t>(vocab_size, 2, 256);
  c.width_ = 1;
  c.count_ = num_tokens;
  c.vocab_size_ = v;
  c.raw_.resize(num_tokens);
  constexpr double kCumulative[4] = {0.6, 0.85, 0.95, 1.0};
  uint64_t state = 0x5eed;
  int64_t token = 0;
  for (size_t i = 0; i < num_tokens; ++i) {
    c.raw_[i] = static_cast<char>(token);
    state = mix(state);
    const double u = static_cast<double>(state >> 11) * 0x1.0p-53;
    int k = 0;
    while (k < 3 && u >= kCumulative[k]) ++k;
    token = static_cast<int64_t>(mix(static_cast<uint64_t>(token) * 4 + k + 0xabcdef) % static_cast<uint64_t>(v));
  }
  c.description_ = "built-in synthetic corpus (Markov chain over " + std::to_string(v) + " tokens, " +
                   std::to_string(num_tokens) + " tokens)";
  c.fingerprint_ = fnv1a(c.raw_.data(), c.raw_.size());
  return c;
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab_size, int width) {
  if (width != 2 && width != 4) throw ConfigError("data", "token width must be 2 or 4 bytes (got " + std::to_string(width) + ")");
  const uint64_t limit = width == 2 ? 65536 : (uint64_t{1} << 32);
  if (vocab_size <= 0 || static_cast<uint64_t>(vocab_size) > limit)
    throw ConfigError("data", "vocabulary size " + std::to_string(vocab_size) + " does not fit " + std::to_string(width) +
                                  "-byte tokens");
  std::string out(kMagic, sizeof kMagic);
  write_le(out, static_cast<uint64_t>(width), 4);
  write_le(out, 0, 4);
  write_le(out, static_cast<uint64_t>(vocab_size), 8);
  write_le(out, tokens.size(), 8);
  for (int32_t t : tokens) {
    if (t < 0 || t >= vocab_size)
      throw ConfigError("data", "token " + std::to_string(t) + " outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
    write_le(out, static_cast<uint64_t>(t), width);
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw EnvironmentError("data: cannot create '" + path + "': " + std::strerror(errno));
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.close();
  if (!f) throw EnvironmentError("data: error writing '" + path + "'");
}

BatchSampler::BatchSampler(const TokenCorpus& corpus, int seq, uint64_t seed) : corpus_(corpus), seq_(seq), seed_(seed) {
  if (corpus.size() < static_cast<size_t>(seq) + 1)
    throw ConfigError("data", corpus.description() + " is too short for model.seq_length " + std::to_string(seq) +
                                  ": needs at least " + std::to_string(seq + 1) + " tokens");
}

void BatchSampler::sample(int64_t step, int64_t index, int32_t* inputs, int32_t* targets) const {
  const uint64_t windows = corpus_.size() - static_cast<size_t>(seq_);  // start positions with a next token
  const uint64_t h = mix(mix(seed_ ^ 0xda7a5eedULL) ^ mix(static_cast<uint64_t>(step) * 0x10001ULL + 7) ^
                         mix(static_cast<uint64_t>(index) + 0x51ULL));
  const size_t start = static_cast<size_t>(h % windows);
  for (int i = 0; i < seq_; ++i) {
    inputs[i] = corpus_.at(start + i);
    targets[i] = corpus_.at(start + i + 1);
  }
}

}  // namespace ptdp::exec
