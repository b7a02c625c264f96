#include "exec/runtime/communicator.hpp"

#include "model/grid.hpp"

#include <algorithm>
#include <cstring>

namespace ptdp::exec {
namespace {

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  void all_reduce(float*, size_t, ReduceOp) override {}
  void all_reduce(double*, size_t, ReduceOp) override {}
  void all_gather(const float* send, float* recv, size_t count) override {
    if (send != recv) std::memmove(recv, send, count * sizeof(float));
  }
  void reduce_scatter(const float* send, float* recv, size_t count) override {
    if (send != recv) std::memmove(recv, send, count * sizeof(float));
  }
  void all_to_all_v(const float* send, const std::vector<size_t>& send_counts, float* recv,
                    const std::vector<size_t>& recv_counts) override {
    PTDP_ASSERT(send_counts.size() == 1 && recv_counts.size() == 1 && send_counts[0] == recv_counts[0], "all-to-all counts");
    if (send != recv && send_counts[0] > 0) std::memmove(recv, send, send_counts[0] * sizeof(float));
  }
  void broadcast(void*, size_t, int root) override { PTDP_ASSERT(root == 0, "broadcast root out of range"); }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine, int root) override {
    PTDP_ASSERT(root == 0, "gather root out of range");
    return {mine};
  }
  void barrier() override {}
  std::unique_ptr<Request> isend(const float*, size_t, int, int) override {
    PTDP_ASSERT(false, "point-to-point transfer in a group of one (" + name_ + ")");
    return nullptr;
  }
  std::unique_ptr<Request> irecv(float*, size_t, int, int) override {
    PTDP_ASSERT(false, "point-to-point transfer in a group of one (" + name_ + ")");
    return nullptr;
  }
  int max_tag() const override { return 0; }

 private:
  std::string name_;
};

class CompletedRequest final : public Request {
 public:
  bool test() override { return true; }
  void wait() override {}
};

}  // namespace

std::unique_ptr<Request> Communicator::start_all_gather(const float* send, float* recv, size_t count) {
  all_gather(send, recv, count);
  return std::make_unique<CompletedRequest>();
}

std::unique_ptr<Request> Communicator::start_all_reduce(float* data, size_t count, ReduceOp op) {
  all_reduce(data, count, op);
  return std::make_unique<CompletedRequest>();
}

std::unique_ptr<Request> Communicator::start_reduce_scatter(const float* send, float* recv, size_t count) {
  reduce_scatter(send, recv, count);
  return std::make_unique<CompletedRequest>();
}

std::unique_ptr<Request> Communicator::start_gather_block(float* data, size_t count, int root) {
  broadcast(data, count * sizeof(float), root);
  return std::make_unique<CompletedRequest>();
}

std::unique_ptr<Request> Communicator::start_reduce_block(const float* send, float* recv, size_t count, int root) {
  PTDP_ASSERT(size() == 1 && root == 0, "a reduce to one member needs a communicator that has it (" + name() + ")");
  if (send != recv) std::memmove(recv, send, count * sizeof(float));
  return std::make_unique<CompletedRequest>();
}

void Communicator::all_to_all_v(const float* send, const std::vector<size_t>& send_counts, float* recv,
                                const std::vector<size_t>& recv_counts) {
  const int n = size();
  PTDP_ASSERT(static_cast<int>(send_counts.size()) == n && static_cast<int>(recv_counts.size()) == n,
              "all-to-all needs a count per member of the " + name());
  std::vector<std::unique_ptr<Request>> requests;
  size_t sent = 0, received = 0;
  for (int r = 0; r < n; ++r) {
    if (recv_counts[static_cast<size_t>(r)] > 0) requests.push_back(irecv(recv + received, recv_counts[static_cast<size_t>(r)], r, 0));
    received += recv_counts[static_cast<size_t>(r)];
  }
  for (int r = 0; r < n; ++r) {
    if (send_counts[static_cast<size_t>(r)] > 0) requests.push_back(isend(send + sent, send_counts[static_cast<size_t>(r)], r, 0));
    sent += send_counts[static_cast<size_t>(r)];
  }
  for (auto& q : requests) q->wait();
}

void Communicator::all_gather_v(const float* send, float* recv, const std::vector<size_t>& counts) {
  const int n = size();
  const auto me = static_cast<size_t>(rank());
  PTDP_ASSERT(static_cast<int>(counts.size()) == n, "all-gather needs a count per member of the " + name());
  if (n == 1) {
    std::copy(send, send + counts[0], recv);
    return;
  }
  std::vector<size_t> send_counts(counts.size(), counts[me]);
  std::vector<float> copies(counts[me] * static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) std::copy(send, send + counts[me], copies.data() + static_cast<size_t>(r) * counts[me]);
  all_to_all_v(copies.data(), send_counts, recv, counts);
}

void Communicator::reduce_scatter_v(const float* send, float* recv, const std::vector<size_t>& counts) {
  const int n = size();
  const auto me = static_cast<size_t>(rank());
  PTDP_ASSERT(static_cast<int>(counts.size()) == n, "reduce-scatter needs a count per member of the " + name());
  if (n == 1) {
    std::copy(send, send + counts[0], recv);
    return;
  }
  std::vector<float> parts(counts[me] * static_cast<size_t>(n));
  all_to_all_v(send, counts, parts.data(), std::vector<size_t>(counts.size(), counts[me]));
  std::fill(recv, recv + counts[me], 0.0f);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < counts[me]; ++i) recv[i] += parts[static_cast<size_t>(r) * counts[me] + i];
}

std::unique_ptr<Communicator> make_self_communicator(const std::string& name) {
  return std::make_unique<SelfCommunicator>(name);
}

int RankCoordinates::global_rank_at_pipeline(int pipeline_rank) const {
  // d counts data × context ranks here (the gradient group): the grid with context folded into data.
  return static_cast<int>(ProcessGrid(t, 1, d, p).rank(tp, 0, dp, pipeline_rank));
}

RankCoordinates RankCoordinates::of(int global_rank, int t, int p, int d) {
  PTDP_ASSERT(t >= 1 && p >= 1 && d >= 1 && global_rank >= 0 && global_rank < t * p * d, "rank outside t·p·d");
  const GridCoord rc = ProcessGrid(t, 1, d, p).coord(global_rank);  // Megatron's layout, context folded into data
  RankCoordinates c;
  c.t = t;
  c.p = p;
  c.d = d;
  c.tp = static_cast<int>(rc.tp);
  c.dp = static_cast<int>(rc.dp);
  c.pp = static_cast<int>(rc.pp);
  return c;
}

}  // namespace ptdp::exec
