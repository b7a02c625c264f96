#include "exec/io/checkpoint.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <cstdlib>
#include <random>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/json_depth.hpp"
#include "core/json_read.hpp"
#include "core/input_file.hpp"

namespace ptdp::exec {
namespace {

namespace fs = std::filesystem;

// FNV-1a 64, continued from `h` (0xcbf29ce484222325 to start).
uint64_t fnv1a_more(uint64_t h, const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}
uint64_t fnv1a(const char* p, size_t n) { return fnv1a_more(0xcbf29ce484222325ULL, p, n); }

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

// Fault injection (configure_checkpoint_faults): which kind, at which count, counters.
struct FaultPlan {
  enum class Kind { None, Kill, Enospc } kind = Kind::None;
  int64_t at = 0;
  int64_t points = 0, writes = 0;
};
FaultPlan& faults() {
  static FaultPlan plan;
  return plan;
}

// The write of one chunk, or ENOSPC when the fault plan says so.
ssize_t checked_write(int fd, const char* p, size_t n) {
  FaultPlan& f = faults();
  if (f.kind == FaultPlan::Kind::Enospc && ++f.writes == f.at) {
    errno = ENOSPC;
    return -1;
  }
  return ::write(fd, p, n);
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;  // best effort for directories on file systems that refuse it
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  checkpoint_fault_point("before create");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw EnvironmentError("checkpoint: cannot create '" + tmp + "': " + sys_error());
  // Written in chunks: each is a point where a kill or a full disk can strike.
  constexpr size_t kChunk = size_t{1} << 16;
  size_t done = 0;
  while (done < bytes.size()) {
    checkpoint_fault_point("write");
    const ssize_t n = checked_write(fd, bytes.data() + done, std::min(kChunk, bytes.size() - done));
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string err = sys_error();
      ::close(fd);
      ::unlink(tmp.c_str());
      throw EnvironmentError("checkpoint: cannot write '" + tmp + "': " + err);
    }
    done += static_cast<size_t>(n);
  }
  checkpoint_fault_point("before fsync");
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string err = sys_error();
    ::unlink(tmp.c_str());
    throw EnvironmentError("checkpoint: cannot flush '" + tmp + "': " + err);
  }
  checkpoint_fault_point("before rename");
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = sys_error();
    ::unlink(tmp.c_str());
    throw EnvironmentError("checkpoint: cannot rename '" + tmp + "' to '" + path + "': " + err);
  }
  checkpoint_fault_point("after rename");
  fsync_path(fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string(), O_RDONLY | O_DIRECTORY);
}

void configure_checkpoint_faults(int world_rank) {
  FaultPlan& f = faults();
  f = FaultPlan{};
  const char* spec = std::getenv("PTDP_CHECKPOINT_FAULT");
  if (spec == nullptr || *spec == '\0') return;
  const std::string text = spec;
  const auto colon = text.find(':'), at = text.find('@');
  const std::string kind = text.substr(0, colon);
  if (colon == std::string::npos || (kind != "kill" && kind != "enospc"))
    throw ConfigError("PTDP_CHECKPOINT_FAULT", "expected kill:N[@RANK] or enospc:N[@RANK] (got '" + text + "')");
  try {
    f.at = std::stoll(text.substr(colon + 1, at == std::string::npos ? std::string::npos : at - colon - 1));
    if (at != std::string::npos && std::stoi(text.substr(at + 1)) != world_rank) return;
  } catch (const std::exception&) {
    throw ConfigError("PTDP_CHECKPOINT_FAULT", "expected kill:N[@RANK] or enospc:N[@RANK] (got '" + text + "')");
  }
  f.kind = kind == "kill" ? FaultPlan::Kind::Kill : FaultPlan::Kind::Enospc;
}

void checkpoint_fault_point(const char* /*what*/) {
  FaultPlan& f = faults();
  if (f.kind == FaultPlan::Kind::Kill && ++f.points == f.at) ::raise(SIGKILL);
}

std::string ShardHeader::to_json() const {
  return nlohmann::json{{"global_rank", global_rank}, {"tp", tp}, {"pp", pp}, {"dp", dp}, {"step", step},
                        {"save_id", save_id}, {"fingerprint", fingerprint}}
      .dump();
}

ShardHeader ShardHeader::from_json(const std::string& text, const std::string& source) {
  ShardHeader h;
  try {
    const auto j = nlohmann::json::parse(text);
    h.global_rank = j.at("global_rank").get<int>();
    h.tp = j.at("tp").get<int>();
    h.pp = j.at("pp").get<int>();
    h.dp = j.at("dp").get<int>();
    h.step = j.at("step").get<int64_t>();
    h.save_id = j.at("save_id").get<std::string>();
    h.fingerprint = j.at("fingerprint").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("checkpoint", source + ": the shard header is malformed or from an older ptdp (" + e.what() + ")");
  }
  return h;
}

std::string shard_mismatch(const ShardHeader& saved, const ShardHeader& expected) {
  auto who = [](const ShardHeader& h) {
    return "rank " + std::to_string(h.global_rank) + " (tp " + std::to_string(h.tp) + ", pp " + std::to_string(h.pp) +
           ", dp " + std::to_string(h.dp) + ")";
  };
  if (saved.global_rank != expected.global_rank || saved.tp != expected.tp || saved.pp != expected.pp ||
      saved.dp != expected.dp)
    return "it is the shard of " + who(saved) + ", this is " + who(expected);
  if (saved.step != expected.step)
    return "it was saved at step " + std::to_string(saved.step) + ", the checkpoint is step " + std::to_string(expected.step);
  if (saved.save_id != expected.save_id)
    return "it was written by save " + saved.save_id + ", the checkpoint's save is " + expected.save_id;
  if (saved.fingerprint != expected.fingerprint)
    return "it belongs to another run (scenario fingerprint " + saved.fingerprint + ", this run's is " +
           expected.fingerprint + ")";
  return "";
}

std::string checkpoint_dir_name(int64_t step, const std::string& save_id) {
  return checkpoint_step_name(step) + "-" + save_id;
}

std::string new_save_id() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                     static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string fingerprint_of(const std::string& text) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a(text.data(), text.size())));
  return buf;
}

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "latest", ec);
}

namespace {

constexpr const char* kOwnerFile = ".ptdp-checkpoint";

// Whether `step_dir` was created by ptdp: it holds the owner file ptdp writes when it creates a
// step directory (its content names the save), or — checkpoints of earlier ptdp versions — a
// meta.json that ptdp wrote (format, save_id and fingerprint). A user's own step-* directory has
// neither, and is never touched.
bool owned_by_ptdp(const fs::path& step_dir) {
  std::error_code ec;
  const fs::path owner = step_dir / kOwnerFile;
  const std::string owner_line = std::string("ptdp checkpoint ") + step_dir.filename().string() + "\n";
  // A save killed right after creating the directory leaves it empty, or holding only a partial
  // temporary of the owner file: nothing but ptdp's own bytes (an empty directory loses nothing).
  {
    bool only_owner_temporaries = true;
    for (const auto& f : fs::directory_iterator(step_dir, ec)) {
      const std::string fname = f.path().filename().string();
      bool ours = false;
      if (fname.rfind(std::string(kOwnerFile) + ".tmp.", 0) == 0 && f.is_regular_file(ec)) {
        try {
          const std::string text = read_input_file(f.path().string(), "checkpoint owner temporary", 4096);
          ours = owner_line.rfind(text, 0) == 0;  // a prefix of what ptdp writes there
        } catch (const std::exception&) {
        }
      }
      if (!ours) {
        only_owner_temporaries = false;
        break;
      }
    }
    if (!ec && only_owner_temporaries) return true;
  }
  if (fs::is_regular_file(owner, ec)) {
    try {
      const std::string text = read_input_file(owner.string(), "checkpoint owner file", 4096);
      const std::string name = step_dir.filename().string();
      return text.rfind("ptdp checkpoint ", 0) == 0 && text.find(name) != std::string::npos;
    } catch (const std::exception&) {
      return false;
    }
  }
  const fs::path meta = step_dir / "meta.json";
  if (!fs::is_regular_file(meta, ec)) return false;
  try {
    const std::string text = read_input_file(meta.string(), "checkpoint meta.json", 1 << 20);
    check_json_depth(text, meta.string());
    const auto j = nlohmann::json::parse(text);
    return j.is_object() && j.contains("save_id") && j.contains("fingerprint") && j.contains("format");
  } catch (const std::exception&) {
    return false;
  }
}

// A temporary of write_file_atomically ("<file>.tmp.<pid>"), by its name's form.
bool temporary_name(const std::string& name, const std::string& of) {
  const std::string prefix = of + ".tmp.";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return false;
  return name.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

}  // namespace

void mark_checkpoint_dir(const std::string& step_dir) {
  const std::string name = fs::path(step_dir).filename().string();
  write_file_atomically((fs::path(step_dir) / kOwnerFile).string(), std::string("ptdp checkpoint ") + name + "\n");
}

void make_directories(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec || !fs::is_directory(path))
    throw EnvironmentError("checkpoint: cannot create directory '" + path + "': " +
                           (ec ? ec.message() : std::string("a file of that name exists")));
}

std::string shard_file_name(int rank) {
  char file[40];
  std::snprintf(file, sizeof file, "rank-%05d.safetensors", rank);
  return file;
}

std::string checkpoint_step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

// A shard is a safetensors file (8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the data), readable by the `safetensors` library and
// other standard tools. ptdp's own fields live in the header's "__metadata__" (string values):
// "ptdp_shard" = the rank's JSON description, "ptdp_checksum" = FNV-1a 64 over the description,
// every tensor's name and byte range, and the data; a corrupt or truncated file is refused.
namespace {

uint64_t shard_checksum(const std::string& meta_json, const std::vector<std::tuple<std::string, uint64_t, uint64_t>>& index,
                        const char* data, size_t data_bytes) {
  uint64_t h = fnv1a_more(0xcbf29ce484222325ULL, meta_json.data(), meta_json.size());
  for (const auto& [name, begin, end] : index) {
    const std::string item = "\n" + name + "\n" + std::to_string(begin) + "\n" + std::to_string(end);
    h = fnv1a_more(h, item.data(), item.size());
  }
  return fnv1a_more(h, data, data_bytes);
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

namespace {

// A tensor to write: its name, shape and F32 values.
struct TensorView {
  const std::string& name;
  std::vector<int64_t> shape;
  const float* values;
  size_t count;
};

// A safetensors file of `tensors` (in order, back to back) with `metadata` as its __metadata__.
std::string encode_views(const std::vector<TensorView>& tensors, const nlohmann::json& metadata) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t at = 0;
  for (const TensorView& t : tensors) {
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {at, at + t.count * sizeof(float)}}};
    at += t.count * sizeof(float);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out;
  out.reserve(8 + text.size() + at);
  put_u64(out, text.size());
  out += text;
  for (const TensorView& t : tensors) out.append(reinterpret_cast<const char*>(t.values), t.count * sizeof(float));
  return out;
}

// A parsed safetensors file: the header and each tensor's byte range, checked to cover the data
// without gaps or overlaps (sorted by offset).
struct ParsedTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};
struct Parsed {
  nlohmann::json metadata;  // null when absent
  std::vector<ParsedTensor> tensors;
  const char* data = nullptr;
};

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

Parsed parse_safetensors(const std::string& bytes, const std::string& source, const std::string& what) {
  auto corrupt = [&](const std::string& why) { return EnvironmentError(source + " is corrupt (" + why + ")"); };
  if (bytes.size() < 8) throw EnvironmentError(source + " is truncated or corrupt");
  Reader head{bytes, 0, source};
  const uint64_t header_size = head.u64();
  if (header_size > bytes.size() - 8 || header_size < 2 || bytes[8] != '{')
    throw EnvironmentError(source + " is not " + what + " (bad safetensors header)");
  nlohmann::json header;
  // The JSON library keeps the last of two entries of one name (other readers the first): a
  // tensor named twice is refused, as the safetensors library does.
  std::set<std::string> names;
  std::string twice;
  const nlohmann::json::parser_callback_t seen = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && !names.insert(parsed.get<std::string>()).second && twice.empty())
      twice = parsed.get<std::string>();
    return true;
  };
  try {
    check_json_depth(bytes.substr(8, header_size), source);
    header = nlohmann::json::parse(bytes.substr(8, header_size), seen);
  } catch (const nlohmann::json::exception&) {
    throw corrupt("unreadable safetensors header");
  } catch (const ConfigError&) {
    throw corrupt("its header nests deeper than any safetensors header");
  }
  if (!twice.empty()) throw corrupt("the header names '" + printable(twice) + "' twice");
  if (!header.is_object()) throw corrupt("the safetensors header is not a JSON object");
  Parsed out;
  out.data = bytes.data() + 8 + header_size;
  const uint64_t data_bytes = bytes.size() - 8 - header_size;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") {
      out.metadata = t;
      continue;
    }
    const std::string quoted = "tensor '" + printable(name) + "'";
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("data_offsets") || !t.contains("shape") ||
        !t["data_offsets"].is_array() || t["data_offsets"].size() != 2 || !t["data_offsets"][0].is_number_unsigned() ||
        !t["data_offsets"][1].is_number_unsigned() || !t["shape"].is_array() || t["shape"].size() > 8)
      throw corrupt(quoted + " needs a dtype, a shape and two data offsets");
    ParsedTensor p{name, t["dtype"].get<std::string>(), {}, t["data_offsets"][0], t["data_offsets"][1]};
    const size_t width = dtype_bytes(p.dtype);
    if (width == 0) throw corrupt(quoted + " has dtype " + printable(p.dtype) + " (F32, F16 or BF16 expected)");
    // The element count with checked arithmetic: [2^40, 2^40] must not wrap to 0 elements.
    constexpr uint64_t kMaxElements = uint64_t{1} << 40;
    uint64_t count = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > kMaxElements) throw corrupt(quoted + " has a malformed shape");
      const uint64_t dim = d.get<uint64_t>();
      p.shape.push_back(static_cast<int64_t>(dim));
      if (dim != 0 && count > kMaxElements / dim) throw corrupt(quoted + " has more than 2^40 elements (shape " + t["shape"].dump() + ")");
      count *= dim;
    }
    if (p.begin > p.end || p.end > data_bytes || p.end - p.begin != count * width)
      throw EnvironmentError(source + " is truncated or corrupt (" + quoted + " bytes " + std::to_string(p.begin) + "…" +
                             std::to_string(p.end) + " of " + std::to_string(data_bytes) + ")");
    out.tensors.push_back(std::move(p));
  }
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const ParsedTensor& a, const ParsedTensor& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t at = 0;  // safetensors: the tensors cover the data without gaps or overlaps
  for (const ParsedTensor& p : out.tensors) {
    if (p.begin != at) throw corrupt("tensor '" + printable(p.name) + "' does not follow the previous one");
    at = p.end;
  }
  if (at != data_bytes)
    throw EnvironmentError(source + " is truncated or corrupt (" + std::to_string(data_bytes) + " data bytes, the header covers " +
                           std::to_string(at) + ")");
  return out;
}

// Values of a parsed tensor as F32 (F16 and BF16 widened exactly).
std::vector<float> tensor_values(const Parsed& parsed, const ParsedTensor& p) {
  const char* src = parsed.data + p.begin;
  const size_t bytes = p.end - p.begin;
  std::vector<float> v(bytes / dtype_bytes(p.dtype));
  if (p.dtype == "F32") {
    if (bytes > 0) std::memcpy(v.data(), src, bytes);
    return v;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const uint32_t half = static_cast<unsigned char>(src[2 * i]) | (static_cast<uint32_t>(static_cast<unsigned char>(src[2 * i + 1])) << 8);
    uint32_t bits;
    if (p.dtype == "BF16") {
      bits = half << 16;
    } else {  // IEEE half → single
      const uint32_t sign = (half & 0x8000u) << 16, exp = (half >> 10) & 0x1f, mant = half & 0x3ff;
      if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
      } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
      } else if (mant == 0) {
        bits = sign;
      } else {  // subnormal: normalise
        int e = -1;
        uint32_t m = mant;
        do {
          m <<= 1;
          ++e;
        } while ((m & 0x400u) == 0);
        bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((m & 0x3ffu) << 13);
      }
    }
    std::memcpy(&v[i], &bits, sizeof bits);
  }
  return v;
}

}  // namespace

std::string encode_shard(const std::string& meta_json, const std::vector<ShardEntry>& entries) {
  std::vector<TensorView> views;
  std::vector<std::tuple<std::string, uint64_t, uint64_t>> index;
  uint64_t at = 0;
  for (const ShardEntry& e : entries) {
    views.push_back(TensorView{e.name, {static_cast<int64_t>(e.values.size())}, e.values.data(), e.values.size()});
    index.emplace_back(e.name, at, at + e.values.size() * sizeof(float));
    at += e.values.size() * sizeof(float);
  }
  // The checksum runs over the data as written: the entries' values back to back.
  uint64_t h = shard_checksum(meta_json, index, nullptr, 0);
  for (const ShardEntry& e : entries) h = fnv1a_more(h, reinterpret_cast<const char*>(e.values.data()), e.values.size() * sizeof(float));
  return encode_views(views, {{"ptdp_shard", meta_json}, {"ptdp_checksum", hex64(h)}});
}

std::vector<ShardEntry> decode_shard(const std::string& bytes, const std::string& source, std::string* meta_json) {
  const std::string where = "checkpoint: " + source;
  const Parsed parsed = parse_safetensors(bytes, where, "a ptdp checkpoint shard");
  const auto& md = parsed.metadata;
  if (!md.is_object() || !md.contains("ptdp_shard") || !md["ptdp_shard"].is_string() || !md.contains("ptdp_checksum") ||
      !md["ptdp_checksum"].is_string())
    throw EnvironmentError(where + " is not a ptdp checkpoint shard (no ptdp metadata)");
  std::vector<std::tuple<std::string, uint64_t, uint64_t>> index;
  for (const ParsedTensor& p : parsed.tensors) {
    if (p.dtype != "F32" || p.shape.size() != 1)
      throw EnvironmentError(where + " is corrupt (tensor '" + printable(p.name) + "' is not a one-dimensional F32 tensor)");
    index.emplace_back(p.name, p.begin, p.end);
  }
  const uint64_t data_bytes = parsed.tensors.empty() ? 0 : parsed.tensors.back().end;
  const std::string meta = md["ptdp_shard"].get<std::string>();
  if (hex64(shard_checksum(meta, index, parsed.data, data_bytes)) != md["ptdp_checksum"].get<std::string>())
    throw EnvironmentError(where + " is corrupt (checksum mismatch)");
  if (meta_json != nullptr) *meta_json = meta;
  std::vector<ShardEntry> entries;
  for (const ParsedTensor& p : parsed.tensors) entries.push_back(ShardEntry{p.name, tensor_values(parsed, p)});
  return entries;
}

std::string encode_safetensors(const std::vector<NamedTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<TensorView> views;
  for (const NamedTensor& t : tensors) views.push_back(TensorView{t.name, t.shape, t.values.data(), t.values.size()});
  nlohmann::json md = nlohmann::json::object();
  for (const auto& [k, v] : metadata) md[k] = v;
  return encode_views(views, md);
}

std::vector<NamedTensor> decode_safetensors(const std::string& bytes, const std::string& source,
                                            std::map<std::string, std::string>* metadata) {
  const Parsed parsed = parse_safetensors(bytes, source, "a safetensors file");
  if (metadata != nullptr && parsed.metadata.is_object())
    for (const auto& [k, v] : parsed.metadata.items())
      if (v.is_string()) (*metadata)[k] = v.get<std::string>();
  std::vector<NamedTensor> out;
  for (const ParsedTensor& p : parsed.tensors) out.push_back(NamedTensor{p.name, p.shape, tensor_values(parsed, p)});
  return out;
}

std::string read_file(const std::string& path, uint64_t max_bytes) {
  return read_input_file(path, "checkpoint file", max_bytes);
}

std::string read_latest(const std::string& dir) {
  const std::string path = (fs::path(dir) / "latest").string();
  if (!path_exists(path)) throw ConfigError("checkpoint", "no checkpoint in '" + dir + "' (" + path + " is missing)");
  std::string name = read_file(path);
  // One line; a trailing newline (LF or CRLF, as an editor on Windows writes it) or blanks are fine.
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ' || name.back() == '\t')) name.pop_back();
  if (name.empty()) throw ConfigError("checkpoint", path + " is empty: it should name the step directory to resume from");
  if (name.rfind("step-", 0) != 0 || name.find('/') != std::string::npos || name.find('\n') != std::string::npos)
    throw ConfigError("checkpoint", path + " is corrupt (it names '" + printable(name) + "')");
  return name;
}

std::string latest_checkpoint_dir(const std::string& dir) {
  const std::string name = read_latest(dir);
  const std::string where = (fs::path(dir) / name).string();
  std::error_code ec;
  if (!fs::is_directory(where, ec))
    throw ConfigError("checkpoint", (fs::path(dir) / "latest").string() + " names " + name + ", which is not a directory of " + dir +
                                        " (restore `latest` to name the checkpoint to resume from)");
  return where;
}

nlohmann::json read_checkpoint_meta(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / "meta.json").string();
  const std::string text = read_file(path);
  nlohmann::json meta;
  try {
    meta = parse_json_text(text, path);
  } catch (const ConfigError& e) {
    throw ConfigError("checkpoint", path + " is corrupt: " + e.where().str() + ": " + (e.key_path().empty() ? "" : e.key_path() + ": ") + e.message());
  }
  if (!meta.is_object()) throw ConfigError("checkpoint", path + " is corrupt: not a JSON object");
  return meta;
}

void remove_other_checkpoints(const std::string& dir, const std::vector<std::string>& keep) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 && entry.is_directory(ec)) {
      if (std::find(keep.begin(), keep.end(), name) != keep.end()) continue;
      if (!owned_by_ptdp(entry.path())) continue;  // a user's own step-* directory
      fs::remove_all(entry.path(), ec);
      continue;
    }
    // `latest`'s own temporary: removed only when it holds what ptdp writes there (a step name).
    if (temporary_name(name, "latest") && entry.is_regular_file(ec)) {
      try {
        // What ptdp writes there ("step-…-<hex>\n"), or a part of it when the write was killed
        // (an empty file loses nothing).
        const std::string text = read_input_file(entry.path().string(), "checkpoint temporary", 4096);
        const bool step_like = text.rfind("step-", 0) == 0 || std::string("step-").rfind(text, 0) == 0;
        if (step_like && text.size() < 64 && text.find_first_not_of("step-0123456789abcdef\n") == std::string::npos)
          fs::remove(entry.path(), ec);
      } catch (const std::exception&) {
      }
    }
  }
}

std::string file_digest(const std::string& bytes) { return "fnv1a64:" + hex64(fnv1a(bytes.data(), bytes.size())); }

std::string Manifest::to_json() const {
  nlohmann::json j = {{"format", 1}, {"digest", "fnv1a64"}, {"files", nlohmann::json::object()}};
  for (const auto& [name, e] : files) j["files"][name] = {{"bytes", e.bytes}, {"digest", e.digest}};
  return j.dump(2) + "\n";
}

bool has_manifest(const std::string& step_dir) {
  std::error_code ec;
  return fs::exists(fs::path(step_dir) / "manifest.json", ec);
}

Manifest read_manifest(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / "manifest.json").string();
  const nlohmann::json j = parse_json_text(read_file(path), path);
  Manifest m;
  const nlohmann::json& files = json_at(j, "files", path);
  if (!files.is_object()) throw ConfigError("checkpoint", path + ": files is not an object");
  for (const auto& [name, e] : files.items()) {
    const std::string key = "files." + printable(name);
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      throw ConfigError("checkpoint", path + ": " + key + " is not a file name of the step directory");
    Manifest::Entry entry;
    entry.bytes = json_get<uint64_t>(json_at(e, "bytes", path, key), path, key + ".bytes");
    entry.digest = json_get<std::string>(json_at(e, "digest", path, key), path, key + ".digest");
    m.files[name] = entry;
  }
  return m;
}

void verify_file(const Manifest& manifest, const std::string& step_dir, const std::string& file, const std::string& bytes) {
  const std::string path = (fs::path(step_dir) / file).string();
  const auto it = manifest.files.find(file);
  if (it == manifest.files.end())
    throw ConfigError("checkpoint", path + " is not listed in " + (fs::path(step_dir) / "manifest.json").string() +
                                        " (the save did not write it)");
  if (it->second.bytes != bytes.size())
    throw ConfigError("checkpoint", path + " is corrupt: " + std::to_string(bytes.size()) + " bytes, the save wrote " +
                                        std::to_string(it->second.bytes) + " (manifest.json)");
  if (const std::string d = file_digest(bytes); d != it->second.digest)
    throw ConfigError("checkpoint", path + " is corrupt: digest " + d + ", the save wrote " + printable(it->second.digest) +
                                        " (manifest.json)");
}

}  // namespace ptdp::exec
