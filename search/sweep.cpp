#include "search/sweep.hpp"

#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <numeric>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "core/csv.hpp"
#include "core/enum_names.hpp"
#include "core/error.hpp"
#include "model/memory.hpp"
#include "model/partition.hpp"
#include "model/plan_fields.hpp"
#include "sim/costing.hpp"
#include "search/sweep_progress.hpp"
#include "topologies/compute_profile.hpp"

namespace ptdp {
namespace {

using sweep_detail::Progress;

using nlohmann::json;

// Activation microbatches in flight that every schedule keeps at least, per pipeline rank: 1F1B's
// min(p − r, m) (GPipe, interleaving, ZB-H2 keep more; ZB-H1 the same; ZB-V as many half-stage
// chunks), or one for zb-auto, which places W under the memory it is given.
std::vector<int> least_inflight(const ParallelPlan& plan) {
  std::vector<int> out(static_cast<size_t>(plan.pipeline), 1);
  if (plan.schedule == ScheduleKind::ZeroBubbleAuto) return out;
  const int64_t m = plan.num_microbatches();
  for (int64_t r = 0; r < plan.pipeline; ++r) out[static_cast<size_t>(r)] = static_cast<int>(std::min(plan.pipeline - r, m));
  return out;
}

// Work plans have in common, computed once per sweep (threads share it). Only candidates of one
// family (SweepCandidate::family: the same model and cluster) share; the keys hold every field
// auto_candidates varies.
class SweepCache {
 public:
  // `ops`: op lists already made for a family (SweepCandidates::take_ops), its memo here.
  explicit SweepCache(std::map<int, std::shared_ptr<LayerOpsMemo>> ops = {}) : ops_memos_(std::move(ops)) {}

  struct ScheduleOrError {
    Schedule schedule;
    std::vector<int> inflight;  // peak_inflight_activations(schedule)
    std::string memory_error;   // MemoryLimitError: no schedule
  };

  // The bound's costs: plan_costs depends on the schedule only through the V placement and, with
  // --overlap-grad-reduce, through whether the backward is split; not on the global batch. The
  // bound also on whether F and B run in pairs (DualPipeV: ZB-V's placement, a bound of its own).
  std::shared_ptr<const BoundCosts> bound_costs_of(const SweepCandidate& c) {
    if (c.family < 0) return std::make_shared<const BoundCosts>(bound_costs(c.base->model, c.plan, c.base->cluster));
    const ParallelPlan& p = c.plan;
    const int schedule_class = p.lanes() > 1                      ? 3
                               : runs_overlapped_pairs(p) ? 4  // DualPipeV: ZB-V's V; pairs' bound
                               : is_v_shape(p.schedule)            ? 2
                               : p.overlap_grad_reduce && is_zero_bubble(p.schedule) ? 1
                                                                                     : 0;
    const std::string key = plan_key(c.family, p) + std::to_string(schedule_class);
    return find_or_make(bounds_, key, [&] { return bound_costs(c.base->model, c.plan, c.base->cluster); });
  }

  // The bound between the two (compute_bound_costs): the costs of the plan's compute twin, shared
  // by the plans that differ only in their sharding, offload and data-parallel overlaps.
  std::shared_ptr<const BoundCosts> compute_bound_costs_of(const SweepCandidate& c) {
    const ParallelPlan twin = compute_twin(c.plan);
    if (c.family < 0) return std::make_shared<const BoundCosts>(compute_bound_costs(c.base->model, c.plan, c.base->cluster));
    const int schedule_class = twin.lanes() > 1 ? 3 : runs_overlapped_pairs(twin) ? 4 : is_v_shape(twin.schedule) ? 2 : 0;
    const std::string key = plan_key(c.family, twin) + std::to_string(schedule_class);
    return find_or_make(computes_, key, [&] { return compute_bound_costs(c.base->model, c.plan, c.base->cluster); });
  }

  // A cheaper bound than iteration_lower_bound_s, from one transformer layer's forward and backward
  // (TP collectives included), which depend only on the key below (not on the pipeline layout,
  // schedule, sharding or overlaps): per pipeline rank, the forwards of the layers before its first
  // stage once (and their backwards, with whole backwards) and its own layers' forwards and
  // backwards m times. The sweep checks it before it
  // computes a plan's own costs. Never above iteration_lower_bound_s.
  double layer_bound_s(const SweepCandidate& c) {
    const ParallelPlan& p = c.plan;
    const TransformerSpec& model = c.base->model;
    const ClusterSpec& cluster = c.base->cluster;
    LayerCosts layer;
    if (c.family < 0) {
      layer = layer_costs(model, p, cluster);
    } else {
      // layer_costs reads neither the pipeline nor the data degree, Megatron's expert overlap nor
      // the FP8 parameter gather (sim/costing.cpp layer_price_key).
      // (A fixed array, not a string: the key of every plan of the space, no allocation each.)
      const LayerKey key = {c.family, p.tensor, p.micro_batch, static_cast<int64_t>(p.recompute),
                            p.sequence_parallel, static_cast<int64_t>(p.precision), p.tp_comm_overlap,
                            p.context, p.expert, p.expert_tensor, static_cast<int64_t>(p.moe_dispatcher),
                            static_cast<int64_t>(p.context_comm)};
      layer = *find_or_make(layers_, key, [&] { return layer_costs(model, p, cluster); });
    }
    double per_layer = layer.forward_s + layer.backward_s, forward_s = layer.forward_s;  // one layer's F + B, and its F
    if (has_overlapped_pairs(p.schedule)) {
      // DualPipe's pairs may hide up to (1 − κ) · T of each action's TP-stream time T under its
      // partner (bound_costs' overlapped_pair_bounds); a layer's part of each action is at least
      // its time less that.
      const double keep = cluster.overlaps_communication() ? hidden_s(1.0, 1.0, kCollectiveContention) : 0.0;
      forward_s = layer.forward_s - keep * layer.forward_tp_s;
      per_layer = forward_s + std::min(layer.backward_s - keep * (layer.backward_tp_s - layer.hidden_tp_s),
                                       layer.input_s + layer.weight_s - keep * layer.backward_tp_s);
    } else if (merges_expert_overlap(p)) {
      // Megatron's merged steps hide up to (1 − κ) of each action's expert all-to-alls.
      const double keep = cluster.overlaps_communication() ? hidden_s(1.0, 1.0, kCollectiveContention) : 0.0;
      forward_s = layer.forward_s - keep * layer.forward_ep_s;
      per_layer = forward_s + layer.backward_s - keep * layer.backward_ep_s;
    }
    // Per rank r, as iteration_lower_bound_s: nothing of r starts before microbatch 0's forward
    // passed the layers of the stages before r's first (head, ≥ their layers' forwards), then
    // r computes m forwards and backwards of its layers.
    const std::vector<int64_t> layers = stage_layers(model, p);
    const size_t ranks = static_cast<size_t>(p.pipeline);
    std::vector<int64_t> per_rank(ranks, 0), head(ranks, std::numeric_limits<int64_t>::max());
    int64_t before = 0;  // layers of the stages before st on its lane
    for (size_t st = 0; st < layers.size(); ++st) {
      if (p.is_first_stage(static_cast<int64_t>(st))) before = 0;
      const auto r = static_cast<size_t>(stage_rank(p, static_cast<int64_t>(st)));
      per_rank[r] += layers[st];
      head[r] = std::min(head[r], before);
      before += layers[st];
    }
    // Schedules with whole backwards (GPipe, 1F1B, interleaved; one lane): after r's last backward,
    // on its first stage, the backwards of the stages before it run in a chain down to stage 0
    // (iteration_lower_bound_s' tail), at least their layers' backwards.
    const bool chain = p.schedule == ScheduleKind::GPipe || p.schedule == ScheduleKind::OneFOneB || p.schedule == ScheduleKind::Interleaved;
    const double before_s = chain ? per_layer : forward_s;  // per layer before r's first stage
    const double m = static_cast<double>(p.num_microbatches()) / static_cast<double>(p.lanes());
    double bound = 0;
    for (size_t r = 0; r < ranks; ++r)
      bound = std::max(bound, static_cast<double>(head[r] == std::numeric_limits<int64_t>::max() ? 0 : head[r]) * before_s +
                                  m * static_cast<double>(per_rank[r]) * per_layer);
    return bound;
  }
  // What layer_bound_s reads of a shape group's variant (SweepCandidates): the TP overlap (its
  // layer key) and the expert overlap (merges_expert_overlap); not the sharding, offload, the
  // data-parallel overlaps or the sends. Members of a group with the same class share their bound.
  static int layer_bound_class(const PlanVariant* v) { return v ? (v->tp_comm_overlap ? 1 : 0) + (v->moe_comm_overlap ? 2 : 0) : 0; }

  // The lowered schedule: GPipe, 1F1B, interleaved and ZB-H1 depend on (kind, p, v, m, group),
  // whether Megatron's expert overlap merges F/B pairs and whether stages are held unsharded
  // (UNSHARD … RESHARD windows) alone; ZB-H2, ZB-V and zb-auto on the costed F, I, W, transfer
  // and memory limits as well.
  std::shared_ptr<const ScheduleOrError> schedule_of(const TransformerSpec& model, const ParallelPlan& p, const ClusterSpec& cluster) {
    std::string key = std::to_string(static_cast<int>(p.schedule)) + "/" + std::to_string(p.pipeline) + "/" +
                      std::to_string(p.virtual_stages) + "/" + std::to_string(p.num_microbatches()) + "/" +
                      std::to_string(p.group_size()) + (merges_expert_overlap(p) ? "/pairs" : "") +
                      (stage_held_unsharded(p) ? "/windows" : "");
    std::optional<ZeroBubbleCosts> zb;
    if (p.schedule == ScheduleKind::ZeroBubbleH2 || p.schedule == ScheduleKind::ZeroBubbleV || p.schedule == ScheduleKind::ZeroBubbleAuto) {
      zb = zero_bubble_costs(model, p, cluster);
      auto bytes = [&key](const void* data, size_t n) { key.append(static_cast<const char*>(data), n); };
      for (const auto* v : {&zb->forward_s, &zb->input_s, &zb->weight_s}) bytes(v->data(), v->size() * sizeof(double));
      bytes(&zb->transfer_s, sizeof(double));
      bytes(zb->memory_limit.data(), zb->memory_limit.size() * sizeof(int));
    }
    // A schedule that cannot be placed (zb-auto without room) is remembered as such too.
    auto made = find_or_make(schedules_, key, [&]() -> ScheduleOrError {
      try {
        ScheduleOrError out;
        out.schedule = make_schedule(p, /*check_deadlocks=*/false, zb ? &*zb : nullptr);  // the critical path finds cycles
        out.inflight = peak_inflight_activations(out.schedule);
        return out;
      } catch (const MemoryLimitError& e) {
        ScheduleOrError out;
        out.memory_error = e.what();
        return out;
      }
    });
    if (!made->memory_error.empty()) throw MemoryLimitError(made->memory_error);
    return made;
  }

  // The family's layer prices (sim/costing.hpp LayerPriceMemo): its plans share the model and
  // cluster. None outside a family.
  LayerPriceMemo* layer_memo(int family) { return family_memo(memos_, family); }
  // The family's layer and head op lists (model/cost.hpp LayerOpsMemo), which its layer and unit
  // prices and memory checks share. None outside a family.
  LayerOpsMemo* ops_memo(int family) { return family_memo(ops_memos_, family); }

 private:
  static std::string plan_key(int family, const ParallelPlan& p) {
    const int64_t fields[] = {family, p.tensor, p.pipeline, p.data, p.micro_batch, p.virtual_stages,
                              static_cast<int64_t>(p.recompute), p.sequence_parallel, static_cast<int64_t>(p.partition),
                              p.zero_stage, static_cast<int64_t>(p.sharding_group), static_cast<int64_t>(p.offload),
                              static_cast<int64_t>(p.precision), p.overlap_grad_reduce, p.overlap_param_gather,
                              p.tp_comm_overlap, p.fp8_param_gather, p.context, p.expert, p.expert_tensor,
                              static_cast<int64_t>(p.moe_dispatcher), static_cast<int64_t>(p.context_comm), p.moe_comm_overlap,
                              p.overlap_p2p};
    return std::string(reinterpret_cast<const char*>(fields), sizeof fields);
  }
  template <class Ptr>
  typename Ptr::element_type* family_memo(std::map<int, Ptr>& memos, int family) {
    if (family < 0) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    auto& memo = memos[family];
    if (!memo) memo = Ptr(new typename Ptr::element_type());
    return memo.get();
  }
  template <class Key, class T, class Make>
  std::shared_ptr<const T> find_or_make(std::map<Key, std::shared_ptr<const T>>& cache, const Key& key, Make make) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = cache.find(key);
      if (it != cache.end()) return it->second;
    }
    auto made = std::make_shared<const T>(make());  // outside the lock: threads may make the same one, the first is kept
    std::lock_guard<std::mutex> lock(mutex_);
    return cache.emplace(key, std::move(made)).first->second;
  }
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const BoundCosts>> bounds_, computes_;
  using LayerKey = std::array<int64_t, 12>;
  std::map<LayerKey, std::shared_ptr<const LayerCosts>> layers_;
  std::map<std::string, std::shared_ptr<const ScheduleOrError>> schedules_;
  std::map<int, std::unique_ptr<LayerPriceMemo>> memos_;
  std::map<int, std::shared_ptr<LayerOpsMemo>> ops_memos_;
};

// An outcome that does not fit in GPU memory (only its memory figures are known).
void mark_oom(const SweepCandidate& c, double peak_bytes, SweepOutcome& out) {
  out.status = "oom";
  out.analytic.peak_memory_bytes = peak_bytes;
  out.analytic.fits_in_memory = false;
  out.analytic.gpus = c.plan.gpus();
  out.analytic.gpu_memory_bytes = c.base->cluster.gpu.memory_bytes;
}

// The ShardedMemory of a plan's shape, made when asked (nullptr, or no function: none).
using ShapeMemory = std::function<const ShardedMemory*()>;

// The ShardedMemory of each shape group of several members (SweepCandidates), made from the
// group's shape: its members differ only in their sharding and overlaps, which
// ShardedMemory::per_rank takes of the plan it is asked about. Threads share it.
class GroupMemory {
 public:
  explicit GroupMemory(const SweepCandidates& cands) : cands_(cands) {}
  const ShardedMemory& of(size_t g) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (const auto it = memo_.find(g); it != memo_.end()) return *it->second;
    }
    ParallelPlan shape = cands_.shape(g).plan;
    shape.zero_stage = 0;
    shape.sharding_group = ShardingGroup::Data;
    shape.offload = Offload::None;
    auto made = std::make_unique<const ShardedMemory>(cands_.shape(g).base->model, shape);  // outside the lock
    std::lock_guard<std::mutex> lock(mutex_);
    return *memo_.emplace(g, std::move(made)).first->second;  // (another thread's, when it made it first)
  }

 private:
  const SweepCandidates& cands_;
  std::mutex mutex_;
  std::unordered_map<size_t, std::unique_ptr<const ShardedMemory>> memo_;
};

// The closed-form memory with the fewest microbatches in flight any schedule keeps: a plan that
// does not fit even so is out whatever its schedule (marked oom; false). `shape`: the memory of
// the plan's shape, shared by the plans that differ only in their sharding (none: made afresh).
bool fits_least(const SweepCandidate& c, SweepOutcome& out, const ShapeMemory& shape) {
  const std::vector<int> inflight = least_inflight(c.plan);
  const ShardedMemory* memory = shape ? shape() : nullptr;
  const MemoryBreakdown least = peak_memory(memory ? memory->per_rank(c.plan, inflight)
                                                   : memory_per_rank(c.base->model, c.plan, inflight));
  if (least.total_bytes <= c.base->cluster.gpu.memory_bytes) return true;
  mark_oom(c, least.total_bytes, out);
  return false;
}

// `fits_least_checked`: fits_least(c) was true already.
void evaluate_analytic(const SweepCandidate& c, SweepOutcome& out, SweepCache& cache, bool fits_least_checked,
                       const ShapeMemory& shapes) {
  const TransformerSpec& model = c.base->model;
  const ParallelPlan& plan = c.plan;
  const ClusterSpec& cluster = c.base->cluster;
  // Memory first, from the schedule's in-flight counts: plans that do not fit are not simulated.
  auto oom = [&](const MemoryBreakdown& mem) { mark_oom(c, mem.total_bytes, out); };
  if (!fits_least_checked && !fits_least(c, out, shapes)) return;
  std::shared_ptr<const SweepCache::ScheduleOrError> s;
  try {
    s = cache.schedule_of(model, plan, cluster);
  } catch (const MemoryLimitError&) {
    // zb-auto found no placement within the memory: the plan does not fit (with one microbatch
    // in flight per rank, the least any schedule keeps).
    return oom(peak_memory(memory_per_rank(model, plan, std::vector<int>(static_cast<size_t>(plan.pipeline), 1))));
  }
  const MemoryBreakdown mem = peak_memory(memory_per_rank(model, plan, s->inflight));
  if (mem.total_bytes > cluster.gpu.memory_bytes) return oom(mem);
  out.status = "ok";
  out.analytic = simulate_report(c.input(), s->schedule, Fidelity::Analytic);
  out.schedule = std::shared_ptr<const Schedule>(s, &s->schedule);  // (the cache's entry lives while an outcome holds it)
}

// A pruned or unfitting plan's analytic figures are the few evaluate_analytic and the pruning set
// (its bound; its memory): sent as such, not as a whole report (most of a split sweep's outcomes).
json analytic_json(const SweepOutcome& o) {
  const Report& r = o.analytic;
  if (o.status == "pruned") return {{"bound", r.iteration_time_s}, {"gpus", r.gpus}};
  if (o.status == "oom") return {{"peak", r.peak_memory_bytes}, {"memory", r.gpu_memory_bytes}, {"gpus", r.gpus}};
  return json::parse(report_to_json(r));
}

void analytic_from_json(const json& j, SweepOutcome& o) {
  Report& r = o.analytic;
  if (o.status == "pruned") {
    r.iteration_time_s = j["bound"];
    r.gpus = j["gpus"];
  } else if (o.status == "oom") {
    r.peak_memory_bytes = j["peak"];
    r.gpu_memory_bytes = j["memory"];
    r.gpus = j["gpus"];
    r.fits_in_memory = false;
  } else {
    r = report_from_json(j.dump(), "sweep");
  }
}

json outcome_json(const SweepOutcome& o) {
  json sets = json::array();
  for (const auto& [k, v] : o.sets) sets.push_back({k, v});
  return {{"sets", sets},
          {"candidate", o.candidate},
          {"family", o.family},
          {"status", o.status},
          {"error", o.error},
          {"analytic", analytic_json(o)},
          {"refined", o.refined ? json::parse(report_to_json(*o.refined)) : json(nullptr)},
          {"refined_error", o.refined_error},
          {"plan", plan_integers(o.plan)}};
}

std::string serialize(const std::vector<SweepOutcome>& outs) {
  json j = json::array();
  for (const auto& o : outs) j.push_back(outcome_json(o));
  return j.dump();
}

void deserialize_into(const std::string& text, std::vector<SweepOutcome>& outs) {
  for (const auto& e : json::parse(text)) {
    SweepOutcome o;
    for (const auto& s : e["sets"]) o.sets.emplace_back(s[0], s[1]);
    o.candidate = e["candidate"];
    o.family = e["family"];
    o.status = e["status"];
    o.error = e["error"];
    analytic_from_json(e["analytic"], o);
    if (!e["refined"].is_null()) o.refined = report_from_json(e["refined"].dump(), "sweep");
    o.refined_error = e["refined_error"];
    o.plan = plan_from_integers(e["plan"].get<std::vector<int64_t>>());  // every field (model/plan_fields.hpp)
    outs.push_back(std::move(o));
  }
}

int workers(const SweepOptions& o) {
  return std::max(1, o.jobs > 0 ? o.jobs : static_cast<int>(std::thread::hardware_concurrency()));
}

// Re-simulates outcomes[i] for i in `which` at `fidelity`, `parallel` SimGrid children at once.
// A relative estimate of a SimGrid run's work: its actions (microbatches × stages, × units per
// stage with per-unit sharded collectives) and, in full fidelity, its devices.
double refine_cost(const SimulationInput& in, Fidelity fidelity) {
  const ParallelPlan& p = in.plan;
  double actions = static_cast<double>(p.num_microbatches()) * static_cast<double>(p.num_stages());
  // Sharded stages 2–3: per-unit reduce-scatters (and gathers), each a ring over the sharding group.
  if (p.zero_stage >= 2)
    actions *= (static_cast<double>(in.model.num_layers) / static_cast<double>(p.num_stages()) + 2) * static_cast<double>(p.sharding_degree());
  if (fidelity == Fidelity::Full) actions *= static_cast<double>(p.gpus()) / static_cast<double>(p.pipeline);
  else actions *= static_cast<double>(std::max<int64_t>(1, p.data));  // reduced: one flow per replica and ring step
  return actions;
}

// `keys` (by outcome; empty: none): the outcomes whose keys are equal run the same simulation
// (refinement_key); the first of them in `which` runs it and the others take its result.
// The SimGrid children run the schedule an outcome holds (its analytic pass's) where it has one.
void refine(std::vector<SweepOutcome>& outcomes, std::vector<size_t> which, const std::vector<const SimulationInput*>& inputs,
            Fidelity fidelity, size_t parallel, bool progress, double budget_s, size_t guaranteed,
            const std::vector<std::string>& keys) {
  guaranteed = std::min(guaranteed, which.size());
  std::vector<std::pair<size_t, size_t>> same_run;  // (outcome, the outcome whose run it shares)
  if (!keys.empty()) {
    std::unordered_map<std::string, size_t> first;
    std::vector<size_t> runs;
    size_t guaranteed_runs = 0;
    for (size_t pos = 0; pos < which.size(); ++pos) {
      const size_t i = which[pos];
      const auto [it, fresh] = first.emplace(keys[i], i);
      if (keys[i].empty() || fresh) {
        runs.push_back(i);
        guaranteed_runs += pos < guaranteed;
      } else {
        same_run.emplace_back(i, it->second);
      }
    }
    which = std::move(runs);
    guaranteed = guaranteed_runs;
  }
  // The first `guaranteed` of `which` (the best of the ranking) are re-simulated whatever the
  // budget; the rest cheapest first, so that the budget refines as many of them as it can.
  auto cheaper = [&](size_t a, size_t b) { return refine_cost(*inputs[a], fidelity) < refine_cost(*inputs[b], fidelity); };
  std::stable_sort(which.begin(), which.begin() + static_cast<long>(guaranteed), cheaper);
  std::stable_sort(which.begin() + static_cast<long>(guaranteed), which.end(), cheaper);
  Progress bar(to_string(fidelity), which.size(), progress && !which.empty());
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto last_said = t0;
  // The plans' SimGrid processes, forked from one that built the platform's hosts and links once.
  std::vector<const SimulationInput*> pooled(outcomes.size(), nullptr);
  std::vector<const Schedule*> schedules(outcomes.size(), nullptr);
  for (size_t i : which) pooled[i] = inputs[i], schedules[i] = outcomes[i].schedule.get();
  SimulationPool pool(std::move(pooled), std::move(schedules));
  std::vector<SimulationJob> running;
  std::vector<size_t> running_idx, running_pos;  // outcome, position in `which`
  size_t started = 0, finished = 0;
  bool stopped = false;
  auto out_of_budget = [&] { return budget_s > 0 && elapsed() >= budget_s; };
  const auto skipped_note = [&] {
    char buf[200];
    std::snprintf(buf, sizeof buf, "not re-simulated: the refinement budget (--refine-budget %g s) was spent on the top %zu and, "
                  "cheapest first, the plans after them", budget_s, guaranteed);
    return std::string(buf);
  };
  while (finished < which.size()) {
    while (started < which.size() && running.size() < parallel && (started < guaranteed || !out_of_budget())) {
      const size_t i = which[started];
      try {
        running.push_back(pool.start(i, fidelity));
        running_idx.push_back(i);
        running_pos.push_back(started);
      } catch (const std::exception& e) {
        outcomes[i].refined_error = e.what();
        ++finished;
      }
      ++started;
    }
    if (!stopped && guaranteed < which.size() && started >= guaranteed && out_of_budget()) {
      // Stop what lies beyond the guaranteed top: killed if running, left at its analytic figure
      // if not started, said so.
      stopped = true;
      for (size_t k = 0; k < running.size();) {
        if (running_pos[k] < guaranteed) {
          ++k;
          continue;
        }
        ::kill(running[k].pid, SIGKILL);
        try {
          running[k].finish();
        } catch (const std::exception&) {
        }
        outcomes[running_idx[k]].refined_error = skipped_note();
        running.erase(running.begin() + static_cast<long>(k));
        running_idx.erase(running_idx.begin() + static_cast<long>(k));
        running_pos.erase(running_pos.begin() + static_cast<long>(k));
        ++finished;
      }
      for (; started < which.size(); ++started, ++finished) outcomes[which[started]].refined_error = skipped_note();
      if (progress) {
        size_t done_ok = 0;
        for (size_t i : which) done_ok += outcomes[i].refined.has_value();
        std::fprintf(stderr, "ptdp: refinement budget spent (%.1f s): the top %zu are re-simulated, %zu of the %zu after them "
                     "(--refine-budget)\n", budget_s, guaranteed, done_ok > guaranteed ? done_ok - guaranteed : 0, which.size() - guaranteed);
      }
    }
    if (running.empty()) continue;
    std::vector<pollfd> fds;
    for (auto& j : running) fds.push_back(pollfd{j.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 250);
    for (size_t k = 0; k < running.size();) {
      if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) && !running[k].read_some()) {
        SweepOutcome& o = outcomes[running_idx[k]];
        try {
          o.refined = running[k].finish().report;
        } catch (const std::exception& e) {
          o.refined_error = e.what();  // reported for this configuration; the sweep goes on
        }
        running.erase(running.begin() + static_cast<long>(k));
        running_idx.erase(running_idx.begin() + static_cast<long>(k));
        running_pos.erase(running_pos.begin() + static_cast<long>(k));
        fds.erase(fds.begin() + static_cast<long>(k));
        bar.tick(++finished);
        continue;
      }
      ++k;
    }
    // Never silent for more than 2 s: which plan runs, how long it has been, what is left.
    if (progress && !running.empty() && std::chrono::steady_clock::now() - last_said >= std::chrono::seconds(2)) {
      last_said = std::chrono::steady_clock::now();
      const double per = finished > 0 ? elapsed() / static_cast<double>(finished) : 0.0;
      std::fprintf(stderr, "ptdp: refining (%s) %s — %zu of %zu done, %.1f s elapsed%s\n", to_string(fidelity).c_str(),
                   plan_label(outcomes[running_idx.front()].plan).c_str(), finished, which.size(), elapsed(),
                   per > 0 ? (", about " + std::to_string(static_cast<int>(per * static_cast<double>(which.size() - finished))) + " s left").c_str()
                           : "");
    }
  }
  for (auto [i, run] : same_run) {
    outcomes[i].refined = outcomes[run].refined;
    outcomes[i].refined_error = outcomes[run].refined_error;
  }
}

}  // namespace

std::string key_of(const Overrides& sets) {
  std::string k;
  for (const auto& [key, value] : sets) k += key + "=" + value + ";";
  return k;
}

std::string refinement_key(const ParallelPlan& plan, const std::string& config_json) {
  ParallelPlan read = plan;
  if (has_overlapped_pairs(read.schedule)) read.moe_comm_overlap = false;
  const std::vector<int64_t> fields = plan_integers(read);
  std::string key(reinterpret_cast<const char*>(fields.data()), fields.size() * sizeof(int64_t));
  return key + config_json;
}

double communication_issued_s(const SimulationInput& in) {
  ParallelPlan plan = in.plan;
  plan.overlap_grad_reduce = plan.overlap_param_gather = plan.tp_comm_overlap = false;
  const PlanCosts c = plan_costs(in.model, plan, in.cluster, true);  // the plan's own placement
  const double m = static_cast<double>(plan.num_microbatches());
  double s = c.optim_gather_s.empty() ? 0.0 : c.optim_gather_s[0];
  for (size_t st = 0; st < c.forward_s.size(); ++st) {
    if (stage_rank(plan, static_cast<int64_t>(st)) != 0) continue;
    s += c.reduce_grad_s[st];
    for (const auto& u : c.units[st]) s += m * (u.reduce_scatter_s + (plan.zero_stage >= 3 ? 2 * u.gather_s : 0.0));  // F and B gather
  }
  return s;
}

namespace {

// The candidates this rank evaluates, and how outcomes name them. A split group's candidates are
// all this rank's (outcomes name them index · size + rank); otherwise every size-th from rank.
struct SweepShare {
  std::vector<size_t> mine;  // indices into the candidates
  bool split = false;
  size_t rank = 0, size = 1;
  size_t id_of(size_t i) const { return split ? i * size + rank : i; }
  // Where candidate i is in `mine` (none: another rank's).
  std::optional<size_t> k_of(size_t i) const {
    if (split || size == 1) return i;
    if (i % size != rank) return std::nullopt;
    return i / size;
  }
};

SweepShare share_of(size_t candidates, const SweepGroup* group) {
  SweepShare s;
  s.rank = group ? static_cast<size_t>(group->rank) : 0;
  s.size = group ? static_cast<size_t>(group->size) : 1;
  s.split = group && group->split && s.size > 1;
  const size_t first = s.split ? 0 : s.rank, step = s.split ? 1 : s.size;
  for (size_t i = first; i < candidates; i += step) s.mine.push_back(i);
  return s;
}

void run_on_threads(const SweepOptions& options, const std::function<void()>& work) {
  std::vector<std::thread> pool;
  for (int i = 0; i < workers(options); ++i) pool.emplace_back(work);
  for (auto& th : pool) th.join();
}

// The outcome of candidate `c` (id: its name in the outcomes), its overrides taken from it (a
// candidate is not read again once it has an outcome).
SweepOutcome outcome_of(SweepCandidate& c, size_t id) {
  SweepOutcome o;
  o.candidate = id;
  o.family = c.family;
  o.sets = c.derived_sets ? candidate_overrides(c) : std::move(c.sets);
  o.plan = c.plan;
  return o;
}

// The peak memory of a candidate that does not fit in GPU memory whatever its schedule
// (fits_least); none when it may fit (or its memory check fails: evaluated in full, which reports
// the error).
std::optional<double> out_of_memory(const SweepCandidate& c, const ShapeMemory& shapes) {
  SweepOutcome checked;
  try {
    if (fits_least(c, checked, shapes)) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return checked.analytic.peak_memory_bytes;
}

// What the analytic pass leaves on this rank: the outcomes SweepResult::outcomes holds (in
// candidate order), how many plans it pruned and how many do not fit.
struct AnalyticPass {
  std::vector<SweepOutcome> outcomes;
  size_t pruned = 0, out_of_memory = 0;
};

// The plans the pass settles by one figure (those that do not fit: their peak memory; pruned
// ones: their bound), kept as that figure until the pass ends: their outcomes (1.6 kB each, a
// hundred thousand and more in a large --auto space) are made once, in candidate order, into a
// list of the right size, not moved at every growth of one and sorted.
struct SettledPlan {
  size_t k;      // index into `mine`
  double value;  // peak bytes (oom) or the bound (pruned)
  bool oom;
};

// The pass's outcomes in candidate order: `made` (evaluated plans, any order) and `settled`;
// `built`: the candidates the pass built, by place in `mine` (the others are built here).
// `every_oom` false: of the settled plans that do not fit, only the closest to fitting (the first
// of equals) gets an outcome.
std::vector<SweepOutcome> in_candidate_order(std::vector<SweepOutcome>& made, std::vector<SettledPlan>& settled,
                                             const SweepCandidates& cands, const std::vector<SweepCandidate*>& built,
                                             const SweepShare& share, bool every_oom) {
  std::sort(made.begin(), made.end(), [](const SweepOutcome& a, const SweepOutcome& b) { return a.candidate < b.candidate; });
  std::sort(settled.begin(), settled.end(), [](const SettledPlan& a, const SettledPlan& b) { return a.k < b.k; });  // mine is ascending
  if (!every_oom) {
    const SettledPlan* closest = nullptr;
    for (const SettledPlan& s : settled)
      if (s.oom && (!closest || s.value < closest->value)) closest = &s;
    // (By value: erasing moves the elements `closest` points into.) Any plan that does not fit
    // makes `closest` one.
    const auto kept = closest ? closest->k : decltype(closest->k){};
    settled.erase(std::remove_if(settled.begin(), settled.end(), [&](const SettledPlan& s) { return s.oom && s.k != kept; }),
                  settled.end());
  }
  std::vector<SweepOutcome> out;
  out.reserve(made.size() + settled.size());
  size_t i = 0;
  for (const SettledPlan& s : settled) {
    const size_t id = share.id_of(share.mine[s.k]);
    for (; i < made.size() && made[i].candidate < id; ++i) out.push_back(std::move(made[i]));
    std::optional<SweepCandidate> unbuilt;
    if (!built[s.k]) unbuilt = cands.member(share.mine[s.k]);
    SweepCandidate& c = built[s.k] ? *built[s.k] : *unbuilt;
    SweepOutcome& o = out.emplace_back(outcome_of(c, id));
    if (s.oom) {
      mark_oom(c, s.value, o);
    } else {
      o.status = "pruned";
      o.analytic.iteration_time_s = s.value;
      o.analytic.gpus = o.plan.gpus();
    }
  }
  for (; i < made.size(); ++i) out.push_back(std::move(made[i]));
  made.clear();
  settled.clear();
  return out;
}

// The analytic pass over this rank's share, on threads. With pruning (time and cost rankings:
// both grow with the iteration time) it goes best first, in two steps: every plan's layer bound
// (SweepCache::layer_bound_s, shared by many plans: once or twice per shape group) first, then the
// plans in the order of it; once the K best plans found so far are all faster than a plan's layer
// bound, or else than its own lower bound (iteration_lower_bound_s), it cannot enter the top K and
// is not simulated. A plan is built (SweepCandidates::member) when it leaves the layer-bound order
// on its own: the plans pruned together at its end are only counted (built for their outcomes
// with keep_pruned).
AnalyticPass analytic_pass(const SweepCandidates& cands, const SweepShare& share, const SweepOptions& options,
                           std::map<int, std::shared_ptr<LayerOpsMemo>> ops) {
  const std::vector<size_t>& mine = share.mine;
  const bool prune = options.prune && options.rank_by != SweepRank::Energy;
  AnalyticPass pass;
  std::vector<SweepOutcome> made;    // the evaluated plans' outcomes, in the order they are made
  std::vector<SettledPlan> settled;  // the others', as one figure (under `mutex` below)
  SweepCache cache(std::move(ops));
  GroupMemory group_memory(cands);
  std::atomic<size_t> next{0}, done{0};
  Progress bar("analytic", mine.size(), options.progress && share.rank == 0);
  std::mutex bar_mutex;
  auto tick = [&] {
    ++done;
    if (bar_mutex.try_lock()) {
      bar.tick(done);
      bar_mutex.unlock();
    }
  };
  std::vector<double> bound(mine.size(), 0.0);
  std::vector<char> fits_checked(mine.size(), 0);  // fits_least passed (before the own bound)
  std::vector<size_t> visit(mine.size());
  for (size_t k = 0; k < visit.size(); ++k) visit[k] = k;
  if (prune) {
    // By group: its members' layer bounds, one per class of variant (layer_bound_class).
    run_on_threads(options, [&] {
      for (size_t g; (g = next++) < cands.groups();) {
        const LayerPriceScope scope(cache.layer_memo(cands.shape(g).family));
        const LayerOpsScope ops_scope(cache.ops_memo(cands.shape(g).family));
        std::array<std::optional<double>, 4> of_class;
        for (size_t j = 0; j < cands.group_size(g); ++j) {
          const std::optional<size_t> k = share.k_of(cands.first(g) + j);
          if (!k) continue;
          std::optional<double>& b = of_class[static_cast<size_t>(SweepCache::layer_bound_class(cands.variant(g, j)))];
          if (!b) {
            try {
              b = cache.layer_bound_s(cands.member(g, j));
            } catch (const std::exception&) {
              b = 0;  // evaluated in full, which reports the error
            }
          }
          bound[*k] = *b;
        }
      }
    });
    std::stable_sort(visit.begin(), visit.end(), [&](size_t a, size_t b) { return bound[a] < bound[b]; });
  }
  // The plans that left the layer-bound order on their own, built (by place in `mine`).
  std::deque<SweepCandidate> built_store;
  std::vector<SweepCandidate*> built(mine.size(), nullptr);
  const size_t keep = std::max<size_t>(1, options.top);
  std::mutex mutex;  // guards everything below
  std::vector<double> best;  // the K smallest iteration times so far (a max-heap)
  double threshold = std::numeric_limits<double>::infinity();
  // Best first: the plans come in the order of their layer bound; each gets a tighter bound on
  // the way into a heap ordered by it — first its compute twin's (compute_bound_costs: shared by
  // its sharding and overlap variants), then, when that leaves it in the race, its own — and the
  // heap's least is evaluated once no plan still to come can have a smaller bound. Plans whose
  // bound is above the K-th best time so far are pruned, at whichever step that shows.
  enum Step : int { kComputeBound = 1, kOwnBound = 2, kEvaluate = 3 };
  using Bounded = std::tuple<double, size_t, int>;  // (bound, k, the step it reached), a min-heap by bound
  std::vector<Bounded> heap;
  const auto later = [](const Bounded& a, const Bounded& b) { return a > b; };
  const auto least = [&] { return std::get<0>(heap.front()); };
  size_t taken = 0;  // visit[0, taken) have left the layer-bound order
  auto mark_pruned = [&](size_t k) {  // (under the lock)
    ++pass.pruned;
    if (options.keep_pruned) settled.push_back(SettledPlan{k, bound[k], false});
  };
  run_on_threads(options, [&] {
    std::map<int, ActivationBytesMemo> activations;  // this thread's, per family (memory checks)
    // The memory of a plan's shape: its group's, or (a group of one) this thread's cache's.
    ShardedMemoryCache shapes;
    const auto shape_memory = [&](size_t k, const SweepCandidate& c) -> ShapeMemory {
      const size_t g = cands.group_of(mine[k]);
      if (cands.group_size(g) > 1) return [&group_memory, g] { return &group_memory.of(g); };
      return [&shapes, &c] { return &shapes.of(c.base->model, c.plan); };
    };
    for (;;) {
      size_t k = 0;
      int step = kEvaluate;
      {
        std::unique_lock<std::mutex> lock(mutex);
        if (!prune) {
          if (taken == visit.size()) return;
          k = visit[taken++];
          built[k] = &built_store.emplace_back(cands.member(mine[k]));
        } else if (taken < visit.size() && (heap.empty() || bound[visit[taken]] < least())) {
          k = visit[taken++];
          if (bound[k] > threshold) {  // so are all after it
            for (size_t n = taken - 1; n < visit.size(); ++n) mark_pruned(visit[n]);
            for (; taken < visit.size(); ++taken) tick();
            tick();
            continue;
          }
          built[k] = &built_store.emplace_back(cands.member(mine[k]));
          step = kComputeBound;
        } else if (!heap.empty()) {
          std::pop_heap(heap.begin(), heap.end(), later);
          int reached = 0;
          std::tie(std::ignore, k, reached) = heap.back();
          heap.pop_back();
          if (bound[k] > threshold) {
            mark_pruned(k);
            tick();
            continue;
          }
          step = reached + 1;
        } else {
          return;  // what other threads still bound they evaluate themselves
        }
      }
      const SweepCandidate& c = *built[k];
      const LayerPriceScope scope(cache.layer_memo(c.family));
      const LayerOpsScope ops_scope(cache.ops_memo(c.family));
      const ActivationBytesScope activation_scope(c.family >= 0 ? &activations[c.family] : nullptr);
      if (step == kOwnBound) {
        // A plan that cannot fit whatever its schedule is out before its own costs: its memory
        // (closed form) costs a fraction of them (it never counted toward the top K).
        if (const std::optional<double> peak = out_of_memory(c, shape_memory(k, c))) {
          std::lock_guard<std::mutex> lock(mutex);
          settled.push_back(SettledPlan{k, *peak, true});
          tick();
          continue;
        }
        fits_checked[k] = 1;
      }
      if (step != kEvaluate) {
        double tighter = bound[k];
        try {
          const auto costs = step == kComputeBound ? cache.compute_bound_costs_of(c) : cache.bound_costs_of(c);
          tighter = std::max(tighter, iteration_lower_bound_s(*costs, c.plan));
        } catch (const std::exception&) {
          // evaluated in full, which reports the error
        }
        std::lock_guard<std::mutex> lock(mutex);
        bound[k] = tighter;
        if (tighter > threshold) {
          mark_pruned(k);
          tick();
          continue;
        }
        heap.emplace_back(tighter, k, step);
        std::push_heap(heap.begin(), heap.end(), later);
        continue;
      }
      SweepOutcome o = outcome_of(*built[k], share.id_of(mine[k]));
      try {
        evaluate_analytic(c, o, cache, fits_checked[k] != 0, shape_memory(k, c));
      } catch (const std::exception& e) {
        o.status = "error";
        o.error = e.what();
      }
      std::lock_guard<std::mutex> lock(mutex);
      if (prune && o.status == "ok") {
        best.push_back(o.analytic.iteration_time_s);
        std::push_heap(best.begin(), best.end());
        if (best.size() > keep) {
          std::pop_heap(best.begin(), best.end());
          best.pop_back();
        }
        if (best.size() == keep) threshold = best.front();
      }
      made.push_back(std::move(o));
      tick();
    }
  });
  bar.tick(mine.size());
  // Candidate order, whatever order the threads finished in.
  for (const SettledPlan& s : settled) pass.out_of_memory += s.oom;
  for (const SweepOutcome& o : made) pass.out_of_memory += o.status == "oom";
  pass.outcomes = in_candidate_order(made, settled, cands, built, share, options.keep_pruned);
  return pass;
}

// Every rank's outcomes on rank 0 (in rank order) and the counts summed there.
void gather_outcomes(AnalyticPass&& pass, size_t candidates, const SweepGroup& group, SweepResult& result) {
  for (const auto& part : group.gather(serialize(pass.outcomes))) deserialize_into(part, result.outcomes);
  const std::string counts = std::to_string(pass.pruned) + " " + std::to_string(candidates) + " " + std::to_string(pass.out_of_memory);
  for (const auto& part : group.gather(counts)) {
    size_t pruned = 0, swept = 0, oom = 0;
    std::istringstream(part) >> pruned >> swept >> oom;
    result.pruned += pruned;
    result.candidates += swept;
    result.out_of_memory += oom;
  }
}

// Indices of the `ok` outcomes by their analytic figure, best first; ties (GPipe and 1F1B often
// take the same time) by overrides, so the order does not depend on how the work was split.
std::vector<size_t> rank_outcomes(const std::vector<SweepOutcome>& outs, SweepRank by, bool check_energy) {
  std::vector<size_t> order;
  for (size_t i = 0; i < outs.size(); ++i)
    if (outs[i].status == "ok") order.push_back(i);
  if (by == SweepRank::Energy && check_energy && !order.empty() && outs[order.front()].analytic.iteration_energy_j <= 0)
    throw ConfigError("--rank-by", "energy needs the GPUs' power: set cluster.topology.gpu.power (and idle_power, node.power)");
  std::vector<std::pair<double, size_t>> scored;  // each score once, not per comparison
  scored.reserve(order.size());
  for (size_t i : order) scored.emplace_back(sweep_score(outs[i].analytic, by), i);
  std::sort(scored.begin(), scored.end(), [&](const auto& a, const auto& b) {
    return a.first != b.first ? a.first < b.first : key_of(outs[a.second].sets) < key_of(outs[b.second].sets);
  });
  for (size_t n = 0; n < order.size(); ++n) order[n] = scored[n].second;
  return order;
}

// The refinement keys of the first k of the ranking (by outcome): family and refinement_key;
// empty (a run of its own) outside a family.
std::vector<std::string> run_keys(const std::vector<SweepOutcome>& outs, const std::vector<size_t>& order, size_t k,
                                  const std::function<const std::string&(size_t)>& config_json_of) {
  std::vector<std::string> keys(outs.size());
  for (size_t n = 0; n < k; ++n) {
    const SweepOutcome& o = outs[order[n]];
    if (o.family < 0) continue;
    const int64_t family = o.family;
    keys[order[n]] = std::string(reinterpret_cast<const char*>(&family), sizeof family) + refinement_key(o.plan, config_json_of(order[n]));
  }
  return keys;
}

// Re-simulates the first k of the ranking (one process).
void refine_top(std::vector<SweepOutcome>& outs, const std::vector<size_t>& order, size_t k,
                const std::function<SimulationInput(const SweepOutcome&)>& input_of, const SweepOptions& options) {
  std::vector<const SimulationInput*> inputs(outs.size(), nullptr);  // the top K's, made for them
  std::vector<SimulationInput> owned;
  owned.reserve(k);
  for (size_t i = 0; i < k; ++i) {
    owned.push_back(input_of(outs[order[i]]));
    inputs[order[i]] = &owned.back();
  }
  refine(outs, std::vector<size_t>(order.begin(), order.begin() + static_cast<long>(k)), inputs, options.refine,
         static_cast<size_t>(workers(options)), options.progress, options.refine_budget_s, options.refine_guaranteed,
         run_keys(outs, order, k, [&](size_t i) -> const std::string& { return inputs[i]->config_json; }));
}

// The rows the table shows beside their figures (add_half_nic_figures): the first max(K, 10).
size_t shown_rows(const std::vector<size_t>& order, size_t top) { return std::min(order.size(), std::max<size_t>(top, 10)); }

// Re-simulates the first k of rank 0's ranking across the group: rank 0 broadcasts the top K's
// outcomes, every rank re-runs its share, rank 0 collects the refined reports. Returns k as
// every rank knows it.
size_t refine_top_across(std::vector<SweepOutcome>& outs, const std::vector<size_t>& order, size_t k, const SweepGroup& group,
                         const std::function<SimulationInput(const SweepOutcome&)>& input_of, const SweepOptions& options) {
  const size_t rank = static_cast<size_t>(group.rank), size = static_cast<size_t>(group.size);
  std::vector<SweepOutcome> top_k;
  if (rank == 0)
    for (size_t i = 0; i < k; ++i) top_k.push_back(outs[order[i]]);
  std::vector<SweepOutcome> all;
  deserialize_into(group.broadcast(rank == 0 ? serialize(top_k) : std::string()), all);
  k = all.size();
  std::vector<SweepOutcome> mine_top;
  std::vector<SimulationInput> owned;
  owned.reserve(k);
  std::vector<const SimulationInput*> inputs;
  std::vector<size_t> which;
  size_t guaranteed = 0;  // this rank's share of the guaranteed top (the first of its list)
  for (size_t i = rank; i < k; i += size) {
    SweepOutcome o;
    o.candidate = all[i].candidate;
    o.family = all[i].family;
    o.sets = all[i].sets;
    o.plan = all[i].plan;
    guaranteed += i < options.refine_guaranteed;
    which.push_back(mine_top.size());
    owned.push_back(input_of(o));
    inputs.push_back(&owned.back());
    mine_top.push_back(std::move(o));
  }
  std::vector<size_t> in_order(mine_top.size());
  std::iota(in_order.begin(), in_order.end(), size_t{0});
  refine(mine_top, which, inputs, options.refine, static_cast<size_t>(workers(options)), options.progress && rank == 0,
         options.refine_budget_s, guaranteed,
         run_keys(mine_top, in_order, mine_top.size(), [&](size_t i) -> const std::string& { return inputs[i]->config_json; }));
  const auto parts = group.gather(serialize(mine_top));
  if (rank == 0) {
    std::map<size_t, size_t> index;  // candidate → outcome
    for (size_t i = 0; i < outs.size(); ++i) index[outs[i].candidate] = i;
    for (const auto& part : parts) {
      std::vector<SweepOutcome> back;
      deserialize_into(part, back);
      for (auto& b : back) {
        SweepOutcome& o = outs[index.at(b.candidate)];
        o.refined = std::move(b.refined);
        o.refined_error = std::move(b.refined_error);
      }
    }
  }
  return k;
}

// Honest top rows: the shown plans that hide more than half of their data-parallel and sharding
// communication (what crosses the NICs when replicas span nodes) get their time with half the
// NIC bandwidth (analytic), which says how much their lead leans on hiding it.
void add_half_nic_figures(std::vector<SweepOutcome>& outs, const std::vector<size_t>& order, size_t top,
                          const std::function<SimulationInput(const SweepOutcome&)>& input_of) {
  for (size_t n = 0; n < shown_rows(order, top); ++n) {
    SweepOutcome& o = outs[order[n]];
    const SimulationInput in = input_of(o);
    double exposed = 0;
    for (const char* cls : {"dp", "shard"})
      if (const auto it = o.analytic.exposed_comm_s.find(cls); it != o.analytic.exposed_comm_s.end()) exposed += it->second;
    try {
      const double issued = communication_issued_s(in);
      o.hidden_comm_fraction = issued > 0 ? std::clamp(1.0 - exposed / issued, 0.0, 1.0) : 0.0;
      if (*o.hidden_comm_fraction > 0.5) {
        SimulationInput half = in;
        half.cluster.nic.bw_Bps *= 0.5;
        o.half_nic_iteration_s =
            simulate(half, make_costed_schedule(half.model, half.plan, half.cluster, false), Fidelity::Analytic, false).report.iteration_time_s;
      }
    } catch (const std::exception&) {
      // (a plan whose half-NIC variant cannot be placed keeps no figure)
    }
  }
}

// The refined top K by their refined figure where they have one, else (the budget did not reach
// them) by their analytic figure; their analytic order is kept in analytic_top.
void order_refined_top(SweepResult& result, size_t k, SweepRank by) {
  const auto& outs = result.outcomes;
  auto refined_score = [&](size_t i) {
    return outs[i].refined ? sweep_score(*outs[i].refined, by) : sweep_score(outs[i].analytic, by);
  };
  std::vector<size_t>& order = result.ranking;
  result.analytic_top.assign(order.begin(), order.begin() + static_cast<long>(k));
  std::stable_sort(order.begin(), order.begin() + static_cast<long>(k), [&](size_t a, size_t b) { return refined_score(a) < refined_score(b); });
}

}  // namespace

SweepResult run_sweep(std::vector<SweepCandidate> cands, const SweepOptions& options, const SweepGroup* group) {
  return run_sweep(SweepCandidates(std::move(cands)), options, group);
}

SweepResult run_sweep(SweepCandidates cands, const SweepOptions& options, const SweepGroup* group) {
  const auto t0 = std::chrono::steady_clock::now();
  const SweepShare share = share_of(cands.size(), group);
  const bool across = share.size > 1;
  SweepResult result;
  result.rank_by = options.rank_by;
  // The simulation input of an outcome (its candidate's, or for a split group its family's input
  // with its plan: the candidate may be another rank's). One process: the shown rows' inputs,
  // made before the candidates are freed.
  std::map<size_t, SimulationInput> shown_inputs;  // by candidate
  auto input_of = [&](const SweepOutcome& o) {
    if (!across) return shown_inputs.at(o.candidate);
    if (!share.split) return cands.member(o.candidate).input();
    SimulationInput in = *group->family_inputs.at(static_cast<size_t>(std::max(0, o.family)));
    in.plan = o.plan;
    in.config_json.clear();
    return in;
  };

  // 1. The analytic pass over this rank's share.
  AnalyticPass pass = analytic_pass(cands, share, options, cands.take_ops());
  result.analytic_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (across) {
    gather_outcomes(std::move(pass), share.mine.size(), *group, result);
  } else {
    result.outcomes = std::move(pass.outcomes);
    result.pruned = pass.pruned;
    result.out_of_memory = pass.out_of_memory;
    result.candidates = share.mine.size();
  }

  // 2. The ranking by the analytic figure, and the top K re-simulated.
  std::vector<SweepOutcome>& outs = result.outcomes;
  result.ranking = rank_outcomes(outs, options.rank_by, share.rank == 0);
  size_t k = options.refine == Fidelity::Analytic ? 0 : std::min(options.top, result.ranking.size());
  // Make the process small before the refinement forks its SimGrid children (their page tables
  // and every page either side writes are copied): only the top K keep their schedules, and one
  // process keeps of its candidates (a million and more in a large --auto space, read by nothing
  // after this) only the inputs of the rows the table shows; the analytic pass's caches are freed
  // too, and the pages go back to the system.
  for (size_t n = k; n < result.ranking.size(); ++n) outs[result.ranking[n]].schedule.reset();
  if (!across) {
    for (size_t n = 0; n < shown_rows(result.ranking, options.top); ++n) {
      const size_t candidate = outs[result.ranking[n]].candidate;
      shown_inputs.emplace(candidate, cands.member(candidate).input());
    }
    cands = SweepCandidates();
  }
  ::malloc_trim(0);
  if (across) k = refine_top_across(outs, result.ranking, k, *group, input_of, options);
  else refine_top(outs, result.ranking, k, input_of, options);
  result.refined = k;

  // 3. What the table shows beside the figures, and the refined order.
  if (share.rank == 0) {
    add_half_nic_figures(outs, result.ranking, options.top, input_of);
    order_refined_top(result, k, options.rank_by);
  } else {
    result.outcomes.clear();
    result.ranking.clear();
  }
  result.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace ptdp
