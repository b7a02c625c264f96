// Fuzz target: the Nsight Systems SQLite reader (issues 23, 36). Two kinds of input:
//   - an SQLite file ("SQLite format 3\0…"): written to a file and read as an export;
//   - anything else: SQL, run into a fresh database that is then read as an export — crafted
//     schemas (views, recursive views, virtual tables, text or reals where times belong,
//     unindexed or duplicate string ids, triggers) that byte mutations of a file rarely reach.
// Any input must either read as a kernel trace or be refused with a ConfigError naming the file;
// anything else escaping, a crash, a hang (scripts/fuzz.sh: -timeout=10) or a sanitizer report is
// a finding. (SQLite itself is not instrumented: the target covers ptdp's queries and checks.)
#include <sqlite3.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.hpp"
#include "interop/nsight.hpp"

namespace {

std::string temp_path(const char* kind) {
  char name[64];
  std::snprintf(name, sizeof name, "/tmp/ptdp-fuzz-nsight-%s-XXXXXX", kind);
  const int fd = mkstemp(name);
  if (fd >= 0) close(fd);
  return name;
}

// Runs `sql` into a new database at `path`; the SQL's own work is bounded (a recursive CTE in an
// INSERT could fill the disk), its errors are ignored (what it created is read as it is).
void build(const std::string& path, const std::string& sql) {
  std::remove(path.c_str());
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) std::abort();
  int steps = 0;
  sqlite3_progress_handler(db, 1000, [](void* n) { return ++*static_cast<int*>(n) > 2000 ? 1 : 0; }, &steps);  // ~2M VM steps
  sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  sqlite3_close(db);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string file_path = temp_path("file"), sql_path = temp_path("sql");
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    if (ptdp::is_sqlite_file(bytes) || !ptdp::looks_like_trace(bytes)) {
      if (ptdp::is_sqlite_file(bytes)) {
        FILE* f = std::fopen(file_path.c_str(), "wb");
        if (!f) std::abort();
        if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
        std::fclose(f);
        (void)ptdp::read_measured_trace(bytes, file_path);
      } else {
        build(sql_path, bytes);
        FILE* f = std::fopen(sql_path.c_str(), "rb");
        std::string db;
        if (f) {
          char buf[65536];
          for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) db.append(buf, n);
          std::fclose(f);
        }
        if (ptdp::is_sqlite_file(db)) (void)ptdp::read_nsight_sqlite(sql_path);
      }
    }
  } catch (const ptdp::ConfigError&) {
  }
  return 0;
}
