#include "sim/costing.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/error.hpp"
#include "model/grid.hpp"
#include "model/measured_kernels.hpp"
#include "model/memory.hpp"
#include "model/partition.hpp"
#include "model/units.hpp"
#include "topologies/collectives.hpp"

namespace ptdp {

EnergyAndPrice energy_and_price(const ClusterSpec& c, std::optional<double> gpu_hour_usd, double energy_usd_per_kwh) {
  EnergyAndPrice e;
  e.gpu_busy_w = c.gpu.power_w;
  e.gpu_idle_w = c.gpu.idle_power_w;
  e.node_w = c.node_power_w;
  e.gpus_per_node = c.gpus_per_node;
  e.gpu_hour_usd = gpu_hour_usd;
  e.energy_usd_per_kwh = energy_usd_per_kwh;
  return e;
}

double comm_op_time_s(const ClusterSpec& cluster, const ParallelPlan& plan, const Op& op) {
  const GroupShape g = group_shape(cluster, group_size(plan, op.group), group_stride(plan, op.group));
  switch (op.kind) {
    case OpKind::AllReduce: return allreduce_time_s(cluster, g, op.bytes);
    case OpKind::ReduceScatter: return reduce_scatter_time_s(cluster, g, op.bytes);
    case OpKind::AllGather: return allgather_time_s(cluster, g, op.bytes);
    case OpKind::AllToAll:
      return plan.moe_dispatcher == MoeDispatcher::Flex && op.group == CommGroup::Expert
                 ? deepep_alltoall_time_s(cluster, g, op.bytes, op.token_copies)
                 : alltoall_time_s(cluster, g, op.bytes);
    case OpKind::RingExchange: return static_cast<double>(op.ring_steps) * p2p_time_s(cluster, g.nodes <= 1, op.bytes);
    default: return 0;
  }
}

double overlapped_s(double compute_s, double comm_s, double contention) {
  if (comm_s <= 0) return compute_s;
  if (compute_s <= 0) return comm_s;
  return std::max(comm_s, compute_s) + contention * std::min(comm_s, compute_s);
}

double hidden_s(double compute_s, double comm_s, double contention) {
  return std::max(0.0, (1.0 - contention) * std::min(compute_s, comm_s));
}

TwoStreamTimes run_two_streams(const std::vector<StreamJob>& compute, const std::vector<StreamJob>& comm, double contention) {
  TwoStreamTimes out;
  const size_t nc = compute.size(), nm = comm.size();
  out.compute_start.assign(nc, 0.0), out.compute_end.assign(nc, 0.0);
  out.comm_start.assign(nm, 0.0), out.comm_end.assign(nm, 0.0);
  size_t ic = 0, im = 0;         // each stream's next job
  double left_c = 0, left_m = 0;  // work left of the job in hand (valid while running)
  bool run_c = false, run_m = false;
  double now = 0;
  const double slow = 1.0 + contention;
  auto ready = [](const StreamJob& j, size_t other_done) { return j.after < 0 || static_cast<size_t>(j.after) < other_done; };
  while (ic < nc || im < nm) {
    // Start whatever may start now (zero-work jobs end at once).
    bool started = true;
    while (started) {
      started = false;
      if (!run_c && ic < nc && ready(compute[ic], im)) {
        out.compute_start[ic] = now;
        if (compute[ic].work_s <= 0) out.compute_end[ic++] = now;
        else run_c = true, left_c = compute[ic].work_s;
        started = true;
      }
      if (!run_m && im < nm && ready(comm[im], ic)) {
        out.comm_start[im] = now;
        if (comm[im].work_s <= 0) out.comm_end[im++] = now;
        else run_m = true, left_m = comm[im].work_s;
        started = true;
      }
    }
    if (!run_c && !run_m) {
      PTDP_ASSERT(ic >= nc && im >= nm, "two streams wait for each other");
      break;
    }
    const double rate = run_c && run_m ? 1.0 / slow : 1.0;
    const double dt = std::min(run_c ? left_c / rate : std::numeric_limits<double>::infinity(),
                               run_m ? left_m / rate : std::numeric_limits<double>::infinity());
    now += dt;
    const bool end_c = run_c && left_c / rate <= dt, end_m = run_m && left_m / rate <= dt;
    if (run_c) left_c -= dt * rate;
    if (run_m) left_m -= dt * rate;
    if (end_c) out.compute_end[ic++] = now, run_c = false;
    if (end_m) out.comm_end[im++] = now, run_m = false;
  }
  return out;
}

double async_tp_chunks_s(const Op& gemm, const GpuSpec& gpu, int64_t chunks) {
  const double whole = op_time_s(gemm, gpu);
  if (chunks <= 1 || gemm.kind != OpKind::Gemm) return whole;
  const bool fp8 = gemm.fp8 && gpu.fp8_peak_flops > 0;
  auto shape = [&](int64_t m) { return fp8 ? fp8_gemm_efficiency(gpu, m, gemm.n, gemm.k) : gemm_efficiency(gpu, m, gemm.n, gemm.k); };
  const double slower = shape(gemm.m) / std::max(1e-12, shape(std::max<int64_t>(1, gemm.m / chunks)));
  return (whole - gpu.kernel_launch_s) * slower + static_cast<double>(chunks) * gpu.kernel_launch_s;
}

namespace {

// TP time of a backward op list hidden under the GEMMs Megatron runs its asynchronous collectives
// under (Op::overlaps): the input gradient's all-reduce / reduce-scatter under the weight-gradient
// GEMM, sequence parallelism's re-gather of the input under the input-gradient GEMM.
double hidden_collectives_s(const std::vector<Op>& bwd, const GpuSpec& gpu, const ClusterSpec& cluster,
                                    const ParallelPlan& plan, double share) {
  double hidden = 0;
  // The CPU back end's collectives block the core that would run the GEMM: nothing hides (the
  // executor runs the collective, then the GEMM).
  if (!cluster.overlaps_communication()) return 0;
  for (const Op& op : bwd) {
    // (A ring's steps hide under its attention blocks step by step: exposed_tp_s prices them.)
    if (!is_communication(op.kind) || op.overlaps.empty() || op.kind == OpKind::RingExchange) continue;
    for (const Op& w : bwd)
      if (w.name == op.overlaps) hidden += hidden_s(op_time_s(w, gpu) * share, comm_op_time_s(cluster, plan, op), kCollectiveContention);
  }
  return hidden;
}

// Exposed TP time of an op list: every collective in full, or with tp_comm_overlap (Transformer
// Engine's userbuffers, sequence parallelism) the all-gathers feeding a GEMM and the
// reduce-scatters after one split into t chunks and pipelined with that GEMM: only the first
// chunk, or what the GEMM is too short to cover, stays exposed. (The backward's asynchronous
// collectives, Op::overlaps, hide under their GEMMs, which a whole B accounts for separately.)
double exposed_tp_s(const std::vector<Op>& ops, const GpuSpec& gpu, const ClusterSpec& cluster, const ParallelPlan& plan,
                    std::map<CommGroup, double>* by_group = nullptr, double* alltoall_s = nullptr) {
  double exposed = 0;
  auto add = [&](const Op& op, double s) {
    exposed += s;
    if (by_group) (*by_group)[op.group] += s;
  };
  const int64_t t = plan.tensor;
  // A CPU rank's collectives block the core the GEMM would run on: neither overlap hides there.
  const bool hides = cluster.overlaps_communication();
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const double comm = comm_op_time_s(cluster, plan, op);
    if (comm <= 0) continue;
    // The expert all-to-alls run in full here: Megatron's overlap hides them only under the other
    // action of a merged forward/backward pair (action_duration_s), never within one pass, whose
    // dispatch, experts and combine wait on each other.
    if (op.kind == OpKind::AllToAll && op.group == CommGroup::Expert && alltoall_s) *alltoall_s += comm;
    if (op.kind == OpKind::RingExchange && !op.overlaps.empty()) {
      // Context parallelism's ring: step k's K/V transfer runs while the attention of the block in
      // hand computes (the attention kernel it names, steps + 1 blocks): only what a step's
      // transfer outlasts its block's attention is exposed. (A ring hop under nothing — the
      // gradients' way home — shows in full, below.)
      const Op* attention = nullptr;
      for (const Op& other : ops)
        if (other.name == op.overlaps) attention = &other;
      const double steps = static_cast<double>(std::max<int64_t>(1, op.ring_steps));
      const double block_s = attention ? op_time_s(*attention, gpu) / (steps + 1) : 0.0;
      add(op, steps * (overlapped_s(block_s, comm / steps, kCollectiveContention) - block_s));
      continue;
    }
    const Op* partner = nullptr;
    if (plan.tp_comm_overlap && hides && op.group == CommGroup::Tensor && op.overlaps.empty()) {
      if (op.kind == OpKind::AllGather) {
        for (size_t j = i + 1; j < ops.size() && !partner; ++j)
          if (ops[j].kind == OpKind::Gemm) partner = &ops[j];
      } else if (op.kind == OpKind::ReduceScatter) {
        for (size_t j = i; j-- > 0 && !partner;)
          if (ops[j].kind == OpKind::Gemm) partner = &ops[j];
      }
    }
    if (!partner) {
      add(op, comm);
      continue;
    }
    // The GEMM decomposed into t chunks of m/t rows under copy-engine transfers: the first
    // chunk's transfer shows, the other t − 1 run under the chunks' compute. The chunks run at
    // their smaller shape's efficiency and launch t times; their wave tails overlap each other
    // (the chunks are issued back to back), so the whole GEMM's wave quantisation stays.
    // Flux's AG+GEMM (H800, TP 8, 4096×6144×12288): 0.846 ms GEMM + 0.583 ms gather → 0.957 ms
    // fused; this model: 0.951 ms (tests/sim/costing_test.cpp).
    const double whole = op_time_s(*partner, gpu);
    const double chunks = async_tp_chunks_s(*partner, gpu, t);
    const double rest = comm * static_cast<double>(t - 1) / static_cast<double>(t);
    add(op, comm / static_cast<double>(t) + std::max(0.0, overlapped_s(chunks, rest, kCopyEngineContention) - whole));
  }
  return exposed;
}

}  // namespace

std::map<std::string, double> layer_comm_by_group(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster) {
  const GpuSpec& gpu = cluster.gpu;
  std::map<CommGroup, double> g;
  for (const auto& [w, moe] : layer_mix(spec)) {
    std::map<CommGroup, double> one;
    const std::vector<Op> bwd = layer_ops(spec, plan, Pass::Backward, moe);
    exposed_tp_s(layer_ops(spec, plan, Pass::Forward, moe), gpu, cluster, plan, &one);
    exposed_tp_s(layer_ops(spec, plan, Pass::Recompute, moe), gpu, cluster, plan, &one);
    exposed_tp_s(bwd, gpu, cluster, plan, &one);
    for (const auto& [k, v] : one) g[k] += w * v;
  }
  std::map<std::string, double> out;
  for (const auto& [k, v] : g) {
    const char* name = k == CommGroup::Tensor ? "tp" : k == CommGroup::Context ? "cp" : k == CommGroup::Pipeline ? "pp" : "ep";
    out[name] += v;
  }
  return out;
}

double bucketed_reduction_tail_s(double bucket_s, int64_t buckets, double backward_s, double contention, double* slowed_s,
                                 double* comm_stretch) {
  if (slowed_s) *slowed_s = 0;
  if (comm_stretch) *comm_stretch = 1;
  if (buckets <= 0 || bucket_s <= 0) return 0;
  // The backward in K slices; bucket k's gradients are final once slice k ended, and the buckets
  // reduce one after another on the communication stream.
  std::vector<StreamJob> slices(static_cast<size_t>(buckets), StreamJob{backward_s / static_cast<double>(buckets), -1});
  std::vector<StreamJob> wire(static_cast<size_t>(buckets));
  for (int64_t b = 0; b < buckets; ++b) wire[static_cast<size_t>(b)] = StreamJob{bucket_s, b};
  const TwoStreamTimes t = run_two_streams(slices, wire, contention);
  const double end = t.compute_end.back();
  if (slowed_s) *slowed_s = std::max(0.0, end - backward_s);
  if (comm_stretch) {
    double busy = 0;
    for (size_t b = 0; b < wire.size(); ++b) busy += t.comm_end[b] - t.comm_start[b];
    *comm_stretch = busy / (bucket_s * static_cast<double>(buckets));
  }
  return std::max(0.0, t.comm_end.back() - end);
}

double bucketed_gather_stall_s(double bucket_s, int64_t buckets, double forward_s) {
  if (buckets <= 0 || bucket_s <= 0) return 0;
  // Bucket k is needed at forward_s·k/K of the next forward; the gathers run back to back from 0.
  const double k = static_cast<double>(buckets);
  double stall = 0;
  for (int64_t b = 0; b < buckets; ++b)
    stall = std::max(stall, bucket_s * static_cast<double>(b + 1) - forward_s * static_cast<double>(b) / k);
  return stall;
}

double overlapped_units_s(const std::vector<double>& gather, const std::vector<double>& compute, int64_t in_flight,
                          const std::vector<double>* reduce_scatter, double* tail_s, double contention,
                          std::vector<double>* slowed_s, std::vector<double>* gather_stretch, std::vector<double>* rs_stretch) {
  const size_t n = compute.size();
  PTDP_ASSERT(gather.empty() || gather.size() == n, "one gather per unit");
  PTDP_ASSERT(!reduce_scatter || reduce_scatter->size() == n, "one reduce-scatter per unit");
  PTDP_ASSERT(in_flight >= 1, "at least one gathered unit");
  const auto k = static_cast<size_t>(in_flight);
  // One communication queue in issue order (gathers and reduce-scatters leave through the same
  // links): the gathers of units 0 … k − 1 first; after unit u computes, its reduce-scatter, then
  // the gather of unit u + k, whose buffer unit u has just freed. Unit u computes once gathered.
  std::vector<StreamJob> units(n), queue;
  std::vector<int64_t> gather_job(n, -1), rs_job(n, -1);
  auto push_gather = [&](size_t i) {
    gather_job[i] = static_cast<int64_t>(queue.size());
    queue.push_back(StreamJob{gather[i], i >= k ? static_cast<int64_t>(i - k) : -1});
  };
  if (!gather.empty())
    for (size_t i = 0; i < std::min(k, n); ++i) push_gather(i);
  int64_t last_rs = -1;
  for (size_t u = 0; u < n; ++u) {
    if (reduce_scatter) {
      last_rs = rs_job[u] = static_cast<int64_t>(queue.size());
      queue.push_back(StreamJob{(*reduce_scatter)[u], static_cast<int64_t>(u)});
    }
    if (!gather.empty() && u + k < n) push_gather(u + k);
  }
  for (size_t u = 0; u < n; ++u) units[u] = StreamJob{compute[u], gather_job[u]};
  const TwoStreamTimes t = run_two_streams(units, queue, contention);
  if (slowed_s)
    for (size_t u = 0; u < n; ++u) slowed_s->push_back(std::max(0.0, t.compute_end[u] - t.compute_start[u] - compute[u]));
  auto stretch = [&](const std::vector<int64_t>& job, std::vector<double>* out) {
    if (!out) return;
    for (size_t u = 0; u < n; ++u) {
      const int64_t j = job[u];
      const bool some = j >= 0 && queue[static_cast<size_t>(j)].work_s > 0;
      out->push_back(some ? (t.comm_end[static_cast<size_t>(j)] - t.comm_start[static_cast<size_t>(j)]) / queue[static_cast<size_t>(j)].work_s
                          : 1.0);
    }
  };
  stretch(gather_job, gather_stretch);
  stretch(rs_job, rs_stretch);
  const double compute_end = n > 0 ? t.compute_end.back() : 0.0;
  // The last reduce-scatter is the queue's last job; what ran before it ends by the returned end.
  const double before_last = last_rs > 0 ? t.comm_end[static_cast<size_t>(last_rs - 1)] : 0.0;
  const double end = std::max(compute_end, before_last);
  if (tail_s) *tail_s = reduce_scatter && last_rs >= 0 ? std::max(0.0, t.comm_end[static_cast<size_t>(last_rs)] - end) : 0.0;
  return end;
}

double shared_core_slowdown(double ranks, double cores, double compute_s, double blocked_s) {
  if (cores <= 0 || ranks <= cores) return 1.0;
  const double waits = compute_s > 0 ? blocked_s / compute_s : 0.0;
  return std::max(1.0, ranks / cores - waits);
}

bool oversubscribes_cores(const ClusterSpec& c, const ParallelPlan& plan) {
  if (c.cores_per_node <= 0) return false;
  const int64_t ranks_on_node = std::min<int64_t>(plan.gpus(), c.gpus_per_node);
  return ranks_on_node > std::max(1L, std::lround(c.cores_per_node));
}

std::optional<ClusterSpec> cluster_for_plan(const ClusterSpec& c, const ParallelPlan& plan) {
  if (!oversubscribes_cores(c, plan) || c.oversubscribed_allreduce.empty() ||
      c.intra_node_allreduce.points == c.oversubscribed_allreduce.points)
    return std::nullopt;
  ClusterSpec out = c;
  out.intra_node_allreduce = c.oversubscribed_allreduce;
  return out;
}

namespace {

// What plan_costs' parts share: its inputs and what it derives from the plan once.
struct CostingContext {
  const TransformerSpec& spec;
  const ParallelPlan& plan;
  const ClusterSpec& cluster;
  const GpuSpec& gpu;
  const Schedule* schedule;          // the program, when the caller has one
  const std::vector<int>& placement;
  const Lowering& lowering;          // of the placement as an empty schedule: its grid, stage parameters
  int64_t t, d, p, n_shard;
  double share;                      // CPU cores shared: compute slowdown
  int grad_b;
  double weight_b;
  const ProcessGrid& grid() const { return lowering.grid(); }
  int rank_of(int st) const { return schedule ? schedule->stage_to_rank[st] : static_cast<int>(stage_rank(plan, st)); }
  /// The first GPU (tensor, context and data rank 0) of pipeline rank `pp`.
  int64_t first_gpu(int pp) const { return grid().rank(0, 0, 0, pp); }
  double host_copy_s(double bytes) const { return bytes / cluster.host_link.bw_Bps + cluster.host_link.latency_s; }
};

// REDUCE_GRAD of stage st, priced from the lowering's steps (and its overlapped buckets).
void price_reduce_grad(const CostingContext& x, int st, double params, double rs_tail, PlanCosts& c) {
  // REDUCE_GRAD: the lowering's steps (schedules/communication.hpp), priced. Megatron's
  // --overlap-grad-reduce (GPUs; the CPU executor's collectives block its core): the gradients
  // of the first pipeline rank's stages reduce in buckets launched as the last microbatch's
  // backward finalises them; only what outlasts that backward is left to REDUCE_GRAD. Other
  // pipeline ranks use one bucket, reduced after their backward, off the critical path
  // (Megatron switches bucketing off there).
  std::vector<CommStep> steps = x.lowering.steps(x.rank_of(st), Action{ActionKind::REDUCE_GRAD, st, -1});
  // (Nothing bucketable, as DualPipe's folded reduction at stage 0: one bucket, at REDUCE_GRAD.)
  const bool bucketable = std::any_of(steps.begin(), steps.end(), [](const CommStep& s) { return s.bucketable; });
  const bool bucketed = x.plan.reduces_in_buckets(x.rank_of(st)) && x.cluster.overlaps_communication() && bucketable;
  const int64_t buckets =
      bucketed ? std::max<int64_t>(1, static_cast<int64_t>(std::ceil(params / static_cast<double>(x.plan.bucket_parameters())))) : 1;
  double reduce = 0, bucket_s = 0, pair_s = 0, pair_bytes = 0;
  int pair_stage = -1;
  for (const CommStep& step : steps) {
    if (step.kind == StepKind::Wait) {  // the last unit's reduce-scatter of the last microbatch
      reduce += rs_tail;
      continue;
    }
    if (buckets > 1 && step.bucketable) {
      CommStep one = step;
      one.bytes /= static_cast<double>(buckets);
      bucket_s += comm_step_time_s(x.cluster, x.plan, x.placement, x.rank_of(st), one);
      continue;
    }
    const double step_s = comm_step_time_s(x.cluster, x.plan, x.placement, x.rank_of(st), step);
    reduce += step_s;
    if (step.group == CommGroup::Pair) pair_s += step_s, pair_bytes += step.bytes, pair_stage = step.peer_stage;
  }
  c.reduce_grad_buckets.push_back(buckets);
  double slowed = 0, stretch = 1, least = reduce;
  if (buckets > 1) {
    // The stage's last backward as its program has it (a W under a split backward); without a
    // program, as the plan's generated schedule would have it.
    const bool programmed = x.schedule && !x.schedule->programs.empty();
    const bool ends_with_w = programmed ? last_backward_kind(*x.schedule, st) == ActionKind::W : is_zero_bubble(x.plan.schedule);
    const double last_backward = ends_with_w ? c.weight_backward_s[st] : c.backward_s[st];
    // The backward under the buckets slows (the concurrency model); that, and what the buckets
    // outlast it by, is REDUCE_GRAD's.
    const double base = reduce;
    reduce += bucketed_reduction_tail_s(bucket_s, buckets, last_backward, kCollectiveContention, &slowed, &stretch);
    reduce += slowed;
    least = reduce;
    if (!programmed) {  // the other possible last backward too (the bounds' price; the engines have the program)
      double other_slowed = 0;
      const double other_backward = ends_with_w ? c.backward_s[st] : c.weight_backward_s[st];
      const double other = base + bucketed_reduction_tail_s(bucket_s, buckets, other_backward, kCollectiveContention, &other_slowed, nullptr);
      least = std::min(reduce, other + other_slowed);
    }
  }
  c.reduce_grad_slowed_s.push_back(slowed);
  c.reduce_grad_comm_stretch.push_back(stretch);
  c.reduce_grad_steps.push_back(std::move(steps));
  c.pair_reduce_s.push_back(pair_s);
  c.pair_stage.push_back(pair_stage);
  c.pair_bytes.push_back(pair_bytes);
  c.reduce_grad_s.push_back(reduce);
  c.reduce_grad_least_s.push_back(least);
}

// OPTIM of every pipeline rank: Adam (or the offloaded step), the norm's all-reduces and the
// updated parameters' all-gather from the lowering's steps.
void price_optim(const CostingContext& x, PlanCosts& c) {
  // Each pipeline rank's parameters (rank_parameter_counts): summed from the stages' counts
  // plan_costs has when they were made for the plan's own placement, else counted afresh.
  std::vector<double> rank_params;
  if (x.placement == stage_placement(x.plan)) {
    rank_params.assign(static_cast<size_t>(x.p), 0.0);
    for (size_t st = 0; st < x.placement.size(); ++st) rank_params[static_cast<size_t>(x.placement[st])] += x.lowering.stages()[st].total;
  } else {
    rank_params = rank_parameter_counts(x.spec, x.plan);
  }
  for (int r = 0; r < x.p; ++r) {
    const double params = rank_params[static_cast<size_t>(r)];
    const double shard = params / static_cast<double>(x.n_shard);
    const int64_t first = x.first_gpu(r);
    const GroupShape shard_group = group_shape(x.cluster, x.n_shard, x.t, first);
    double adam = 0, exposed = 0;
    if (x.plan.offload == Offload::None) {
      const double tensors = parameter_tensor_count(x.spec, static_cast<double>(x.spec.num_layers) / static_cast<double>(x.p));
      adam = optimizer_time_s(shard, tensors, x.gpu, x.plan.precision, x.plan.framework) * x.share;
    } else {
      // ZeRO-Offload: the gradient shard goes down, Adam runs on the host (memory-bound, the
      // node's GPUs sharing its memory bandwidth), the updated parameters come back.
      const double host_Bps = x.cluster.host_memory_Bps / static_cast<double>(std::min<int64_t>(x.plan.gpus(), x.cluster.gpus_per_node));
      adam = shard * state_bytes(x.plan.precision).adam_step / host_Bps;
      exposed += x.host_copy_s(shard * x.grad_b);
      if (x.plan.offload == Offload::Optimizer) exposed += x.host_copy_s(shard * x.weight_b);
    }
    // Stages 1 and 2 all-gather the updated parameters over the sharding group.
    // OPTIM's communication: the lowering's steps — the gradient norm's all-reduces (experts,
    // shards, the model-parallel group) and with stages 1–2 the updated parameters' all-gather.
    double norm = 0, gather_bytes = 0;
    for (const CommStep& step : x.lowering.steps(r, Action{ActionKind::OPTIM, -1, -1})) {
      if (step.kind == StepKind::AllGather) gather_bytes += step.bytes;
      else norm += comm_step_time_s(x.cluster, x.plan, x.placement, r, step);
    }
    if (r == 0) c.grad_norm_allreduce_s = norm;
    const bool gathers = gather_bytes > 0;
    // Before the all-gather each member's updated block is copied out of the parameters (the
    // executor: into the gather's send buffer, exec/model/zero.cpp adam_step; Megatron's
    // distributed optimizer: the fp32 main shard cast into the model's weights): computation of
    // the step, 4 bytes read and weight_b written per shard element, at the element-wise rate of
    // that working set.
    if (gathers) {
      const double bytes = shard * (4 + x.weight_b);
      adam += (bytes / elementwise_bandwidth(x.gpu, bytes) + x.gpu.kernel_launch_s) * x.share;
    }
    double gather_s = gathers ? allgather_time_s(x.cluster, shard_group, gather_bytes) : 0.0;
    double gather_wire = gather_bytes;
    if (gathers && x.plan.overlap_param_gather && x.cluster.overlaps_communication()) {
      // --overlap-param-gather: per-bucket all-gathers issued after the step, each waited for by
      // the next forward's pre-hook: the exposed part is the stall of the rank's first forward.
      const int64_t buckets = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(params / static_cast<double>(x.plan.bucket_parameters()))));
      const double bucket_s = allgather_time_s(x.cluster, shard_group, gather_bytes / static_cast<double>(buckets));
      const double stall = bucketed_gather_stall_s(bucket_s, buckets, c.forward_s[static_cast<size_t>(r)]);
      gather_wire = gather_s > 0 ? gather_bytes * std::min(1.0, stall / gather_s) : 0.0;
      // The gathers that do not stall the forward run under it, and the two slow each other (the
      // concurrency model: κ · the shorter of them): charged to the step, which that forward follows.
      const double under = std::max(0.0, gather_s - stall);
      adam += overlapped_s(c.forward_s[static_cast<size_t>(r)], under, kCollectiveContention) -
              std::max(c.forward_s[static_cast<size_t>(r)], under);
      gather_s = std::min(gather_s, stall);
    }
    c.optim_gather_bytes.push_back(gather_wire);
    c.optim_gather_s.push_back(gather_s);
    exposed += c.optim_gather_s.back();
    c.optim_shard_s.push_back(exposed);
    c.optim_s.push_back(adam + exposed + x.gpu.iteration_overhead_s + norm);
  }
}

// Times a list of ops on the plan's GPU: compute (slowed where CPU ranks share cores) plus the
// tensor-parallel communication it leaves exposed; adds that communication and the FLOPs to the
// caller's running sums.
struct OpTimer {
  const GpuSpec& gpu;
  const ClusterSpec& cluster;
  const ParallelPlan& plan;
  double ranks_on_node, cores;
  double operator()(const std::vector<Op>& ops, double& tp_s, double& flops, double* ep_s = nullptr) const {
    const OpsCost oc = cost_of(ops, gpu);
    const double comm = exposed_tp_s(ops, gpu, cluster, plan, nullptr, ep_s);
    tp_s += comm;
    flops += oc.flops;
    return oc.compute_s * shared_core_slowdown(ranks_on_node, cores, oc.compute_s, comm) + comm;
  }
};

// One layer: forward; backward split into I (recompute + input-gradient path, all TP
// all-reduces) and W (weight-gradient GEMMs), as the IR defines them. A model with experts: the
// share-weighted mean of its dense and MoE layers (model/cost.hpp layer_mix).
struct LayerTimes {
  double fwd_tp = 0, bwd_tp = 0, fwd_flops = 0, bwd_flops = 0, fwd_ep = 0, bwd_ep = 0;
  double fwd = 0, in = 0, recompute = 0, w = 0, hidden = 0;
};

LayerTimes price_layer(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster, const OpTimer& timed,
                       double share) {
  LayerTimes l;
  for (const auto& [w, moe] : layer_mix(spec)) {
    double ftp = 0, btp = 0, ff = 0, bf = 0, fep = 0, bep = 0;
    const auto bwd_list = shared_layer_ops(spec, plan, Pass::Backward, moe);  // (a LayerOpsMemo's in scope)
    const std::vector<Op>& bwd_ops = *bwd_list;
    l.fwd += w * timed(*shared_layer_ops(spec, plan, Pass::Forward, moe), ftp, ff, &fep);
    const double rec = timed(*shared_layer_ops(spec, plan, Pass::Recompute, moe), btp, bf, &bep);
    l.recompute += w * rec;
    // A collective hidden under a GEMM of the input-gradient path hides in an I as in a B; one
    // hidden under a weight-gradient GEMM only in a whole B.
    const std::vector<Op> in_ops = input_gradient_ops(bwd_ops);
    const double hidden_in = hidden_collectives_s(in_ops, timed.gpu, cluster, plan, share);
    l.in += w * (timed(in_ops, btp, bf, &bep) - hidden_in + rec);
    btp -= hidden_in;
    l.w += w * timed(weight_gradient_ops(bwd_ops), btp, bf, &bep);
    l.hidden += w * (hidden_collectives_s(bwd_ops, timed.gpu, cluster, plan, share) - hidden_in);
    l.fwd_tp += w * ftp, l.bwd_tp += w * btp, l.fwd_flops += w * ff, l.bwd_flops += w * bf;
    l.fwd_ep += w * fep, l.bwd_ep += w * bep;
  }
  return l;
}

}  // namespace

// A unit outside the layers (embedding, head, vocabulary share): its forward, I and W, the TP
// time and FLOPs each adds to its stage's sums, and the TP time its backward hides.
struct UnitPrice {
  double fwd = 0, ftp = 0, fflops = 0, in = 0, in_tp = 0, in_flops = 0, w = 0, w_tp = 0, w_flops = 0, hidden = 0;
  double fep = 0, bep = 0;  // expert all-to-alls (a multi-token-prediction module's MoE layer)
};

struct LayerPriceMemo::Prices {
  std::mutex mutex;
  std::unordered_map<std::string, LayerTimes> by_key;
  std::unordered_map<std::string, UnitPrice> units;  // by the layer's key, the unit and p
};
LayerPriceMemo::LayerPriceMemo() : prices(std::make_unique<Prices>()) {}
LayerPriceMemo::~LayerPriceMemo() = default;


namespace {

// price_layer, from the thread's LayerPriceMemo when a scope set one. The key: every plan field
// the layer's ops (model/cost.cpp layer_ops), their TP/CP/EP groups (ProcessGrid) and the
// overlaps of their communication read, and the core sharing; the model and cluster are the
// scope's. Not the pipeline or data degree: a layer's groups (tensor, context, expert,
// expert-tensor, expert-model) have sizes and strides of t, cp, ep and etp alone and are placed
// from rank 0 (group_shape), and its ops read neither (only the vocabulary's ops read p). Nor
// Megatron's expert overlap or the FP8 parameter gather: they change how actions pair and what
// memory holds, not a layer's or a unit's ops or the exposure of their communication.
std::string layer_price_key(const ParallelPlan& plan, const OpTimer& timed, double share) {
  const int64_t fields[] = {plan.tensor, plan.context, plan.expert, plan.expert_tensor, plan.micro_batch,
                            static_cast<int64_t>(plan.recompute), static_cast<int64_t>(plan.recompute_modules),
                            plan.sequence_parallel, static_cast<int64_t>(plan.precision), plan.tp_comm_overlap,
                            static_cast<int64_t>(plan.moe_dispatcher),
                            static_cast<int64_t>(plan.context_comm), static_cast<int64_t>(plan.framework),
                            static_cast<int64_t>(plan.fp8_recipe), static_cast<int64_t>(resolved_attention_kernel(plan)),
                            plan.vocab_parallel_pipeline, plan.node_gpus,
                            plan.mtp_apart()};
  const double sharing[] = {timed.ranks_on_node, timed.cores, share};
  std::string key(sizeof fields + sizeof sharing, '\0');
  std::memcpy(key.data(), fields, sizeof fields);
  std::memcpy(key.data() + sizeof fields, sharing, sizeof sharing);
  return key;
}

LayerTimes priced_layer(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster, const OpTimer& timed,
                        double share) {
  LayerPriceMemo* memo = LayerPriceScope::current();
  if (!memo) return price_layer(spec, plan, cluster, timed, share);
  std::string key = layer_price_key(plan, timed, share);
  LayerPriceMemo::Prices& p = *memo->prices;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    if (const auto it = p.by_key.find(key); it != p.by_key.end()) return it->second;
  }
  const LayerTimes l = price_layer(spec, plan, cluster, timed, share);  // outside the lock
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.by_key.emplace(std::move(key), l).first->second;
}

// Per stage, the units' compute, and the sharded parameter count (for REDUCE_GRAD and OPTIM).
struct UnitTimes {
  double forward_s = 0, input_s = 0, weight_s = 0, params = 0, hidden_tp_s = 0;
  bool kept_whole = false;  // not resharded after its forward (plan.hpp last_unit_kept_whole)
};

// A stage: its units (embedding, layers, head, vocabulary share) in forward order, and their sums.
struct StageTimes {
  std::vector<UnitTimes> units;
  double ftp = 0, btp = 0, fflops = 0, bflops = 0, fwd = 0, in = 0, w = 0, hidden = 0, fep = 0, bep = 0;
};

StageTimes price_stage(const CostingContext& x, const OpTimer& timed, const LayerTimes& layer, int st, int64_t stage_layer_count,
                       const StageParameters& stage_params) {
  const TransformerSpec& spec = x.spec;
  const ParallelPlan& plan = x.plan;
  const double n = static_cast<double>(stage_layer_count);
  StageTimes s;
  s.ftp = n * layer.fwd_tp, s.btp = n * layer.bwd_tp, s.fflops = n * layer.fwd_flops, s.bflops = n * layer.bwd_flops;
  s.fwd = n * layer.fwd, s.in = n * layer.in, s.w = n * layer.w, s.hidden = n * layer.hidden;
  s.fep = n * layer.fwd_ep, s.bep = n * layer.bwd_ep;
  // A unit outside the layers (embedding, head, vocabulary share): its forward, I and W timed
  // from its ops (`ops(pass)`), once per shape under the thread's LayerPriceMemo (the layer's key,
  // the unit and, where it reads it, p); the stage's sums add what it adds.
  auto unit = [&](char which, auto ops, bool hides) {
    auto price = [&] {
      UnitPrice u;
      const auto backward_list = ops(Pass::Backward);  // (shared, or made for this call)
      const std::vector<Op>& backward = *backward_list;
      u.fwd = timed(*ops(Pass::Forward), u.ftp, u.fflops, &u.fep);
      u.in = timed(input_gradient_ops(backward), u.in_tp, u.in_flops, &u.bep);
      u.w = timed(weight_gradient_ops(backward), u.w_tp, u.w_flops, &u.bep);
      if (hides) u.hidden = hidden_collectives_s(backward, x.gpu, x.cluster, plan, x.share);
      return u;
    };
    UnitPrice u;
    if (LayerPriceMemo* memo = LayerPriceScope::current()) {
      std::string key = layer_price_key(plan, timed, x.share);
      key += which;
      // p, for the units that read it: the vocabulary's share, and the embedding and the head
      // when the output layer is split over the pipeline (the head's ops otherwise read the
      // layer's fields alone: its norm, output layer and MTP modules, on the tensor group).
      if (which != 'h' || plan.vocab_parallel_pipeline)
        key.append(reinterpret_cast<const char*>(&plan.pipeline), sizeof plan.pipeline);
      LayerPriceMemo::Prices& p = *memo->prices;
      std::unique_lock<std::mutex> lock(p.mutex);
      if (const auto it = p.units.find(key); it != p.units.end()) {
        u = it->second;
      } else {
        lock.unlock();
        u = price();  // outside the lock
        lock.lock();
        p.units.emplace(std::move(key), u);
      }
    } else {
      u = price();
    }
    s.ftp += u.ftp, s.fflops += u.fflops;
    s.btp += u.in_tp, s.bflops += u.in_flops;
    s.btp += u.w_tp, s.bflops += u.w_flops;
    s.hidden += u.hidden;
    s.fep += u.fep, s.bep += u.bep;
    s.fwd += u.fwd, s.in += u.in, s.w += u.w;
    return UnitTimes{u.fwd, u.in, u.w, 0, u.hidden};
  };
  // Each unit's ops as a shared list: the head's from the LayerOpsMemo in scope, if any.
  auto made = [](std::vector<Op>&& ops) { return std::make_shared<const std::vector<Op>>(std::move(ops)); };
  if (plan.is_first_stage(st)) s.units.push_back(unit('e', [&](Pass pass) { return made(embedding_ops(spec, plan, pass)); }, false));
  for (int64_t l = 0; l < stage_layer_count; ++l) s.units.push_back({layer.fwd, layer.in, layer.w, 0, layer.hidden});
  // A layout's MTP stage before the last: the MTP modules, a unit after the stage's layers.
  if (plan.mtp_apart() && st % plan.lane_stages() == plan.mtp_stage())
    s.units.push_back(unit('m', [&](Pass pass) { return made(mtp_ops(spec, plan, pass)); }, true));
  if (plan.is_last_stage(st)) {
    s.units.push_back(unit('h', [&](Pass pass) { return shared_head_ops(spec, plan, pass); }, true));
    s.units.back().kept_whole = last_unit_kept_whole(plan);
  }
  // Vocabulary parallelism: every pipeline rank's share of the output layer and loss (and of its
  // weights), a unit after the stage's layers (and after the last stage's norm).
  if (plan.vocab_parallel_pipeline && plan.pipeline > 1)
    s.units.push_back(unit('v', [&](Pass pass) { return made(vocab_ops(spec, plan, pass)); }, true));
  // The units' parameters: the one count (model/units.hpp), in the same forward order.
  PTDP_ASSERT(stage_params.units.size() == s.units.size(), "one parameter count per unit");
  for (size_t i = 0; i < s.units.size(); ++i) s.units[i].params = stage_params.units[i];
  return s;
}

// Boundary st → st+1 between pipeline ranks st mod p and (st+1) mod p; returns the sending
// pipeline rank's first GPU.
int64_t price_boundary(const CostingContext& x, int st, PlanCosts& c) {
  const int stages = static_cast<int>(x.plan.num_stages());
  const int64_t r_from = x.first_gpu(x.rank_of(st));
  const int64_t r_to = x.first_gpu(x.rank_of((st + 1) % stages));
  const bool same = node_of(r_from, x.cluster.gpus_per_node) == node_of(r_to, x.cluster.gpus_per_node);
  c.boundary_same_node.push_back(same);
  double transfer = 0;
  if (!x.plan.is_last_stage(st) && r_from != r_to)
    transfer = p2p_time_s(x.cluster, same, c.p2p_wire_bytes, !same && crosses_leaf(x.cluster, r_from, r_to)) + c.wakeup_s;
  c.send_forward_s.push_back(transfer);
  return r_from;
}

// Sharded data parallelism (ZeRO 2–3) of one stage: per-unit gathers (stage 3) and gradient
// reduce-scatters, overlapped with the units' compute as schedule.hpp defines; what the overlap
// does not hide lengthens the action. Each figure is what the stage's F, B, I, W (and a B inside
// an UNSHARD … RESHARD window, where nothing is gathered) take beyond their compute.
struct ShardTimes {
  double fwd = 0, bwd = 0, in = 0, w = 0, rs_tail = 0, bwd_gathered = 0, unshard = 0;
  std::vector<PlanCosts::ShardUnit> units;
};

ShardTimes price_sharding(const CostingContext& x, int st, const StageTimes& s, int64_t first_gpu) {
  const ParallelPlan& plan = x.plan;
  const ClusterSpec& cluster = x.cluster;
  ShardTimes r;
  if (plan.zero_stage < 2) return r;
  // The stage's sharding group starts at its pipeline rank's first GPU (which leaf switches it spans).
  const GroupShape shard_group = group_shape(cluster, x.n_shard, x.t, first_gpu);
  std::vector<PlanCosts::ShardUnit>& shard_units = r.units;
  std::vector<double> gathers, bgathers, fcomp, bcomp, icomp, wcomp, rs;
  // The backward's re-gather group (reshard_after_forward): the sharding group, a subgroup of its
  // consecutive members (same stride), or none.
  const int64_t regather = reshard_group(plan);
  const GroupShape regather_group = group_shape(cluster, regather, x.t, first_gpu);
  const bool reduce_per_microbatch = !gradients_reduced_once_per_step(plan);
  for (const UnitTimes& u : s.units) {
    PlanCosts::ShardUnit su;
    su.forward_s = u.forward_s, su.input_s = u.input_s, su.weight_s = u.weight_s, su.hidden_tp_s = u.hidden_tp_s;
    su.param_bytes = u.params * x.weight_b;
    su.grad_bytes = u.params * x.grad_b;
    if (plan.zero_stage >= 3) {
      su.gather_s = allgather_time_s(cluster, shard_group, su.param_bytes);
      if (plan.offload == Offload::OptimizerAndParams) su.gather_s += x.host_copy_s(su.param_bytes / static_cast<double>(x.n_shard));
      su.kept_whole = u.kept_whole;
      if (u.kept_whole) su.backward_gather_s = 0;  // whole since its forward: nothing to gather
      else if (regather == x.n_shard) su.backward_gather_s = su.gather_s;
      else if (regather > 1) su.backward_gather_s = allgather_time_s(cluster, regather_group, su.param_bytes);
    }
    if (reduce_per_microbatch) su.reduce_scatter_s = allgather_time_s(cluster, shard_group, su.grad_bytes);
    shard_units.push_back(su);
  }
  auto collect = [&](bool reverse) {
    gathers.clear(), bgathers.clear(), fcomp.clear(), bcomp.clear(), icomp.clear(), wcomp.clear(), rs.clear();
    for (size_t i = 0; i < shard_units.size(); ++i) {
      const PlanCosts::ShardUnit& su = shard_units[reverse ? shard_units.size() - 1 - i : i];
      if (plan.zero_stage >= 3) gathers.push_back(su.gather_s), bgathers.push_back(su.backward_gather_s);
      fcomp.push_back(su.forward_s), bcomp.push_back(su.input_s + su.weight_s - su.hidden_tp_s);
      icomp.push_back(su.input_s), wcomp.push_back(su.weight_s), rs.push_back(su.reduce_scatter_s);
    }
  };
  // A GPU gathers on its own streams while it computes; a CPU rank (cluster.cores_per_node set:
  // the CPU back end) runs the executor's blocking MPI collectives on the core it computes
  // with, so nothing overlaps: one unit gathered at a time and each reduce-scatter waited for.
  const bool overlap = cluster.overlaps_communication();
  const int64_t k = overlap ? plan.max_inflight_gathers : 1;
  // The units' compute slows while a gather or reduce-scatter runs under it (NCCL on the SMs).
  const double contention = overlap ? kCollectiveContention : 0.0;
  std::vector<double> slowed;
  // Each unit's slowdown in one pass, back in forward order.
  std::vector<double> g_stretch, rs_stretch;
  using SU = PlanCosts::ShardUnit;
  auto keep_slowed = [&](double SU::*field, SU::CommStretch SU::*comm_field, bool reverse) {
    const size_t n = shard_units.size();
    for (size_t i = 0; i < slowed.size() && i < n; ++i) shard_units[reverse ? n - 1 - i : i].*field = slowed[i];
    for (size_t i = 0; i < g_stretch.size() && i < n; ++i) (shard_units[reverse ? n - 1 - i : i].*comm_field).gather = g_stretch[i];
    for (size_t i = 0; i < rs_stretch.size() && i < n; ++i) (shard_units[reverse ? n - 1 - i : i].*comm_field).reduce_scatter = rs_stretch[i];
    slowed.clear(), g_stretch.clear(), rs_stretch.clear();
  };
  auto units_s = [&](const std::vector<double>& g, const std::vector<double>& comp, const std::vector<double>* r, double* tail) {
    return overlapped_units_s(g, comp, k, r, tail, contention, &slowed, &g_stretch, &rs_stretch);
  };
  const double bwd = s.in + s.w - s.hidden;
  collect(false);
  r.fwd = plan.zero_stage >= 3 ? units_s(gathers, fcomp, nullptr, nullptr) - s.fwd : 0.0;
  keep_slowed(&SU::forward_slowed_s, &SU::forward_comm_stretch, false);
  collect(true);  // backward walks the units in reverse
  if (!overlap)
    for (double& v : rs) v = 0;  // added below, in series
  r.bwd = units_s(bgathers, bcomp, &rs, &r.rs_tail) - bwd;
  keep_slowed(&SU::backward_slowed_s, &SU::backward_comm_stretch, true);
  r.in = plan.zero_stage >= 3 ? units_s(bgathers, icomp, nullptr, nullptr) - s.in : 0.0;
  keep_slowed(&SU::input_slowed_s, &SU::input_comm_stretch, true);
  r.w = units_s({}, wcomp, &rs, nullptr) - s.w;
  keep_slowed(&SU::weight_slowed_s, &SU::weight_comm_stretch, true);
  double gathered_tail = 0;
  r.bwd_gathered = units_s({}, bcomp, &rs, &gathered_tail) - bwd;
  keep_slowed(&SU::gathered_backward_slowed_s, &SU::gathered_backward_comm_stretch, true);
  if (!overlap) {
    double rs_total = 0;
    for (const auto& su : shard_units) rs_total += su.reduce_scatter_s;
    r.bwd += rs_total;
    r.bwd_gathered += rs_total;
    r.w += rs_total;
    r.rs_tail = 0;
  }
  if (plan.zero_stage >= 3) {
    // UNSHARD: the whole stage gathered at once (the lowering's all-gather step).
    for (const CommStep& step : x.lowering.steps(x.rank_of(st), Action{ActionKind::UNSHARD, st, -1}))
      r.unshard += comm_step_time_s(cluster, plan, x.placement, x.rank_of(st), step);
    if (plan.offload == Offload::OptimizerAndParams)
      for (const auto& su : shard_units) r.unshard += x.host_copy_s(su.param_bytes / static_cast<double>(x.n_shard));
  }
  return r;
}

// One stage's figures into the per-stage columns.
void record_stage(const StageTimes& s, double recompute_s, ShardTimes&& shard, PlanCosts& c) {
  const double fwd_shard = std::max(0.0, shard.fwd), bwd_shard = std::max(0.0, shard.bwd);
  const double in_shard = std::max(0.0, shard.in), w_shard = std::max(0.0, shard.w);
  const double backward = s.in + s.w - s.hidden;
  c.forward_s.push_back(s.fwd + fwd_shard);
  c.input_backward_s.push_back(s.in + in_shard);
  c.recompute_s.push_back(recompute_s);
  c.weight_backward_s.push_back(s.w + w_shard);
  c.backward_s.push_back(backward + bwd_shard);
  c.backward_hidden_tp_s.push_back(s.hidden);
  c.forward_tp_s.push_back(s.ftp);
  c.backward_tp_s.push_back(s.btp);
  c.forward_ep_s.push_back(s.fep);
  c.backward_ep_s.push_back(s.bep);
  c.forward_flops.push_back(s.fflops);
  c.backward_flops.push_back(s.bflops);
  c.forward_shard_s.push_back(fwd_shard);
  c.backward_shard_s.push_back(bwd_shard);
  c.input_shard_s.push_back(in_shard);
  c.weight_shard_s.push_back(w_shard);
  c.unshard_s.push_back(shard.unshard);
  c.forward_gathered_s.push_back(s.fwd);
  c.backward_gathered_s.push_back(backward + std::max(0.0, shard.bwd_gathered));
  c.input_gathered_s.push_back(s.in);
  c.units.push_back(std::move(shard.units));
}

}  // namespace

namespace {

// Ranks sharing too few CPU cores compute proportionally slower (CPU back end): the ranks on a
// node, the cores they share (0: none counted) and the slowdown.
struct CoreSharing {
  double ranks_on_node = 0, cores = 0, share = 1;
};
CoreSharing core_sharing(const ClusterSpec& cluster, const ParallelPlan& plan, bool static_core_sharing) {
  CoreSharing s;
  s.ranks_on_node = static_cast<double>(std::min<int64_t>(plan.gpus(), cluster.gpus_per_node));
  s.cores = cluster.cpu_host() && static_core_sharing ? cluster.cores_per_node : 0.0;
  s.share = shared_core_slowdown(s.ranks_on_node, s.cores, 1.0, 0.0);
  return s;
}

}  // namespace

LayerCosts layer_costs(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& given_cluster,
                       bool static_core_sharing) {
  const std::optional<ClusterSpec> seen = cluster_for_plan(given_cluster, plan);
  const ClusterSpec& cluster = seen ? *seen : given_cluster;
  const CoreSharing cs = core_sharing(cluster, plan, static_core_sharing);
  const OpTimer timed{cluster.gpu, cluster, plan, cs.ranks_on_node, cs.cores};
  const LayerTimes layer = priced_layer(spec, plan, cluster, timed, cs.share);
  LayerCosts out;
  out.forward_s = layer.fwd;
  out.backward_s = layer.in + layer.w - layer.hidden;
  out.input_s = layer.in, out.weight_s = layer.w;
  out.forward_tp_s = layer.fwd_tp, out.backward_tp_s = layer.bwd_tp, out.hidden_tp_s = layer.hidden;
  out.forward_ep_s = layer.fwd_ep, out.backward_ep_s = layer.bwd_ep;
  return out;
}

namespace {

// plan_costs; `reductions` false: without REDUCE_GRAD and OPTIM (plan_compute_costs).
PlanCosts costs_of_plan(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& given_cluster,
                        bool static_core_sharing, const Schedule* schedule, bool reductions) {
  const std::optional<ClusterSpec> seen = cluster_for_plan(given_cluster, plan);  // GPUs: none, no copy
  const ClusterSpec& cluster = seen ? *seen : given_cluster;
  const GpuSpec& gpu = cluster.gpu;
  const int stages = static_cast<int>(plan.num_stages());
  // d: the ranks holding the same weights — the data-parallel ranks, times the context ranks
  // (Megatron's data-parallel group with context parallelism), which sit between them in the
  // rank order (tensor fastest, then context, then data).
  const int64_t t = plan.tensor, d = plan.gradient_ranks(), p = plan.pipeline;
  const std::vector<int64_t> layers = stage_layers(spec, plan);
  const double e = bytes_per_element(plan.precision);

  PTDP_ASSERT(!schedule || schedule->num_stages() == stages, "one placement per stage");

  PlanCosts c;
  const CoreSharing cs = core_sharing(cluster, plan, static_core_sharing);
  const double ranks_on_node = cs.ranks_on_node, cores = cs.cores, share = cs.share;
  c.compute_slowdown = share;
  c.overlaps_communication = cluster.overlaps_communication();
  c.pairs_hide_tp_stream = !merges_expert_overlap(plan);
  // With more ranks than cores (the executor's test: whole cores) the CPU executor's waits
  // sleep. A pipeline receive waits for a peer that is still computing, so its rank sleeps and
  // resumes the node's measured wake-up latency late. The members of a collective do the same
  // work and arrive nearly together: their waits mostly end while polling, and are not charged.
  c.wakeup_s = oversubscribes_cores(cluster, plan) ? cluster.wakeup_latency_s : 0.0;
  c.tp_allreduce_bytes = static_cast<double>(plan.micro_batch * spec.seq_length * spec.hidden_size) * e;
  const GroupShape tp_group = group_shape(cluster, t, 1);
  c.tp_allreduce_s = allreduce_time_s(cluster, tp_group, c.tp_allreduce_bytes);
  const OpTimer timed{gpu, cluster, plan, ranks_on_node, cores};
  const LayerTimes layer = priced_layer(spec, plan, cluster, timed, share);
  c.layer_forward_s = layer.fwd;
  c.layer_backward_s = layer.in + layer.w - layer.hidden;

  // The boundary tensor: each context rank sends its s/cp tokens (model/units.hpp), as the
  // executor does and the lowering's Send/Recv steps say.
  c.p2p_bytes = pipeline_boundary_bytes(spec, plan);
  // Sequence parallelism keeps the boundary tensor in sequence shards: each TP rank sends its
  // 1/t and nothing is gathered on arrival (scatter/gather is implicit).
  c.sequence_parallel = plan.sequence_parallel && t > 1;
  c.scatter_gather = scatter_gather_applies(spec, plan);
  c.p2p_wire_bytes = c.scatter_gather || c.sequence_parallel ? c.p2p_bytes / static_cast<double>(t) : c.p2p_bytes;
  c.p2p_allgather_s = c.scatter_gather ? allgather_time_s(cluster, tp_group, c.p2p_bytes) : 0;
  c.p2p_blocking = !plan.overlap_p2p;

  // Pipeline neighbours are t·d ranks apart (Megatron layout); DP peers t apart.
  const int grad_b = gradient_bytes(plan.precision);
  // The placement as a schedule's shape (lanes included), for the lowering of communication.
  const std::vector<int> placement = schedule ? schedule->stage_to_rank : stage_placement(plan);
  Schedule shape = empty_schedule(static_cast<int>(plan.pipeline), static_cast<int>(plan.virtual_stages), 1, placement);
  shape.lanes = static_cast<int>(plan.lanes());

  // Sharding: the group of N data-parallel ranks sharing the states (stride t; a node group stays
  // inside a node), and for a node group the replicas across nodes (stride t·N).
  const int64_t n_shard = plan.sharding_degree();
  const double weight_b = bytes_per_element(plan.precision);
  c.sharding_degree = n_shard;
  c.host_copy_Bps = cluster.host_link.bw_Bps;
  const Lowering lowering(shape, plan, spec);
  const std::vector<StageParameters>& all_params = lowering.stages();
  const CostingContext x{spec, plan, cluster, gpu, schedule, placement, lowering, t, d, p, n_shard, share, grad_b, weight_b};

  for (int st = 0; st < stages; ++st) {
    const int64_t stage_layer_count = layers[static_cast<size_t>(st)];
    const StageParameters& stage_params = all_params[static_cast<size_t>(st)];
    const StageTimes s = price_stage(x, timed, layer, st, stage_layer_count, stage_params);
    const int64_t first_gpu = price_boundary(x, st, c);
    c.grad_bytes.push_back(stage_params.total * grad_b);
    ShardTimes shard = price_sharding(x, st, s, first_gpu);
    const double rs_tail = shard.rs_tail;
    record_stage(s, static_cast<double>(stage_layer_count) * layer.recompute, std::move(shard), c);
    if (reductions) price_reduce_grad(x, st, stage_params.total, rs_tail, c);
  }
  c.send_backward_s.assign(stages, 0);
  for (int st = 1; st < stages; ++st) c.send_backward_s[st] = c.send_forward_s[st - 1];
  if (reductions) {
    price_optim(x, c);
  } else {
    c.reduce_grad_s.assign(static_cast<size_t>(stages), 0.0);
    c.reduce_grad_least_s.assign(static_cast<size_t>(stages), 0.0);
    c.optim_s.assign(static_cast<size_t>(p), 0.0);
  }
  return c;
}

}  // namespace

PlanCosts plan_costs(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster, bool static_core_sharing,
                     const Schedule* schedule) {
  return costs_of_plan(spec, plan, cluster, static_core_sharing, schedule, true);
}

PlanCosts plan_compute_costs(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster) {
  return costs_of_plan(spec, plan, cluster, true, nullptr, false);
}

double action_duration_s(const PlanCosts& c, int pipeline_rank, const Action& a, double* tp_s, double* shard_s, bool gathered) {
  double tp = 0, d = 0, shard = 0;
  // Hand-made costs (tests) may leave the sharding parts out: none.
  auto part = [](const std::vector<double>& v, int i) { return v.empty() ? 0.0 : v[static_cast<size_t>(i)]; };
  if (gathered && !c.forward_gathered_s.empty() && (a.kind == ActionKind::F || a.kind == ActionKind::B || a.kind == ActionKind::I)) {
    // Between UNSHARD and RESHARD (stage 3): the stage's parameters are whole, no unit gathers.
    const size_t st = static_cast<size_t>(a.stage);
    const bool fwd = a.kind == ActionKind::F, whole = a.kind == ActionKind::B;
    d = fwd ? c.forward_gathered_s[st] : whole ? c.backward_gathered_s[st] : c.input_gathered_s[st];
    tp = fwd ? c.forward_tp_s[st] : c.backward_tp_s[st] - (whole ? part(c.backward_hidden_tp_s, a.stage) : 0.0);
    shard = whole ? std::max(0.0, c.backward_gathered_s[st] - (c.backward_s[st] - part(c.backward_shard_s, a.stage))) : 0.0;
    if (tp_s) *tp_s = tp;
    if (shard_s) *shard_s = shard;
    return d;
  }
  switch (a.kind) {
    case ActionKind::F: d = c.forward_s[a.stage], tp = c.forward_tp_s[a.stage], shard = part(c.forward_shard_s, a.stage); break;
    case ActionKind::B:
      // A whole B hides part of its TP collectives under the weight-gradient GEMMs.
      d = c.backward_s[a.stage], tp = c.backward_tp_s[a.stage] - part(c.backward_hidden_tp_s, a.stage);
      shard = part(c.backward_shard_s, a.stage);
      break;
    case ActionKind::I:
      d = c.input_backward_s[a.stage], tp = c.backward_tp_s[a.stage], shard = part(c.input_shard_s, a.stage);
      break;
    case ActionKind::W: d = c.weight_backward_s[a.stage], shard = part(c.weight_shard_s, a.stage); break;
    case ActionKind::REDUCE_GRAD: d = c.reduce_grad_s[a.stage]; break;
    case ActionKind::OPTIM: d = c.optim_s[pipeline_rank], shard = part(c.optim_shard_s, pipeline_rank); break;
    case ActionKind::UNSHARD: d = shard = part(c.unshard_s, a.stage); break;
    default: break;  // SEND/RECV: transfer_s / recv_completion_s; RESHARD frees memory only
  }
  if (a.overlap != 0 && a.overlap_stage >= 0 && c.overlaps_communication) {
    // OVERLAP_F_B (schedules/schedule.hpp): this action's communication runs under its partner's
    // compute; what the partner's compute cannot cover stays exposed. The partner's own exposed
    // communication (its collectives, its sharding waits) is not compute to hide under. On a CPU
    // cluster the executor runs F, then B, each collective blocking its core: nothing hides.
    Action partner{a.overlap_kind, a.overlap_stage, a.microbatch};
    double partner_tp = 0, partner_shard = 0;
    const double partner_compute =
        action_duration_s(c, pipeline_rank, partner, &partner_tp, &partner_shard) - partner_tp - partner_shard;
    // DualPipe's pairs hide every collective of the TP stream; Megatron's merged steps only the
    // expert all-to-alls, which run on their own stream (the TP collectives stay on the compute
    // stream).
    const double comm = c.pairs_hide_tp_stream ? tp
                        : a.kind == ActionKind::F ? part(c.forward_ep_s, a.stage)
                        : a.kind == ActionKind::B ? part(c.backward_ep_s, a.stage) : 0.0;
    const double hidden = hidden_s(partner_compute, std::min(comm, tp), kCollectiveContention);
    d -= hidden;
    tp -= hidden;
  }
  if (tp_s) *tp_s = tp;
  if (shard_s) *shard_s = shard;
  return d;
}

double comm_step_time_s(const ClusterSpec& cluster, const ParallelPlan& plan, const std::vector<int>& stage_to_rank,
                        int pipeline_rank, const CommStep& step) {
  const ProcessGrid grid(plan);
  const int64_t t = plan.tensor, replica_block = t * plan.context * plan.data;
  GroupShape g;
  switch (step.group) {
    case CommGroup::Pair: {
      const int64_t a = pipeline_rank, b = stage_to_rank[static_cast<size_t>(step.peer_stage)];
      if (a == b) return 0;
      g = group_shape(cluster, 2, replica_block * std::abs(a - b), grid.rank(0, 0, 0, std::min(a, b)));
      break;
    }
    case CommGroup::Model:
      // One value over the t·p ranks of a replica: latency-bound, priced over the pipeline group
      // (which spans the nodes), or the TP group without pipelining.
      g = plan.pipeline > 1 ? group_shape(cluster, plan.pipeline, replica_block) : group_shape(cluster, t, 1);
      break;
    default: g = group_shape(cluster, grid.size(step.group), grid.stride(step.group), grid.rank(0, 0, 0, pipeline_rank)); break;
  }
  switch (step.kind) {
    case StepKind::AllReduce: return allreduce_time_s(cluster, g, step.bytes);
    case StepKind::ReduceScatter: return reduce_scatter_time_s(cluster, g, step.bytes);
    case StepKind::AllGather: return allgather_time_s(cluster, g, step.bytes);
    default: return 0;  // Send/Recv: transfer_s; Wait: priced where it started
  }
}

std::vector<std::vector<char>> gathered_windows(const Schedule& s) {
  std::vector<std::vector<char>> out(static_cast<size_t>(s.p));
  GatheredWindows windows(s);
  for (int r = 0; r < s.p; ++r) {
    out[r].reserve(s.programs[r].actions.size());
    for (const Action& a : s.programs[r].actions) out[r].push_back(windows.inside(r, a) ? 1 : 0);
  }
  return out;
}

double transfer_s(const PlanCosts& c, const Action& send) {
  return send.kind == ActionKind::SEND_F ? c.send_forward_s[send.stage] : c.send_backward_s[send.stage];
}

double send_wait_s(const PlanCosts& c, const Action& send) { return c.p2p_blocking ? transfer_s(c, send) : 0.0; }

double recv_completion_s(const PlanCosts& c, const Schedule& s, const Action& recv) {
  const int from = recv.kind == ActionKind::RECV_F ? recv.stage - 1 : recv.stage + 1;
  return s.stage_to_rank[from] != s.stage_to_rank[recv.stage] ? c.p2p_allgather_s : 0.0;
}

double recompute_part_s(const PlanCosts& c, const Action& a) {
  if (a.kind != ActionKind::B && a.kind != ActionKind::I) return 0;
  return static_cast<size_t>(a.stage) < c.recompute_s.size() ? c.recompute_s[a.stage] : 0;  // hand-made costs may leave it empty
}

ZeroBubbleCosts zero_bubble_costs(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster) {
  const PlanCosts c = plan_costs(spec, plan, cluster);
  ZeroBubbleCosts z;
  z.forward_s = c.forward_s;
  z.input_s = c.input_backward_s;
  z.weight_s = c.weight_backward_s;
  double transfer = 0;
  for (double x : c.send_forward_s) transfer = std::max(transfer, x);
  z.transfer_s = transfer + c.p2p_allgather_s;
  // Free memory per rank after its model states, in microbatches of its stage's activations.
  const int p = static_cast<int>(plan.pipeline);
  if (plan.schedule != ScheduleKind::ZeroBubbleAuto) {  // zb-h2 / zb-v bring their own limits
    z.memory_limit.assign(p, 2 * p);
    return z;
  }
  const auto none = memory_per_rank(spec, plan, std::vector<int>(p, 0));
  const auto one = memory_per_rank(spec, plan, std::vector<int>(p, 1));
  for (int r = 0; r < p; ++r) {
    const double per_microbatch = one[r].total_bytes - none[r].total_bytes;
    const double free = cluster.gpu.memory_bytes - none[r].total_bytes;
    const double fits = per_microbatch > 0 ? std::floor(free / per_microbatch) : 2.0 * p;
    z.memory_limit.push_back(static_cast<int>(std::clamp(fits, 0.0, 2.0 * p)));
  }
  return z;
}

Schedule make_costed_schedule(const TransformerSpec& spec, const ParallelPlan& plan, const ClusterSpec& cluster,
                              bool check_deadlocks) {
  if (plan.schedule != ScheduleKind::ZeroBubbleAuto && plan.schedule != ScheduleKind::ZeroBubbleH2 &&
      plan.schedule != ScheduleKind::ZeroBubbleV)
    return make_schedule(plan, check_deadlocks);
  const ZeroBubbleCosts costs = zero_bubble_costs(spec, plan, cluster);
  return make_schedule(plan, check_deadlocks, &costs);
}

}  // namespace ptdp
