// Nsight Systems SQLite and JSON exports (interop/nsight*.cpp): a small export written with SQLite in the
// tables and columns nsys writes (CUPTI_ACTIVITY_KIND_KERNEL, _RUNTIME, NVTX_EVENTS, StringIds,
// ThreadNames), read as the kernels of one GPU and classified as for a Kineto trace.
#include "interop/nsight.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.hpp"

namespace ptdp {
namespace {

// One training step of a 2-GPU export: on device 0 a forward GEMM launched by the main thread,
// a backward GEMM inside an NVTX "MmBackward0" range, one on the autograd thread, an NCCL
// all-reduce and a send/recv; device 1 has one kernel. Times in ns.
// The fuzz target's seed export, written as SQL once (tests/fuzz/nsight_seed.sql).
std::string export_sql() {
  std::ifstream in(std::string(PTDP_SOURCE_DIR) + "/tests/fuzz/nsight_seed.sql");
  std::ostringstream s;
  s << in.rdbuf();
  EXPECT_FALSE(s.str().empty()) << "tests/fuzz/nsight_seed.sql missing";
  return s.str();
}

std::string write_export(const std::string& name, const char* sql) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::remove(path.c_str());
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
  return path;
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Nsight, KernelsOfTheBusiestGpuClassedAsForKineto) {
  const std::string path = write_export("step.sqlite", export_sql().c_str());
  const std::string bytes = bytes_of(path);
  ASSERT_TRUE(is_sqlite_file(bytes));
  EXPECT_TRUE(looks_like_trace(bytes));
  const KernelTrace k = read_measured_trace(bytes, path);
  EXPECT_EQ(k.rank, 0);  // device 0: five kernels against device 1's one
  EXPECT_EQ(k.world_size, 2);
  EXPECT_EQ(k.kernels, 5);
  EXPECT_EQ(k.nccl_kernels, 2);
  ASSERT_EQ(k.events.size(), 5u);
  EXPECT_EQ(k.events[0].klass, "F");  // launched by the main thread outside any backward range
  EXPECT_EQ(k.events[1].klass, "B");  // launched inside the MmBackward0 range
  EXPECT_EQ(k.events[2].klass, "B");  // launched on the autograd thread
  EXPECT_EQ(k.events[3].klass, "nccl");
  EXPECT_EQ(k.events[4].klass, "pp");  // SendRecv
  EXPECT_NEAR(k.forward_s, 2e-6, 1e-12);
  EXPECT_NEAR(k.backward_s, 5e-6, 1e-12);
  EXPECT_NEAR(k.span_s, 14.5e-6, 1e-12);
  EXPECT_EQ(k.steps, 1);
  EXPECT_NEAR(k.iteration_s(), 40e-6, 1e-12);  // the ProfilerStep#3 range
  // Read-only: the export is not modified.
  EXPECT_EQ(bytes_of(path), bytes);
}

TEST(Nsight, AnExportWithoutKernelsOrNotSqliteSaysWhatWasExpected) {
  const std::string path = write_export("nokernels.sqlite", "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);");
  try {
    read_measured_trace(bytes_of(path), path);
    FAIL() << "an export without kernels accepted";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("--trace=cuda"), std::string::npos) << what;
  }
  const std::string bad = ::testing::TempDir() + "/truncated.sqlite";
  {
    std::ofstream(bad, std::ios::binary) << std::string("SQLite format 3\0", 16) << std::string(100, 'x');
  }
  EXPECT_THROW(read_measured_trace(bytes_of(bad), bad), ConfigError);
  const std::string empty = write_export("empty.sqlite",
                                         "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, \"end\" INTEGER, deviceId INTEGER);");
  EXPECT_THROW(read_measured_trace(bytes_of(empty), empty), ConfigError);
}

std::string refusal(const std::string& path) {
  try {
    read_measured_trace(bytes_of(path), path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

// Issue 36: crafted exports. A recursive view as the kernel table hung `compare` for minutes; it
// is refused as a view (the reader reads tables only).
TEST(Nsight, AViewAsTheKernelTableIsRefused) {
  const std::string path = write_export("view.sqlite",
                                        "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);"
                                        "CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS WITH RECURSIVE r(start, \"end\", deviceId) AS "
                                        "(SELECT 0, 1, 0 UNION ALL SELECT start + 1, \"end\" + 1, deviceId FROM r) SELECT * FROM r;");
  const std::string why = refusal(path);
  EXPECT_NE(why.find("CUPTI_ACTIVITY_KIND_KERNEL is a view, not a table"), std::string::npos) << why;
}

// Kernel times stored as text read as 0: refused, naming the column and row.
TEST(Nsight, TextWhereAnIntegerBelongsIsRefused) {
  const std::string path = write_export("text.sqlite",
                                        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, \"end\", deviceId INTEGER);"
                                        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1000, 2000, 0), ('3000ns', '4000ns', 0);");
  const std::string why = refusal(path);
  EXPECT_NE(why.find("CUPTI_ACTIVITY_KIND_KERNEL.start of row 2 is text ('3000ns'), not an integer"), std::string::npos) << why;
}

// 100 000 kernels with an unindexed string table: one scan of it (into memory), not one per
// kernel. Within a few seconds (it took over a minute).
TEST(Nsight, ManyKernelsWithAnUnindexedStringTableReadFast) {
  std::string sql =
      "CREATE TABLE StringIds (id INTEGER, value TEXT);"
      "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, \"end\" INTEGER, deviceId INTEGER, demangledName INTEGER);"
      "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000) "
      "INSERT INTO StringIds SELECT i, 'kernel_' || i FROM n;"
      "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000) "
      "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT i * 1000, i * 1000 + 500, 0, i FROM n;";
  const std::string path = write_export("many.sqlite", sql.c_str());
  const auto t0 = std::chrono::steady_clock::now();
  const KernelTrace k = read_measured_trace(bytes_of(path), path);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(k.kernels, 100000);
  EXPECT_LT(seconds, 10.0);
}

// The JSON export (nsys export --type json) of the same step as the SQLite seed, written by hand
// in nsys' record form (tests/fuzz/corpus/nsight_json/step.json): the same kernels, classes and
// times as the SQLite export, the memcpy skipped.
TEST(NsightJson, TheSameStepAsTheSqliteExportReadsTheSame) {
  const std::string path = std::string(PTDP_SOURCE_DIR) + "/tests/fuzz/corpus/nsight_json/step.json";
  const std::string bytes = bytes_of(path);
  ASSERT_TRUE(is_nsight_json(bytes));
  EXPECT_TRUE(looks_like_trace(bytes));
  const KernelTrace j = read_measured_trace(bytes, path);
  const std::string db = write_export("same.sqlite", export_sql().c_str());
  const KernelTrace s = read_measured_trace(bytes_of(db), db);
  EXPECT_EQ(j.rank, 0);
  EXPECT_EQ(j.world_size, 2);
  EXPECT_EQ(j.kernels, 5);
  EXPECT_EQ(j.nccl_kernels, 2);
  ASSERT_EQ(j.events.size(), s.events.size());
  for (size_t i = 0; i < j.events.size(); ++i) {
    EXPECT_EQ(j.events[i].klass, s.events[i].klass) << i;
    EXPECT_EQ(j.events[i].name, s.events[i].name) << i;
    EXPECT_DOUBLE_EQ(j.events[i].start_s, s.events[i].start_s) << i;
    EXPECT_DOUBLE_EQ(j.events[i].dur_s, s.events[i].dur_s) << i;
  }
  EXPECT_EQ(j.events[1].klass, "B");  // inside the MmBackward0 range
  EXPECT_EQ(j.events[2].klass, "B");  // on the autograd thread (thread names by string id)
  EXPECT_EQ(j.events[4].klass, "pp");
  EXPECT_NEAR(j.forward_s, 2e-6, 1e-12);
  EXPECT_NEAR(j.backward_s, 5e-6, 1e-12);
  EXPECT_EQ(j.steps, 1);
  EXPECT_NEAR(j.iteration_s(), 40e-6, 1e-12);  // ProfilerStep#3 by its TextId
}

std::string json_refusal(const std::string& text) {
  try {
    read_measured_trace(text, "t.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

// Numbers as JSON numbers (not protobuf's strings) and names inline read too; a Kineto trace on
// one line is not taken for an nsys export.
TEST(NsightJson, InlineNamesAndPlainNumbersRead) {
  const std::string text =
      "{\"Type\":48,\"CudaEvent\":{\"startNs\":1000,\"endNs\":3000,\"deviceId\":3,\"kernel\":{\"shortName\":\"gemm\"}}}\n"
      "{\"Type\":48,\"CudaEvent\":{\"startNs\":4000,\"endNs\":5000,\"deviceId\":3,\"kernel\":{\"shortName\":\"ncclKernel_AllGather\"}}}\n";
  const KernelTrace k = read_measured_trace(text, "t.json");
  EXPECT_EQ(k.rank, 3);
  EXPECT_EQ(k.kernels, 2);
  EXPECT_EQ(k.events[0].name, "gemm");
  EXPECT_NEAR(k.span_s, 4e-6, 1e-15);
  EXPECT_FALSE(is_nsight_json("{\"traceEvents\": [], \"Type\": 1}"));
  EXPECT_FALSE(is_nsight_json("{\n  \"traceEvents\": []\n}"));
}

// Bad input: the line and what was expected.
TEST(NsightJson, BadLinesAreRefusedByLine) {
  const std::string first = "{\"Type\":48,\"CudaEvent\":{\"startNs\":\"1\",\"endNs\":\"2\",\"kernel\":{}}}\n";
  std::string why = json_refusal(first + "{\"Type\":48,\"CudaEvent\":{\"startNs\":\"3000ns\",\"endNs\":\"4000\",\"kernel\":{}}}\n");
  EXPECT_NE(why.find("t.json:2"), std::string::npos) << why;
  EXPECT_NE(why.find("CudaEvent.startNs is \"3000ns\", not a non-negative integer of nanoseconds"), std::string::npos) << why;
  why = json_refusal(first + "{\"Type\":48,\"CudaEvent\":{\"startNs\":\"5\",\"kernel\":{}}}\n");
  EXPECT_NE(why.find("t.json:2"), std::string::npos) << why;
  EXPECT_NE(why.find("CudaEvent.endNs is missing"), std::string::npos) << why;
  why = json_refusal(first + "\n{\"Type\":48, oops\n");
  EXPECT_NE(why.find("t.json:3"), std::string::npos) << why;
  EXPECT_NE(why.find("not valid JSON"), std::string::npos) << why;
  why = json_refusal(first + "[1, 2]\n");
  EXPECT_NE(why.find("not a JSON object"), std::string::npos) << why;
  why = json_refusal(first + "{\"Type\":48,\"CudaEvent\":{\"startNs\":\"9\",\"endNs\":\"2\",\"kernel\":{}}}\n");
  EXPECT_NE(why.find("ends before it starts"), std::string::npos) << why;
  why = json_refusal("{\"Type\":27,\"CudaEvent\":{\"startNs\":\"1\",\"endNs\":\"2\",\"memcpy\":{}}}\n");
  EXPECT_NE(why.find("no CUDA kernel records"), std::string::npos) << why;
  EXPECT_NE(why.find("--trace=cuda"), std::string::npos) << why;
  EXPECT_NE(why.find("nsys export --type json"), std::string::npos) << why;
}

}  // namespace
}  // namespace ptdp
