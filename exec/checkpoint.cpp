#include "exec/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"

namespace ptdp::exec {
namespace {

namespace fs = std::filesystem;

constexpr char kShardMagic[8] = {'P', 'T', 'D', 'P', 'C', 'K', 'P', '1'};

uint64_t fnv1a(const char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

struct Reader {
  const std::string& bytes;
  size_t pos;
  const std::string& source;

  uint64_t u64() {
    need(8);
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[pos + i]);
    pos += 8;
    return v;
  }
  std::string str(uint64_t n) {
    need(n);
    std::string s = bytes.substr(pos, n);
    pos += n;
    return s;
  }
  void need(uint64_t n) const {
    if (n > bytes.size() - pos) throw EnvironmentError("checkpoint: " + source + " is truncated or corrupt");
  }
};

std::string sys_error() { return std::strerror(errno); }

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;  // best effort for directories on file systems that refuse it
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw EnvironmentError("checkpoint: cannot create '" + tmp + "': " + sys_error());
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string err = sys_error();
      ::close(fd);
      ::unlink(tmp.c_str());
      throw EnvironmentError("checkpoint: cannot write '" + tmp + "': " + err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string err = sys_error();
    ::unlink(tmp.c_str());
    throw EnvironmentError("checkpoint: cannot flush '" + tmp + "': " + err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = sys_error();
    ::unlink(tmp.c_str());
    throw EnvironmentError("checkpoint: cannot rename '" + tmp + "' to '" + path + "': " + err);
  }
  fsync_path(fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string(), O_RDONLY | O_DIRECTORY);
}

void make_directories(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec || !fs::is_directory(path))
    throw EnvironmentError("checkpoint: cannot create directory '" + path + "': " +
                           (ec ? ec.message() : std::string("a file of that name exists")));
}

std::string checkpoint_step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string encode_shard(const std::string& meta_json, const std::vector<ShardEntry>& entries) {
  std::string payload;
  put_u64(payload, meta_json.size());
  payload += meta_json;
  put_u64(payload, entries.size());
  for (const ShardEntry& e : entries) {
    put_u64(payload, e.name.size());
    payload += e.name;
    put_u64(payload, e.values.size());
    payload.append(reinterpret_cast<const char*>(e.values.data()), e.values.size() * sizeof(float));
  }
  std::string out(kShardMagic, sizeof kShardMagic);
  put_u64(out, payload.size());
  put_u64(out, fnv1a(payload.data(), payload.size()));
  out += payload;
  return out;
}

std::vector<ShardEntry> decode_shard(const std::string& bytes, const std::string& source, std::string* meta_json) {
  if (bytes.size() < 24 || std::memcmp(bytes.data(), kShardMagic, sizeof kShardMagic) != 0)
    throw EnvironmentError("checkpoint: " + source + " is not a ptdp checkpoint shard (bad header)");
  Reader head{bytes, 8, source};
  const uint64_t size = head.u64(), sum = head.u64();
  if (size != bytes.size() - 24)
    throw EnvironmentError("checkpoint: " + source + " is truncated or corrupt (" + std::to_string(bytes.size() - 24) +
                           " payload bytes, header says " + std::to_string(size) + ")");
  if (fnv1a(bytes.data() + 24, size) != sum)
    throw EnvironmentError("checkpoint: " + source + " is corrupt (checksum mismatch)");
  Reader r{bytes, 24, source};
  std::string meta = r.str(r.u64());
  if (meta_json != nullptr) *meta_json = meta;
  const uint64_t n = r.u64();
  std::vector<ShardEntry> entries;
  for (uint64_t i = 0; i < n; ++i) {
    ShardEntry e;
    e.name = r.str(r.u64());
    const uint64_t count = r.u64();
    r.need(count * sizeof(float));
    e.values.resize(count);
    std::memcpy(e.values.data(), bytes.data() + r.pos, count * sizeof(float));
    r.pos += count * sizeof(float);
    entries.push_back(std::move(e));
  }
  return entries;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw EnvironmentError("checkpoint: cannot open '" + path + "': " + sys_error());
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw EnvironmentError("checkpoint: error reading '" + path + "'");
  return s;
}

std::string read_latest(const std::string& dir) {
  const std::string path = (fs::path(dir) / "latest").string();
  if (!fs::exists(path)) throw EnvironmentError("checkpoint: no checkpoint in '" + dir + "' (" + path + " is missing)");
  std::string name = read_file(path);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.rfind("step-", 0) != 0 || name.find('/') != std::string::npos)
    throw EnvironmentError("checkpoint: " + path + " is corrupt (it names '" + name + "')");
  return name;
}

void remove_other_checkpoints(const std::string& dir, const std::vector<std::string>& keep) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0 || !entry.is_directory(ec)) continue;
    if (std::find(keep.begin(), keep.end(), name) != keep.end()) continue;
    fs::remove_all(entry.path(), ec);
  }
}

}  // namespace ptdp::exec
