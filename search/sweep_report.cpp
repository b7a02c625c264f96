// How a sweep's plans and results are named, scored and written: plan labels, the framework a
// plan needs, the strategy classes of compare-strategies, the ranking figures and the CSV.
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/csv.hpp"
#include "core/enum_names.hpp"
#include "search/sweep.hpp"

namespace ptdp {

std::string framework_needed(const ParallelPlan& p) {
  std::vector<std::string> needs;
  if (p.zero_stage == 3) needs.push_back(p.sharding_group == ShardingGroup::Node ? "DeepSpeed ZeRO++ (hpZ) or PyTorch FSDP (HYBRID_SHARD)"
                                                                                 : "DeepSpeed ZeRO-3 or PyTorch FSDP (FULL_SHARD)");
  else if (p.zero_stage == 2 && p.pipeline > 1)
    needs.push_back("a framework that reduce-scatters sharded gradients after every microbatch with pipeline stages (ptdp's "
                    "executor; DeepSpeed's pipeline engine refuses ZeRO-2, PyTorch's pipelining with FSDP reduces once per step: "
                    "zero_stage 3 under torchtitan)");
  else if (p.zero_stage == 2) needs.push_back(p.sharding_group == ShardingGroup::Node ? "DeepSpeed ZeRO-2 with node groups or PyTorch FSDP (_HYBRID_SHARD_ZERO2)"
                                                                                      : "DeepSpeed ZeRO-2 or PyTorch FSDP (SHARD_GRAD_OP)");
  else if (p.zero_stage == 1 && p.sharding_group == ShardingGroup::Node) needs.push_back("DeepSpeed ZeRO-1 with node groups");
  if (p.offload != Offload::None) needs.push_back("DeepSpeed ZeRO-Offload");
  if (p.schedule == ScheduleKind::DualPipeV) needs.push_back("PyTorch pipelining (ScheduleDualPipeV)");
  else if (p.schedule == ScheduleKind::DualPipe) needs.push_back("DeepSeek's DualPipe (deepseek-ai/DualPipe)");
  else if (is_zero_bubble(p.schedule)) needs.push_back("the zero-bubble pipeline fork of Megatron-LM (sail-sg/zero-bubble-pipeline-parallelism)");
  if (p.schedule == ScheduleKind::GPipe) needs.push_back("PyTorch pipelining (ScheduleGPipe)");
  std::string out;
  for (const auto& n : needs) out += (out.empty() ? "" : "; ") + n;
  return out;
}

std::string plan_label(const ParallelPlan& p) {
  std::ostringstream o;
  o << "t" << p.tensor;
  if (p.context > 1) o << " cp" << p.context << context_comm_mark(p.context_comm);
  o << " p" << p.pipeline << " d" << p.data;
  if (p.expert > 1) o << " ep" << p.expert;
  if (p.expert_tensor > 0 && p.expert_tensor != p.tensor) o << " etp" << p.expert_tensor;
  o << " b" << p.micro_batch << " " << to_string(p.schedule);
  if (p.schedule == ScheduleKind::Interleaved) o << " v" << p.virtual_stages;
  o << " rc-" << to_string(p.recompute);
  if (p.sequence_parallel) o << " sp";
  if (p.partition == Partition::Balanced) o << " balanced";
  if (p.zero_stage > 0) o << " z" << p.zero_stage << (p.sharding_group == ShardingGroup::Node ? "-node" : "");
  if (p.offload != Offload::None) o << " off-" << (p.offload == Offload::Optimizer ? "opt" : "opt+params");
  if (p.precision == Precision::FP8) o << " fp8";
  if (p.overlap_grad_reduce || p.overlap_param_gather || p.tp_comm_overlap || p.moe_comm_overlap) o << " overlap";
  // The pipeline's sends beside compute: plans that differ only in it are two rows.
  if (p.overlap_p2p && p.pipeline > 1) o << " p2p";
  return o.str();
}

std::string to_string(Strategy s) {
  switch (s) {
    case Strategy::MegatronPtdp: return "Megatron PTD-P";
    case Strategy::FullySharded: return "ZeRO-3 / FSDP";
    case Strategy::Hybrid: return "hybrid";
  }
  return "?";
}

Strategy strategy_of(const ParallelPlan& p) {
  if (p.zero_stage <= 1 && p.offload == Offload::None) return Strategy::MegatronPtdp;
  if (p.zero_stage == 3 && p.sharding_group == ShardingGroup::Data && p.tensor == 1 && p.pipeline == 1 &&
      p.offload == Offload::None)
    return Strategy::FullySharded;
  return Strategy::Hybrid;
}

std::map<Strategy, size_t> best_by_strategy(const SweepResult& result) {
  std::map<Strategy, size_t> best;
  for (size_t i : result.ranking) best.emplace(strategy_of(result.outcomes[i].plan), i);  // ranking is best first
  return best;
}

namespace {
constexpr EnumName kSweepRankNames[] = {
    {static_cast<int>(SweepRank::Time), "time"}, {static_cast<int>(SweepRank::Cost), "cost"}, {static_cast<int>(SweepRank::Energy), "energy"}};
}  // namespace

std::string to_string(SweepRank r) { return enum_name(kSweepRankNames, static_cast<int>(r)); }
SweepRank parse_sweep_rank(const std::string& text) { return parse_enum_as<SweepRank>(kSweepRankNames, text, "ranking", "--rank-by"); }

double sweep_score(const Report& r, SweepRank by) {
  const double tokens_per_iteration = r.tokens_per_s * r.iteration_time_s;
  if (!(tokens_per_iteration > 0)) return std::numeric_limits<double>::infinity();
  switch (by) {
    case SweepRank::Time: return 1.0 / r.tokens_per_s;
    case SweepRank::Cost:
      // With a price: dollars for the token budget (the same for every candidate); without one,
      // GPU-seconds per token, which any GPU-hour price scales alike.
      if (r.cost_usd) return *r.cost_usd;
      return static_cast<double>(r.gpus) * r.iteration_time_s / tokens_per_iteration;
    case SweepRank::Energy: return r.iteration_energy_j / tokens_per_iteration;
  }
  return 0;
}

RankFigure rank_figure(const Report& r, SweepRank by) {
  const double per_mtok = 1e6 * sweep_score(r, by);
  switch (by) {
    case SweepRank::Time: return {"tokens_per_s", r.tokens_per_s, true};
    case SweepRank::Cost:
      if (r.cost_usd) return {"cost_usd", *r.cost_usd, false};
      return {"gpu_hours_per_mtok", per_mtok / 3600, false};
    case SweepRank::Energy: return {"kwh_per_mtok", per_mtok / 3.6e6, false};
  }
  return {};
}

std::string sweep_csv(const SweepResult& result) {
  const auto& outs = result.outcomes;
  auto cells = [](const Report& r, bool present) {
    std::vector<std::string> c;
    if (!present) return std::vector<std::string>(16);
    c.push_back(csv_number(r.iteration_time_s));
    c.push_back(csv_number(r.tflops_per_gpu));
    c.push_back(csv_number(r.mfu));
    c.push_back(csv_number(r.bubble_fraction));
    c.push_back(csv_number(r.peak_memory_bytes));
    c.push_back(csv_number(r.gpu_memory_bytes));
    c.push_back(r.fits_in_memory ? "true" : "false");
    c.push_back(csv_number(r.tokens_per_s));
    c.push_back(r.training_days ? csv_number(*r.training_days) : "");
    c.push_back(r.gpu_hours ? csv_number(*r.gpu_hours) : "");
    c.push_back(r.energy_kwh ? csv_number(*r.energy_kwh) : "");
    c.push_back(r.cost_usd ? csv_number(*r.cost_usd) : "");
    c.push_back(csv_number(r.parameters));
    c.push_back(std::to_string(r.gpus));
    c.push_back(r.bottleneck);
    c.push_back(r.fidelity);
    return c;
  };
  const std::vector<std::string> cols = {"iteration_time_s", "tflops_per_gpu", "mfu", "bubble_fraction",
                                         "peak_memory_bytes", "gpu_memory_bytes", "fits_in_memory", "tokens_per_s",
                                         "training_days", "gpu_hours", "energy_kwh", "cost_usd", "parameters", "gpus",
                                         "bottleneck", "fidelity"};
  std::vector<std::string> header = {"rank", "status", "tensor", "pipeline", "data", "micro_batch", "virtual_stages",
                                     "schedule", "recompute", "sequence_parallel", "overrides"};
  header.insert(header.end(), cols.begin(), cols.end());
  for (const char* c : {"exposed_tp_s", "exposed_pp_s", "exposed_dp_s", "exposed_shard_s", "exposed_cp_s", "exposed_ep_s", "zero_stage", "sharding_group", "offload",
                        "context", "expert", "expert_tensor"})
    header.push_back(c);
  for (const char* c : {"hidden_comm_fraction", "half_nic_iteration_s"}) header.push_back(c);
  for (const auto& c : cols) header.push_back("refined_" + c);
  header.push_back("error");
  for (const char* c : {"ranked_by", "ranked_value"}) header.push_back(c);
  std::string out = csv_record(header);

  std::map<size_t, size_t> rank_of;
  for (size_t i = 0; i < result.ranking.size(); ++i) rank_of[result.ranking[i]] = i + 1;
  std::vector<size_t> rows(result.ranking.begin(), result.ranking.end()), rest;
  for (size_t i = 0; i < outs.size(); ++i)
    if (!rank_of.count(i)) rest.push_back(i);
  {
    std::vector<std::pair<std::string, size_t>> keyed;  // each key built once, not per comparison
    keyed.reserve(rest.size());
    for (size_t i : rest) keyed.emplace_back(key_of(outs[i].sets), i);
    std::sort(keyed.begin(), keyed.end());
    for (size_t j = 0; j < keyed.size(); ++j) rest[j] = keyed[j].second;
  }
  rows.insert(rows.end(), rest.begin(), rest.end());
  for (size_t i : rows) {
    const SweepOutcome& o = outs[i];
    const ParallelPlan& plan = o.plan;
    std::string sets;
    for (const auto& [k, v] : o.sets) sets += (sets.empty() ? "" : ";") + k + "=" + v;
    std::vector<std::string> row = {rank_of.count(i) ? std::to_string(rank_of[i]) : "", o.status,
                                    std::to_string(plan.tensor), std::to_string(plan.pipeline), std::to_string(plan.data),
                                    std::to_string(plan.micro_batch), std::to_string(plan.virtual_stages),
                                    to_string(plan.schedule), to_string(plan.recompute),
                                    plan.sequence_parallel ? "true" : "false", sets};
    const bool ok = o.status == "ok", oom = o.status == "oom";
    std::vector<std::string> a = cells(o.analytic, ok || oom);
    if (oom) {  // only the memory figures are known
      for (size_t c = 0; c < cols.size(); ++c)
        if (cols[c] != "peak_memory_bytes" && cols[c] != "gpu_memory_bytes" && cols[c] != "fits_in_memory" && cols[c] != "gpus")
          a[c].clear();
    }
    row.insert(row.end(), a.begin(), a.end());
    for (const char* cls : {"tp", "pp", "dp", "shard", "cp", "ep"}) {
      const auto it = o.analytic.exposed_comm_s.find(cls);
      row.push_back(ok && it != o.analytic.exposed_comm_s.end() ? csv_number(it->second) : "");
    }
    row.push_back(std::to_string(plan.zero_stage));
    row.push_back(to_string(plan.sharding_group));
    row.push_back(to_string(plan.offload));
    row.push_back(std::to_string(plan.context));
    row.push_back(std::to_string(plan.expert));
    row.push_back(std::to_string(plan.expert_tensor_size()));
    row.push_back(o.hidden_comm_fraction ? csv_number(*o.hidden_comm_fraction) : "");
    row.push_back(o.half_nic_iteration_s ? csv_number(*o.half_nic_iteration_s) : "");
    const auto r = cells(o.refined ? *o.refined : Report{}, o.refined.has_value());
    row.insert(row.end(), r.begin(), r.end());
    row.push_back(!o.error.empty() ? o.error : o.refined_error);
    if (ok) {
      const RankFigure f = rank_figure(o.refined ? *o.refined : o.analytic, result.rank_by);
      row.push_back(f.name);
      row.push_back(csv_number(f.value));
    } else {
      row.insert(row.end(), {"", ""});
    }
    out += csv_record(row);
  }
  return out;
}

}  // namespace ptdp
