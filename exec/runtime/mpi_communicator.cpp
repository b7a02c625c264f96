#include "exec/runtime/mpi_communicator.hpp"

#include "exec/runtime/cpu_time.hpp"
#include "model/grid.hpp"

#include <mpi.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <thread>

namespace ptdp::exec {
namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

#define PTDP_MPI_CHECK(call)                                                                                  \
  do {                                                                                                        \
    const int ptdp_rc_ = (call);                                                                              \
    if (ptdp_rc_ != MPI_SUCCESS)                                                                              \
      throw CommunicationError(std::string("MPI call ") + #call + " failed at " + __FILE__ + ":" +           \
                               std::to_string(__LINE__) + ": " + mpi_error_text(ptdp_rc_));                  \
  } while (0)

int world_rank_or_minus_one() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return -1;
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Polls a request until it completes. A waiting rank first polls (at least 64 times, and for
// g_spin_window), yielding between polls, then backs off to sleeping so that ranks sharing a
// core leave it to the ones computing. The window is a time: a peer a few microseconds late is
// the common case inside training, and a sleeping rank wakes up late. Measured on the 2-core VM
// with a peer 20 µs late: 190 µs lost per collective after 64 polls then sleeping, 1.5 µs with a
// 200 µs window. But spinning ranks slow the computing ones when there are more ranks than cores
// (4 ranks on 2 cores: 8–23% slower on most validate rows, one run each), so MpiSession sets the
// window (kSpinWindow) only when every rank of the host has a core.
// No progress within timeout_s → CommunicationError: a peer died or hangs, and MPI itself would
// wait forever.
constexpr auto kSpinWindow = std::chrono::microseconds(200);
std::chrono::microseconds g_spin_window{0};

void wait_request(MPI_Request& req, double timeout_s, const std::string& what) {
  // The CPU this wait burns (polls, the transport's copies) is communication, not computation.
  const CommCpuScope comm_cpu;
  int done = 0;
  PTDP_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
  if (done) return;
  const auto start = std::chrono::steady_clock::now();
  int sleeps = 0;
  for (int polls = 0;; ++polls) {
    if (polls < 64 || std::chrono::steady_clock::now() - start < g_spin_window) {
      std::this_thread::yield();
    } else {
      // 10 µs doubling to 40 µs: a consumer wakes at most ~40 µs after its data arrived. Non-
      // blocking collectives only progress inside MPI_Test, so every round of an all-reduce pays
      // this delay; longer sleeps (250 µs was measured) made tensor-parallel all-reduces 4× slower.
      const int us = std::min(40, 10 << std::min(sleeps++, 2));
      std::this_thread::sleep_for(std::chrono::microseconds(us));
    }
    PTDP_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.0f", timeout_s);
      throw CommunicationError("world rank " + std::to_string(world_rank_or_minus_one()) + ": " + what +
                               " made no progress for " + secs +
                               " s; a peer rank probably died or hangs (aborting the job)");
    }
  }
}

class MpiRequest final : public Request {
 public:
  MpiRequest(MPI_Request req, bool is_recv, double timeout_s, std::string what)
      : req_(req), is_recv_(is_recv), timeout_s_(timeout_s), what_(std::move(what)) {}
  ~MpiRequest() override {
    if (req_ != MPI_REQUEST_NULL && world_rank_or_minus_one() >= 0) {
      // Only reached on error paths (the job is being torn down): detach the request.
      if (is_recv_) MPI_Cancel(&req_);
      MPI_Request_free(&req_);
    }
  }
  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    const CommCpuScope comm_cpu;
    int done = 0;
    PTDP_MPI_CHECK(MPI_Test(&req_, &done, MPI_STATUS_IGNORE));
    return done != 0;
  }
  void wait() override {
    if (req_ == MPI_REQUEST_NULL) return;
    wait_request(req_, timeout_s_, what_);
  }

 private:
  MPI_Request req_;
  bool is_recv_;
  double timeout_s_;
  std::string what_;
};

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

constexpr size_t kMaxChunk = static_cast<size_t>(INT_MAX) / 2;
// All-reduces go in pieces, one after the other. Open MPI's non-blocking all-reduce slows down
// as the message outgrows the caches: 12.6 M floats (the small benchmark shape's gradients) took
// 58–62 ms in one call on 2 polling ranks of the dev machine, 25–27 ms in 4 MiB pieces, 17–19 ms
// in 256–512 KiB pieces and 23 ms in 64 KiB pieces (bench/mpi_allreduce_pieces.cpp). Ranks that sleep in their waits pay a wake-up
// per piece, so they take larger pieces (docs/BENCHMARKS.md).
size_t all_reduce_piece_bytes() { return g_spin_window.count() > 0 ? size_t{512} << 10 : size_t{4} << 20; }

// Several posted pieces of one non-blocking all-reduce, completed in the order posted.
class MpiPiecesRequest final : public Request {
 public:
  std::vector<std::unique_ptr<MpiRequest>> pieces;
  bool test() override {
    bool all = true;
    for (auto& p : pieces) all = p->test() && all;  // testing every piece progresses them all
    return all;
  }
  void wait() override {
    for (auto& p : pieces) p->wait();
  }
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, double timeout_s)
      : comm_(comm), name_(std::move(name)), timeout_s_(timeout_s) {
    PTDP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    PTDP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    PTDP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    int flag = 0;
    void* value = nullptr;
    PTDP_MPI_CHECK(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag));
    max_tag_ = flag ? *static_cast<int*>(value) : 32767;
  }
  ~MpiCommunicator() override {
    if (world_rank_or_minus_one() >= 0 && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  void all_reduce(float* data, size_t count, ReduceOp op) override { reduce_impl(data, count, MPI_FLOAT, op); }
  void all_reduce(double* data, size_t count, ReduceOp op) override { reduce_impl(data, count, MPI_DOUBLE, op); }
  std::unique_ptr<Request> start_all_reduce(float* data, size_t count, ReduceOp op) override {
    const CommCpuScope comm_cpu;
    auto request = std::make_unique<MpiPiecesRequest>();
    if (size_ == 1 || count == 0) return request;
    const size_t chunk = all_reduce_piece();
    for (size_t off = 0; off < count; off += chunk) {
      const size_t len = std::min(chunk, count - off);
      MPI_Request req;
      PTDP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data + off, static_cast<int>(len), MPI_FLOAT, to_mpi(op), comm_, &req));
      request->pieces.push_back(std::make_unique<MpiRequest>(req, false, timeout_s_, "all-reduce (bucket) over the " + name_));
    }
    return request;
  }
  size_t all_reduce_piece() const override { return std::max<size_t>(1, all_reduce_piece_bytes() / sizeof(float)); }
  void all_gather(const float* send, float* recv, size_t count) override {
    const CommCpuScope comm_cpu;
    if (size_ == 1) {
      if (send != recv) std::copy(send, send + count, recv);
      return;
    }
    PTDP_ASSERT(count <= kMaxChunk, "all-gather block too large for one MPI call");
    MPI_Request req;
    PTDP_MPI_CHECK(MPI_Iallgather(send, static_cast<int>(count), MPI_FLOAT, recv, static_cast<int>(count), MPI_FLOAT,
                                  comm_, &req));
    wait_request(req, timeout_s_, "all-gather over the " + name_);
  }
  void reduce_scatter(const float* send, float* recv, size_t count) override { start_reduce_scatter(send, recv, count)->wait(); }
  std::unique_ptr<Request> start_reduce_scatter(const float* send, float* recv, size_t count) override {
    return start_reduction(send, recv, count, "reduce-scatter over the " + name_, [&](MPI_Request* req) {
      return MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm_, req);
    });
  }
  std::unique_ptr<Request> start_gather_block(float* data, size_t count, int root) override {
    const CommCpuScope comm_cpu;
    const std::string what = "all-gather block (broadcast) over the " + name_;
    if (size_ == 1 || count == 0) return std::make_unique<MpiRequest>(MPI_REQUEST_NULL, false, timeout_s_, what);
    PTDP_ASSERT(count <= kMaxChunk, "all-gather block too large for one MPI call");
    MPI_Request req;
    PTDP_MPI_CHECK(MPI_Ibcast(data, static_cast<int>(count), MPI_FLOAT, root, comm_, &req));
    return std::make_unique<MpiRequest>(req, false, timeout_s_, what);
  }
  std::unique_ptr<Request> start_reduce_block(const float* send, float* recv, size_t count, int root) override {
    return start_reduction(send, recv, count, "reduce-scatter block (reduce) over the " + name_, [&](MPI_Request* req) {
      return MPI_Ireduce(send, rank_ == root ? recv : nullptr, static_cast<int>(count), MPI_FLOAT, MPI_SUM, root, comm_, req);
    });
  }
  void broadcast(void* bytes, size_t size, int root) override {
    const CommCpuScope comm_cpu;
    if (size_ == 1 || size == 0) return;
    for (size_t off = 0; off < size; off += kMaxChunk) {
      const size_t len = std::min(kMaxChunk, size - off);
      MPI_Request req;
      PTDP_MPI_CHECK(MPI_Ibcast(static_cast<char*>(bytes) + off, static_cast<int>(len), MPI_BYTE, root, comm_, &req));
      wait_request(req, timeout_s_, "broadcast over the " + name_);
    }
  }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine, int root) override {
    const CommCpuScope comm_cpu;
    long long my_size = static_cast<long long>(mine.size());
    std::vector<long long> sizes(rank_ == root ? size_ : 0);
    MPI_Request req;
    PTDP_MPI_CHECK(MPI_Igather(&my_size, 1, MPI_LONG_LONG, sizes.data(), 1, MPI_LONG_LONG, root, comm_, &req));
    wait_request(req, timeout_s_, "gather over the " + name_);
    std::vector<int> counts, displs;
    std::vector<char> all;
    if (rank_ == root) {
      long long total = 0;
      for (long long s : sizes) {
        displs.push_back(static_cast<int>(total));
        counts.push_back(static_cast<int>(s));
        total += s;
      }
      PTDP_ASSERT(total <= INT_MAX, "gathered data too large for one MPI call");
      all.resize(static_cast<size_t>(total));
    }
    PTDP_MPI_CHECK(MPI_Igatherv(mine.data(), static_cast<int>(mine.size()), MPI_BYTE, all.data(), counts.data(),
                                displs.data(), MPI_BYTE, root, comm_, &req));
    wait_request(req, timeout_s_, "gather over the " + name_);
    std::vector<std::vector<char>> out;
    if (rank_ == root)
      for (int r = 0; r < size_; ++r) out.emplace_back(all.begin() + displs[r], all.begin() + displs[r] + counts[r]);
    return out;
  }
  void barrier() override {
    const CommCpuScope comm_cpu;
    if (size_ == 1) return;
    MPI_Request req;
    PTDP_MPI_CHECK(MPI_Ibarrier(comm_, &req));
    wait_request(req, timeout_s_, "barrier of the " + name_);
  }
  std::unique_ptr<Request> isend(const float* data, size_t count, int peer, int tag) override {
    const CommCpuScope comm_cpu;
    PTDP_ASSERT(count <= kMaxChunk && tag >= 0 && tag <= max_tag_, "send too large or tag out of range");
    MPI_Request req;
    PTDP_MPI_CHECK(MPI_Isend(data, static_cast<int>(count), MPI_FLOAT, peer, tag, comm_, &req));
    return std::make_unique<MpiRequest>(req, false, timeout_s_,
                                        "send to member " + std::to_string(peer) + " of the " + name_);
  }
  std::unique_ptr<Request> irecv(float* data, size_t count, int peer, int tag) override {
    const CommCpuScope comm_cpu;
    PTDP_ASSERT(count <= kMaxChunk && tag >= 0 && tag <= max_tag_, "receive too large or tag out of range");
    MPI_Request req;
    PTDP_MPI_CHECK(MPI_Irecv(data, static_cast<int>(count), MPI_FLOAT, peer, tag, comm_, &req));
    return std::make_unique<MpiRequest>(req, true, timeout_s_,
                                        "receive from member " + std::to_string(peer) + " of the " + name_);
  }
  int max_tag() const override { return max_tag_; }

 private:
  // A non-blocking reduction of `count` floats into recv (≠ send), posted by `post`; a group of
  // one (or nothing to move) copies at once.
  template <typename Post>
  std::unique_ptr<Request> start_reduction(const float* send, float* recv, size_t count, const std::string& what, Post post) {
    const CommCpuScope comm_cpu;
    PTDP_ASSERT(send != recv, what + ": in place");
    if (size_ == 1 || count == 0) {
      if (count > 0) std::copy(send, send + count, recv);
      return std::make_unique<MpiRequest>(MPI_REQUEST_NULL, false, timeout_s_, what);
    }
    PTDP_ASSERT(count <= kMaxChunk, what + ": block too large for one MPI call");
    MPI_Request req;
    PTDP_MPI_CHECK(post(&req));
    return std::make_unique<MpiRequest>(req, false, timeout_s_, what);
  }

  void reduce_impl(void* data, size_t count, MPI_Datatype type, ReduceOp op) {
    const CommCpuScope comm_cpu;
    if (size_ == 1 || count == 0) return;
    int type_size = 0;
    MPI_Type_size(type, &type_size);
    const size_t chunk = std::max<size_t>(1, all_reduce_piece_bytes() / static_cast<size_t>(type_size));
    for (size_t off = 0; off < count; off += chunk) {
      const size_t len = std::min(chunk, count - off);
      MPI_Request req;
      PTDP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(data) + off * type_size, static_cast<int>(len),
                                    type, to_mpi(op), comm_, &req));
      wait_request(req, timeout_s_, "all-reduce over the " + name_);
    }
  }

  MPI_Comm comm_;
  std::string name_;
  double timeout_s_;
  int rank_ = 0, size_ = 1, max_tag_ = 32767;
};

}  // namespace

bool set_mpi_poll_first(bool poll_first) {
  const bool before = g_spin_window.count() > 0;
  g_spin_window = poll_first ? kSpinWindow : std::chrono::microseconds(0);
  // Polling first, sleeps end within ~1 µs of their time instead of Linux's default 50 µs timer
  // slack (a waiting rank's wake-up is on the critical path of a collective). Sleeping ranks keep
  // the default (0 = reset to it): with more ranks than cores, precise wake-ups took the
  // computing ranks' cores (4 ranks on 2 cores: up to 39% slower, t1p4d1 37 → 50 ms).
  ::prctl(PR_SET_TIMERSLACK, poll_first ? 1000UL : 0UL, 0UL, 0UL, 0UL);
  return before;
}

namespace {

void require_active() {
  if (!MpiSession::active())
    throw EnvironmentError("MPI is not initialised: create a ptdp::exec::MpiSession before training");
}

std::unique_ptr<Communicator> split(MPI_Comm parent, int color, int key, const std::string& name, double timeout_s) {
  MPI_Comm comm = MPI_COMM_NULL;
  PTDP_MPI_CHECK(MPI_Comm_split(parent, color, key, &comm));
  if (comm == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(comm, name, timeout_s);
}

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) throw EnvironmentError("MPI_Init_thread failed: " + mpi_error_text(rc));
    owns_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  // Spin before sleeping only when every rank of this host has a core of its own.
  MPI_Comm host;
  int host_ranks = size_;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host) == MPI_SUCCESS) {
    MPI_Comm_size(host, &host_ranks);
    MPI_Comm_free(&host);
  }
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  set_mpi_poll_first(cores > 0 && host_ranks <= cores);
}

MpiSession::~MpiSession() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (owns_ && !fin) MPI_Finalize();
}

void MpiSession::abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

bool MpiSession::active() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

std::unique_ptr<Communicator> make_mpi_world(double timeout_s) {
  require_active();
  MPI_Comm comm;
  PTDP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  return std::make_unique<MpiCommunicator>(comm, "world", timeout_s);
}

ProcessGroups make_mpi_groups(const GroupLayout& layout, double timeout_s) {
  const int t = layout.t, p = layout.p, d = layout.d, first_stage_rank = layout.first_stage_rank;
  const int last_stage_rank = layout.last_stage_rank < 0 ? p - 1 : layout.last_stage_rank;
  const int sharding_size = layout.sharding_size, context = layout.context, expert = layout.expert;
  const bool mirrored = layout.mirrored, moe = layout.moe;
  require_active();
  ProcessGroups g;
  g.world = make_mpi_world(timeout_s);
  PTDP_ASSERT(g.world->size() == t * p * d, "world size differs from t·p·d (validate before creating groups)");
  MPI_Comm world = MPI_COMM_WORLD;
  const RankCoordinates c = RankCoordinates::of(g.world->rank(), t, p, d);
  g.coords = c;
  PTDP_ASSERT(context >= 1 && d % context == 0, "the context size must divide the data × context ranks");
  const int etp = layout.expert_tensor > 0 ? layout.expert_tensor : t;
  const bool folded = etp != t;
  PTDP_ASSERT(expert >= 1 && (folded ? (t * d) % (etp * expert) == 0 : d % expert == 0),
              "the expert-parallel size must divide the data-parallel ranks (folded: expert-tensor × expert the stage's ranks)");
  PTDP_ASSERT(sharding_size >= 0 && sharding_size <= d && (sharding_size == 0 || d % sharding_size == 0),
              "the sharding group size must divide data");
  // Every group's members, colour and rank come from the one process grid (model/grid.hpp); `d`
  // counts data × context.
  const bool reshard = layout.reshard_size > 1 && layout.reshard_size < sharding_size;
  PTDP_ASSERT(!reshard || sharding_size % layout.reshard_size == 0, "the reshard group size must divide the sharding group's");
  const ProcessGrid grid(t, context, d / context, p, expert, etp, sharding_size > 0 ? sharding_size : 1,
                         reshard ? layout.reshard_size : 0);
  const int64_t me = g.world->rank();
  auto group = [&](CommGroup kind, const std::string& name) {
    return split(world, static_cast<int>(grid.color(kind, me)), static_cast<int>(grid.index_in(kind, me)), name, timeout_s);
  };
  g.tensor = group(CommGroup::Tensor, "tensor-parallel group");
  g.pipeline = group(CommGroup::Pipeline, "pipeline-parallel group");
  g.data = group(CommGroup::Gradient, "data-parallel group");
  g.model = group(CommGroup::Model, "model-parallel group");
  // Pairs of pipeline ranks (the tied embedding's two copies; DualPipe's mirror): coloured by
  // their lower member, ranked by pipeline rank.
  auto pair = [&](bool member, int other_pp, const std::string& name) {
    const int color = member ? static_cast<int>(grid.members(CommGroup::Pair, me, other_pp).front()) : MPI_UNDEFINED;
    return split(world, color, c.pp, name, timeout_s);
  };
  const bool in_embedding =
      first_stage_rank != last_stage_rank && (c.pp == first_stage_rank || c.pp == last_stage_rank);
  g.embedding = pair(in_embedding, c.pp == first_stage_rank ? last_stage_rank : first_stage_rank, "embedding group");
  if (sharding_size > 0) {
    g.sharding = group(CommGroup::Sharding, "sharding group");
    if (sharding_size < d) g.replicas = group(CommGroup::ShardReplicas, "sharding replica group");
    if (reshard) g.reshard = group(CommGroup::Reshard, "reshard group");
  }
  if (context > 1) g.context = group(CommGroup::Context, "context-parallel group");
  if (expert > 1) g.expert = group(CommGroup::Expert, "expert-parallel group");
  if (expert > 1 || folded) g.expert_data = group(CommGroup::ExpertData, "expert-data-parallel group");
  if (moe && (t > 1 || folded)) {
    g.expert_tensor = group(CommGroup::ExpertTensor, "expert-tensor-parallel group");
    g.expert_model = group(CommGroup::ExpertModel, "expert-model-parallel group");
  }
  if (mirrored) {
    PTDP_ASSERT(p % 2 == 0, "mirrored pipeline ranks pair r with p − 1 − r: p must be even");
    g.mirror = pair(true, p - 1 - c.pp, "mirror group");
  }
  return g;
}

}  // namespace ptdp::exec
