// MPI: the process launcher's world and the Communicator of the `cpu` executor.
//
// Error handling is MPI_ERRORS_RETURN on every communicator; every blocking operation is a
// non-blocking one polled with a deadline, so a dead or hung peer turns into a
// CommunicationError after `timeout_s` instead of a hang. Typical main():
//
//   ptdp::exec::MpiSession mpi(&argc, &argv);
//   try { … ptdp::exec::train(…) … }
//   catch (const ptdp::exec::CommunicationError& e) { print e.what(); mpi.abort(1); }   // any rank
//   catch (const ptdp::ConfigError& e) { if (mpi.rank() == 0) print e.what(); return 2; }  // all ranks throw it
#pragma once

#include <memory>

#include "exec/runtime/communicator.hpp"

namespace ptdp::exec {

/// Owns MPI initialisation for the process (MPI_Init_thread, FUNNELED) and finalisation.
/// Without mpirun the process is a world of one. Only one session may exist at a time.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// Terminates every rank of the job (MPI_Abort) with `exit_code`. Use after a
  /// CommunicationError: a normal MPI_Finalize could wait forever for the dead peer.
  [[noreturn]] void abort(int exit_code);

  /// True between MPI_Init and MPI_Finalize (by this session or anyone else).
  static bool active();

 private:
  bool owns_ = false;
  int rank_ = 0, size_ = 1;
};

/// How this process's blocking MPI waits behave. `poll_first`: poll (yielding) for 200 µs before
/// sleeping, with 1 µs timer slack — what MpiSession sets when every rank of the host has a
/// core. Otherwise 64 polls, then sleeps with the system's default timer slack (ranks sharing a
/// core leave it to the computing ones). Returns the previous setting. Calibration switches it
/// to measure the all-reduce in both modes and the wake-up of a sleeping rank.
bool set_mpi_poll_first(bool poll_first);

/// Default seconds a blocking MPI operation may make no progress before CommunicationError.
inline constexpr double kDefaultCommTimeout_s = 30.0;

/// The world communicator (MPI_COMM_WORLD duplicated). Requires an active MPI.
std::unique_ptr<Communicator> make_mpi_world(double timeout_s = kDefaultCommTimeout_s);

/// The groups make_mpi_groups builds.
struct GroupLayout {
  int t = 1, p = 1;
  /// The data × context ranks holding the same weights (Megatron's order puts the context ranks
  /// between tensor and data: dp = cp_rank + context · data_rank), so gradients and sharding span
  /// them.
  int d = 1;
  /// The pipeline ranks holding the first and the last stage: the embedding group joins them
  /// (none when they coincide). -1: p − 1.
  int first_stage_rank = 0, last_stage_rank = -1;
  /// N > 0 adds the sharding group (N consecutive data-parallel ranks) and, when N < d, the
  /// replica group across them (ProcessGroups::sharding, ::replicas); N must divide d.
  int sharding_size = 0;
  /// 1 < R < sharding_size (dividing it) adds ProcessGroups::reshard: R consecutive members of
  /// each sharding group (reshard_after_forward R). 0: none.
  int reshard_size = 0;
  /// > 1: ProcessGroups::context joins the `context` consecutive ranks of d (same tp, pp, data
  /// rank; rank = cp_rank); it must divide d.
  int context = 1;
  /// > 1 adds the expert-parallel and expert-data groups (ProcessGroups::expert, ::expert_data);
  /// with expert_tensor = t it must divide d.
  int expert = 1;
  /// The ranks splitting each expert's columns (parallel.expert_tensor; 0 = t). Another size than
  /// t folds the t·d ranks of a pipeline stage into expert-tensor, expert and expert-data groups
  /// (model/grid.hpp) and adds the expert-data group (and with `moe` the expert-tensor and
  /// expert-model groups) whatever `expert` is; expert_tensor × expert must divide t·d.
  int expert_tensor = 0;
  /// DualPipe's lanes (p even) add ProcessGroups::mirror.
  bool mirrored = false;
  /// MoE with t > 1 (or a folded expert-tensor size) adds the expert-tensor and expert-model
  /// groups (ProcessGroups::expert_tensor, ::expert_model) the sequence-parallel MoE dispatchers use.
  bool moe = false;
};

/// Splits the world into the tensor-, pipeline-, data-parallel, model-parallel and embedding
/// groups of the Megatron layout (global rank = tp + t·(dp + d·pp)), and the others `layout`
/// asks for, every group from the one process grid (model/grid.hpp). Collective over the world;
/// the world size must equal t·p·d (asserted: callers validate it as a ConfigError).
ProcessGroups make_mpi_groups(const GroupLayout& layout, double timeout_s = kDefaultCommTimeout_s);

}  // namespace ptdp::exec
