// Communicator: collectives and point-to-point transfers of one process group, the second
// interface of the executor besides Device. MPI implements it for `cpu` (exec/runtime/mpi_communicator.hpp);
// NCCL (bootstrapped over MPI) will implement it for `cuda`. Buffers are Device memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace ptdp::exec {

enum class ReduceOp : uint8_t { Sum, Max, Min };

/// A failed or timed-out transfer: a peer died, hangs or the library failed. Other ranks may be
/// blocked waiting for this one, so the caller must not finalise normally: print the message (on
/// whichever rank caught it) and call MpiSession::abort().
class CommunicationError : public EnvironmentError {
 public:
  using EnvironmentError::EnvironmentError;
};

/// A posted non-blocking transfer.
class Request {
 public:
  virtual ~Request() = default;
  /// True once the transfer completed (never blocks). Throws CommunicationError on failure.
  virtual bool test() = 0;
  /// Blocks until completion; throws CommunicationError on failure or when no progress was made
  /// within the communicator's timeout.
  virtual void wait() = 0;
};

/// One process group (world, tensor-, pipeline-, data-parallel, ...). Collective calls must be
/// made by every member in the same order. Blocking calls throw CommunicationError after the
/// group's timeout instead of hanging when a member died.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Name for messages ("tensor-parallel group").
  virtual const std::string& name() const = 0;

  virtual void all_reduce(float* data, size_t count, ReduceOp op) = 0;
  virtual void all_reduce(double* data, size_t count, ReduceOp op) = 0;
  /// recv[r·count .. (r+1)·count) = send of member r.
  virtual void all_gather(const float* send, float* recv, size_t count) = 0;
  /// all_gather started without waiting: the returned request completes it (recv is valid, and
  /// send may be reused, after wait()). NCCL runs it on the group's stream, overlapping the
  /// device's compute; this default (MPI, a group of one) gathers at once and returns a completed
  /// request. Started collectives of a group complete in the order they were started.
  virtual std::unique_ptr<Request> start_all_gather(const float* send, float* recv, size_t count);
  /// all_reduce started without waiting (data is valid after wait()); the same arithmetic as
  /// all_reduce on the same range: both split a message into the same pieces of
  /// all_reduce_piece() elements counted from its start, so a caller whose ranges start at
  /// multiples of it gets bit-identical sums. This default (a group of one, or a communicator
  /// without non-blocking collectives) reduces at once and returns a completed request.
  virtual std::unique_ptr<Request> start_all_reduce(float* data, size_t count, ReduceOp op);
  /// Elements per piece of an all-reduce (0: messages are not split).
  virtual size_t all_reduce_piece() const { return 0; }
  /// recv (count floats) = Σ over members of their send[rank·count .. (rank+1)·count): member r
  /// gets block r of the reduction (sum) of every member's size·count floats. send ≠ recv.
  virtual void reduce_scatter(const float* send, float* recv, size_t count) = 0;
  /// reduce_scatter started without waiting: recv is valid, and send may be reused, after
  /// wait(); the same arithmetic as reduce_scatter. MPI posts a non-blocking reduce-scatter,
  /// NCCL runs it on the group's stream after the compute queued so far (the backward's
  /// input-gradient reduce-scatter under the weight-gradient GEMM); this default (a group of one)
  /// reduces at once and returns a completed request.
  virtual std::unique_ptr<Request> start_reduce_scatter(const float* send, float* recv, size_t count);
  /// One block of a chunked all-gather or reduce-scatter (tp_comm_overlap: Transformer Engine's
  /// userbuffers split a sequence-parallel collective into the members' blocks and pipeline them
  /// with the GEMM beside it), started without waiting. start_gather_block: member `root`'s
  /// `count` floats at `data` to every member's `data` (a broadcast); start_reduce_block: the sum
  /// over members of their `count` floats at `send` into `recv` on `root` (a reduce; recv ≠ send,
  /// unused elsewhere). The blocks of one collective are started by every member in the same
  /// order; together they move what the whole collective moves. These defaults serve a group of
  /// one (a copy) and return a completed request.
  virtual std::unique_ptr<Request> start_gather_block(float* data, size_t count, int root);
  virtual std::unique_ptr<Request> start_reduce_block(const float* send, float* recv, size_t count, int root);
  /// Expert-parallel exchange: member r's send[soff_r .. soff_r + send_counts[r]) goes to member r,
  /// recv[roff_r .. roff_r + recv_counts[r]) comes from member r (offsets: prefix sums of the
  /// counts; each member's recv_counts[r] must equal member r's send_counts[rank]). This default
  /// posts one non-blocking send and receive per member (itself included) and waits for them.
  virtual void all_to_all_v(const float* send, const std::vector<size_t>& send_counts, float* recv,
                            const std::vector<size_t>& recv_counts);
  /// All-gather of unequal parts: member r's counts[r] floats at recv[prefix_r ..) (prefix: the
  /// sum of the counts before r); send holds this member's counts[rank()]. This default moves
  /// them with all_to_all_v.
  virtual void all_gather_v(const float* send, float* recv, const std::vector<size_t>& counts);
  /// Reduce-scatter of unequal parts: recv (counts[rank()] floats) = Σ over members of their
  /// send[prefix_rank ..) (every member's send holds Σ counts floats). This default moves the
  /// parts with all_to_all_v and sums them in member order.
  virtual void reduce_scatter_v(const float* send, float* recv, const std::vector<size_t>& counts);
  virtual void broadcast(void* bytes, size_t size, int root) = 0;
  /// Every member's bytes, in rank order, on `root` (empty elsewhere).
  virtual std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine, int root) = 0;
  virtual void barrier() = 0;
  /// Non-blocking point-to-point; the buffer must stay valid until the request completed.
  /// Messages between a pair of members are matched by tag.
  virtual std::unique_ptr<Request> isend(const float* data, size_t count, int peer, int tag) = 0;
  virtual std::unique_ptr<Request> irecv(float* data, size_t count, int peer, int tag) = 0;
  /// The largest tag isend/irecv accept.
  virtual int max_tag() const = 0;
};

/// A group of one process (no MPI needed): collectives are identities, p2p is an error.
std::unique_ptr<Communicator> make_self_communicator(const std::string& name);

/// This process's coordinates in the Megatron layout: global rank = tp + t·(dp + d·pp).
struct RankCoordinates {
  int tp = 0, dp = 0, pp = 0;
  int t = 1, d = 1, p = 1;

  static RankCoordinates of(int global_rank, int t, int p, int d);
  int global_rank() const { return global_rank_at_pipeline(pp); }
  /// Global rank of the member of this rank's pipeline with pipeline rank `pipeline_rank`
  /// (the topology's layout, topologies/cluster.hpp global_rank).
  int global_rank_at_pipeline(int pipeline_rank) const;
};

/// The process groups of one rank.
struct ProcessGroups {
  RankCoordinates coords;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> tensor;     // t members: same (dp, pp), rank = tp
  std::unique_ptr<Communicator> pipeline;   // p members: same (tp, dp), rank = pp
  std::unique_ptr<Communicator> data;       // d members: same (tp, pp), rank = dp
  std::unique_ptr<Communicator> model;      // t·p members: same dp (gradient norm)
  std::unique_ptr<Communicator> embedding;  // pipeline ranks of the first and last stage, same (tp, dp);
                                            // null when one rank holds both, or for other ranks
  /// Sharded data parallelism (plan.zero_stage > 0): the N data-parallel ranks sharing one copy
  /// of the model states (same (tp, pp), dp in [⌊dp/N⌋·N, ⌊dp/N⌋·N + N), rank = dp mod N), and
  /// with a node sharding group (N < d) the replicas holding the same shard on the other nodes
  /// (same (tp, pp), same dp mod N, rank = ⌊dp/N⌋). Null when not sharded / not hybrid.
  std::unique_ptr<Communicator> sharding;
  std::unique_ptr<Communicator> replicas;
  /// FSDP2's reshard_after_forward N (1 < N < the sharding group): the N consecutive members of
  /// the sharding group a unit stays sharded over between its forward and its backward, which
  /// re-gathers it over them (rank = sharding rank mod N). Null otherwise.
  std::unique_ptr<Communicator> reshard;
  /// Context parallelism: the cp ranks splitting each sequence (same tp, pp and data rank; rank =
  /// cp_rank); then `data` and coords.dp span data × context (dp = cp_rank + cp · data rank).
  /// Null without context parallelism.
  std::unique_ptr<Communicator> context;
  /// Expert parallelism (ep > 1): the ep consecutive data-parallel ranks splitting the routed
  /// experts (same tp, pp; rank = dp mod ep), and the d/ep ranks holding the same experts, over
  /// which expert gradients are reduced (same tp, pp, dp mod ep; rank = dp / ep). Null otherwise.
  /// With an expert-tensor size other than t (parallel folding) both come from the process grid's
  /// expert order over a stage's t·d ranks instead (model/grid.hpp; expert_data then exists at ep 1).
  std::unique_ptr<Communicator> expert;
  std::unique_ptr<Communicator> expert_data;
  /// MoE with t > 1 or folded: the ranks splitting each expert's columns (Megatron's expert-tensor
  /// group; at expert-tensor size t the tensor group's members) and the ranks
  /// splitting the experts either way (expert-tensor × expert, Megatron's tp_ep group), over which
  /// the sequence-parallel dispatchers gather each rank's tokens. Null otherwise.
  std::unique_ptr<Communicator> expert_tensor;
  std::unique_ptr<Communicator> expert_model;
  /// DualPipe (two lanes): pipeline ranks r and p − 1 − r (same tp, dp), which hold copies of the
  /// same two stages and sum their gradients (rank = pp order). Null otherwise.
  std::unique_ptr<Communicator> mirror;
};

}  // namespace ptdp::exec
