// Timeline (what ran when) and Report (the figures users read): the common output format of the
// simulator and the executor, so predicted and measured runs compare action by action.
#pragma once

#include <algorithm>
#include <array>
#include <compare>
#include <limits>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/memory.hpp"
#include "schedules/schedule.hpp"

namespace ptdp {

/// Which engine of a device an event occupied (a thread in the Chrome trace).
enum class Stream : uint8_t { Compute, TP, PP, DP };
std::string_view to_string(Stream s);

/// One executed (or simulated) action, or a part of it. Every engine records the same events,
/// so one function (rank_breakdown) reads all of them:
///   Compute, no label   a whole F, B, I, W or OPTIM action (its TP collectives included);
///   Compute, label "recompute"  the part of a B or I spent re-running the forward (activation
///                       recompute: the whole layer or its attention core), inside the action;
///   TP                  a part of such an action spent in tensor-parallel collectives;
///   PP RECV_*, no label the RECV's wait for its data (peer = the sending device);
///   PP RECV_*, label "pp all-gather"  the scatter/gather all-gather that completes the RECV;
///   PP SEND_*           from the post (the producer's data is ready) to the delivery; sends
///                       are asynchronous, so they are not the rank's time (peer = receiver);
///   DP REDUCE_GRAD      the whole action;
///   DP, label "shard"   a part of a compute or OPTIM action spent waiting for sharded
///                       data-parallel communication (parameter all-gathers, gradient reduce-
///                       scatters, offload copies) that its overlap did not hide.
struct TimelineEvent {
  int device = 0;         // global rank (full fidelity, executor) or pipeline rank (reduced)
  int pipeline_rank = 0;  // pipeline rank the device belongs to
  Action action;
  Stream stream = Stream::Compute;
  double start_s = 0;
  double end_s = 0;
  std::string label;  // optional detail ("tp all-reduce"), empty = action string
  int peer = -1;      // SEND/RECV: the device at the other end
};

struct Timeline {
  std::vector<TimelineEvent> events;
  std::map<int, std::string> device_names;  // process names in the trace ("gpu 3 (tp0 dp0 pp1)")
};

/// Label of the all-gather part of a scatter/gather RECV.
inline constexpr const char* kPipelineAllGather = "pp all-gather";
/// Label of the recompute part of a B or I (a Compute event inside the action's).
inline constexpr const char* kRecompute = "recompute";
/// Label of a SEND its rank waits for (parallel.overlap_p2p false): exposed pipeline communication.
inline constexpr const char* kBlockingSend = "blocking send";
/// Label of the exposed sharding communication inside an action.
inline constexpr const char* kShardWait = "shard";

/// The one JSON mapping of a Timeline (events and device names), used between processes
/// (SimGrid child → parent, executor ranks → rank 0). Throws ConfigError when malformed.
std::string timeline_to_json(const Timeline& t);
Timeline timeline_from_json(const std::string& text, const std::string& source);

/// Writes a Chrome trace (JSON array format) that Perfetto and chrome://tracing open: one process
/// per device, one thread per Stream, flow events linking each SEND to its matching RECV.
/// Throws EnvironmentError when the file cannot be written.
void write_chrome_trace(const Timeline& t, const std::string& path);
std::string chrome_trace_json(const Timeline& t);

/// Classes of actions compared between predicted and measured runs (`ptdp compare`).
enum class ActionClass : uint8_t { F, B, IW, P2P, ReduceGrad, Optim };
inline constexpr int kActionClasses = 6;
std::string_view to_string(ActionClass c);  // "F", "B", "I/W", "SEND/RECV", "REDUCE_GRAD", "OPTIM"
inline ActionClass action_class(ActionKind k) {
  switch (k) {
    case ActionKind::F: return ActionClass::F;
    case ActionKind::B: return ActionClass::B;
    case ActionKind::I:
    case ActionKind::W: return ActionClass::IW;
    case ActionKind::REDUCE_GRAD: return ActionClass::ReduceGrad;
    case ActionKind::OPTIM: return ActionClass::Optim;
    default: return ActionClass::P2P;
  }
}

/// Exposed time by communication class, per pipeline rank (seconds in the iteration).
struct RankBreakdown {
  int pipeline_rank = 0;
  double busy_s = 0;     // compute running
  double bubble_s = 0;   // idle with no work: waiting for a peer
  double exposed_tp_s = 0, exposed_pp_s = 0, exposed_dp_s = 0;
  /// The context- and expert-parallel collectives inside F/B run on the TP stream: their part of
  /// the exposed TP time, split off by the layer's shares (sim/simulate: exposed_tp_s then keeps
  /// the tensor-parallel part; the three add up to what the stream exposed).
  double exposed_cp_s = 0, exposed_ep_s = 0;
  /// Part of the B/I actions' time spent re-running the forward (activation recompute): the
  /// Compute events labelled kRecompute.
  double recompute_s = 0;
  double exposed_shard_s = 0;  // sharded data parallelism: gathers/reduce-scatters/offload copies not hidden
  /// Per ActionClass: how many actions ran and how long they took in total. SEND/RECV time is
  /// the time the rank spent blocked in receives; sends only count.
  std::array<int64_t, kActionClasses> class_count{};
  std::array<double, kActionClasses> class_time_s{};
};

/// Adds one executed action of `duration_s` to the per-class figures of `rb`.
/// (Inline: the breakdown calls it for every event.)
inline void add_action_time(RankBreakdown& rb, const Action& a, double duration_s) {
  const auto c = static_cast<size_t>(action_class(a.kind));
  ++rb.class_count[c];
  if (a.kind != ActionKind::SEND_F && a.kind != ActionKind::SEND_B) rb.class_time_s[c] += duration_s;
}

/// The per-pipeline-rank breakdown of an iteration of `iteration_s`, from the events of the
/// device that stands for each pipeline rank (`representative[r]`; its peers' SEND events are
/// looked up among `events` too). The same function for every engine:
///   busy = compute actions − their TP and shard parts; exposed tp = TP parts; exposed dp =
///   REDUCE_GRAD; exposed shard = the "shard" parts;
///   exposed pp = RECV waits after the matching SEND was posted (data on the wire) + all-gathers;
///   bubble = the rest of the iteration (RECV waits before the producer posted, idle time).
/// Per action class: counts of every action, time of compute/REDUCE_GRAD/OPTIM actions and the
/// RECV waits including their all-gathers (sends only count).
std::vector<RankBreakdown> rank_breakdown(const std::vector<TimelineEvent>& events,
                                          const std::vector<int>& representative, double iteration_s);

/// A pipeline transfer: (sender device, receiver device, direction, sender stage, microbatch).
struct TransferKey {
  int sender = 0, receiver = 0, direction = 0, stage = 0, microbatch = 0;
  auto operator<=>(const TransferKey&) const = default;
};

/// rank_breakdown fed one event at a time (engines that need not keep their events).
class RankBreakdownBuilder {
 public:
  explicit RankBreakdownBuilder(const std::vector<int>& representative);
  /// Room for about `transfers` sends and receives (an optimisation only).
  void reserve(size_t transfers) {
    posted_.reserve(transfers);
    waits_.reserve(transfers);
  }
  void add(const TimelineEvent& e);
  /// What an event's label says to the breakdown (add() compares the label once).
  enum class Part : uint8_t { Whole, Recompute, Shard, PipelineAllGather, BlockingSend };
  /// The part an event's label names (its stream and action kind decide which labels count).
  static Part part_of(Stream stream, ActionKind kind, std::string_view label);
  /// add() of an event given by its fields, its label named by `part` (for an engine that makes
  /// its events as it goes and need not build a TimelineEvent for each). Inline: with the stream
  /// and part known where it is called, only their case is left.
  void add(int device, int peer, const Action& a, Stream stream, Part part, double start_s, double end_s) {
    if ((a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B) && rank_of(peer) >= 0) post(device, peer, a, start_s);
    const int r = rank_of(device);
    if (r >= 0 && count(ranks_[static_cast<size_t>(r)], a, stream, part, start_s, end_s)) wait(r, device, peer, a, start_s, end_s);
  }
  /// add() of a RECV's wait (no label) whose SEND the engine paired with it itself: posted at
  /// `posted_s`. That SEND is then added with peer −1 (only counted): nothing is kept for
  /// finish() to pair. The same figures as the two events added with their peers, provided an
  /// engine pairs all its transfers or none (finish() adds the paired waits' exposed time before
  /// the others).
  void add_paired_recv_wait(int device, const Action& a, double start_s, double end_s, double posted_s) {
    const int r = rank_of(device);
    if (r < 0) return;
    Rank& rank = ranks_[static_cast<size_t>(r)];
    if (count(rank, a, Stream::PP, Part::Whole, start_s, end_s)) rank.paired_exposed_s.push_back(exposed_wait_s(start_s, end_s, posted_s));
  }
  std::vector<RankBreakdown> finish(double iteration_s);
  /// The iteration time when each rank's optimizer step follows its own last action
  /// (parallel.optimizer_sync: post_validate) and successive iterations overlap: the longest
  /// window any rank spends from its first compute action to the end of its last action (every
  /// rank then starts the next iteration one window after it started this one).
  double longest_rank_window_s() const;

 private:
  struct Wait {
    int rank;
    TransferKey transfer;
    double start_s, end_s;
  };
  // What one representative's events add up to.
  struct Rank {
    RankBreakdown out;
    double compute_s = 0;
    double first_compute_s = std::numeric_limits<double>::infinity(), last_end_s = 0;
    bool seen = false;
    std::vector<double> paired_exposed_s;  // each paired wait's exposed time, in order
  };
  int rank_of(int device) const {
    return device >= 0 && static_cast<size_t>(device) < rank_of_.size() ? rank_of_[device] : -1;
  }
  // The exposed pipeline communication of a RECV's wait from start_s to end_s for data whose
  // SEND was posted at posted_s: the time the data was on the wire (before, the wait is bubble).
  static double exposed_wait_s(double start_s, double end_s, double posted_s) {
    return std::max(0.0, end_s - std::max(start_s, posted_s));
  }
  // An event of the rank into its figures; true for a RECV's wait, which the caller pairs with
  // its SEND.
  static bool count(Rank& rank, const Action& a, Stream stream, Part part, double start_s, double end_s) {
    const ActionKind k = a.kind;
    const bool send = k == ActionKind::SEND_F || k == ActionKind::SEND_B, recv = k == ActionKind::RECV_F || k == ActionKind::RECV_B;
    RankBreakdown& rb = rank.out;
    rank.seen = true;
    const double dur = std::max(0.0, end_s - start_s);
    if (stream == Stream::Compute && is_compute(k)) rank.first_compute_s = std::min(rank.first_compute_s, start_s);
    rank.last_end_s = std::max(rank.last_end_s, end_s);
    if (stream == Stream::TP) {
      rb.exposed_tp_s += dur;
    } else if (stream == Stream::Compute && part == Part::Recompute) {
      rb.recompute_s += dur;  // a part of its B or I, which is counted whole
    } else if (stream == Stream::Compute) {
      rank.compute_s += dur;
      add_action_time(rb, a, dur);
    } else if (stream == Stream::DP && part == Part::Shard) {
      rb.exposed_shard_s += dur;  // inside a compute or OPTIM action, which counts the time
    } else if (stream == Stream::DP) {
      rb.exposed_dp_s += dur;
      add_action_time(rb, a, dur);
    } else if (recv && part == Part::PipelineAllGather) {
      rb.exposed_pp_s += dur;
      rb.class_time_s[static_cast<size_t>(action_class(k))] += dur;
    } else if (recv) {
      add_action_time(rb, a, dur);
      return true;
    } else if (send && part == Part::BlockingSend) {
      rb.exposed_pp_s += dur;  // the sender waited for it
      add_action_time(rb, a, dur);
    } else if (send) {
      add_action_time(rb, a, 0);
    }
    return false;
  }
  void post(int device, int peer, const Action& send, double start_s);  // a SEND towards a representative
  void wait(int r, int device, int peer, const Action& recv, double start_s, double end_s);  // a RECV's wait, paired in finish()
  std::vector<int> rank_of_;  // device → pipeline rank it stands for, -1 none
  std::vector<Rank> ranks_;
  std::vector<std::pair<TransferKey, double>> posted_;  // transfer → when its SEND was posted
  std::vector<Wait> waits_;
};

/// The figures of one iteration. JSON keys are stable (documented in README).
struct Report {
  std::string fidelity;            // analytic | reduced | full | measured
  std::string backend;             // simulator: "sim"; executor: "cpu" | "cuda"
  std::string schedule;            // what ran: "1f1b (generated)", or the CSV file given with --schedule
  double iteration_time_s = 0;
  double tflops_per_gpu = 0;       // paper Eq. 3 counting when recompute is full
  double mfu = 0;                  // model FLOPs (no recompute) / peak
  double bubble_fraction = 0;      // pipeline bubble as a fraction of iteration time
  double peak_memory_bytes = 0;    // per GPU
  double gpu_memory_bytes = 0;     // capacity
  bool fits_in_memory = true;
  double tokens_per_s = 0;
  std::optional<double> training_days;
  std::optional<double> gpu_hours;    // GPUs × training time for train_tokens
  std::optional<double> energy_kwh;   // GPUs (busy/idle power) and nodes, for train_tokens
  std::optional<double> cost_usd;     // GPU-hours × price (+ electricity), when a price is given
  double iteration_energy_j = 0;      // one iteration (0: power unknown)
  double parameters = 0;
  int64_t gpus = 0;
  std::string bottleneck;          // compute | bubble | tp | cp | ep | pp | dp | shard
  std::vector<RankBreakdown> ranks;
  /// Predicted memory of each pipeline rank (JSON: memory_breakdown for the peak rank,
  /// memory_breakdown_per_rank for all); empty when not predicted.
  std::vector<MemoryBreakdown> memory;
  std::map<std::string, double> exposed_comm_s;  // "tp", "pp", "dp"
  /// Each overlap the plan turns on (its key, e.g. "overlap_grad_reduce"): the iteration time the
  /// same plan takes without it less the time with it, both analytic (negative: it costs more
  /// than it hides). Empty when none is on or the cluster overlaps nothing (CPU).
  std::map<std::string, double> overlap_gain_s;
  std::vector<double> losses;      // executor only: the loss trained, per step
  std::vector<double> mtp_losses;  // executor, model.mtp_layers: the MTP modules' mean loss (1/D Σ_k), per step
  std::string config_json;         // the resolved scenario as JSON
  std::map<std::string, double> extra;  // further figures (e.g. activities_per_s)
};

struct RunMetrics;
/// Fills the derived figures: the run's metrics (model/metrics.hpp: TFLOP/s, MFU, tokens/s,
/// days, parameters, GPUs), and from `ranks` the bubble fraction, exposed communication by
/// class and the bottleneck.
void complete_report(Report& r, const RunMetrics& m);

/// The report's invariants: every number finite and physically possible (iteration time,
/// tokens/s, parameters > 0; MFU and bubble fraction in [0, 1]; times, memory, TFLOP/s ≥ 0;
/// losses finite). Returns the first violation as "key: what (got X)", or "" when none.
std::string report_violation(const Report& r);
/// Throws InternalError naming the quantity when report_violation finds one: a report that
/// breaks them comes from a bug and is never written or printed.
void check_report(const Report& r);

/// JSON of the report (callers that write it for users run check_report first).
std::string report_to_json(const Report& r);
/// Parses a report written by report_to_json (for `ptdp compare`). Throws ConfigError.
Report report_from_json(const std::string& text, const std::string& source);

}  // namespace ptdp
