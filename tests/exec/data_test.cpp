// Training data and checkpoint files: formats, errors users meet, determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/error.hpp"
#include "exec/io/checkpoint.hpp"
#include "exec/io/data.hpp"
#include "tests/support/temp_dir.hpp"

namespace ptdp::exec {
namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  const fs::path dir = ptdp::testing::scratch_dir("ptdp-data-test");
  return (dir / name).string();
}

TEST(TokenCorpus, AnyFileIsReadAsBytes) {
  const std::string path = temp_path("bytes.txt");
  std::ofstream(path) << "hello";
  const TokenCorpus c = TokenCorpus::from_file(path);
  EXPECT_EQ(c.vocab_size(), 256);
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c.at(0), 'h');
  EXPECT_EQ(c.at(4), 'o');
  EXPECT_NE(c.description().find("bytes of"), std::string::npos);
}

TEST(TokenCorpus, TokenFilesRoundTripInBothWidths) {
  for (int width : {2, 4}) {
    const std::string path = temp_path("tokens" + std::to_string(width) + ".bin");
    const std::vector<int32_t> tokens = {0, 1, 299, 70000 % 300, 42};
    write_token_file(path, tokens, 300, width);
    EXPECT_EQ(fs::file_size(path), 32u + tokens.size() * width);
    const TokenCorpus c = TokenCorpus::from_file(path);
    EXPECT_EQ(c.vocab_size(), 300);
    ASSERT_EQ(c.size(), tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(c.at(i), tokens[i]);
  }
  const std::string big = temp_path("big.bin");
  write_token_file(big, {100000, 5}, 200000, 4);
  EXPECT_EQ(TokenCorpus::from_file(big).at(0), 100000);
  EXPECT_THROW(write_token_file(big, {70000}, 70001, 2), ConfigError);  // does not fit 16 bits
}

TEST(TokenCorpus, MalformedTokenFilesAreConfigErrorsNamingTheFile) {
  const std::string path = temp_path("bad.bin");
  write_token_file(path, {1, 2, 3, 4}, 10, 2);
  fs::resize_file(path, fs::file_size(path) - 1);  // truncated
  try {
    TokenCorpus::from_file(path);
    FAIL() << "truncated token file accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "data");
    EXPECT_NE(e.message().find(path), std::string::npos);
    EXPECT_NE(e.message().find("header says 4 tokens"), std::string::npos) << e.what();
  }
  write_token_file(path, {1, 2, 3, 4}, 10, 2);
  {  // a token beyond the declared vocabulary
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(32 + 2 * 2);
    const char big[2] = {char(50), 0};
    f.write(big, 2);
  }
  EXPECT_THROW(TokenCorpus::from_file(path), ConfigError);
  EXPECT_THROW(TokenCorpus::from_file(temp_path("missing.bin")), ConfigError);  // a wrong path is bad input
}

// Megatron-LM's indexed dataset (tools/preprocess_data.py): PREFIX.bin + PREFIX.idx, read by
// prefix or by either file name, sequences concatenated in index order.
TEST(TokenCorpus, MegatronIndexedDatasetInBothWidths) {
  const std::vector<std::vector<int32_t>> docs = {{5, 6, 7, 0}, {}, {65535, 1, 0}, {9, 0}};
  for (int width : {2, 4}) {
    const std::string prefix = temp_path("megatron-" + std::to_string(width) + "_text_document");
    write_megatron_dataset(prefix, docs, width);
    EXPECT_EQ(fs::file_size(prefix + ".bin"), 9u * width);
    EXPECT_EQ(fs::file_size(prefix + ".idx"), 9u + 8 + 1 + 8 + 8 + 4 * 12 + 5 * 8);
    for (const std::string& name : {prefix, prefix + ".bin", prefix + ".idx"}) {
      const TokenCorpus c = TokenCorpus::from_file(name);
      ASSERT_EQ(c.size(), 9u) << name;
      const std::vector<int32_t> want = {5, 6, 7, 0, 65535, 1, 0, 9, 0};
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(c.at(i), want[i]) << name << " token " << i;
      EXPECT_EQ(c.vocab_size(), 65536);  // the largest id + 1
      EXPECT_NE(c.description().find("Megatron indexed dataset"), std::string::npos) << c.description();
      EXPECT_NE(c.description().find("4 documents"), std::string::npos) << c.description();
    }
  }
}

TEST(TokenCorpus, MalformedMegatronIndexIsAConfigErrorNamingTheFileAndField) {
  const std::string prefix = temp_path("bad_text_document");
  write_megatron_dataset(prefix, {{1, 2, 3}, {4, 5}}, 2);
  const std::string idx = [&] {
    std::ifstream in(prefix + ".idx", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto expect_error = [&](const std::string& index, const std::string& bin_tail, const std::string& fragment) {
    std::ofstream(prefix + ".idx", std::ios::binary | std::ios::trunc) << index;
    if (!bin_tail.empty()) std::ofstream(prefix + ".bin", std::ios::binary | std::ios::trunc) << bin_tail;
    try {
      (void)TokenCorpus::from_file(prefix);
      ADD_FAILURE() << "accepted: " << fragment;
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.key_path(), "data");
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  std::string wrong_magic = idx;
  wrong_magic[0] = 'X';
  expect_error(wrong_magic, "", "bad_text_document.idx: not a Megatron indexed dataset index");
  std::string version = idx;
  version[9] = 2;
  expect_error(version, "", "index version 2 is not supported");
  std::string dtype = idx;
  dtype[17] = 6;  // float64
  expect_error(dtype, "", "dtype code 6 is not an integer token type");
  expect_error(idx.substr(0, 40), "", "truncated at the sequence lengths");
  std::string offset = idx;
  offset[9 + 8 + 1 + 8 + 8 + 8 + 8] = 100;  // second sequence's byte offset past the end
  expect_error(offset, "", "sequence 1 (offset 100, 2 tokens) runs past the end");
  expect_error(idx, std::string(4, '\0'), "runs past the end");  // .bin shorter than the index says
}

TEST(TokenCorpus, SyntheticCorpusIsDeterministicAndLearnable) {
  const TokenCorpus a = TokenCorpus::synthetic(256, 100000), b = TokenCorpus::synthetic(256, 100000);
  ASSERT_EQ(a.size(), 100000u);
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  // Structure: the empirical next-token entropy is far below ln 256 (four successors per token).
  std::map<int, std::map<int, int>> next;
  std::set<int> seen;
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    next[a.at(i)][a.at(i + 1)]++;
    seen.insert(a.at(i));
  }
  double entropy = 0;
  for (auto& [tok, succ] : next) {
    double n = 0;
    for (auto& [s, k] : succ) n += k;
    for (auto& [s, k] : succ) entropy -= k / (a.size() - 1.0) * std::log(k / n);
  }
  EXPECT_LT(entropy, 1.2);
  EXPECT_GT(entropy, 0.8);
  EXPECT_GT(seen.size(), 50u);  // not a short cycle
  EXPECT_LE(TokenCorpus::synthetic(50, 1000).vocab_size(), 50);
}

TEST(BatchSampler, SamplesAreAPureFunctionOfSeedIterationAndIndex) {
  const TokenCorpus c = TokenCorpus::synthetic(256, 5000);
  const BatchSampler s(c, 16, 3), same(c, 16, 3), other(c, 16, 4);
  std::vector<int32_t> in1(16), t1(16), in2(16), t2(16);
  s.sample(5, 2, in1.data(), t1.data());
  same.sample(5, 2, in2.data(), t2.data());
  EXPECT_EQ(in1, in2);
  EXPECT_EQ(t1, t2);
  for (int i = 0; i + 1 < 16; ++i) EXPECT_EQ(t1[i], in1[i + 1]);  // targets are the next tokens
  other.sample(5, 2, in2.data(), t2.data());
  EXPECT_NE(in1, in2);
  s.sample(6, 2, in2.data(), t2.data());
  EXPECT_NE(in1, in2);
  EXPECT_THROW(BatchSampler(TokenCorpus::synthetic(256, 16), 16, 1), ConfigError);  // needs s + 1 tokens
}

TEST(Checkpoint, ShardsRoundTripAndCorruptionIsDetected) {
  const std::vector<ShardEntry> entries = {{"a", {1.0f, -2.5f}}, {"b#adam_m", {}}, {"c", {3.0f}}};
  const std::string bytes = encode_shard("{\"rank\":1}", entries);
  std::string meta;
  const auto back = decode_shard(bytes, "x.bin", &meta);
  EXPECT_EQ(meta, "{\"rank\":1}");
  ASSERT_EQ(back.size(), 3u);
  EXPECT_EQ(back[0].values, entries[0].values);
  EXPECT_EQ(back[2].name, "c");
  std::string flipped = bytes;
  flipped[bytes.size() - 2] ^= 1;
  EXPECT_THROW(decode_shard(flipped, "x.bin", nullptr), EnvironmentError);
  EXPECT_THROW(decode_shard(bytes.substr(0, bytes.size() - 3), "x.bin", nullptr), EnvironmentError);
  EXPECT_THROW(decode_shard("garbage", "x.bin", nullptr), EnvironmentError);
}

TEST(Checkpoint, AtomicWriteReplacesWholeFilesOnlyAndFailuresKeepTheOldOne) {
  const std::string path = temp_path("atomic.txt");
  write_file_atomically(path, "first");
  write_file_atomically(path, "second");
  EXPECT_EQ(read_file(path), "second");
  for (const auto& e : fs::directory_iterator(fs::path(path).parent_path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "temporary file left behind";
  // Writing into a missing directory fails and leaves nothing behind.
  EXPECT_THROW(write_file_atomically(temp_path("no-such-dir") + "/x/y", "z"), EnvironmentError);
  EXPECT_EQ(checkpoint_step_name(12), "step-00000012");
}

}  // namespace
}  // namespace ptdp::exec
