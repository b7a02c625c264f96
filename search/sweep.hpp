// The sweep engine: what-if sweeps over parallel plans. Candidates are enumerated (every valid
// plan of a model, GPU count and global batch, or the cartesian product of listed values of any
// scenario key), every one is evaluated with the analytic critical path on threads (plans that
// do not fit in GPU memory are only memory-checked), and the best K again at a chosen fidelity
// (SimGrid child processes, `jobs` at a time). Work can be split across the ranks of a group
// (e.g. MPI); the results are identical to one process.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "model/partition.hpp"
#include "sim/simulate.hpp"

namespace ptdp {

struct LayerOpsMemo;  // model/cost.hpp

/// Scenario overrides ("parallel.tensor", "4") that make a candidate from the base scenario.
using Overrides = std::vector<std::pair<std::string, std::string>>;

struct SweepCandidate {
  Overrides sets;
  /// The model, cluster, prices and options: one copy shared by every candidate of an --auto
  /// enumeration (a few hundred bytes of plan each, not the whole input). Its plan and
  /// config_json are not the candidate's.
  std::shared_ptr<const SimulationInput> base;
  ParallelPlan plan;
  std::string config_json;
  /// Candidates of one family (≥ 0) have the same model and cluster and differ only in the plan
  /// fields auto_candidates sets, so the sweep shares their per-stage costs and schedules;
  /// -1: none shared.
  int family = -1;
  /// --auto's candidates: `sets` holds only the family's own keys (--vary with --auto), the keys
  /// --auto chose follow from the plan (auto_overrides), made when an outcome needs them.
  bool derived_sets = false;
  /// The candidate as a simulation input of its own (a copy: made for the plans simulated).
  SimulationInput input() const {
    SimulationInput in = *base;
    in.plan = plan;
    in.config_json = config_json;
    return in;
  }
};

/// What makes one candidate of a shape group (SweepCandidates) from the group's shape: the fields
/// --auto sets after a plan's layout, micro batch, schedule, partition and recompute — its
/// sharding (ZeRO stage, group, offload) and overlaps (Megatron's, the sends beside compute).
struct PlanVariant {
  int zero_stage = 0;
  ShardingGroup sharding_group = ShardingGroup::Data;
  Offload offload = Offload::None;
  bool overlap_grad_reduce = false, overlap_param_gather = false, tp_comm_overlap = false, moe_comm_overlap = false,
       overlap_p2p = false;
  /// Sets every field above in `plan`.
  void apply_to(ParallelPlan& plan) const;
};

/// A sweep's candidates, held in groups: a group is a shape (a candidate) and the variants that
/// make its members (PlanVariant; none: the shape is the group's one member). --auto's plans of one
/// shape differ only in their variants, and the sweep's layer bound reads of a variant only its
/// TP and expert overlaps: it bounds a group's members once or twice, and builds the members of a
/// group only when one can still enter the top (the others are counted). Members are numbered
/// in order, group after group: member i is the i-th candidate of the list `expand` returns.
class SweepCandidates {
 public:
  SweepCandidates() = default;
  /// Each candidate a group of its own.
  explicit SweepCandidates(std::vector<SweepCandidate> singles);
  void add(SweepCandidate c) { add_group(std::move(c), {}); }
  void add_group(SweepCandidate shape, std::vector<PlanVariant> variants);
  /// Moves `more`'s groups to the end.
  void append(SweepCandidates&& more);
  /// Puts `sets` before each group's own overrides (--auto's families of --vary keys).
  void prepend_sets(const Overrides& sets);

  size_t size() const { return size_; }  // members
  size_t groups() const { return groups_.size(); }
  size_t first(size_t g) const { return first_[g]; }
  size_t group_size(size_t g) const { return std::max<size_t>(1, groups_[g].variants.size()); }
  const SweepCandidate& shape(size_t g) const { return groups_[g].shape; }
  /// The variant of member j of group g (nullptr: the shape itself).
  const PlanVariant* variant(size_t g, size_t j) const {
    return groups_[g].variants.empty() ? nullptr : &groups_[g].variants[j];
  }
  /// The group of member i.
  size_t group_of(size_t i) const {
    return static_cast<size_t>(std::upper_bound(first_.begin(), first_.end(), i) - first_.begin()) - 1;
  }
  /// Member j of group g, and member i (of all), built.
  SweepCandidate member(size_t g, size_t j) const;
  SweepCandidate member(size_t i) const;
  /// Every member, in order (the groups are taken).
  std::vector<SweepCandidate> expand() &&;
  /// The layer and head op lists the enumeration of family `family` made (model/cost.hpp
  /// LayerOpsMemo): the sweep prices that family's plans with them instead of making them again.
  void share_ops(int family, std::shared_ptr<LayerOpsMemo> memo) { ops_[family] = std::move(memo); }
  /// Takes them (by family): the sweep frees them with its analytic pass.
  std::map<int, std::shared_ptr<LayerOpsMemo>> take_ops() { return std::move(ops_); }

 private:
  struct Group {
    SweepCandidate shape;
    std::vector<PlanVariant> variants;
  };
  std::vector<Group> groups_;
  std::vector<size_t> first_;  // each group's first member
  size_t size_ = 0;
  std::map<int, std::shared_ptr<LayerOpsMemo>> ops_;
};

/// Plans a sweep skipped, by reason: the message with its numbers taken out ("N") is the key;
/// each keeps its count and the message of one plan with its real numbers, e.g. "parallel.tensor:
/// 8 does not divide model.num_query_groups (5)".
struct Skipped {
  size_t count = 0;
  std::string example;
  /// auto_candidates: the layout the example comes from, in the enumeration's order (so that the
  /// ranks of a split enumeration agree on the example one process would give).
  size_t first = SIZE_MAX;
};
using SkipReasons = std::map<std::string, Skipped>;
/// What --auto's balanced splits balance (stage_costs), kept per (cp, its exchange, t, vocabulary
/// parallelism, ep, etp, b, sp): the layer, embedding, head and MTP ops' times read of the layout
/// only cp (and how its ranks exchange: ring, all-gather or Ulysses) and t, and the pipeline only through vocabulary parallelism (p > 1); not d, the schedule nor the
/// partition (model/cost.cpp; the enumeration clears the layout keys, so no MTP stage stands
/// apart). The layouts (cp, t, p) of one family share it, on threads. The rest of the plan must be
/// the same for every plan asked (one family's).
class SplitCosts {
 public:
  const StageCosts& of(const TransformerSpec& model, const ParallelPlan& plan, const GpuSpec& gpu);

 private:
  std::mutex mutex_;
  std::map<std::array<int64_t, 8>, StageCosts> costs_;
};

/// Counts a rule violation under its reason (keeps the first example).
void count_skip(SkipReasons& skips, const ConfigError& e);

/// The overrides that turn `base` (an --auto family's input) into `plan`: the keys --auto chooses,
/// in a fixed order (the sweep's tables, CSV and launch lines name plans by them).
Overrides auto_overrides(const SimulationInput& base, const ParallelPlan& plan);
/// A candidate's whole overrides (its own `sets`, then auto_overrides when derived_sets).
Overrides candidate_overrides(const SweepCandidate& c);

/// Every (context, tensor, pipeline, data, expert, micro_batch, virtual_stages, schedule, partition,
/// recompute, sequence_parallel, sharding, overlaps) of the base input's model, GPU count
/// (base.plan.gpus()) and global batch, built valid by construction: tensor over the divisors of the
/// heads, key/value groups, ffn and vocabulary that tile one NVLink domain, pipeline over the layer
/// splits a partition allows, context over the divisors of the sequence, expert over those of the
/// experts, data from the GPU count, micro_batch over the divisors of the per-replica batch, the
/// schedules and virtual stages whose rules the microbatch count meets. Each layout is still checked
/// by validate_plan; what it refuses (rules of the scenario's own keys, e.g. optimizer_sync) is
/// counted in `invalid`. The precision and the other keys that change the run's arithmetic are the
/// base's. `config_of(plan, sets)` gives each candidate's resolved config JSON (empty function: none). Candidates get
/// `family`. Built on `jobs` threads (0 = cores; config_of must allow concurrent calls); the result
/// does not depend on it. `part` of `parts` (mpirun: rank of size): only the layouts (cp, t, p)
/// whose place in the enumeration is part modulo parts; the parts together are the whole.
std::vector<SweepCandidate> auto_candidates(const SimulationInput& base,
                                            const std::function<std::string(const ParallelPlan&, const Overrides&)>& config_of,
                                            SkipReasons& invalid, int jobs = 0, int family = 0, int part = 0, int parts = 1);
/// The same plans in shape groups (SweepCandidates: members built when needed), without config
/// JSON: what `ptdp sweep --auto` ranks.
SweepCandidates auto_candidate_groups(const SimulationInput& base, SkipReasons& invalid, int jobs = 0, int family = 0,
                                      int part = 0, int parts = 1);

/// What auto_candidates does not build for the base plan's framework (framework_mechanisms), one
/// phrase each (e.g. "context parallelism", "ZeRO-2 with pipeline stages"); the sweep prints them.
std::vector<std::string> auto_exclusions(const TransformerSpec& model, const ParallelPlan& base);

/// Default cap on the configurations of a --vary sweep (`ptdp sweep --max-configurations`).
inline constexpr size_t kDefaultMaxConfigurations = 100'000;

/// How many combinations `axes` has (the product of their sizes; SIZE_MAX when it overflows).
size_t product_size(const std::vector<std::pair<std::string, std::vector<std::string>>>& axes);

/// The cartesian product of `axes` (key, values); `load(sets)` turns a combination into an input
/// and throws ConfigError: rule violations (ConfigError::is_rule_violation) are counted in
/// `invalid`, other errors (a malformed value) stop the sweep. The combinations are counted
/// first: more than `max_configurations` is a ConfigError (key "--vary") before any is built.
/// `progress`: a progress bar on stderr while they are built.
std::vector<SweepCandidate> product_candidates(const std::vector<std::pair<std::string, std::vector<std::string>>>& axes,
                                               const std::function<SimulationInput(const Overrides&)>& load,
                                               SkipReasons& invalid,
                                               size_t max_configurations = kDefaultMaxConfigurations, bool progress = false);

/// Where the work of a sweep runs: this process is `rank` of `size`; `gather` collects every
/// rank's string on rank 0 (in rank order; elsewhere empty), `broadcast` gives rank 0's string
/// to all. Both are collective. (The CLI wires them to the executor's MPI Communicator.)
struct SweepGroup {
  int rank = 0;
  int size = 1;
  /// The candidates given to run_sweep are this rank's share already (auto_candidates' part of
  /// size), not the same list on every rank: each is this rank's, and a plan of another rank is
  /// rebuilt from its family's input (family_inputs[family], the same on every rank) and its plan.
  bool split = false;
  std::vector<std::shared_ptr<const SimulationInput>> family_inputs;
  std::function<std::vector<std::string>(const std::string&)> gather;
  std::function<std::string(const std::string&)> broadcast;
};

/// What a sweep ranks by: time (tokens/s), cost (cost_usd for train_tokens when a GPU-hour
/// price is given, else GPU-seconds per token), or energy (joules per token).
enum class SweepRank { Time, Cost, Energy };
std::string to_string(SweepRank r);
/// "time" | "cost" | "energy"; throws ConfigError naming the choices.
SweepRank parse_sweep_rank(const std::string& text);
/// The ranking key of a report: lower is better.
double sweep_score(const Report& r, SweepRank by);

struct SweepOptions {
  size_t top = 10;                        // re-simulate the best K …
  Fidelity refine = Fidelity::Reduced;    // … at this fidelity (Analytic: none)
  int jobs = 0;                           // threads / simulations at once; 0 = cores
  bool progress = false;                  // progress bars on stderr (rank 0)
  SweepRank rank_by = SweepRank::Time;
  /// Skip plans whose lower bound (iteration_lower_bound_s) cannot enter the top K (time and cost
  /// rankings). false: every plan is simulated (the exhaustive search).
  bool prune = true;
  /// Keep an outcome for every pruned plan and every plan that does not fit (`ptdp sweep --csv`
  /// writes a row each); false: they are counted (SweepResult::pruned, ::out_of_memory) and of the
  /// plans that do not fit only the closest to fitting, and those whose schedule showed it, kept,
  /// which keeps a large --auto space's memory and time small.
  bool keep_pruned = true;
  /// Wall-clock budget of the top-K re-simulation (seconds; 0 = none): the first
  /// `refine_guaranteed` of the ranking are re-simulated whatever it says, the rest cheapest
  /// first; what the budget does not reach keeps its analytic figure and says so.
  double refine_budget_s = 0;
  size_t refine_guaranteed = 0;
};

/// What a plan's lower bound needs of its costs (sim/costing plan_costs), per stage unless said.
/// Plans that differ only in what these do not depend on (the pipeline schedule within GPipe,
/// 1F1B, interleaved at the same v, ZB-H1/H2/auto; the global batch) share them.
struct BoundCosts {
  std::vector<int> stage_to_rank;
  std::vector<double> forward_s, backward_s, reduce_grad_s;
  std::vector<double> split_backward_s;  // I + W (zero-bubble schedules split every backward)
  std::vector<double> hop_s;    // stage → stage + 1 and back: wire time + the RECV's all-gather
  std::vector<double> optim_s;  // per pipeline rank
};
BoundCosts bound_costs(const SimulationInput& in);
BoundCosts bound_costs(const TransformerSpec& model, const ParallelPlan& plan, const ClusterSpec& cluster);

/// A lower bound of a plan's analytic iteration time: per pipeline rank, the forwards that must
/// reach its first stage, its compute (m forwards and backwards of its stages, TP collectives and
/// exposed sharding waits included), its gradient reductions and, for schedules with whole
/// backwards, the chain of backwards below it; then the slowest optimizer step. No bubble beyond
/// that. The sweep skips plans whose bound cannot enter the top K.
double iteration_lower_bound_s(const BoundCosts& costs, const ParallelPlan& plan);
double iteration_lower_bound_s(const SimulationInput& in);

/// A plan's compute twin: the same plan without sharding (stage 0), offload or data-parallel
/// overlaps. Its forwards, backwards and hops cost no more than the plan's (sharding only adds
/// waits to them; the overlaps only change the gradient reduction and the optimizer step).
ParallelPlan compute_twin(const ParallelPlan& plan);
/// The bound costs of `plan`'s compute twin with no gradient reduction and no optimizer step:
/// iteration_lower_bound_s of them, with `plan`'s own microbatches and schedule, is a lower bound
/// of the plan's (and of every plan with the same twin: one costing serves a dozen sharding and
/// overlap choices). The sweep checks it between the layer bound and the plan's own bound.
BoundCosts compute_bound_costs(const TransformerSpec& model, const ParallelPlan& plan, const ClusterSpec& cluster);

struct SweepOutcome {
  size_t candidate = 0;  // index into the sweep's candidates (split groups: index · size + rank)
  int family = -1;       // the candidate's
  Overrides sets;
  ParallelPlan plan;
  std::string status;  // ok | oom | error | pruned (its lower bound, in analytic.iteration_time_s, cannot enter the top K)
  std::string error;
  Report analytic;     // ok: the analytic report; oom: memory figures only
  std::optional<Report> refined;  // top K: the report at SweepOptions::refine
  std::string refined_error;      // top K: why the refined run failed
  /// Shown rows (the first max(K, 10) of the ranking): the share of the data-parallel and sharding
  /// communication the plan issues (communication_issued_s) that its overlaps hide, analytic;
  /// and, when that is over half, the analytic iteration time with the NICs at half bandwidth.
  std::optional<double> hidden_comm_fraction;
  std::optional<double> half_nic_iteration_s;
  /// ok, in the process whose analytic pass evaluated it: the lowered schedule it ran
  /// (make_costed_schedule's), which the refinement hands to its SimGrid child instead of making
  /// it again. Kept only for the top K once ranked; not sent between ranks.
  std::shared_ptr<const Schedule> schedule;
};

/// The data-parallel and sharding communication a plan's pipeline rank 0 issues per iteration,
/// each collective at its own pace as if nothing overlapped: gradient reductions, parameter
/// gathers after the step, per-unit gathers and reduce-scatters of sharded stages (the plan's
/// costs with Megatron's overlaps switched off). The classes "dp" and "shard" of exposed_comm_s.
double communication_issued_s(const SimulationInput& in);

/// The framework a plan needs when Megatron-LM cannot run it as such (empty when it can: 1F1B or
/// interleaved, plain data parallelism or the distributed optimizer over the data-parallel group,
/// no offload), e.g. "DeepSpeed ZeRO-3 or PyTorch FSDP (FULL_SHARD)".
std::string framework_needed(const ParallelPlan& p);

struct SweepResult {
  /// rank 0: every evaluated plan (and, with keep_pruned, every pruned one; without, of those that
  /// do not fit the ones SweepOptions::keep_pruned says) in candidate order; other ranks: empty.
  std::vector<SweepOutcome> outcomes;
  std::vector<size_t> ranking;         // indices of `ok` outcomes, best first (refined ones by their refined throughput)
  size_t refined = 0;                  // how many of the ranking's first were re-simulated
  size_t pruned = 0;                   // plans skipped by their lower bound (rank 0: every rank's)
  size_t out_of_memory = 0;            // plans that do not fit in GPU memory (rank 0: every rank's)
  size_t candidates = 0;               // plans swept, evaluated or pruned (rank 0: every rank's)
  /// The refined top K (ranking[0, refined)) in their analytic order, before the refined figures
  /// reordered them: rank stability is how the first three moved.
  std::vector<size_t> analytic_top;
  double analytic_s = 0, total_s = 0;  // wall time of the analytic phase and of the sweep
  SweepRank rank_by = SweepRank::Time;  // what `ranking` orders by
};

/// The figure a sweep ranks by, as the table, the CSV (`ranked_by`, `ranked_value`) and the plot
/// show it: tokens/s (time; higher is better), cost_usd or GPU-hours per million tokens (cost),
/// kWh per million tokens (energy; lower is better). The report is the refined one when there is.
struct RankFigure {
  std::string name;  // tokens_per_s | cost_usd | gpu_hours_per_mtok | kwh_per_mtok
  double value = 0;
  bool higher_is_better = false;
};
RankFigure rank_figure(const Report& r, SweepRank by);

/// What a re-simulation of a plan of one family (the same model, cluster and options) reads:
/// plans of a family with equal keys run the same simulation, so the sweep re-simulates one and
/// gives the others its report. Every plan field (model/plan_fields.hpp) and the config JSON the
/// report carries, except moe_comm_overlap on a schedule that pairs its forwards and backwards
/// itself (DualPipe, DualPipeV: merges_expert_overlap is false whatever the flag says, and no
/// engine or costing reads it otherwise).
std::string refinement_key(const ParallelPlan& plan, const std::string& config_json);

/// Runs the sweep. Candidates must be the same on every rank of `group` (null: one process).
/// Ranking: by SweepOptions::rank_by (time: tokens/s, equivalently throughput for a fixed global
/// batch), ties broken by the overrides so the order does not depend on how the work was split.
/// Throws ConfigError when ranking by energy on a topology without GPU power.
/// The candidates are taken (their overrides move into the outcomes): pass them with std::move
/// when they are not needed after.
SweepResult run_sweep(SweepCandidates candidates, const SweepOptions& options, const SweepGroup* group = nullptr);
SweepResult run_sweep(std::vector<SweepCandidate> candidates, const SweepOptions& options,
                      const SweepGroup* group = nullptr);

/// "t8 p4 d32 b1 interleaved v2 rc-full" (+ " z3-node off-opt" with sharding).
std::string plan_label(const ParallelPlan& p);
/// A plan's overrides as one text key ("key=value;…"): the order of equal-scoring rows.
std::string key_of(const Overrides& sets);

/// The families `ptdp compare-strategies` sets side by side: Megatron's PTD-P (plain data
/// parallelism or its distributed optimizer = ZeRO-1, no offload); ZeRO-3 / FSDP full shard as
/// DeepSpeed and PyTorch users run it (stage 3 over the whole data-parallel group, no tensor or
/// pipeline parallelism); and hybrids (every other sharded plan: ZeRO-2/3 with tensor or
/// pipeline parallelism, node sharding groups, offload).
enum class Strategy { MegatronPtdp, FullySharded, Hybrid };
inline constexpr Strategy kStrategies[] = {Strategy::MegatronPtdp, Strategy::FullySharded, Strategy::Hybrid};
std::string to_string(Strategy s);
Strategy strategy_of(const ParallelPlan& p);
/// Index (into result.outcomes) of the best-ranked outcome of each strategy that has one.
std::map<Strategy, size_t> best_by_strategy(const SweepResult& result);

/// The sweep as RFC 4180 CSV: one row per outcome (ranked first, then the rest by overrides)
/// with the plan, every report key and `refined_*` for the re-simulated ones.
std::string sweep_csv(const SweepResult& result);

}  // namespace ptdp
