// NCCL process groups (see make_nccl_groups in exec/runtime/cuda/cuda.hpp).
//
// Each group wraps the MPI communicator of the same members: device buffers go through NCCL on
// the group's own stream, host buffers (the executor's scalars, bytes, barriers) through MPI.
// Communicators are non-blocking (ncclConfig_t::blocking = 0): every call is followed by a poll of
// ncclCommGetAsyncError with a deadline, so a dead or hung peer ends in CommunicationError (and
// ncclCommAbort, which stops the communicator's kernels) instead of a hang.
//
// Pipeline transfers. NCCL runs the operations of one communicator in the order they were
// issued, and a send completes only once its receive was posted. Megatron's 1F1B has pipeline
// rank r send an activation forward while rank r+1 sends a gradient backward; on one
// communicator (one queue per rank) the two sends can wait for each other forever. So each
// ordered pair of neighbouring pipeline ranks (r → r±1 mod p) gets its own two-rank communicator
// and stream, used in one direction only: transfers between a pair then run in posting order,
// as NCCL channels do (and as the simulator models them), and the two directions are independent.
// Each transfer is one ncclGroupStart/End holding a 16-byte header (tag, count) and the payload;
// the receiver checks the header, so a schedule whose sends and receives between a pair are not
// posted in the same order fails with a message instead of delivering the wrong tensor.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <thread>

#include "exec/runtime/cuda/check.hpp"
#include "exec/runtime/cuda/cuda_device.hpp"
#include "model/grid.hpp"

namespace ptdp::exec::cuda {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Polling with back-off: yield first, then sleep up to 1 ms (ranks may share cores).
void pause(int polls) {
  if (polls < 64) std::this_thread::yield();
  else std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 20 << std::min(polls - 64, 6))));
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", s);
  return buf;
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

bool on_device(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

ncclConfig_t nonblocking_config(const char* name) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.blocking = 0;
  c.commName = name;
  return c;
}

// One NCCL communicator and the stream its operations run on.
class NcclQueue {
 public:
  NcclQueue(ncclComm_t comm, std::string what, double timeout_s) : comm_(comm), what_(std::move(what)), timeout_s_(timeout_s) {
    PTDP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclQueue() {
    if (comm_ != nullptr && !aborted_) {
      // Finalise (flushes outstanding work; non-blocking), bounded by the timeout, then free.
      ncclResult_t st = ncclCommFinalize(comm_);
      const auto t0 = Clock::now();
      for (int polls = 0; st == ncclInProgress && seconds_since(t0) < timeout_s_; ++polls) {
        pause(polls);
        if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) break;
      }
      if (st == ncclSuccess) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  NcclQueue(const NcclQueue&) = delete;
  NcclQueue& operator=(const NcclQueue&) = delete;

  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  const std::string& what() const { return what_; }
  double timeout_s() const { return timeout_s_; }

  /// Waits until the last call on the communicator left the in-progress state.
  void wait_ready(const char* during) {
    const auto t0 = Clock::now();
    for (int polls = 0;; ++polls) {
      ncclResult_t st = ncclSuccess;
      PTDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &st));
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) throw_nccl_error(st, during, __FILE__, __LINE__);
      if (seconds_since(t0) > timeout_s_) fail_timeout(during);
      pause(polls);
    }
  }

  /// Waits for `event` (recorded on the stream after an operation), with the deadline.
  void wait_event(cudaEvent_t event, const std::string& during) {
    const auto t0 = Clock::now();
    for (int polls = 0;; ++polls) {
      if (poll_event(event)) return;
      if (seconds_since(t0) > timeout_s_) fail_timeout(during);
      pause(polls);
    }
  }

  /// True once `event` completed; throws on a CUDA or an asynchronous NCCL error.
  bool poll_event(cudaEvent_t event) {
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) throw_cuda_error(rc, "cudaEventQuery(event)", __FILE__, __LINE__);
    ncclResult_t st = ncclSuccess;
    PTDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &st));
    if (st != ncclSuccess && st != ncclInProgress) throw_nccl_error(st, ("operation on the " + what_).c_str(), __FILE__, __LINE__);
    return false;
  }

  [[noreturn]] void fail_timeout(const std::string& during) {
    ncclCommAbort(comm_);  // ends the communicator's kernels: the stream can drain
    aborted_ = true;
    const std::optional<int> world = world_rank_from_environment();
    throw CommunicationError((world ? "world rank " + std::to_string(*world) + ": " : std::string()) + during +
                             " on the " + what_ + " made no progress for " + seconds_text(timeout_s_) +
                             " s; a peer rank probably died or hangs (aborting the job)");
  }

 private:
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::string what_;
  double timeout_s_;
  bool aborted_ = false;
};

// A cudaEvent_t owned by one operation.
class Event {
 public:
  Event() { PTDP_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// One direction of one pair of pipeline ranks: a two-rank communicator and 16-byte headers
// (tag, count) in pinned host and in device memory, one slot per transfer in flight.
class P2pChannel {
 public:
  static constexpr int kSlots = 4096;

  P2pChannel(ncclComm_t comm, int peer_in_pair, std::string what, double timeout_s)
      : queue_(comm, std::move(what), timeout_s), peer_(peer_in_pair) {
    PTDP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_), 2 * kSlots * sizeof(int64_t)));
    PTDP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_), 2 * kSlots * sizeof(int64_t)));
    for (int i = kSlots - 1; i >= 0; --i) free_.push_back(i);
  }
  ~P2pChannel() {
    cudaStreamSynchronize(queue_.stream());
    if (host_ != nullptr) cudaFreeHost(host_);
    if (device_ != nullptr) cudaFree(device_);
  }
  NcclQueue& queue() { return queue_; }
  int peer() const { return peer_; }
  int64_t* host_slot(int s) { return host_ + 2 * s; }
  int64_t* device_slot(int s) { return device_ + 2 * s; }
  int take_slot() {
    if (free_.empty())
      throw InternalError("more than " + std::to_string(kSlots) + " transfers in flight on the " + queue_.what());
    const int s = free_.back();
    free_.pop_back();
    return s;
  }
  void give_back(int s) { free_.push_back(s); }

 private:
  NcclQueue queue_;
  int peer_;
  int64_t* host_ = nullptr;
  int64_t* device_ = nullptr;
  std::vector<int> free_;
};

class NcclRequest final : public Request {
 public:
  // expected_tag < 0: a send (nothing to check on completion).
  NcclRequest(P2pChannel& ch, int slot, int64_t expected_tag, int64_t expected_count, std::string what)
      : ch_(ch), slot_(slot), tag_(expected_tag), count_(expected_count), what_(std::move(what)) {
    PTDP_CUDA_CHECK(cudaEventRecord(done_.get(), ch.queue().stream()));
  }
  bool test() override {
    if (finished_) return true;
    if (!ch_.queue().poll_event(done_.get())) return false;
    finish();
    return true;
  }
  void wait() override {
    if (finished_) return;
    ch_.queue().wait_event(done_.get(), what_);
    finish();
  }
  // An unfinished request (error paths) keeps its header slot: it may still be written.

 private:
  void finish() {
    finished_ = true;
    const int64_t got_tag = ch_.host_slot(slot_)[0], got_count = ch_.host_slot(slot_)[1];
    ch_.give_back(slot_);
    // Only this rank sees it, and its peers may already wait for what follows: the job must stop.
    if (tag_ >= 0 && (got_tag != tag_ || got_count != count_))
      throw CommunicationError(what_ + " expected the transfer with tag " + std::to_string(tag_) + " (" +
                          std::to_string(count_) + " floats), but the sender's next transfer was tag " +
                          std::to_string(got_tag) + " (" + std::to_string(got_count) +
                          " floats): NCCL matches the transfers between two ranks in posting order, so a "
                          "schedule must post its sends and receives between each pair in the same order");
  }

  P2pChannel& ch_;
  int slot_;
  int64_t tag_, count_;
  std::string what_;
  Event done_;
  bool finished_ = false;
};

// A collective started on a group's stream (start_all_gather): done when its event is.
class CollectiveRequest final : public Request {
 public:
  CollectiveRequest(NcclQueue& queue, std::string what) : queue_(queue), what_(std::move(what)) {
    PTDP_CUDA_CHECK(cudaEventRecord(done_.get(), queue.stream()));
  }
  bool test() override { return finished_ || (finished_ = queue_.poll_event(done_.get())); }
  void wait() override {
    if (finished_) return;
    queue_.wait_event(done_.get(), what_);
    finished_ = true;
  }

 private:
  NcclQueue& queue_;
  std::string what_;
  Event done_;
  bool finished_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(CudaDevice& dev, std::unique_ptr<Communicator> mpi, ncclComm_t comm, double timeout_s)
      : dev_(dev), mpi_(std::move(mpi)) {
    if (comm != nullptr) queue_ = std::make_unique<NcclQueue>(comm, mpi_->name(), timeout_s);
  }

  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  const std::string& name() const override { return mpi_->name(); }

  void all_reduce(float* data, size_t count, ReduceOp op) override {
    if (!on_device(data)) return mpi_->all_reduce(data, count, op);
    reduce_on_device(data, count, ncclFloat, op);
  }
  void all_reduce(double* data, size_t count, ReduceOp op) override {
    if (!on_device(data)) return mpi_->all_reduce(data, count, op);
    reduce_on_device(data, count, ncclDouble, op);
  }
  void all_gather(const float* send, float* recv, size_t count) override {
    if (!on_device(recv)) return mpi_->all_gather(send, recv, count);
    if (size() == 1) {
      if (send != recv) dev_.copy(send, recv, count);
      return;
    }
    run("all-gather", [&](ncclComm_t c, cudaStream_t s) {
      PTDP_NCCL_CHECK(ncclAllGather(send, recv, count, ncclFloat, c, s));
    });
  }
  // Stage-3 prefetch: the gather runs on this group's stream after the compute queued so far,
  // while the compute stream goes on with the current unit.
  std::unique_ptr<Request> start_all_gather(const float* send, float* recv, size_t count) override {
    if (!on_device(recv) || size() == 1) return Communicator::start_all_gather(send, recv, count);
    PTDP_ASSERT(queue_ != nullptr, "no NCCL communicator for the " + name());
    dev_.order_after_compute(queue_->stream());
    PTDP_NCCL_CHECK(ncclAllGather(send, recv, count, ncclFloat, queue_->comm(), queue_->stream()));
    queue_->wait_ready("all-gather");
    return std::make_unique<CollectiveRequest>(*queue_, "all-gather over the " + name());
  }
  // The backward's input-gradient collectives (exec/model/layers.cpp): started on this group's
  // stream after the compute queued so far (the input-gradient GEMM that produced the data),
  // while the compute stream runs the weight-gradient GEMM; wait() blocks the host on the
  // collective's event before anything reads the result (compiled; no GPU has run it here).
  std::unique_ptr<Request> start_all_reduce(float* data, size_t count, ReduceOp op) override {
    if (!on_device(data) || size() == 1 || count == 0) return Communicator::start_all_reduce(data, count, op);
    PTDP_ASSERT(queue_ != nullptr, "no NCCL communicator for the " + name());
    dev_.order_after_compute(queue_->stream());
    PTDP_NCCL_CHECK(ncclAllReduce(data, data, count, ncclFloat, to_nccl(op), queue_->comm(), queue_->stream()));
    queue_->wait_ready("all-reduce");
    return std::make_unique<CollectiveRequest>(*queue_, "all-reduce over the " + name());
  }
  std::unique_ptr<Request> start_reduce_scatter(const float* send, float* recv, size_t count) override {
    if (!on_device(recv) || size() == 1 || count == 0) return Communicator::start_reduce_scatter(send, recv, count);
    PTDP_ASSERT(queue_ != nullptr, "no NCCL communicator for the " + name());
    dev_.order_after_compute(queue_->stream());
    PTDP_NCCL_CHECK(ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, queue_->comm(), queue_->stream()));
    queue_->wait_ready("reduce-scatter");
    return std::make_unique<CollectiveRequest>(*queue_, "reduce-scatter over the " + name());
  }
  // tp_comm_overlap's blocks: on this group's stream, each done when its event is (compiled; no
  // GPU has run it here).
  std::unique_ptr<Request> start_gather_block(float* data, size_t count, int root) override {
    if (!on_device(data)) return mpi_->start_gather_block(data, count, root);
    if (size() == 1 || count == 0) return Communicator::start_gather_block(data, count, root);
    PTDP_ASSERT(queue_ != nullptr, "no NCCL communicator for the " + name());
    dev_.order_after_compute(queue_->stream());
    PTDP_NCCL_CHECK(ncclBroadcast(data, data, count, ncclFloat, root, queue_->comm(), queue_->stream()));
    queue_->wait_ready("broadcast");
    return std::make_unique<CollectiveRequest>(*queue_, "all-gather block over the " + name());
  }
  std::unique_ptr<Request> start_reduce_block(const float* send, float* recv, size_t count, int root) override {
    if (!on_device(send)) return mpi_->start_reduce_block(send, recv, count, root);
    if (size() == 1 || count == 0) return Communicator::start_reduce_block(send, recv, count, root);
    PTDP_ASSERT(queue_ != nullptr, "no NCCL communicator for the " + name());
    dev_.order_after_compute(queue_->stream());
    PTDP_NCCL_CHECK(ncclReduce(send, recv, count, ncclFloat, ncclSum, root, queue_->comm(), queue_->stream()));
    queue_->wait_ready("reduce");
    return std::make_unique<CollectiveRequest>(*queue_, "reduce-scatter block over the " + name());
  }
  void reduce_scatter(const float* send, float* recv, size_t count) override {
    if (!on_device(recv)) return mpi_->reduce_scatter(send, recv, count);
    if (size() == 1) {
      dev_.copy(send, recv, count);
      return;
    }
    run("reduce-scatter", [&](ncclComm_t c, cudaStream_t s) {
      PTDP_NCCL_CHECK(ncclReduceScatter(send, recv, count, ncclFloat, ncclSum, c, s));
    });
  }
  // Expert-parallel all-to-all: one NCCL group of a send and a receive per member (compiled; no
  // GPU has run it here).
  void all_to_all_v(const float* send, const std::vector<size_t>& send_counts, float* recv,
                    const std::vector<size_t>& recv_counts) override {
    if (!on_device(recv)) return mpi_->all_to_all_v(send, send_counts, recv, recv_counts);
    const int n = size();
    PTDP_ASSERT(static_cast<int>(send_counts.size()) == n && static_cast<int>(recv_counts.size()) == n,
                "all-to-all needs a count per member of the " + name());
    if (n == 1) {
      if (send_counts[0] > 0 && send != recv) dev_.copy(send, recv, send_counts[0]);
      return;
    }
    run("all-to-all", [&](ncclComm_t c, cudaStream_t s) {
      PTDP_NCCL_CHECK(ncclGroupStart());
      size_t sent = 0, received = 0;
      for (int r = 0; r < n; ++r) {
        const auto k = static_cast<size_t>(r);
        if (send_counts[k] > 0) PTDP_NCCL_CHECK(ncclSend(send + sent, send_counts[k], ncclFloat, r, c, s));
        if (recv_counts[k] > 0) PTDP_NCCL_CHECK(ncclRecv(recv + received, recv_counts[k], ncclFloat, r, c, s));
        sent += send_counts[k];
        received += recv_counts[k];
      }
      PTDP_NCCL_CHECK(ncclGroupEnd());
    });
  }
  void broadcast(void* bytes, size_t size_bytes, int root) override {
    if (size() == 1 || size_bytes == 0) return;
    if (!on_device(bytes)) return mpi_->broadcast(bytes, size_bytes, root);
    run("broadcast", [&](ncclComm_t c, cudaStream_t s) {
      PTDP_NCCL_CHECK(ncclBroadcast(bytes, bytes, size_bytes, ncclChar, root, c, s));
    });
  }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine, int root) override {
    return mpi_->gather_bytes(mine, root);
  }
  void barrier() override { mpi_->barrier(); }

  std::unique_ptr<Request> isend(const float* data, size_t count, int peer, int tag) override {
    if (!on_device(data)) return mpi_->isend(data, count, peer, tag);
    P2pChannel& ch = channel(send_, peer, "send to");
    const int slot = ch.take_slot();
    ch.host_slot(slot)[0] = tag;
    ch.host_slot(slot)[1] = static_cast<int64_t>(count);
    NcclQueue& q = ch.queue();
    dev_.order_after_compute(q.stream());
    PTDP_CUDA_CHECK(cudaMemcpyAsync(ch.device_slot(slot), ch.host_slot(slot), 2 * sizeof(int64_t),
                                    cudaMemcpyHostToDevice, q.stream()));
    PTDP_NCCL_CHECK(ncclGroupStart());
    PTDP_NCCL_CHECK(ncclSend(ch.device_slot(slot), 2, ncclInt64, ch.peer(), q.comm(), q.stream()));
    PTDP_NCCL_CHECK(ncclSend(data, count, ncclFloat, ch.peer(), q.comm(), q.stream()));
    PTDP_NCCL_CHECK(ncclGroupEnd());
    q.wait_ready("ncclSend");
    return std::make_unique<NcclRequest>(ch, slot, -1, static_cast<int64_t>(count),
                                         "send to member " + std::to_string(peer) + " of the " + name());
  }
  std::unique_ptr<Request> irecv(float* data, size_t count, int peer, int tag) override {
    if (!on_device(data)) return mpi_->irecv(data, count, peer, tag);
    P2pChannel& ch = channel(recv_, peer, "receive from");
    const int slot = ch.take_slot();
    NcclQueue& q = ch.queue();
    dev_.order_after_compute(q.stream());  // the buffer may have been in use by compute until now
    PTDP_NCCL_CHECK(ncclGroupStart());
    PTDP_NCCL_CHECK(ncclRecv(ch.device_slot(slot), 2, ncclInt64, ch.peer(), q.comm(), q.stream()));
    PTDP_NCCL_CHECK(ncclRecv(data, count, ncclFloat, ch.peer(), q.comm(), q.stream()));
    PTDP_NCCL_CHECK(ncclGroupEnd());
    q.wait_ready("ncclRecv");
    PTDP_CUDA_CHECK(cudaMemcpyAsync(ch.host_slot(slot), ch.device_slot(slot), 2 * sizeof(int64_t),
                                    cudaMemcpyDeviceToHost, q.stream()));
    return std::make_unique<NcclRequest>(ch, slot, tag, static_cast<int64_t>(count),
                                         "receive from member " + std::to_string(peer) + " of the " + name());
  }
  int max_tag() const override { return mpi_->max_tag(); }

  /// Adds the channel for transfers to (`sending`) or from pipeline member `peer`.
  void add_channel(bool sending, int peer, std::unique_ptr<P2pChannel> ch) {
    (sending ? send_ : recv_)[peer] = std::move(ch);
  }
  NcclQueue* queue() { return queue_.get(); }

 private:
  P2pChannel& channel(std::map<int, std::unique_ptr<P2pChannel>>& channels, int peer, const char* verb) {
    auto it = channels.find(peer);
    if (it == channels.end())
      throw EnvironmentError("the NCCL " + name() + " has no channel to " + verb + " member " + std::to_string(peer) +
                             " (member " + std::to_string(rank()) +
                             "): the cuda executor transfers between neighbouring pipeline ranks only");
    return *it->second;
  }

  template <class Op>
  void run(const char* what, Op&& op) {
    PTDP_ASSERT(queue_ != nullptr, std::string("no NCCL communicator for the ") + name());
    dev_.order_after_compute(queue_->stream());
    op(queue_->comm(), queue_->stream());
    queue_->wait_ready(what);
    Event done;
    PTDP_CUDA_CHECK(cudaEventRecord(done.get(), queue_->stream()));
    queue_->wait_event(done.get(), what);
  }

  void reduce_on_device(void* data, size_t count, ncclDataType_t type, ReduceOp op) {
    if (size() == 1 || count == 0) return;
    run("all-reduce", [&](ncclComm_t c, cudaStream_t s) {
      PTDP_NCCL_CHECK(ncclAllReduce(data, data, count, type, to_nccl(op), c, s));
    });
  }

  CudaDevice& dev_;
  std::unique_ptr<Communicator> mpi_;
  std::unique_ptr<NcclQueue> queue_;  // null for groups of one
  std::map<int, std::unique_ptr<P2pChannel>> send_, recv_;  // by pipeline member
};

// Waits for a communicator created by a non-blocking init or split.
void wait_created(ncclComm_t comm, double timeout_s, const std::string& what) {
  const auto t0 = Clock::now();
  for (int polls = 0;; ++polls) {
    ncclResult_t st = ncclSuccess;
    PTDP_NCCL_CHECK(ncclCommGetAsyncError(comm, &st));
    if (st == ncclSuccess) return;
    if (st != ncclInProgress) throw_nccl_error(st, ("creating the NCCL " + what).c_str(), __FILE__, __LINE__);
    if (seconds_since(t0) > timeout_s) {
      ncclCommAbort(comm);
      throw CommunicationError("creating the NCCL " + what + " made no progress for " + seconds_text(timeout_s) +
                               " s; a peer rank probably died or hangs (aborting the job)");
    }
    pause(polls);
  }
}

// ncclCommSplit of `parent` (collective over it); null for NCCL_SPLIT_NOCOLOR.
ncclComm_t split(NcclQueue& parent, int color, int key, const char* name, double timeout_s) {
  ncclConfig_t config = nonblocking_config(name);
  ncclComm_t comm = nullptr;
  PTDP_NCCL_CHECK(ncclCommSplit(parent.comm(), color, key, &comm, &config));
  parent.wait_ready("ncclCommSplit");
  if (comm != nullptr) wait_created(comm, timeout_s, name);
  return comm;
}

// The 2-rank channels between neighbouring pipeline ranks, one per direction: pairs
// {k, k+1 mod p} are created in rounds of disjoint pairs (even k, odd k, and the pair {p−1, 0}
// alone when p is odd), each round twice (k → k+1, then k+1 → k). Right after its creation a
// channel carries one transfer, so that NCCL connects the pair now rather than at the first
// training transfer (which would then wait for the peer to reach its receive).
void add_pipeline_channels(NcclCommunicator& pipeline, double timeout_s) {
  const int p = pipeline.size(), r = pipeline.rank();
  if (p < 2) return;
  const int pairs = p == 2 ? 1 : p;
  auto round_of = [&](int k) { return (p % 2 == 1 && k == p - 1) ? 2 : k % 2; };
  constexpr size_t kWarmupFloats = size_t{1} << 20;
  float* warmup = nullptr;
  PTDP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&warmup), kWarmupFloats * sizeof(float)));
  struct Free {
    float* p;
    ~Free() { cudaFree(p); }
  } free_warmup{warmup};
  for (int round = 0; round < 3; ++round) {
    bool used = false;
    int mine = -1;  // my pair's k in this round
    for (int k = 0; k < pairs; ++k) {
      if (round_of(k) != round) continue;
      used = true;
      if (r == k || r == (k + 1) % p) mine = k;
    }
    if (!used) continue;
    for (int upward = 1; upward >= 0; --upward) {
      const int low = mine, high = mine < 0 ? -1 : (mine + 1) % p;
      const char* name = upward ? "pipeline channel k -> k+1" : "pipeline channel k+1 -> k";
      ncclComm_t comm = split(*pipeline.queue(), mine < 0 ? NCCL_SPLIT_NOCOLOR : mine, r == low ? 0 : 1, name, timeout_s);
      if (comm == nullptr) continue;
      const bool sending = (r == low) == (upward == 1);
      const int peer = r == low ? high : low;
      const std::string what = "pipeline channel " + std::to_string(sending ? r : peer) + " -> " +
                               std::to_string(sending ? peer : r) + " of the " + pipeline.name();
      auto ch = std::make_unique<P2pChannel>(comm, r == low ? 1 : 0, what, timeout_s);
      NcclQueue& q = ch->queue();
      PTDP_NCCL_CHECK(ncclGroupStart());
      if (sending) PTDP_NCCL_CHECK(ncclSend(warmup, kWarmupFloats, ncclFloat, ch->peer(), q.comm(), q.stream()));
      else PTDP_NCCL_CHECK(ncclRecv(warmup, kWarmupFloats, ncclFloat, ch->peer(), q.comm(), q.stream()));
      PTDP_NCCL_CHECK(ncclGroupEnd());
      q.wait_ready("connecting the pipeline channel");
      Event done;
      PTDP_CUDA_CHECK(cudaEventRecord(done.get(), q.stream()));
      q.wait_event(done.get(), "connecting the pipeline channel");
      pipeline.add_channel(sending, peer, std::move(ch));
    }
  }
}

}  // namespace

ProcessGroups make_nccl_groups(Device& device, ProcessGroups mpi, double timeout_s) {
  CudaDevice* dev = as_cuda_device(device);
  PTDP_ASSERT(dev != nullptr, "make_nccl_groups needs the cuda device of this rank (got '" +
                                  std::string(device.name()) + "')");
  PTDP_ASSERT(mpi.world && mpi.tensor && mpi.pipeline && mpi.data && mpi.model, "incomplete MPI process groups");
  PTDP_CUDA_CHECK(cudaSetDevice(dev->ordinal()));
  const RankCoordinates c = mpi.coords;

  // The world communicator: rank 0's unique id, broadcast over MPI.
  ncclUniqueId id{};
  if (mpi.world->rank() == 0) PTDP_NCCL_CHECK(ncclGetUniqueId(&id));
  mpi.world->broadcast(&id, sizeof id, 0);
  ncclConfig_t config = nonblocking_config("world");
  ncclComm_t world_comm = nullptr;
  PTDP_NCCL_CHECK(ncclCommInitRankConfig(&world_comm, mpi.world->size(), id, mpi.world->rank(), &config));
  wait_created(world_comm, timeout_s, "world communicator");

  ProcessGroups g;
  g.coords = c;
  auto world = std::make_unique<NcclCommunicator>(*dev, std::move(mpi.world), world_comm, timeout_s);
  NcclQueue& parent = *world->queue();
  // The groups of make_mpi_groups, from the same process grid (model/grid.hpp; `d` counts data ×
  // context, the sharding group's size is the MPI group's); groups of one need no NCCL communicator.
  const ProcessGrid grid(c.t, 1, c.d, c.p, 1, c.t, mpi.sharding ? mpi.sharding->size() : 1, mpi.reshard ? mpi.reshard->size() : 0);
  const int64_t me = world->rank();
  auto color = [&](CommGroup kind) { return static_cast<int>(grid.color(kind, me)); };
  auto key = [&](CommGroup kind) { return static_cast<int>(grid.index_in(kind, me)); };
  auto group = [&](std::unique_ptr<Communicator> m, bool member, int color, int key, const char* name) {
    ncclComm_t comm = split(parent, member ? color : NCCL_SPLIT_NOCOLOR, key, name, timeout_s);
    if (!m) return std::unique_ptr<NcclCommunicator>();
    return std::make_unique<NcclCommunicator>(*dev, std::move(m), comm, timeout_s);
  };
  auto group_or_single = [&](std::unique_ptr<Communicator> m, int size, int color, int key, const char* name) {
    if (size == 1) return std::make_unique<NcclCommunicator>(*dev, std::move(m), nullptr, timeout_s);
    return group(std::move(m), true, color, key, name);
  };
  g.tensor = group_or_single(std::move(mpi.tensor), c.t, color(CommGroup::Tensor), key(CommGroup::Tensor), "tensor-parallel group");
  auto pipeline =
      group_or_single(std::move(mpi.pipeline), c.p, color(CommGroup::Pipeline), key(CommGroup::Pipeline), "pipeline-parallel group");
  add_pipeline_channels(*pipeline, timeout_s);
  g.pipeline = std::move(pipeline);
  g.data = group_or_single(std::move(mpi.data), c.d, color(CommGroup::Gradient), key(CommGroup::Gradient), "data-parallel group");
  g.model = group_or_single(std::move(mpi.model), c.t * c.p, color(CommGroup::Model), key(CommGroup::Model), "model-parallel group");
  // Every rank joins the embedding split when any rank is a member (the members are the first and
  // last pipeline ranks, which exist exactly when the MPI embedding groups do).
  double any_member = mpi.embedding ? 1.0 : 0.0;
  g.world = std::move(world);
  g.world->all_reduce(&any_member, 1, ReduceOp::Max);  // host value: over MPI
  if (any_member > 0) {
    const bool member = mpi.embedding != nullptr;
    g.embedding = group(std::move(mpi.embedding), member, c.tp + c.t * c.dp, c.pp, "embedding group");
  }
  // Sharded data parallelism: the same colours as make_mpi_groups (every rank has the sharding
  // group when any has; the replica group exists on every rank or none).
  if (mpi.sharding) {
    const int n = mpi.sharding->size();
    g.sharding = group_or_single(std::move(mpi.sharding), n, color(CommGroup::Sharding), key(CommGroup::Sharding), "sharding group");
    if (mpi.replicas)
      g.replicas = group_or_single(std::move(mpi.replicas), c.d / n, color(CommGroup::ShardReplicas), key(CommGroup::ShardReplicas),
                                   "sharding replica group");
    if (mpi.reshard) {
      const int r = mpi.reshard->size();
      g.reshard = group_or_single(std::move(mpi.reshard), r, color(CommGroup::Reshard), key(CommGroup::Reshard), "reshard group");
    }
  }
  // DualPipe: pipeline ranks r and p − 1 − r (every rank is a member when any is).
  if (mpi.mirror) {
    const int pair = std::min(c.pp, c.p - 1 - c.pp);
    g.mirror = group(std::move(mpi.mirror), true, c.tp + c.t * (c.dp + c.d * pair), c.pp, "mirror group");
  }
  return g;
}

}  // namespace ptdp::exec::cuda
