#include "model/partition.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/error.hpp"
#include "model/layout.hpp"

namespace ptdp {
namespace {

std::string num(int64_t v) { return std::to_string(v); }

std::string list_of(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + num(v[i]);
  return out + "]";
}

// Layers from first/last_stage_layers: the given ends, the rest shared evenly.
std::vector<int64_t> first_last_layers(const TransformerSpec& spec, const ParallelPlan& plan) {
  const int64_t S = plan.lane_stages(), l = spec.num_layers;
  std::vector<int64_t> out(static_cast<size_t>(S), 0);
  int64_t rest = l, middle = S;
  if (plan.first_stage_layers > 0) {
    out.front() = plan.first_stage_layers;
    rest -= plan.first_stage_layers;
    --middle;
  }
  if (plan.last_stage_layers > 0 && S > 1) {
    out.back() = plan.last_stage_layers;
    rest -= plan.last_stage_layers;
    --middle;
  }
  for (int64_t s = 0; s < S; ++s) {
    const bool given = (s == 0 && plan.first_stage_layers > 0) || (s == S - 1 && S > 1 && plan.last_stage_layers > 0);
    if (!given) out[static_cast<size_t>(s)] = middle > 0 ? rest / middle : 0;
  }
  return out;
}

// A layout (ParallelPlan::layout_layers/layout_mtp) against the model and the stage count. The
// layout's own syntax and order were checked when it was parsed (model/layout.hpp).
void validate_layout(const TransformerSpec& spec, const ParallelPlan& plan, const std::string& stages_text) {
  const char* key = "parallel.pipeline_layout";
  const std::string shown = " (\"" + format_pipeline_layout(plan.layout_layers, plan.layout_mtp) + "\")";
  const char* other = !plan.layers_per_stage.empty()                                  ? "parallel.layers_per_stage"
                      : plan.first_stage_layers != 0                                  ? "parallel.first_stage_layers"
                      : plan.last_stage_layers != 0                                   ? "parallel.last_stage_layers"
                      : plan.account_embedding_in_split                               ? "parallel.account_for_embedding_in_pipeline_split"
                      : plan.account_loss_in_split                                    ? "parallel.account_for_loss_in_pipeline_split"
                      : plan.partition == Partition::Balanced                         ? "parallel.partition: balanced"
                                                                                      : nullptr;
  if (other) throw ConfigError::rule(key, std::string("places every layer already; remove ") + other);
  if (plan.lanes() > 1)
    throw ConfigError::rule(key, "dualpipe's two lanes each hold the whole model; a Megatron layout places one (use 1f1b, "
                                 "interleaved or a zero-bubble schedule)");
  const int64_t n = static_cast<int64_t>(plan.layout_layers.size()), S = plan.lane_stages();
  if (n != S)
    throw ConfigError::rule(key, "has " + num(n) + " stages, expected one per stage: " + stages_text + shown);
  int64_t layers = 0, mtp = 0;
  for (int64_t s = 0; s < n; ++s) {
    layers += plan.layout_layers[static_cast<size_t>(s)];
    mtp += plan.layout_mtp[static_cast<size_t>(s)];
  }
  if (layers != spec.num_layers)
    throw ConfigError::rule(key, "places " + num(layers) + " decoder layers (t) but num_layers is " + num(spec.num_layers) + shown);
  if (mtp != spec.mtp_layers)
    throw ConfigError::rule(key, "places " + num(mtp) + " multi-token-prediction layers (m) but model.mtp_layers is " +
                                     num(spec.mtp_layers) + shown);
}

}  // namespace

StageCosts stage_costs(const TransformerSpec& spec, const ParallelPlan& plan, const GpuSpec& gpu) {
  StageCosts c;
  for (Pass pass : {Pass::Forward, Pass::Backward, Pass::Recompute}) {
    for (const auto& [share, moe] : layer_mix(spec)) c.layer_s += share * cost_of(layer_ops(spec, plan, pass, moe), gpu).compute_s;
    c.first_extra_s += cost_of(embedding_ops(spec, plan, pass), gpu).compute_s;
    c.last_extra_s += cost_of(head_ops(spec, plan, pass), gpu).compute_s;
    c.mtp_extra_s += cost_of(mtp_ops(spec, plan, pass), gpu).compute_s;
  }
  return c;
}

void validate_partition(const TransformerSpec& spec, const ParallelPlan& plan) {
  // DualPipe's two lanes each hold the whole model: its layers are split over one lane's stages.
  const int64_t S = plan.lane_stages(), l = spec.num_layers;
  const bool ends = plan.first_stage_layers != 0 || plan.last_stage_layers != 0;
  const bool chunks = plan.virtual_stages > 1 && plan.lanes() == 1;
  const char* stages_key = chunks ? "parallel.virtual_stages" : "parallel.pipeline";
  const std::string stages_text = plan.lanes() > 1 ? "pipeline (" + num(S) + "; each of dualpipe's two lanes holds the whole model)"
                                  : chunks
                                      ? "pipeline × virtual_stages (" + num(plan.pipeline) + " × " + num(plan.virtual_stages) + " = " + num(S) + ")"
                                      : "pipeline (" + num(S) + ")";
  if (!plan.layout_layers.empty()) {
    validate_layout(spec, plan, stages_text);
    return;
  }
  if ((plan.account_embedding_in_split || plan.account_loss_in_split) && (ends || !plan.layers_per_stage.empty()))
    throw ConfigError::rule(plan.account_embedding_in_split ? "parallel.account_for_embedding_in_pipeline_split"
                                                            : "parallel.account_for_loss_in_pipeline_split",
                            "applies to partition: uniform; the layers of each stage are already given");
  if (!plan.layers_per_stage.empty()) {
    if (ends)
      throw ConfigError::rule("parallel.layers_per_stage", "give either layers_per_stage or first/last_stage_layers, not both");
    if (plan.partition == Partition::Balanced)
      throw ConfigError::rule("parallel.partition", "balanced computes the layers of each stage; remove parallel.layers_per_stage "
                                                    "or set partition: uniform");
    const int64_t n = static_cast<int64_t>(plan.layers_per_stage.size());
    if (n != S)
      throw ConfigError::rule("parallel.layers_per_stage", "has " + num(n) + " entries, expected one per stage: " + stages_text +
                                                               " (got " + list_of(plan.layers_per_stage) + ")");
    for (int64_t s = 0; s < n; ++s)
      if (plan.layers_per_stage[static_cast<size_t>(s)] < 1)
        throw ConfigError::rule("parallel.layers_per_stage", "stage " + num(s) + " has " + num(plan.layers_per_stage[static_cast<size_t>(s)]) +
                                                                 " layers; every stage needs at least one (got " + list_of(plan.layers_per_stage) + ")");
    int64_t sum = 0;
    for (int64_t v : plan.layers_per_stage) sum += std::min<int64_t>(v, 1'000'000'000);
    if (sum != l)
      throw ConfigError::rule("parallel.layers_per_stage", "sums to " + num(sum) + " layers but num_layers is " + num(l) + " (got " +
                                                               list_of(plan.layers_per_stage) + ")");
    return;
  }
  if (ends) {
    if (plan.partition == Partition::Balanced)
      throw ConfigError::rule("parallel.partition", "balanced computes the layers of each stage; remove first/last_stage_layers "
                                                    "or set partition: uniform");
    for (auto [key, v] : {std::pair{"parallel.first_stage_layers", plan.first_stage_layers},
                          std::pair{"parallel.last_stage_layers", plan.last_stage_layers}})
      if (v < 0 || v > l)
        throw ConfigError::rule(key, "must be between 1 and num_layers (" + num(l) + "), or 0 for not set (got " + num(v) + ")");
    if (S == 1) {
      throw ConfigError::rule(plan.first_stage_layers != 0 ? "parallel.first_stage_layers" : "parallel.last_stage_layers",
                              "needs more than one pipeline stage (got pipeline × virtual_stages = 1)");
    }
    const int64_t given = plan.first_stage_layers + plan.last_stage_layers;
    const int64_t middle = S - (plan.first_stage_layers > 0 ? 1 : 0) - (plan.last_stage_layers > 0 ? 1 : 0);
    const int64_t rest = l - given;
    const char* key = plan.last_stage_layers > 0 ? "parallel.last_stage_layers" : "parallel.first_stage_layers";
    if (middle == 0 && rest != 0)
      throw ConfigError::rule(key, "first_stage_layers + last_stage_layers (" + num(plan.first_stage_layers) + " + " +
                                       num(plan.last_stage_layers) + " = " + num(given) + ") must equal num_layers (" + num(l) +
                                       ") with 2 stages");
    if (middle > 0 && (rest < middle || rest % middle != 0))
      throw ConfigError::rule(key, "leaves " + num(rest) + " of num_layers (" + num(l) + ") for the other " + num(middle) +
                                       " stages, which must be a positive multiple of " + num(middle) +
                                       " (every stage at least one layer, shared evenly)");
    return;
  }
  const bool accounted = plan.account_embedding_in_split || plan.account_loss_in_split;
  const char* account_key = plan.account_embedding_in_split ? "parallel.account_for_embedding_in_pipeline_split"
                                                            : "parallel.account_for_loss_in_pipeline_split";
  if (accounted && plan.partition == Partition::Balanced)
    throw ConfigError::rule(account_key, "applies to partition: uniform (balanced already weighs the embedding and the "
                                         "output layer + loss by their costed times)");
  if (plan.partition == Partition::Balanced) {
    if (l < S)
      throw ConfigError::rule("parallel.partition", "balanced needs at least one layer per stage: num_layers (" + num(l) + ") < " +
                                                        stages_text);
    return;
  }
  if (accounted) {
    const int64_t counted = l + (plan.account_embedding_in_split ? 1 : 0) + (plan.account_loss_in_split ? 1 : 0);
    if (S == 1) throw ConfigError::rule(account_key, "needs more than one pipeline stage");
    // One counted layer per stage is allowed: the first (last) stage then holds the embedding
    // (the output layer and loss) and no transformer layer, as Megatron-LM runs it (94 + 2 layers
    // over 32 × 3 virtual stages).
    if (counted % S != 0 || counted / S < 1)
      throw ConfigError::rule(account_key, "num_layers (" + num(l) + ") plus the accounted embedding/loss layers (" +
                                               num(counted - l) + ") must be a multiple of " + stages_text +
                                               " (Megatron's rule; got " + num(counted) + ")");
    return;
  }
  if (l % S != 0)
    throw ConfigError::rule(stages_key, (chunks ? "pipeline × virtual_stages (" + num(S) + ") must divide num_layers (" + num(l) + ")"
                                                                 : num(S) + " does not divide num_layers (" + num(l) + ")") +
                                            " with partition: uniform; give parallel.layers_per_stage, "
                                            "parallel.first_stage_layers / last_stage_layers, or parallel.partition: balanced");
}

namespace {

// The layers of one lane's stages (all stages but DualPipe's).
std::vector<int64_t> lane_layers(const TransformerSpec& spec, const ParallelPlan& plan) {
  const int64_t S = plan.lane_stages();
  if (!plan.layers_per_stage.empty()) return plan.layers_per_stage;
  if (!plan.layout_layers.empty()) return plan.layout_layers;
  if (plan.first_stage_layers != 0 || plan.last_stage_layers != 0) return first_last_layers(spec, plan);
  if (plan.partition == Partition::Balanced) {
    PTDP_ASSERT(static_cast<int64_t>(plan.balanced_layers.size()) == S,
                "a balanced plan must be resolved (resolve_partition) before its stages are used");
    return plan.balanced_layers;
  }
  if (plan.account_embedding_in_split || plan.account_loss_in_split) {
    const int64_t e = plan.account_embedding_in_split ? 1 : 0, o = plan.account_loss_in_split ? 1 : 0;
    std::vector<int64_t> out(static_cast<size_t>(S), (spec.num_layers + e + o) / S);
    out.front() -= e;
    out.back() -= o;
    return out;
  }
  return std::vector<int64_t>(static_cast<size_t>(S), spec.num_layers / S);
}

}  // namespace

std::vector<int64_t> stage_layers(const TransformerSpec& spec, const ParallelPlan& plan) {
  const std::vector<int64_t> lane = lane_layers(spec, plan);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(plan.num_stages()));
  for (int64_t k = 0; k < plan.lanes(); ++k) out.insert(out.end(), lane.begin(), lane.end());
  return out;
}

std::vector<double> stage_compute_times_s(const TransformerSpec& spec, const ParallelPlan& plan, const GpuSpec& gpu,
                                          const std::vector<int64_t>& layers) {
  const StageCosts c = stage_costs(spec, plan, gpu);
  std::vector<double> out;
  for (size_t s = 0; s < layers.size(); ++s) {
    double t = static_cast<double>(layers[s]) * c.layer_s;
    if (plan.is_first_stage(static_cast<int64_t>(s))) t += c.first_extra_s;
    if (plan.is_last_stage(static_cast<int64_t>(s))) t += c.last_extra_s;
    if (static_cast<int64_t>(s) % plan.lane_stages() == plan.mtp_stage()) t += c.mtp_extra_s;
    out.push_back(t);
  }
  return out;
}

std::vector<int64_t> balanced_stage_layers(const TransformerSpec& spec, const ParallelPlan& plan, const GpuSpec& gpu) {
  return balanced_stage_layers(stage_costs(spec, plan, gpu), plan.lane_stages(), spec.num_layers);
}

std::vector<int64_t> balanced_stage_layers(const StageCosts& c, int64_t S, int64_t l) {
  PTDP_ASSERT(l >= S, "balanced partition needs a layer per stage");
  auto extra = [&](int64_t s) { return (s == 0 ? c.first_extra_s : 0.0) + (s == S - 1 ? c.last_extra_s : 0.0); };
  // With identical layers, a bottleneck time T admits floor((T − extra_s) / layer) layers on
  // stage s. The smallest T whose capacities hold every layer (with one layer at least on each
  // stage) is one of the values k·layer + extra_s: binary search over them.
  auto capacity = [&](double T, int64_t s) {
    const double room = (T - extra(s)) / c.layer_s + 1e-9;
    return room < 1 ? int64_t{0} : static_cast<int64_t>(std::min(room, static_cast<double>(l)));
  };
  auto fits = [&](double T) {
    int64_t total = 0;
    for (int64_t s = 0; s < S; ++s) {
      const int64_t cap = capacity(T, s);
      if (cap < 1) return false;
      total += cap;
    }
    return total >= l;
  };
  std::vector<double> candidates;
  for (int64_t s : {int64_t{0}, std::min<int64_t>(1, S - 1), S - 1})
    for (int64_t k = 1; k <= l; ++k) candidates.push_back(static_cast<double>(k) * c.layer_s + extra(s));
  std::sort(candidates.begin(), candidates.end());
  const auto best = std::partition_point(candidates.begin(), candidates.end(), [&](double T) { return !fits(T); });
  PTDP_ASSERT(best != candidates.end(), "no balanced partition found");
  // Fill every stage to capacity, then take the surplus layers off the slowest stages (the
  // later one on ties), so the stages below the bottleneck end up as even as they can.
  std::vector<int64_t> out(static_cast<size_t>(S));
  int64_t left = -l;
  for (int64_t s = 0; s < S; ++s) {
    out[static_cast<size_t>(s)] = capacity(*best, s);
    left += out[static_cast<size_t>(s)];
  }
  for (; left > 0; --left) {
    int64_t slowest = -1;
    double slowest_s = -1;
    for (int64_t s = S - 1; s >= 0; --s) {
      const double t = static_cast<double>(out[static_cast<size_t>(s)]) * c.layer_s + extra(s);
      if (out[static_cast<size_t>(s)] > 1 && t > slowest_s + 1e-12 * t) {
        slowest = s;
        slowest_s = t;
      }
    }
    PTDP_ASSERT(slowest >= 0, "balanced partition cannot shed layers");
    --out[static_cast<size_t>(slowest)];
  }
  return out;
}

void resolve_partition(const TransformerSpec& spec, ParallelPlan& plan, const GpuSpec& gpu) {
  plan.balanced_layers.clear();
  if (plan.partition != Partition::Balanced || !plan.layers_per_stage.empty() || plan.first_stage_layers != 0 ||
      plan.last_stage_layers != 0)
    return;
  plan.balanced_layers = balanced_stage_layers(spec, plan, gpu);
}

int64_t stage_rank(const ParallelPlan& plan, int64_t st) {
  const int64_t p = plan.pipeline;
  if (is_v_shape(plan.schedule) && plan.num_stages() == 2 * p) return st < p ? st : 2 * p - 1 - st;
  return st % p;
}

std::vector<int> stage_placement(const ParallelPlan& plan) {
  std::vector<int> out(static_cast<size_t>(plan.num_stages()));
  for (size_t st = 0; st < out.size(); ++st) out[st] = static_cast<int>(stage_rank(plan, static_cast<int64_t>(st)));
  return out;
}

bool rank_holds_first_stage(const ParallelPlan& plan, int64_t r) {
  for (int64_t st = 0; st < plan.num_stages(); st += plan.lane_stages())
    if (stage_rank(plan, st) == r) return true;
  return false;
}

bool rank_holds_last_stage(const ParallelPlan& plan, int64_t r) {
  for (int64_t st = plan.lane_stages() - 1; st < plan.num_stages(); st += plan.lane_stages())
    if (stage_rank(plan, st) == r) return true;
  return false;
}

std::vector<int64_t> rank_chunk_layers(const ParallelPlan& plan, const std::vector<int64_t>& layers, int pipeline_rank) {
  std::vector<int64_t> out;
  if (is_v_shape(plan.schedule) && static_cast<int64_t>(layers.size()) == 2 * plan.pipeline) {
    // The V: rank r holds stages r and 2p − 1 − r.
    out.push_back(layers[static_cast<size_t>(pipeline_rank)]);
    out.push_back(layers[static_cast<size_t>(2 * plan.pipeline - 1 - pipeline_rank)]);
    return out;
  }
  for (int64_t s = pipeline_rank; s < static_cast<int64_t>(layers.size()); s += plan.pipeline) out.push_back(layers[static_cast<size_t>(s)]);
  return out;
}

}  // namespace ptdp
