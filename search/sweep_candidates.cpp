// The sweep's candidates: `--auto`'s enumeration of valid plans by construction (the layouts a
// model and cluster allow, the sharding settings worth trying) and `--vary`'s cartesian product,
// with the skipped plans counted by reason (search/sweep.hpp).
#include "search/sweep.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <unordered_map>

#include "core/error.hpp"
#include "model/cost.hpp"
#include "model/memory.hpp"
#include "model/partition.hpp"
#include "sim/costing.hpp"
#include "search/sweep_progress.hpp"
#include "topologies/compute_profile.hpp"

namespace ptdp {
namespace {

using sweep_detail::Progress;

// Rule violations counted by key and message with the numbers taken out.
std::string reason_of(const ConfigError& e) {
  const std::string& in = e.message();
  std::string msg;
  for (size_t i = 0; i < in.size(); ++i) {
    const bool digit = std::isdigit(static_cast<unsigned char>(in[i]));
    const bool in_word = i > 0 && std::isalpha(static_cast<unsigned char>(in[i - 1]));  // "p2p" keeps its digit
    if (digit && !in_word) {
      msg += 'N';
      while (i + 1 < in.size() && (std::isdigit(static_cast<unsigned char>(in[i + 1])) || in[i + 1] == '.')) ++i;
    } else {
      msg += in[i];
    }
  }
  return e.key_path() + ": " + msg;
}


std::vector<int64_t> divisors(int64_t n, int64_t limit) {
  std::vector<int64_t> out;
  for (int64_t i = 1; i <= n && i <= limit; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}


}  // namespace

namespace {

struct Sharding {
  int zero_stage = 0;
  ShardingGroup group = ShardingGroup::Data;
  Offload offload = Offload::None;
};

// The sharding settings `--auto` tries for a layout: none; stages 1 to 3 over the data-parallel
// group (and inside nodes when a node holds several of its ranks and there are several nodes),
// with pipeline stages those its framework runs with them (framework_mechanisms: stage 1, and
// torchtitan's stage 3). Offloading only buys memory at a cost in time, so it is tried only
// where the plan without it cannot hold the model states and min(p, m) microbatches.
std::vector<Sharding> sharding_options(const TransformerSpec& model, const ParallelPlan& plan, const ClusterSpec& cluster) {
  std::vector<Sharding> out = {{}};
  if (plan.data < 2) return out;
  const int64_t per_node = plan.node_data_ranks();
  const bool node = per_node >= 2 && plan.data > per_node && plan.data % per_node == 0;
  // The plan's stages and activations priced once for its sharding choices.
  const ShardedMemory memory(model, plan);
  const int inflight = static_cast<int>(std::min(plan.pipeline, plan.num_microbatches()));
  const std::vector<int> inflight_chunks(static_cast<size_t>(plan.pipeline), inflight);
  ParallelPlan p = plan;
  const FrameworkMechanisms has = framework_mechanisms(plan.framework);
  for (int z = 1; z <= 3; ++z) {
    if (!has.auto_builds(z, plan.pipeline > 1)) continue;
    for (ShardingGroup g : {ShardingGroup::Data, ShardingGroup::Node}) {
      if (g == ShardingGroup::Node && !node) continue;
      out.push_back({z, g, Offload::None});
      p.zero_stage = z;
      p.sharding_group = g;
      const double need = peak_memory(memory.per_rank(p, inflight_chunks)).total_bytes;
      if (need <= cluster.gpu.memory_bytes) continue;
      out.push_back({z, g, Offload::Optimizer});
      if (z == 3) out.push_back({z, g, Offload::OptimizerAndParams});
    }
  }
  return out;
}

}  // namespace

void count_skip(SkipReasons& skips, const ConfigError& e) {
  Skipped& s = skips[reason_of(e)];
  if (s.count++ == 0) s.example = e.key_path() + ": " + e.message();
}

const StageCosts& SplitCosts::of(const TransformerSpec& model, const ParallelPlan& plan, const GpuSpec& gpu) {
  const std::array<int64_t, 8> key = {plan.context, static_cast<int64_t>(plan.context_comm), plan.tensor,
                                      plan.vocab_parallel_pipeline && plan.pipeline > 1, plan.expert, plan.expert_tensor,
                                      plan.micro_batch, plan.sequence_parallel};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (const auto it = costs_.find(key); it != costs_.end()) return it->second;
  }
  StageCosts made = stage_costs(model, plan, gpu);  // outside the lock: another thread may make the same, the first is kept
  std::lock_guard<std::mutex> lock(mutex_);
  return costs_.emplace(key, made).first->second;  // std::map: references stay valid
}

// One --auto family's space: its input, and what the enumeration reads of it.
struct AutoSpace {
  const SimulationInput& base;
  const TransformerSpec& model;
  std::shared_ptr<const SimulationInput> shared;  // the candidates' base
  int family;
  int64_t n, B, l, seq;  // GPUs, global batch, layers, sequence length
  SplitCosts& split_costs;
};

// A layout (cp, t, p) and its candidates (in shape groups; `expanded`: one by one, when asked)
// and skips, built on a thread of its own.
struct Layout {
  int64_t cp, t, p;
  SweepCandidates out;
  std::vector<SweepCandidate> expanded;
  SkipReasons invalid;
  ContextComm comm = ContextComm::Ring;  // the context exchange at cp > 1
};

// sharding_options of the plans of one layout, each computed once: the memory check reads the
// stages' placement and layers, not which schedule of a placement runs them (GPipe, 1F1B, ZB-H1,
// ZB-H2 and zb-auto place one stage per rank; ZB-V and DualPipeV the same V), so those share it.
class ShardingMemo {
 public:
  const std::vector<Sharding>& of(const TransformerSpec& model, const ParallelPlan& plan, const ClusterSpec& cluster) {
    ScheduleKind placed = plan.schedule;
    if (placed == ScheduleKind::GPipe || placed == ScheduleKind::ZeroBubbleH1 || placed == ScheduleKind::ZeroBubbleH2 ||
        placed == ScheduleKind::ZeroBubbleAuto)
      placed = ScheduleKind::OneFOneB;
    if (placed == ScheduleKind::DualPipeV) placed = ScheduleKind::ZeroBubbleV;
    const int64_t fields[] = {plan.expert, plan.expert_tensor, plan.micro_batch, static_cast<int64_t>(placed), plan.virtual_stages,
                              static_cast<int64_t>(plan.partition), plan.sequence_parallel, static_cast<int64_t>(plan.recompute)};
    key_.assign(reinterpret_cast<const char*>(fields), sizeof fields);
    key_.append(reinterpret_cast<const char*>(plan.balanced_layers.data()), plan.balanced_layers.size() * sizeof(int64_t));
    const auto it = memo_.find(key_);
    if (it != memo_.end()) return it->second;
    return memo_.emplace(key_, sharding_options(model, plan, cluster)).first->second;
  }

 private:
  std::string key_;
  std::unordered_map<std::string, std::vector<Sharding>> memo_;
};

// The candidates of one layout: every (ep, etp, micro batch, schedule, v, partition, sequence
// parallelism, recompute, sharding, overlaps) that fits it.
void layout_candidates(const AutoSpace& space, Layout& lay) {
  const SimulationInput& base = space.base;
  const TransformerSpec& model = space.model;
  const GpuSpec& gpu = base.cluster.gpu;
  const int64_t n = space.n, B = space.B, l = space.l, seq = space.seq;
  const auto& shared = space.shared;
  const int family = space.family;
  const int64_t cp = lay.cp, t = lay.t, p = lay.p;
  auto& out = lay.out;
  const int64_t d = n / (cp * t * p);
  if (B % d != 0) return;
  const FrameworkMechanisms has = framework_mechanisms(base.plan.framework);
  ShardingMemo shardings;  // every replica takes B / d sequences: no micro batch fits
  std::map<std::array<int64_t, 5>, std::vector<int64_t>> balanced;  // balanced splits by (ep, etp, b, sp, stages)
  // (ep, etp): ep over the divisors of the experts that, with etp (0: t), divide the t·cp·d
  // ranks of a stage; each expert whole (etp 1) or split over t, where its ffn allows.
  std::vector<std::pair<int64_t, int64_t>> experts;
  if (!model.has_moe() || model.expert_ffn() % t == 0) experts.emplace_back(1, 0);
  if (model.has_moe())
    for (int64_t etp : t > 1 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{0})
      for (int64_t ep : divisors(model.moe.num_experts, model.moe.num_experts)) {
        const int64_t etp_size = etp > 0 ? etp : t;
        if (ep > 1 && model.expert_ffn() % etp_size == 0 && (t * cp * d) % (etp_size * ep) == 0) experts.emplace_back(ep, etp);
      }
  // Sequence parallelism splits each (context rank's) sequence over the TP ranks.
  const bool sp_fits = t > 1 && (seq / cp) % t == 0;
  for (auto [ep, etp] : experts)
  for (int64_t b : divisors(B / d, B / d)) {
    const int64_t m = B / (d * b);
    if (m > kMaxMicrobatches) continue;
    for (ScheduleKind kind : kScheduleKinds) {
      // Without a pipeline every schedule is 1F1B (one stage: forward, backward, per microbatch).
      if (p == 1 && kind != ScheduleKind::OneFOneB) continue;
      if (p > 1 && !has.runs(kind)) continue;  // a schedule the framework lacks
      std::vector<int64_t> vs = {1};
      if (is_v_shape(kind)) vs = {2};
      if (kind == ScheduleKind::Interleaved) {
        // Megatron's groups of p microbatches: p > 2 (2 with overlapped p2p) and p | m.
        vs.clear();
        if ((p > 2 || (p == 2 && base.plan.overlap_p2p)) && m % p == 0)
          for (int64_t v : divisors(l, l / p))
            if (v >= 2) vs.push_back(v);
      }
      if (kind == ScheduleKind::DualPipe && (p % 2 != 0 || m % 2 != 0 || m < 2 * p)) continue;
      if (kind == ScheduleKind::DualPipeV && m < 2 * p) continue;
      for (int64_t v : vs) {
        if (m * v * p > kMaxScheduleCells) continue;
        // The stages one copy of the model is split over: uniform where they divide the layers,
        // balanced (when it differs from uniform) where each gets at least one.
        const int64_t S = kind == ScheduleKind::DualPipe ? p : p * v;
        std::vector<Partition> parts;
        if (l % S == 0) parts.push_back(Partition::Uniform);
        if (p > 1 && l >= S) parts.push_back(Partition::Balanced);
        for (bool sp : {false, true}) {
          if (sp && !sp_fits) continue;
          // Tensor-parallel experts route each rank's own sequence shard (Megatron-Core).
          if (!sp && t > 1 && model.has_moe() && (ep > 1 || (etp > 0 && etp != t))) continue;
          for (Partition part : parts) {
            ParallelPlan plan = base.plan;
            plan.layers_per_stage.clear();
            plan.layout_layers.clear();
            plan.layout_mtp.clear();
            plan.first_stage_layers = plan.last_stage_layers = 0;
            plan.partition = part;
            plan.tensor = t;
            plan.pipeline = p;
            plan.data = d;
            plan.context = cp;
            if (cp > 1) plan.context_comm = lay.comm;
            plan.expert = ep;
            plan.expert_tensor = etp;
            plan.micro_batch = b;
            plan.schedule = kind;
            plan.virtual_stages = v;
            plan.sequence_parallel = sp;
            plan.microbatch_group = 0;
            plan.zero_stage = 0;
            plan.sharding_group = ShardingGroup::Data;
            plan.offload = Offload::None;
            plan.overlap_grad_reduce = plan.overlap_param_gather = plan.tp_comm_overlap = plan.moe_comm_overlap = false;
            // The construction meets the layout rules; validate_plan still has the last word
            // (the scenario's own keys, e.g. optimizer_sync, have rules of their own). It does
            // not read the recompute mode: one verdict serves the three.
            try {
              validate_plan(model, plan, n);
            } catch (const ConfigError& e) {
              if (!e.is_rule_violation()) throw;
              count_skip(lay.invalid, e);
              continue;
            }
            if (part == Partition::Balanced) {
              // The balanced split reads the layer, embedding and head ops' costs (of the fields
              // this layout varies: ep, etp, b, sp) and the lane's stage count, not the schedule
              // (resolve_partition's balanced_stage_layers, from costs shared by the stage counts).
              const std::array<int64_t, 5> shape = {ep, etp, b, sp, plan.lane_stages()};
              const auto known = balanced.find(shape);
              if (known != balanced.end()) {
                plan.balanced_layers = known->second;
              } else {
                plan.balanced_layers = balanced_stage_layers(space.split_costs.of(model, plan, gpu), plan.lane_stages(), l);
                balanced.emplace(shape, plan.balanced_layers);
              }
            } else {
              resolve_partition(model, plan, gpu);
            }
            if (part == Partition::Balanced && l % S == 0 &&
                plan.balanced_layers == std::vector<int64_t>(static_cast<size_t>(S), l / S))
              continue;  // the same plan as uniform
            for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
              // The candidates carry no overrides of their own: auto_overrides derives them
              // from the plan when an outcome needs them (most plans are pruned unseen). One
              // group per shape: its members are its sharding and overlap variants.
              SweepCandidate c{{}, shared, plan, {}, family, true};
              c.plan.recompute = rc;
              std::vector<PlanVariant> variants;
              for (const Sharding& sh : shardings.of(model, c.plan, base.cluster))
                for (bool overlap : {false, true}) {
                  // Megatron's overlaps where they apply: the bucketed gradient reduction with
                  // data parallelism (stages 0–1), the parameter gather with the distributed
                  // optimizer, the TP overlap with sequence parallelism; the TP and expert
                  // overlaps only where the framework has them (framework_mechanisms).
                  const bool grads = d > 1 && sh.zero_stage <= 1;
                  // Megatron's merged F/B steps only: DualPipe's own pairs hide the all-to-alls
                  // whatever the flag says (a plan with it would be a duplicate row).
                  const bool moe_overlap = overlap && has.moe_comm_overlap && ep > 1 && expert_overlap_schedule(c.plan) &&
                                           !has_overlapped_pairs(c.plan.schedule);
                  const bool tp_overlap = sp && has.tp_comm_overlap;
                  // With the overlaps on, sends run beside compute wherever the schedule's
                  // implementation does it: Megatron's interleaved schedule (its default there),
                  // the zero-bubble runtimes, PyTorch's GPipe — not Megatron's 1F1B. DualPipe's
                  // runtime always runs them beside compute: its plans have no blocking variant.
                  const bool p2p_always = shared->plan.overlap_p2p || has_overlapped_pairs(c.plan.schedule);
                  const bool p2p = p2p_always || (overlap && c.plan.schedule != ScheduleKind::OneFOneB);
                  // Nothing the overlaps could turn on applies (e.g. DualPipe's pairs already
                  // hide the all-to-alls and the sends already overlap): the plan without them.
                  if (overlap && !grads && !tp_overlap && !moe_overlap && p2p == p2p_always) continue;
                  PlanVariant& v = variants.emplace_back();
                  v.zero_stage = sh.zero_stage;
                  v.sharding_group = sh.group;
                  v.offload = sh.offload;
                  v.overlap_grad_reduce = overlap && grads;
                  v.overlap_param_gather = overlap && grads && sh.zero_stage == 1;
                  v.tp_comm_overlap = overlap && tp_overlap;
                  v.moe_comm_overlap = moe_overlap;
                  v.overlap_p2p = p2p;
                }
              out.add_group(std::move(c), std::move(variants));
            }
          }
        }
      }
    }
  }
}

Overrides auto_overrides(const SimulationInput& base, const ParallelPlan& plan) {
  const bool moe = base.model.has_moe();
  Overrides sets;
  sets.reserve(28);  // every key below: one allocation (a sweep derives them for each outcome it keeps)
  sets = {{"parallel.tensor", std::to_string(plan.tensor)},
          {"parallel.pipeline", std::to_string(plan.pipeline)},
          {"parallel.data", std::to_string(plan.data)},
          {"training.micro_batch", std::to_string(plan.micro_batch)},
          {"parallel.schedule", to_string(plan.schedule)},
          {"parallel.virtual_stages", std::to_string(plan.virtual_stages)},
          {"parallel.recompute", to_string(plan.recompute)},
          {"parallel.partition", to_string(plan.partition)},
          {"parallel.sequence_parallel", plan.sequence_parallel ? "true" : "false"}};
  if (plan.context > 1 || base.plan.context > 1) sets.emplace_back("parallel.context", std::to_string(plan.context));
  if (plan.context_comm != base.plan.context_comm) sets.emplace_back("parallel.context_comm", to_string(plan.context_comm));
  if (moe) {
    sets.emplace_back("parallel.expert", std::to_string(plan.expert));
    sets.emplace_back("parallel.expert_tensor", std::to_string(plan.expert_tensor_size()));
  }
  if (!base.plan.layers_per_stage.empty()) sets.emplace_back("parallel.layers_per_stage", "[]");
  if (!base.plan.layout_layers.empty()) sets.emplace_back("parallel.pipeline_layout", "\"\"");
  if (base.plan.first_stage_layers != 0) sets.emplace_back("parallel.first_stage_layers", "0");
  if (base.plan.last_stage_layers != 0) sets.emplace_back("parallel.last_stage_layers", "0");
  if (base.plan.microbatch_group != 0) sets.emplace_back("parallel.microbatch_group", "0");
  sets.emplace_back("parallel.zero_stage", std::to_string(plan.zero_stage));
  sets.emplace_back("parallel.sharding_group", to_string(plan.sharding_group));
  sets.emplace_back("parallel.offload", to_string(plan.offload));
  sets.emplace_back("parallel.overlap_grad_reduce", plan.overlap_grad_reduce ? "true" : "false");
  sets.emplace_back("parallel.overlap_param_gather", plan.overlap_param_gather ? "true" : "false");
  sets.emplace_back("parallel.tp_comm_overlap", plan.tp_comm_overlap ? "true" : "false");
  if (moe) sets.emplace_back("parallel.moe_comm_overlap", plan.moe_comm_overlap ? "true" : "false");
  if (plan.overlap_p2p != base.plan.overlap_p2p) sets.emplace_back("parallel.overlap_p2p", plan.overlap_p2p ? "true" : "false");
  return sets;
}

Overrides candidate_overrides(const SweepCandidate& c) {
  if (!c.derived_sets) return c.sets;
  if (c.sets.empty()) return auto_overrides(*c.base, c.plan);
  Overrides all = c.sets;
  for (auto& kv : auto_overrides(*c.base, c.plan)) all.push_back(std::move(kv));
  return all;
}

std::vector<std::string> auto_exclusions(const TransformerSpec& model, const ParallelPlan& base) {
  const FrameworkMechanisms has = framework_mechanisms(base.framework);
  std::vector<std::string> out;
  if (!has.pipeline) out.emplace_back("pipeline stages");
  if (!has.auto_builds(1, false)) out.emplace_back("ZeRO-1 (PyTorch's FSDP shards gradients and parameters: stage 2 or 3)");
  if (!has.context && model.attention == AttentionKind::Flash && model.seq_length >= 8192)
    out.emplace_back(has.ulysses ? "context parallelism by a K/V ring or all-gather (DeepSpeed has Ulysses' all-to-alls)"
                                 : "context parallelism");
  if (has.pipeline) {
    auto excluded = [&](int z) { return has.auto_builds(z, false) && !has.auto_builds(z, true); };
    const bool deepspeed = has.max_zero_with_pipeline < 2;
    if (excluded(2))
      out.emplace_back(deepspeed ? "ZeRO-2 with pipeline stages (DeepSpeed's pipeline engine refuses it)"
                                 : "ZeRO-2 with pipeline stages (no framework reduce-scatters its gradients after every microbatch)");
    if (excluded(3)) out.emplace_back("ZeRO-3 with pipeline stages (torchtitan's FSDP has it)");
    if (!has.runs(ScheduleKind::GPipe)) out.emplace_back("pipeline schedules other than 1F1B");
    else if (!has.runs(ScheduleKind::DualPipe)) out.emplace_back("the bidirectional DualPipe");
  }
  if (!has.tp_comm_overlap) out.emplace_back("the TP communication overlap");
  if (!has.moe_comm_overlap && model.has_moe()) out.emplace_back("the expert all-to-all overlap");
  return out;
}

namespace {

// --auto's layouts (cp, t, p) of `base`, each with its candidates in shape groups, built on `jobs`
// threads (each layout then handed to `finish` on its thread, when given) and returned in the
// enumeration's order; their skips merged into `invalid`. `part` of `parts`: see auto_candidates.
// `ops`: the layer and head op lists the balanced splits and memory checks made (per shape).
std::vector<Layout> auto_layouts(const SimulationInput& base, SkipReasons& invalid, int jobs, int family, int part, int parts,
                                 const std::function<void(Layout&)>& finish, LayerOpsMemo& ops) {
  const TransformerSpec& model = base.model;
  const int64_t n = base.plan.gpus(), B = base.plan.global_batch, l = model.num_layers, seq = model.seq_length;
  // One copy of the model, cluster and prices for every candidate (its plan and JSON are theirs).
  std::shared_ptr<SimulationInput> shared_base = std::make_shared<SimulationInput>(base);
  shared_base->config_json.clear();
  const std::shared_ptr<const SimulationInput> shared = std::move(shared_base);
  // Tensor parallelism splits the heads, the key/value groups, the MLP and the vocabulary, and
  // tiles one NVLink domain: t runs over the divisors of their greatest common divisor.
  int64_t t_span = std::gcd(std::gcd(model.num_attention_heads, model.query_groups()), std::gcd(model.ffn(), base.plan.node_gpus));
  if (model.padded_vocab_size > 0) t_span = std::gcd(t_span, model.padded_vocab_size);
  // Context parallelism where sequences are long (Megatron-Core's guideline: from 8k tokens; flash
  // attention only), each sequence in 2·cp chunks. Dense models at short sequences: cp = 1 only.
  // Only what the framework runs (framework_mechanisms): no context or pipeline parallelism where
  // it has none.
  // The exchange: the scenario's, and Ulysses' all-to-alls beside a ring or all-gather where the
  // framework has both (a speed choice, not the run's arithmetic); DeepSpeed's only kind is Ulysses.
  // Ulysses gives each context rank 1/cp of a tensor rank's heads: t·cp divides the heads and the
  // key/value heads.
  const FrameworkMechanisms has = framework_mechanisms(base.plan.framework);
  std::vector<ContextComm> comms;
  if (has.context) comms.push_back(base.plan.context_comm);
  if (has.ulysses && base.plan.context_comm != ContextComm::AllToAll) comms.push_back(ContextComm::AllToAll);
  const int64_t kv_heads = model.has_mla() ? model.num_attention_heads : model.query_groups();
  auto heads_split = [&](int64_t parts) { return model.num_attention_heads % parts == 0 && kv_heads % parts == 0; };
  std::vector<int64_t> cps = {1};
  if (!comms.empty() && seq >= 8192 && model.attention == AttentionKind::Flash)
    for (int64_t c = 2; c <= 64; c *= 2)
      if (n % c == 0 && seq % (2 * c) == 0 && (comms.front() != ContextComm::AllToAll || heads_split(c))) cps.push_back(c);
  // The layouts (cp, t, p) are built on `jobs` threads, each into its own list, and joined in
  // the serial order: the same candidates in the same order whatever the thread count.
  SplitCosts split_costs;
  const AutoSpace space{base, model, shared, family, n, B, l, seq, split_costs};
  std::vector<Layout> layouts;
  std::vector<size_t> ordinal;  // each layout's place in the whole enumeration
  size_t all_layouts = 0;
  for (int64_t cp : cps)
    for (int64_t t : divisors(t_span, t_span)) {
      if ((n / cp) % t != 0) continue;
      for (ContextComm comm : cp > 1 ? comms : std::vector<ContextComm>{base.plan.context_comm}) {
        if (cp > 1 && comm == ContextComm::AllToAll && !heads_split(t * cp)) continue;
        for (int64_t p : divisors(n / (cp * t), has.pipeline ? l : 1)) {
          if (static_cast<int>(all_layouts++ % static_cast<size_t>(std::max(1, parts))) != part) continue;
          layouts.push_back(Layout{cp, t, p, {}, {}, {}, comm});
          ordinal.push_back(all_layouts - 1);
        }
      }
    }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    const LayerOpsScope ops_scope(&ops);
    // The memory checks' layer, embedding and head figures, per shape: this thread's, kept
    // across its layouts (the layouts of one t share them, model/memory.cpp per_shape).
    ActivationBytesMemo activations;
    const ActivationBytesScope activation_scope(&activations);
    for (size_t i = next++; i < layouts.size(); i = next++) {
      layout_candidates(space, layouts[i]);
      if (finish) finish(layouts[i]);
    }
  };
  std::vector<std::thread> pool;
  const int threads = std::max(1, jobs > 0 ? jobs : static_cast<int>(std::thread::hardware_concurrency()));
  for (int j = 1; j < std::min<int>(threads, static_cast<int>(layouts.size())); ++j) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  for (size_t i = 0; i < layouts.size(); ++i) {
    for (const auto& [reason, s] : layouts[i].invalid) {
      Skipped& into = invalid[reason];
      if (into.count == 0) {  // the layouts come in the enumeration's order: the first is kept
        into.example = s.example;
        into.first = (static_cast<size_t>(std::max(0, family)) << 32) | ordinal[i];
      }
      into.count += s.count;
    }
    SkipReasons().swap(layouts[i].invalid);
  }
  return layouts;
}

}  // namespace

std::vector<SweepCandidate> auto_candidates(const SimulationInput& base,
                                            const std::function<std::string(const ParallelPlan&, const Overrides&)>& config_of,
                                            SkipReasons& invalid, int jobs, int family, int part, int parts) {
  // Each layout's members built (with their config JSON) on the thread that enumerated it.
  LayerOpsMemo ops;
  std::vector<Layout> layouts = auto_layouts(base, invalid, jobs, family, part, parts, [&](Layout& lay) {
    lay.expanded = std::move(lay.out).expand();
    if (config_of)
      for (SweepCandidate& c : lay.expanded) c.config_json = config_of(c.plan, auto_overrides(*c.base, c.plan));
  }, ops);
  std::vector<SweepCandidate> out;
  size_t total = 0;
  for (const Layout& lay : layouts) total += lay.expanded.size();
  out.reserve(total);
  for (Layout& lay : layouts) {
    for (auto& c : lay.expanded) out.push_back(std::move(c));
    std::vector<SweepCandidate>().swap(lay.expanded);  // freed as it goes: the lists are not held twice
  }
  return out;
}

SweepCandidates auto_candidate_groups(const SimulationInput& base, SkipReasons& invalid, int jobs, int family, int part, int parts) {
  auto ops = std::make_shared<LayerOpsMemo>();
  std::vector<Layout> layouts = auto_layouts(base, invalid, jobs, family, part, parts, {}, *ops);
  SweepCandidates out;
  for (Layout& lay : layouts) out.append(std::move(lay.out));
  if (family >= 0) out.share_ops(family, std::move(ops));  // (the sweep keeps no memo outside a family)
  return out;
}

void PlanVariant::apply_to(ParallelPlan& plan) const {
  plan.zero_stage = zero_stage;
  plan.sharding_group = sharding_group;
  plan.offload = offload;
  plan.overlap_grad_reduce = overlap_grad_reduce;
  plan.overlap_param_gather = overlap_param_gather;
  plan.tp_comm_overlap = tp_comm_overlap;
  plan.moe_comm_overlap = moe_comm_overlap;
  plan.overlap_p2p = overlap_p2p;
}

SweepCandidates::SweepCandidates(std::vector<SweepCandidate> singles) {
  groups_.reserve(singles.size());
  first_.reserve(singles.size());
  for (SweepCandidate& c : singles) add(std::move(c));
}

void SweepCandidates::add_group(SweepCandidate shape, std::vector<PlanVariant> variants) {
  first_.push_back(size_);
  size_ += std::max<size_t>(1, variants.size());
  groups_.push_back(Group{std::move(shape), std::move(variants)});
}

void SweepCandidates::append(SweepCandidates&& more) {
  for (auto& [family, memo] : more.ops_) ops_[family] = std::move(memo);
  if (groups_.empty()) {
    auto ops = std::move(ops_);
    *this = std::move(more);
    ops_ = std::move(ops);
    return;
  }
  // Grown geometrically: a sweep appends thousands of layouts' groups one list at a time.
  if (groups_.capacity() < groups_.size() + more.groups_.size()) {
    groups_.reserve(std::max(2 * groups_.capacity(), groups_.size() + more.groups_.size()));
    first_.reserve(groups_.capacity());
  }
  for (size_t g = 0; g < more.groups_.size(); ++g) {
    first_.push_back(size_ + more.first_[g]);
    groups_.push_back(std::move(more.groups_[g]));
  }
  size_ += more.size_;
  more = SweepCandidates();
}

void SweepCandidates::prepend_sets(const Overrides& sets) {
  for (Group& g : groups_) g.shape.sets.insert(g.shape.sets.begin(), sets.begin(), sets.end());
}

SweepCandidate SweepCandidates::member(size_t g, size_t j) const {
  SweepCandidate c = groups_[g].shape;
  if (const PlanVariant* v = variant(g, j)) v->apply_to(c.plan);
  return c;
}

SweepCandidate SweepCandidates::member(size_t i) const {
  const size_t g = group_of(i);
  return member(g, i - first_[g]);
}

std::vector<SweepCandidate> SweepCandidates::expand() && {
  std::vector<SweepCandidate> out;
  out.reserve(size_);
  for (Group& grp : groups_) {
    if (grp.variants.empty()) {
      out.push_back(std::move(grp.shape));
      continue;
    }
    for (const PlanVariant& v : grp.variants) {
      SweepCandidate& c = out.emplace_back(grp.shape);  // built in place: one copy of the shape
      v.apply_to(c.plan);
    }
  }
  *this = SweepCandidates();
  return out;
}

size_t product_size(const std::vector<std::pair<std::string, std::vector<std::string>>>& axes) {
  size_t n = 1;
  for (const auto& [key, values] : axes) {
    if (values.empty()) return 0;
    if (n > SIZE_MAX / values.size()) return SIZE_MAX;
    n *= values.size();
  }
  return n;
}

std::vector<SweepCandidate> product_candidates(const std::vector<std::pair<std::string, std::vector<std::string>>>& axes,
                                               const std::function<SimulationInput(const Overrides&)>& load,
                                               SkipReasons& invalid, size_t max_configurations,
                                               bool progress) {
  const size_t total = product_size(axes);
  if (total > max_configurations) {
    std::string sizes;
    for (const auto& [key, values] : axes) sizes += (sizes.empty() ? "" : " × ") + std::to_string(values.size());
    throw ConfigError("--vary", "the values give " + (total == SIZE_MAX ? std::string("more than 2^64") : std::to_string(total)) +
                                    " configurations (" + sizes + "), above the limit of " +
                                    std::to_string(max_configurations) +
                                    ": vary fewer values, or raise --max-configurations");
  }
  std::vector<SweepCandidate> out;
  if (total == 0) return out;
  out.reserve(total);
  Progress bar("building", total, progress);
  size_t built = 0;
  std::vector<size_t> idx(axes.size(), 0);
  for (;;) {
    bar.tick(built++);
    Overrides sets;
    for (size_t a = 0; a < axes.size(); ++a) sets.emplace_back(axes[a].first, axes[a].second[idx[a]]);
    try {
      auto in = std::make_shared<SimulationInput>(load(sets));
      SweepCandidate c{sets, nullptr, in->plan, std::move(in->config_json), -1};
      in->config_json.clear();
      c.base = std::move(in);
      out.push_back(std::move(c));
    } catch (const ConfigError& e) {
      if (!e.is_rule_violation()) throw;  // a malformed value stops the sweep, naming the key
      count_skip(invalid, e);
    }
    size_t a = 0;
    while (a < axes.size() && ++idx[a] == axes[a].second.size()) idx[a++] = 0;
    if (a == axes.size()) break;
  }
  bar.tick(total);
  return out;
}

}  // namespace ptdp
