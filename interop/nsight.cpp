// Nsight Systems SQLite exports in (interop/nsight.hpp), through SQLite's C API, read-only.
#include "interop/nsight.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "core/error.hpp"

namespace ptdp {
namespace {

// Bounds of one read (a crafted export must not hang or exhaust memory): every row of every query
// counts against kMaxRows, every query against the clock (checked by SQLite's progress handler).
constexpr int64_t kMaxRows = 20'000'000;
constexpr double kMaxSeconds = 60;
constexpr size_t kMaxStringBytes = size_t{256} << 20;

const char* kExpected =
    "expected an Nsight Systems SQLite export with CUDA kernels (nsys profile --trace=cuda,nvtx …; nsys export --type sqlite "
    "REPORT.nsys-rep), its JSON export (--type json), or a PyTorch profiler (Kineto) JSON trace";

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
    // The clock: SQLite calls back every 10 000 virtual-machine steps; a non-zero return
    // interrupts the query (SQLITE_INTERRUPT), which `each` reports as too slow.
    started_ = std::chrono::steady_clock::now();
    sqlite3_progress_handler(
        db_, 10'000,
        [](void* self) -> int {
          const Db& d = *static_cast<const Db*>(self);
          return std::chrono::duration<double>(std::chrono::steady_clock::now() - d.started_).count() > kMaxSeconds ? 1 : 0;
        },
        this);
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
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      if (++rows_ > kMaxRows) fail("more than " + std::to_string(kMaxRows) + " rows read (refused: larger than any trace ptdp compares)");
      row(st);
    }
    if (rc == SQLITE_INTERRUPT)
      fail("reading it takes longer than " + std::to_string(static_cast<int>(kMaxSeconds)) + " s (refused: a crafted schema?)");
    if (rc != SQLITE_DONE) fail("unreadable (" + std::string(sqlite3_errstr(rc)) + ")");
  }
  // Tables only, never views: a view is a query of the file's own (it may recurse without end).
  std::set<std::string> tables() {
    std::set<std::string> out;
    each("SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%'",
         [&](sqlite3_stmt* st) { out.insert(text(st, 0)); });
    return out;
  }
  std::set<std::string> views() {
    std::set<std::string> out;
    each("SELECT name FROM sqlite_master WHERE type <> 'table' OR sql LIKE 'CREATE VIRTUAL%'", [&](sqlite3_stmt* st) { out.insert(text(st, 0)); });
    return out;
  }
  // An integer cell (a time in ns, an id): text, a real or a blob where an integer belongs is
  // refused, naming the table, column and row (text read as 0 before).
  int64_t integer(sqlite3_stmt* st, int col, const char* table, const char* column, int64_t row) const {
    if (sqlite3_column_type(st, col) != SQLITE_INTEGER)
      fail(std::string(table) + "." + column + " of row " + std::to_string(row) + " is " + kind(st, col) + ", not an integer");
    return sqlite3_column_int64(st, col);
  }
  static std::string kind(sqlite3_stmt* st, int col) {
    switch (sqlite3_column_type(st, col)) {
      case SQLITE_TEXT: return "text ('" + printable(text(st, col), 30) + "')";
      case SQLITE_FLOAT: return "a real number";
      case SQLITE_BLOB: return "a blob";
      case SQLITE_NULL: return "NULL";
      default: return "an integer";
    }
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
  std::chrono::steady_clock::time_point started_;
  int64_t rows_ = 0;
};

}  // namespace

void add_annotation_range(RawKernelTrace& raw, double start_s, double end_s, const std::string& text, const std::string& thread) {
  std::string low = text;
  std::transform(low.begin(), low.end(), low.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (text.rfind("ProfilerStep#", 0) == 0 || low == "iteration" || low == "step" || low.rfind("iteration ", 0) == 0 ||
      low.rfind("train_step", 0) == 0)
    raw.steps.push_back(end_s - start_s);
  if (low.find("backward") != std::string::npos) raw.backward_ranges[thread].emplace_back(start_s, end_s);
}

bool is_sqlite_file(const std::string& bytes) { return bytes.compare(0, 16, std::string("SQLite format 3\0", 16)) == 0; }

KernelTrace read_nsight_sqlite(const std::string& path) {
  Db db(path);
  const auto tables = db.tables();
  if (!tables.count("CUPTI_ACTIVITY_KIND_KERNEL")) {
    if (db.views().count("CUPTI_ACTIVITY_KIND_KERNEL")) db.fail("CUPTI_ACTIVITY_KIND_KERNEL is a view, not a table (nsys exports tables)");
    db.fail("no table CUPTI_ACTIVITY_KIND_KERNEL (no CUDA kernels: profiled with --trace=cuda?)");
  }
  const auto kcols = db.columns("CUPTI_ACTIVITY_KIND_KERNEL");
  for (const char* c : {"start", "end"})
    if (!kcols.count(c)) db.fail(std::string("CUPTI_ACTIVITY_KIND_KERNEL has no column ") + c);
  const bool strings = tables.count("StringIds") > 0;
  std::string name_col;
  for (const char* c : {"demangledName", "shortName", "mangledName"})
    if (name_col.empty() && kcols.count(c)) name_col = c;
  // The string table, read once into memory: a lookup per kernel in an unindexed StringIds
  // would scan it per row.
  std::unordered_map<int64_t, std::string> string_ids;
  if (strings) {
    const auto scols = db.columns("StringIds");
    if (scols.count("id") && scols.count("value")) {
      size_t bytes = 0;
      db.each("SELECT id, value FROM StringIds", [&](sqlite3_stmt* st) {
        if (sqlite3_column_type(st, 0) != SQLITE_INTEGER) return;  // not an id any row can name
        std::string v = Db::text(st, 1);
        bytes += v.size();
        if (bytes > kMaxStringBytes) db.fail("StringIds holds more than 256 MiB of text");
        string_ids[sqlite3_column_int64(st, 0)] = std::move(v);
      });
    }
  }
  auto string_of = [&](sqlite3_stmt* st, int col) -> std::string {
    if (sqlite3_column_type(st, col) == SQLITE_TEXT) return Db::text(st, col);  // a name stored inline
    if (sqlite3_column_type(st, col) != SQLITE_INTEGER) return "";
    const auto it = string_ids.find(sqlite3_column_int64(st, col));
    return it == string_ids.end() ? std::string() : it->second;
  };
  const std::string name_sql = !name_col.empty() ? "k." + name_col : "NULL";
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
  int64_t kernel_row = 0;
  db.each("SELECT k.start, k.\"end\", " + name_sql + ", " + corr_sql + " FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE " + device_sql +
              " = " + std::to_string(device) + " ORDER BY k.start",
          [&](sqlite3_stmt* st) {
            ++kernel_row;
            const double a = static_cast<double>(db.integer(st, 0, "CUPTI_ACTIVITY_KIND_KERNEL", "start", kernel_row)) * 1e-9;
            const double b = static_cast<double>(db.integer(st, 1, "CUPTI_ACTIVITY_KIND_KERNEL", "end", kernel_row)) * 1e-9;
            if (!(b >= a) || a < 0) db.fail("a kernel ends before it starts (start " + std::to_string(a) + " s)");
            raw.kernels.push_back(RawKernelTrace::Kernel{a, b - a, string_of(st, 2), "", -1, ""});
            correlation.push_back(sqlite3_column_int64(st, 3));
          });

  // A deviceId that is not an integer (NULL, text) groups but matches nothing.
  if (raw.kernels.empty()) db.fail("CUPTI_ACTIVITY_KIND_KERNEL holds no kernels of an integer deviceId");
  // Launches: the runtime API call with the kernel's correlation id (thread, time).
  if (tables.count("CUPTI_ACTIVITY_KIND_RUNTIME")) {
    const auto rcols = db.columns("CUPTI_ACTIVITY_KIND_RUNTIME");
    if (rcols.count("correlationId") && rcols.count("start") && rcols.count("globalTid")) {
      std::map<int64_t, std::pair<std::string, double>> launch;
      int64_t runtime_row = 0;
      db.each("SELECT correlationId, globalTid, start FROM CUPTI_ACTIVITY_KIND_RUNTIME", [&](sqlite3_stmt* st) {
        ++runtime_row;
        const double at = static_cast<double>(db.integer(st, 2, "CUPTI_ACTIVITY_KIND_RUNTIME", "start", runtime_row)) * 1e-9;
        launch[sqlite3_column_int64(st, 0)] = {Db::text(st, 1), at};
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
      const std::string text_sql = ncols.count("text") ? "n.text" : "NULL";
      const std::string id_sql = ncols.count("textId") ? "n.textId" : "NULL";
      int64_t nvtx_row = 0;
      db.each("SELECT n.start, n.\"end\", " + text_sql + ", n.globalTid, " + id_sql + " FROM NVTX_EVENTS n WHERE n.\"end\" IS NOT NULL",
              [&](sqlite3_stmt* st) {
                ++nvtx_row;
                const double a = static_cast<double>(db.integer(st, 0, "NVTX_EVENTS", "start", nvtx_row)) * 1e-9;
                const double b = static_cast<double>(db.integer(st, 1, "NVTX_EVENTS", "end", nvtx_row)) * 1e-9;
                if (!(b >= a)) return;
                const std::string text = sqlite3_column_type(st, 2) == SQLITE_NULL ? string_of(st, 4) : Db::text(st, 2);
                add_annotation_range(raw, a, b, text, Db::text(st, 3));
              });
    }
  }
  if (tables.count("ThreadNames") && strings) {
    const auto tcols = db.columns("ThreadNames");
    if (tcols.count("nameId") && tcols.count("globalTid"))
      db.each("SELECT t.globalTid, t.nameId FROM ThreadNames t", [&](sqlite3_stmt* st) { raw.thread_name[Db::text(st, 0)] = string_of(st, 1); });
  }
  return summarize_kernels(std::move(raw));
}

bool looks_like_trace(const std::string& bytes) {
  return is_sqlite_file(bytes) || is_nsight_json(bytes) || is_kineto_trace(bytes) || bytes.find("\"traceEvents\"") != std::string::npos;
}

KernelTrace read_measured_trace(const std::string& bytes, const std::string& path) {
  if (is_sqlite_file(bytes)) return read_nsight_sqlite(path);
  if (is_nsight_json(bytes)) return read_nsight_json(bytes, path);
  return read_kineto_trace(bytes, path);
}

}  // namespace ptdp
