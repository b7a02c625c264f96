// Nothing saved is ever deleted by a failed run (issue 25): a resume that fails on a missing,
// empty, CRLF-terminated, misnamed or directory `latest`, and a fresh run into a directory holding
// a user's own step-* directories and *.tmp.* files, leave every byte the user had; the previous
// good checkpoint still resumes once `latest` is put back. Runs `ptdp train` as a user does.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "run_ptdp.hpp"

namespace {
using namespace ptdp_cli_test;

class CheckpointSafety : public Cli {
 protected:
  std::vector<std::string> train_args(const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {"train",        std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml",
                                  "--set",        "parallel.tensor=1",
                                  "--set",        "parallel.pipeline=1",
                                  "--set",        "cluster.gpus=1",
                                  "--checkpoint", file("ck")};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // Every regular file under `root` (relative path → bytes), and the directories (→ "<dir>").
  std::map<std::string, std::string> tree(const std::string& root) const {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      const std::string rel = fs::relative(e.path(), root).string();
      if (e.is_directory()) out[rel] = "<dir>";
      else if (e.is_regular_file()) out[rel] = slurp(e.path().string());
    }
    return out;
  }
  // What a user keeps in the checkpoint folder besides ptdp's files.
  void add_user_files() const {
    fs::create_directories(file("ck/step-99999999"));
    write("ck/step-99999999/my-notes.txt", "the user's own step directory\n");
    fs::create_directories(file("ck/step-00000001-mine"));
    write("ck/step-00000001-mine/weights.bin", std::string(1000, 'w'));
    write("ck/results.tmp.csv", "a,b\n1,2\n");
    fs::create_directories(file("ck/run.tmp.backup"));
    write("ck/run.tmp.backup/keep.txt", "keep me\n");
    write("ck/latest.tmp.draft", "my own draft\n");
  }
  // Every user file above is still there, byte for byte.
  void expect_user_files(const std::map<std::string, std::string>& before) const {
    const auto now = tree(file("ck"));
    for (const auto& [path, bytes] : before) {
      if (path.rfind("step-99999999", 0) == 0 || path.rfind("step-00000001-mine", 0) == 0 || path.find(".tmp.") != std::string::npos) {
        auto it = now.find(path);
        ASSERT_NE(it, now.end()) << path << " was deleted";
        EXPECT_EQ(it->second, bytes) << path << " changed";
      }
    }
  }
};

TEST_F(CheckpointSafety, FreshRunAndItsRotationKeepTheUsersOwnStepDirectoriesAndTemporaries) {
  add_user_files();
  const auto before = tree(file("ck"));
  // Saves at steps 2 and 4: the second save removes the first (ptdp's own), never the user's.
  const Outcome r = ptdp(train_args({"--steps", "4", "--save-every", "2"}));
  ASSERT_EQ(r.status, 0) << r.err;
  expect_user_files(before);
  const std::string latest = slurp(file("ck/latest"));
  EXPECT_EQ(latest.rfind("step-00000004-", 0), 0u) << latest;
  int ptdp_dirs = 0;
  for (const auto& e : fs::directory_iterator(file("ck")))
    if (fs::exists(e.path() / ".ptdp-checkpoint")) ++ptdp_dirs;
  EXPECT_EQ(ptdp_dirs, 1) << "the rotation keeps ptdp's latest checkpoint only";
}

TEST_F(CheckpointSafety, AFailedResumeDeletesNothingAndTheGoodCheckpointStillResumes) {
  // A good checkpoint at step 2, plus the user's files.
  ASSERT_EQ(ptdp(train_args({"--steps", "2", "--save-every", "2"})).status, 0);
  add_user_files();
  // A save that was killed before its meta.json (ptdp's own, never published): the only thing a
  // later run may remove.
  const std::string good = slurp(file("ck/latest"));
  const std::string good_name = good.substr(0, good.find('\n'));
  const auto intact = tree(file("ck"));

  struct Corruption {
    const char* what;
    std::function<void()> apply;
  };
  const std::vector<Corruption> corruptions = {
      {"missing", [&] { fs::remove(file("ck/latest")); }},
      {"empty", [&] { write("ck/latest", ""); }},
      {"misnamed", [&] { write("ck/latest", "step-00000099-0000000000000000\n"); }},
      {"garbage", [&] { write("ck/latest", "../../etc\n"); }},
      {"a directory", [&] {
         fs::remove(file("ck/latest"));
         fs::create_directories(file("ck/latest"));
       }},
  };
  for (const auto& c : corruptions) {
    SCOPED_TRACE(c.what);
    c.apply();
    auto before = tree(file("ck"));
    const Outcome r = ptdp(train_args({"--steps", "4", "--save-every", "2", "--resume"}));
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_NE(r.err.find("latest"), std::string::npos) << r.err;
    // Not one byte changed: every file (ptdp's checkpoint and the user's) is still there.
    EXPECT_EQ(tree(file("ck")), before);
    // Put `latest` back: the previous good checkpoint resumes.
    fs::remove_all(file("ck/latest"));
    write("ck/latest", good);
    EXPECT_EQ(tree(file("ck")), intact);
  }
  // CRLF, as an editor on Windows saves it: still the good checkpoint, it resumes.
  write("ck/latest", good_name + "\r\n");
  const Outcome crlf = ptdp(train_args({"--steps", "4", "--save-every", "2", "--resume"}));
  ASSERT_EQ(crlf.status, 0) << crlf.err;
  expect_user_files(intact);
}

TEST_F(CheckpointSafety, OnlyPtdpsOwnUnpublishedSaveIsCleanedUp) {
  ASSERT_EQ(ptdp(train_args({"--steps", "2", "--save-every", "2"})).status, 0);
  add_user_files();
  // What a save killed before its meta.json leaves: ptdp's step directory with its owner file.
  fs::create_directories(file("ck/step-00000004-00000000deadbeef"));
  write("ck/step-00000004-00000000deadbeef/.ptdp-checkpoint", "ptdp checkpoint step-00000004-00000000deadbeef\n");
  write("ck/step-00000004-00000000deadbeef/rank-00000.safetensors.tmp.123", "partial");
  write("ck/latest.tmp.4242", "step-00000004-00000000deadbeef\n");
  const auto before = tree(file("ck"));
  const Outcome r = ptdp(train_args({"--steps", "4", "--save-every", "2", "--resume"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_FALSE(fs::exists(file("ck/step-00000004-00000000deadbeef"))) << "ptdp's killed save is removed";
  EXPECT_FALSE(fs::exists(file("ck/latest.tmp.4242"))) << "ptdp's own latest temporary is removed";
  auto users = before;
  for (auto it = users.begin(); it != users.end();)
    it = it->first == "latest.tmp.4242" || it->first.rfind("step-00000004-00000000deadbeef", 0) == 0 ? users.erase(it) : std::next(it);
  expect_user_files(users);
}

}  // namespace

namespace {
using namespace ptdp_cli_test;

// `ptdp checkpoint DIR` reads back every file of the latest save and says what it belongs to; a
// corrupt or missing shard is exit 2 naming the file; it never changes a byte of the directory.
TEST_F(CheckpointSafety, CheckpointCommandReadsBackEverySaveFileAndChangesNothing) {
  ASSERT_EQ(ptdp(train_args({"--steps", "2"})).status, 0);
  add_user_files();
  const auto before = tree(file("ck"));
  const Outcome ok = ptdp({"checkpoint", file("ck")});
  ASSERT_EQ(ok.status, 0) << ok.err;
  EXPECT_TRUE(contains(ok.out, "(step 2)")) << ok.out;
  EXPECT_TRUE(contains(ok.out, "shards:      1 of 1 intact")) << ok.out;
  EXPECT_TRUE(contains(ok.out, "model.safetensors: 52 tensors")) << ok.out;
  EXPECT_TRUE(contains(ok.out, "optimizer.safetensors: 104 tensors")) << ok.out;
  EXPECT_TRUE(contains(ok.out, "manifest:    4 files, sizes and digests match")) << ok.out;
  EXPECT_TRUE(contains(ok.out, "step-99999999")) << ok.out;  // a user's step directory is listed, not touched
  EXPECT_EQ(tree(file("ck")), before);
  // --hf writes a GPT-2 model into a new directory, and never over its files.
  const Outcome hf = ptdp({"checkpoint", file("ck"), "--hf", file("hf")});
  ASSERT_EQ(hf.status, 0) << hf.err;
  EXPECT_TRUE(fs::exists(file("hf/model.safetensors")) && fs::exists(file("hf/config.json")));
  const std::string config = slurp(file("hf/config.json"));
  EXPECT_TRUE(contains(config, "\"GPT2LMHeadModel\"")) << config;
  const Outcome again = ptdp({"checkpoint", file("ck"), "--hf", file("hf")});
  EXPECT_EQ(again.status, 2) << again.err;
  EXPECT_TRUE(contains(again.err, "model.safetensors exists: give a new or empty directory")) << again.err;
  EXPECT_EQ(slurp(file("hf/config.json")), config);
  EXPECT_EQ(tree(file("ck")), before);
  // One flipped byte in the shard's data: the checksum names the file.
  const std::string latest = slurp(file("ck/latest")).substr(0, slurp(file("ck/latest")).find('\n'));
  const std::string shard = file("ck/" + latest + "/rank-00000.safetensors");
  std::string bytes = slurp(shard);
  bytes[bytes.size() - 5] ^= 0x40;
  write("ck/" + latest + "/rank-00000.safetensors", bytes);
  const Outcome bad = ptdp({"checkpoint", file("ck")});
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_TRUE(contains(bad.err, shard + " is corrupt (checksum mismatch)")) << bad.err;
  fs::remove(shard);
  const Outcome missing = ptdp({"checkpoint", file("ck")});
  EXPECT_EQ(missing.status, 2) << missing.err;
  EXPECT_TRUE(contains(missing.err, shard + " is missing")) << missing.err;
  const Outcome none = ptdp({"checkpoint", file("nothing-here")});
  EXPECT_EQ(none.status, 2) << none.err;
  EXPECT_TRUE(contains(none.err, "no checkpoint in")) << none.err;
}

}  // namespace

namespace {
using namespace ptdp_cli_test;

// FNV-1a 64, as manifest.json records it ("fnv1a64:<hex>"): lets a test forge a consistent
// manifest, to reach the checks behind the digests.
std::string digest_of(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "fnv1a64:%016llx", static_cast<unsigned long long>(h));
  return buf;
}

class ResumeCorruption : public CheckpointSafety {
 protected:
  // A good checkpoint at step 2; returns its step directory (relative to the test folder).
  std::string save_good() {
    const Outcome r = ptdp(train_args({"--steps", "2", "--save-every", "2"}));
    EXPECT_EQ(r.status, 0) << r.err;
    const std::string latest = slurp(file("ck/latest"));
    return "ck/" + latest.substr(0, latest.find('\n'));
  }
  void flip(const std::string& rel, size_t from_end) const {
    std::string b = slurp(file(rel));
    b[b.size() - from_end] ^= 0x01;
    write(rel, b);
  }
  // Rewrites manifest.json's entry of `name` to the file's present size and digest.
  void reseal(const std::string& step, const std::string& name) const {
    std::string m = slurp(file(step + "/manifest.json"));
    const std::string bytes = slurp(file(step + "/" + name));
    const size_t at = m.find("\"" + name + "\"");
    ASSERT_NE(at, std::string::npos);
    const size_t b = m.find("\"bytes\": ", at) + 9, be = m.find(',', b);
    m.replace(b, be - b, std::to_string(bytes.size()));
    const size_t d = m.find("fnv1a64:", at);
    m.replace(d, 24, digest_of(bytes));
    write(step + "/manifest.json", m);
  }
  // A failed resume: exit 2 naming `expect`, and not one byte of the folder changed.
  void expect_refused_and_untouched(const std::string& expect) {
    const auto before = tree(file("ck"));
    const Outcome r = ptdp(train_args({"--steps", "4", "--save-every", "2", "--resume"}));
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_TRUE(contains(r.err, expect)) << r.err;
    EXPECT_EQ(tree(file("ck")), before) << "a failed resume changed the checkpoint folder";
  }
};

// Each corruption of the checkpoint `latest` names: the resume refuses it (exit 2, naming the
// file) and deletes nothing — the step directory `latest` names, every other file, all intact.
TEST_F(ResumeCorruption, MissingMetaJsonDeletesNothing) {
  const std::string step = save_good();
  // The killed save of issue 36's report: ptdp's leftovers beside it stay too (no clean-up on resume).
  fs::create_directories(file("ck/step-00000009-00000000deadbeef"));
  write("ck/step-00000009-00000000deadbeef/.ptdp-checkpoint", "ptdp checkpoint step-00000009-00000000deadbeef\n");
  fs::remove(file(step + "/meta.json"));
  expect_refused_and_untouched("meta.json");
  EXPECT_TRUE(fs::exists(file(step + "/rank-00000.safetensors")));
  EXPECT_TRUE(fs::exists(file(step + "/model.safetensors")));
  EXPECT_TRUE(fs::exists(file("ck/step-00000009-00000000deadbeef/.ptdp-checkpoint")));
}

TEST_F(ResumeCorruption, EditedMetaJsonIsRefusedByItsDigest) {
  const std::string step = save_good();
  std::string meta = slurp(file(step + "/meta.json"));
  const size_t at = meta.find("\"num_attention_heads\": 4");
  ASSERT_NE(at, std::string::npos) << meta;
  meta.replace(at, 24, "\"num_attention_heads\": 8");
  write(step + "/meta.json", meta);
  expect_refused_and_untouched(file(step + "/meta.json") + " is corrupt: digest");
  // `ptdp checkpoint` and --hf refuse it too.
  const Outcome c = ptdp({"checkpoint", file("ck"), "--hf", file("hf")});
  EXPECT_EQ(c.status, 2) << c.err;
  EXPECT_TRUE(contains(c.err, "meta.json is corrupt: digest")) << c.err;
  EXPECT_FALSE(fs::exists(file("hf")));
  // Resealed (a consistent manifest): the head layout the state dict was written with still
  // disagrees with meta.json's, and --hf refuses to reorder the QKV columns by it.
  reseal(step, "meta.json");
  const Outcome hf = ptdp({"checkpoint", file("ck"), "--hf", file("hf")});
  EXPECT_EQ(hf.status, 2) << hf.err;
  EXPECT_TRUE(contains(hf.err, "was written with num_attention_heads = 4")) << hf.err;
  EXPECT_FALSE(fs::exists(file("hf")));
}

TEST_F(ResumeCorruption, FlippedBitInEachFileIsRefusedAndKept) {
  const std::string step = save_good();
  const auto good = tree(file("ck"));
  for (const char* f : {"rank-00000.safetensors", "model.safetensors", "optimizer.safetensors"}) {
    SCOPED_TRACE(f);
    flip(step + "/" + f, 5);
    // The shard's own checksum, or for the state dicts the manifest's digest, names the file.
    expect_refused_and_untouched(file(step + "/" + f) + " is corrupt");
    const Outcome c = ptdp({"checkpoint", file("ck")});
    EXPECT_EQ(c.status, 2) << c.err;
    EXPECT_TRUE(contains(c.err, std::string(f) + " is corrupt")) << c.err;
    flip(step + "/" + f, 5);  // restored: the checkpoint resumes
    EXPECT_EQ(tree(file("ck")), good);
  }
  fs::remove(file(step + "/manifest.json"));
  expect_refused_and_untouched("manifest.json is missing");
  const Outcome c = ptdp({"checkpoint", file("ck")});
  EXPECT_EQ(c.status, 2) << c.err;
  write(step + "/manifest.json", good.at(step.substr(3) + "/manifest.json"));
  const Outcome r = ptdp(train_args({"--steps", "4", "--save-every", "2", "--resume"}));
  EXPECT_EQ(r.status, 0) << r.err;
}

// A state dict of another save with a manifest that agrees with it: the digests pass, the full
// comparison with the shards after loading them does not.
TEST_F(ResumeCorruption, StateDictOfAnotherSaveDisagreesWithTheShards) {
  const std::string step = save_good();
  const std::string other = slurp(file(step + "/model.safetensors"));
  ASSERT_EQ(ptdp(train_args({"--steps", "4", "--save-every", "2", "--resume"})).status, 0);
  const std::string latest = slurp(file("ck/latest"));
  const std::string now = "ck/" + latest.substr(0, latest.find('\n'));
  write(now + "/model.safetensors", other);
  reseal(now, "model.safetensors");
  expect_refused_and_untouched("model.safetensors disagrees with the shards at ");
}

TEST_F(ResumeCorruption, ResumeWithOverwriteIsRefused) {
  const std::string step = save_good();
  const auto before = tree(file("ck"));
  const Outcome r = ptdp(train_args({"--steps", "4", "--resume", "--overwrite"}));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "--overwrite")) << r.err;
  EXPECT_EQ(tree(file("ck")), before);
}

// --init reads a checkpoint's state dict against its manifest and its head layout.
TEST_F(ResumeCorruption, InitChecksTheManifestAndTheHeadLayout) {
  const std::string step = save_good();
  auto init = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"train", std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml", "--set", "parallel.tensor=1",
                                  "--set", "parallel.pipeline=1", "--set", "cluster.gpus=1", "--steps", "1",
                                  "--init", file(step + "/model.safetensors")};
    a.insert(a.end(), extra.begin(), extra.end());
    return ptdp(a);
  };
  const Outcome ok = init({});
  ASSERT_EQ(ok.status, 0) << ok.err;
  const Outcome heads = init({"--set", "model.num_attention_heads=8"});
  EXPECT_EQ(heads.status, 2) << heads.err;
  EXPECT_TRUE(contains(heads.err, "was written for num_attention_heads = 4, the model has 8")) << heads.err;
  flip(step + "/model.safetensors", 5);
  const Outcome bad = init({});
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_TRUE(contains(bad.err, "model.safetensors is corrupt: digest")) << bad.err;
}

}  // namespace
