// Nsight Systems SQLite exports in (interop/nsight.hpp), through SQLite's C API, read-only.
#include "interop/nsight.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "core/error.hpp"

namespace ptdp {
namespace {

const char* kExpected =
    "expected an Nsight Systems SQLite export with CUDA kernels (nsys profile --trace=cuda,nvtx …; nsys export --type sqlite "
    "REPORT.nsys-rep), or a PyTorch profiler (Kineto) JSON trace";

class Db {
 public:
  explicit Db(const std::string& path) : path_(path) {
    // Read-only and immutable: no journal or lock files beside the user's export.
    std::string uri = "file:";
    for (char c : path) {
      if (c == '%' || c == '?' || c == '#') {
        char buf[4];
        std::snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(c));
        uri += buf;
      } else {
        uri += c;
      }
    }
    uri += "?immutable=1";
    if (sqlite3_open_v2(uri.c_str(), &db_, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr) != SQLITE_OK) {
      const std::string why = db_ ? sqlite3_errmsg(db_) : "cannot open";
      sqlite3_close(db_);
      db_ = nullptr;
      fail("cannot open it as SQLite (" + why + ")");
    }
  }
  ~Db() { sqlite3_close(db_); }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  [[noreturn]] void fail(const std::string& what) const { throw ConfigError("", what + "; " + kExpected, SourceLocation{path_, 0, 0}); }

  // Runs `sql`, calling `row` with the statement for each row.
  void each(const std::string& sql, const std::function<void(sqlite3_stmt*)>& row) {
    sqlite3_stmt* st = nullptr;
    // Finalized however the rows end (a row may throw): an open statement would keep the
    // connection from closing.
    struct Finalize {
      sqlite3_stmt*& st;
      ~Finalize() { sqlite3_finalize(st); }
    } finalize{st};
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) fail("unreadable (" + std::string(sqlite3_errmsg(db_)) + ")");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) row(st);
    if (rc != SQLITE_DONE) fail("unreadable (" + std::string(sqlite3_errstr(rc)) + ")");
  }
  std::set<std::string> tables() {
    std::set<std::string> out;
    each("SELECT name FROM sqlite_master WHERE type = 'table' OR type = 'view'", [&](sqlite3_stmt* st) { out.insert(text(st, 0)); });
    return out;
  }
  std::set<std::string> columns(const std::string& table) {
    std::set<std::string> out;
    each("PRAGMA table_info(\"" + table + "\")", [&](sqlite3_stmt* st) { out.insert(text(st, 1)); });
    return out;
  }
  static std::string text(sqlite3_stmt* st, int col) {
    const unsigned char* t = sqlite3_column_text(st, col);
    return t ? std::string(reinterpret_cast<const char*>(t), static_cast<size_t>(sqlite3_column_bytes(st, col))) : std::string();
  }

 private:
  std::string path_;
  sqlite3* db_ = nullptr;
};

}  // namespace

bool is_sqlite_file(const std::string& bytes) { return bytes.compare(0, 16, std::string("SQLite format 3\0", 16)) == 0; }

KernelTrace read_nsight_sqlite(const std::string& path) {
  Db db(path);
  const auto tables = db.tables();
  if (!tables.count("CUPTI_ACTIVITY_KIND_KERNEL")) db.fail("no table CUPTI_ACTIVITY_KIND_KERNEL (no CUDA kernels: profiled with --trace=cuda?)");
  const auto kcols = db.columns("CUPTI_ACTIVITY_KIND_KERNEL");
  for (const char* c : {"start", "end"})
    if (!kcols.count(c)) db.fail(std::string("CUPTI_ACTIVITY_KIND_KERNEL has no column ") + c);
  const bool strings = tables.count("StringIds") > 0;
  std::string name_col;
  for (const char* c : {"demangledName", "shortName", "mangledName"})
    if (name_col.empty() && kcols.count(c)) name_col = c;
  const std::string name_sql = strings && !name_col.empty() ? "(SELECT value FROM StringIds WHERE id = k." + name_col + ")" : "''";
  const std::string device_sql = kcols.count("deviceId") ? "k.deviceId" : "0";
  const std::string corr_sql = kcols.count("correlationId") ? "k.correlationId" : "-1";

  // The GPU with the most kernels.
  int64_t device = 0, most = -1, devices = 0;
  db.each("SELECT " + device_sql + ", COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k GROUP BY 1", [&](sqlite3_stmt* st) {
    ++devices;
    if (sqlite3_column_int64(st, 1) > most) most = sqlite3_column_int64(st, 1), device = sqlite3_column_int64(st, 0);
  });
  if (most <= 0) db.fail("CUPTI_ACTIVITY_KIND_KERNEL holds no kernels");

  RawKernelTrace raw;
  raw.rank = static_cast<int>(std::clamp<int64_t>(device, 0, 1'000'000));
  raw.world_size = static_cast<int>(std::clamp<int64_t>(devices, 1, 1'000'000));
  std::vector<int64_t> correlation;
  auto seconds = [](sqlite3_stmt* st, int col) { return static_cast<double>(sqlite3_column_int64(st, col)) * 1e-9; };
  db.each("SELECT k.start, k.\"end\", " + name_sql + ", " + corr_sql + " FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE " + device_sql +
              " = " + std::to_string(device) + " ORDER BY k.start",
          [&](sqlite3_stmt* st) {
            const double a = seconds(st, 0), b = seconds(st, 1);
            if (!(b >= a) || a < 0) db.fail("a kernel ends before it starts (start " + std::to_string(a) + " s)");
            raw.kernels.push_back(RawKernelTrace::Kernel{a, b - a, Db::text(st, 2), "", -1, ""});
            correlation.push_back(sqlite3_column_int64(st, 3));
          });

  // A deviceId that is not an integer (NULL, text) groups but matches nothing.
  if (raw.kernels.empty()) db.fail("CUPTI_ACTIVITY_KIND_KERNEL holds no kernels of an integer deviceId");
  // Launches: the runtime API call with the kernel's correlation id (thread, time).
  if (tables.count("CUPTI_ACTIVITY_KIND_RUNTIME")) {
    const auto rcols = db.columns("CUPTI_ACTIVITY_KIND_RUNTIME");
    if (rcols.count("correlationId") && rcols.count("start") && rcols.count("globalTid")) {
      std::map<int64_t, std::pair<std::string, double>> launch;
      db.each("SELECT correlationId, globalTid, start FROM CUPTI_ACTIVITY_KIND_RUNTIME", [&](sqlite3_stmt* st) {
        launch[sqlite3_column_int64(st, 0)] = {Db::text(st, 1), seconds(st, 2)};
      });
      for (size_t i = 0; i < raw.kernels.size(); ++i)
        if (const auto it = launch.find(correlation[i]); it != launch.end())
          raw.kernels[i].launch_thread = it->second.first, raw.kernels[i].launch_ts = it->second.second;
    }
  }
  // NVTX ranges: backward regions per thread, iterations.
  if (tables.count("NVTX_EVENTS")) {
    const auto ncols = db.columns("NVTX_EVENTS");
    if (ncols.count("start") && ncols.count("end") && ncols.count("globalTid")) {
      std::string text_sql = ncols.count("text") ? "n.text" : "NULL";
      if (strings && ncols.count("textId")) text_sql = "COALESCE(" + text_sql + ", (SELECT value FROM StringIds WHERE id = n.textId))";
      db.each("SELECT n.start, n.\"end\", " + text_sql + ", n.globalTid FROM NVTX_EVENTS n WHERE n.\"end\" IS NOT NULL",
              [&](sqlite3_stmt* st) {
                const double a = seconds(st, 0), b = seconds(st, 1);
                if (!(b >= a)) return;
                const std::string text = Db::text(st, 2);
                std::string low = text;
                std::transform(low.begin(), low.end(), low.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
                if (text.rfind("ProfilerStep#", 0) == 0 || low == "iteration" || low == "step" || low.rfind("iteration ", 0) == 0 ||
                    low.rfind("train_step", 0) == 0)
                  raw.steps.push_back(b - a);
                if (low.find("backward") != std::string::npos) raw.backward_ranges[Db::text(st, 3)].emplace_back(a, b);
              });
    }
  }
  if (tables.count("ThreadNames") && strings) {
    const auto tcols = db.columns("ThreadNames");
    if (tcols.count("nameId") && tcols.count("globalTid"))
      db.each("SELECT t.globalTid, (SELECT value FROM StringIds WHERE id = t.nameId) FROM ThreadNames t",
              [&](sqlite3_stmt* st) { raw.thread_name[Db::text(st, 0)] = Db::text(st, 1); });
  }
  return summarize_kernels(std::move(raw));
}

bool looks_like_trace(const std::string& bytes) {
  return is_sqlite_file(bytes) || is_kineto_trace(bytes) || bytes.find("\"traceEvents\"") != std::string::npos;
}

KernelTrace read_measured_trace(const std::string& bytes, const std::string& path) {
  if (is_sqlite_file(bytes)) return read_nsight_sqlite(path);
  return read_kineto_trace(bytes, path);
}

}  // namespace ptdp
