#include "model/plan_fields.hpp"

#include <stdexcept>
#include <type_traits>

namespace ptdp {
namespace {

template <auto Member>
PlanScalarField scalar(const char* name) {
  using T = std::remove_cvref_t<decltype(std::declval<ParallelPlan&>().*Member)>;
  return {name, [](const ParallelPlan& p) { return static_cast<int64_t>(p.*Member); },
          [](ParallelPlan& p, int64_t v) { p.*Member = static_cast<T>(v); }};
}

}  // namespace

const std::vector<PlanScalarField>& plan_scalar_fields() {
  using P = ParallelPlan;
  static const std::vector<PlanScalarField> fields = {
      scalar<&P::tensor>("tensor"),
      scalar<&P::pipeline>("pipeline"),
      scalar<&P::data>("data"),
      scalar<&P::context>("context"),
      scalar<&P::context_comm>("context_comm"),
      scalar<&P::expert>("expert"),
      scalar<&P::expert_tensor>("expert_tensor"),
      scalar<&P::moe_dispatcher>("moe_dispatcher"),
      scalar<&P::moe_comm_overlap>("moe_comm_overlap"),
      scalar<&P::virtual_stages>("virtual_stages"),
      scalar<&P::micro_batch>("micro_batch"),
      scalar<&P::global_batch>("global_batch"),
      scalar<&P::microbatch_group>("microbatch_group"),
      scalar<&P::schedule>("schedule"),
      scalar<&P::recompute>("recompute"),
      scalar<&P::recompute_modules>("recompute_modules"),
      scalar<&P::scatter_gather>("scatter_gather"),
      scalar<&P::overlap_p2p>("overlap_p2p"),
      scalar<&P::sequence_parallel>("sequence_parallel"),
      scalar<&P::precision>("precision"),
      scalar<&P::fp8_format>("fp8_format"),
      scalar<&P::fp8_recipe>("fp8_recipe"),
      scalar<&P::framework>("framework"),
      scalar<&P::attention_kernel>("attention_kernel"),
      scalar<&P::fp8_param_gather>("fp8_param_gather"),
      scalar<&P::overlap_grad_reduce>("overlap_grad_reduce"),
      scalar<&P::overlap_param_gather>("overlap_param_gather"),
      scalar<&P::tp_comm_overlap>("tp_comm_overlap"),
      scalar<&P::bucket_size>("bucket_size"),
      scalar<&P::first_stage_layers>("first_stage_layers"),
      scalar<&P::last_stage_layers>("last_stage_layers"),
      scalar<&P::partition>("partition"),
      scalar<&P::account_embedding_in_split>("account_embedding_in_split"),
      scalar<&P::account_loss_in_split>("account_loss_in_split"),
      scalar<&P::vocab_parallel_pipeline>("vocab_parallel_pipeline"),
      scalar<&P::zero_stage>("zero_stage"),
      scalar<&P::sharding_group>("sharding_group"),
      scalar<&P::offload>("offload"),
      scalar<&P::optimizer_sync>("optimizer_sync"),
      scalar<&P::max_inflight_gathers>("max_inflight_gathers"),
      scalar<&P::reshard_after_forward>("reshard_after_forward"),
      scalar<&P::node_gpus>("node_gpus"),
      scalar<&P::gpu_runtime_memory>("gpu_runtime_memory"),
      scalar<&P::nvls>("nvls"),
      scalar<&P::expandable_segments>("expandable_segments"),
  };
  return fields;
}

const std::vector<PlanListField>& plan_list_fields() {
  static const std::vector<PlanListField> fields = {
      {"layers_per_stage", &ParallelPlan::layers_per_stage},
      {"balanced_layers", &ParallelPlan::balanced_layers},
      {"layout_layers", &ParallelPlan::layout_layers},
      {"layout_mtp", &ParallelPlan::layout_mtp},
  };
  return fields;
}

std::vector<int64_t> plan_integers(const ParallelPlan& p) {
  std::vector<int64_t> out;
  for (const auto& f : plan_scalar_fields()) out.push_back(f.get(p));
  for (const auto& f : plan_list_fields()) {
    const auto& list = p.*(f.member);
    out.push_back(static_cast<int64_t>(list.size()));
    out.insert(out.end(), list.begin(), list.end());
  }
  return out;
}

ParallelPlan plan_from_integers(const std::vector<int64_t>& v) {
  ParallelPlan p;
  size_t i = 0;
  auto next = [&] {
    if (i >= v.size()) throw std::invalid_argument("plan_from_integers: the sequence ends early");
    return v[i++];
  };
  for (const auto& f : plan_scalar_fields()) f.set(p, next());
  for (const auto& f : plan_list_fields()) {
    const int64_t n = next();
    if (n < 0 || static_cast<uint64_t>(n) > v.size() - i) throw std::invalid_argument("plan_from_integers: a list longer than the sequence");
    auto& list = p.*(f.member);
    list.assign(v.begin() + static_cast<std::ptrdiff_t>(i), v.begin() + static_cast<std::ptrdiff_t>(i) + n);
    i += static_cast<size_t>(n);
  }
  if (i != v.size()) throw std::invalid_argument("plan_from_integers: trailing values");
  return p;
}

}  // namespace ptdp
