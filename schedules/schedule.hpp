// The shared pipeline-schedule IR: what every pipeline rank does in one training iteration.
// The simulator and the executor both interpret the same lowered Schedule.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ptdp {

enum class ActionKind : uint8_t {
  F,            // forward of a stage for one microbatch
  B,            // full backward (input and weight gradients)
  I,            // input-gradient backward (zero-bubble split)
  W,            // weight-gradient backward (zero-bubble split)
  SEND_F,       // stage sends its forward output of microbatch to stage+1
  RECV_F,       // stage receives its forward input of microbatch from stage-1
  SEND_B,       // stage sends the gradient of its input to stage-1
  RECV_B,       // stage receives the gradient of its output from stage+1
  REDUCE_GRAD,  // data-parallel all-reduce of the stage's gradients (after its last backward)
  OPTIM,        // optimizer step of the pipeline rank (after all its REDUCE_GRADs)
};

std::string_view to_string(ActionKind k);
bool is_compute(ActionKind k);  // F, B, I, W
bool is_p2p(ActionKind k);      // SEND_*, RECV_*

/// One step of a rank's program. `microbatch` is -1 for REDUCE_GRAD and OPTIM.
/// For SEND_* the stage is the sender's, for RECV_* the receiver's (PyTorch convention).
struct Action {
  ActionKind kind = ActionKind::F;
  int32_t stage = 0;
  int32_t microbatch = -1;

  /// PyTorch pipelining string form: "2F0", "1SEND_B3", "0REDUCE_GRAD", "OPTIM".
  std::string str() const;
  bool operator==(const Action&) const = default;
};

/// Parses the PyTorch string form; throws ConfigError (message names the text) when malformed.
Action parse_action(std::string_view text);

/// One pipeline rank's ordered list of actions.
struct RankProgram {
  std::vector<Action> actions;
};

/// A schedule for p pipeline ranks, v chunks each, m microbatches.
/// Stage s (0 ≤ s < p·v) lives on pipeline rank stage_to_rank[s] (Megatron: s mod p).
struct Schedule {
  int p = 1;
  int v = 1;
  int m = 1;
  std::vector<int> stage_to_rank;
  std::vector<RankProgram> programs;  // one per pipeline rank
  bool lowered = false;               // send/recv and REDUCE_GRAD/OPTIM added

  int num_stages() const { return p * v; }
  /// Chunk index of a stage on its rank (0 … v−1).
  int chunk_of(int stage) const { return stage / p; }
  size_t num_actions() const;
};

/// Options that generators take besides (p, v, m).
struct GeneratorOptions {
  int microbatch_group = 0;  // interleaved group size G; 0 = p
};

/// GPipe: all forwards, then all backwards (reverse order).
Schedule make_gpipe(int p, int m);
/// 1F1B (PipeDream-Flush): min(p−r−1, m) warm-up forwards, then 1F/1B, then cool-down.
Schedule make_1f1b(int p, int m);
/// Megatron interleaved 1F1B with v chunks per rank and microbatch groups of G (default p).
Schedule make_interleaved(int p, int v, int m, const GeneratorOptions& opts = {});

struct ParallelPlan;
/// The plan's schedule (gpipe, 1f1b or interleaved with its v and group size), lowered.
Schedule build_schedule(const ParallelPlan& plan, bool check_deadlocks = true);

/// Number of warm-up forwards of pipeline rank r before its first backward (from the program).
int warmup_forwards(const Schedule& s, int rank);

/// Validation pass: every stage runs m forwards and m backwards (B, or I and W), F before its
/// backward, I before W, stages on the ranks stage_to_rank says. Throws ScheduleError.
void validate(const Schedule& s);

/// Validation of a lowered schedule (a complete program per rank, e.g. an imported CSV): what
/// validate() checks, plus every stage's REDUCE_GRAD once, on its rank, after its last backward;
/// exactly one OPTIM per rank, its last action; each transfer a stage needs (RECV_F before
/// every F of a stage > 0, SEND_F after every F of a stage before the last, likewise RECV_B /
/// SEND_B around backwards) present once, on the rank holding the stage. Pairing of SENDs with
/// RECVs across ranks and deadlocks are check_deadlock_free's. Throws ScheduleError.
void validate_lowered(const Schedule& s);

/// Lowering pass 1: append REDUCE_GRAD for each stage after its last backward, then OPTIM.
void add_reduce_and_optim(Schedule& s);
/// Lowering pass 2: after each F/B that feeds another stage, a SEND; the sender places the
/// matching RECV on the consumer's list right before the action that consumes it.
void add_send_recv(Schedule& s);
/// validate → add_reduce_and_optim → add_send_recv → check_deadlock_free (skipped when
/// `check_deadlocks` is false, for callers that run critical_path, which detects cycles itself).
/// Input: a compute-only schedule. Throws ScheduleError on any violation.
void lower(Schedule& s, bool check_deadlocks = true);

/// Peak number of microbatch-chunks whose activations are held at once on each pipeline rank
/// (F seen, its B/W not yet): 1F1B rank r: p − r, GPipe: m.
std::vector<int> peak_inflight_activations(const Schedule& s);

/// A malformed or deadlocking schedule. The message names the offending actions.
class ScheduleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Text grid, one line per pipeline rank ("rank 0 | 0F0 0F1 …").
std::string format_grid(const Schedule& s);

/// PyTorch-compatible CSV: one row per pipeline rank, one action per cell.
std::string to_csv(const Schedule& s);
/// Parses CSV written by to_csv or PyTorch; infers p, v, m. `source` names the file in errors
/// ("file.csv:3:5: bad action 'XF0'"). Lowered when it contains send/recv actions.
Schedule from_csv(std::string_view text, const std::string& source);

}  // namespace ptdp
