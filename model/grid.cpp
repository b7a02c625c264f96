#include "model/grid.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace ptdp {

std::string_view to_string(CommGroup g) {
  switch (g) {
    case CommGroup::Tensor: return "tensor";
    case CommGroup::Context: return "context";
    case CommGroup::Expert: return "expert";
    case CommGroup::ExpertTensor: return "expert-tensor";
    case CommGroup::ExpertModel: return "expert-model";
    case CommGroup::Pipeline: return "pipeline";
    case CommGroup::Gradient: return "gradient";
    case CommGroup::Sharding: return "sharding";
    case CommGroup::ShardReplicas: return "shard-replicas";
    case CommGroup::Reshard: return "reshard";
    case CommGroup::ExpertData: return "expert-data";
    case CommGroup::Model: return "model";
    case CommGroup::Pair: return "pair";
  }
  return "?";
}

ProcessGrid::ProcessGrid(const ParallelPlan& plan)
    : ProcessGrid(plan.tensor, plan.context, plan.data, plan.pipeline, plan.expert, plan.expert_tensor_size(),
                  plan.sharding_degree(), reshard_group(plan)) {}

ProcessGrid::ProcessGrid(int64_t t, int64_t cp, int64_t d, int64_t p, int64_t ep, int64_t etp, int64_t n_shard, int64_t n_reshard)
    : t_(t), cp_(cp), d_(d), p_(p), ep_(ep), etp_(etp > 0 ? etp : t), n_shard_(n_shard), n_reshard_(n_reshard > 0 ? n_reshard : n_shard) {
  PTDP_ASSERT(t_ >= 1 && cp_ >= 1 && d_ >= 1 && p_ >= 1 && ep_ >= 1 && etp_ >= 1 && n_shard_ >= 1, "positive degrees");
  PTDP_ASSERT(n_shard_ % n_reshard_ == 0, "the reshard group divides the sharding group");
}

GridCoord ProcessGrid::coord(int64_t rank) const {
  PTDP_ASSERT(rank >= 0 && rank < world(), "rank inside the grid");
  GridCoord c;
  c.tp = rank % t_;
  c.cp = rank / t_ % cp_;
  c.dp = rank / (t_ * cp_) % d_;
  c.pp = rank / (t_ * cp_ * d_);
  const int64_t stage_block = t_ * cp_ * d_, local = rank % stage_block;
  c.etp = local % etp_;
  c.ep = local / etp_ % ep_;
  c.edp = local / (etp_ * ep_);
  return c;
}

int64_t ProcessGrid::rank(int64_t tp, int64_t cp, int64_t dp, int64_t pp) const {
  return tp + t_ * (cp + cp_ * (dp + d_ * pp));
}

int64_t ProcessGrid::size(CommGroup g) const {
  switch (g) {
    case CommGroup::Tensor: return t_;
    case CommGroup::Context: return cp_;
    case CommGroup::Expert: return ep_;
    case CommGroup::ExpertTensor: return etp_;
    case CommGroup::ExpertModel: return etp_ * ep_;
    case CommGroup::Pipeline: return p_;
    case CommGroup::Gradient: return cp_ * d_;
    case CommGroup::Sharding: return n_shard_;
    case CommGroup::ShardReplicas: return cp_ * d_ / n_shard_;
    case CommGroup::Reshard: return n_reshard_;
    case CommGroup::ExpertData: return t_ * cp_ * d_ / (etp_ * ep_);
    case CommGroup::Model: return t_ * p_;
    case CommGroup::Pair: return 2;
  }
  return 1;
}

int64_t ProcessGrid::stride(CommGroup g) const {
  switch (g) {
    case CommGroup::Tensor:
    case CommGroup::ExpertTensor:
    case CommGroup::ExpertModel: return 1;
    case CommGroup::Context:
    case CommGroup::Gradient:
    case CommGroup::Sharding:
    case CommGroup::Reshard: return t_;
    case CommGroup::Expert: return etp_;
    case CommGroup::Pipeline: return t_ * cp_ * d_;
    case CommGroup::ShardReplicas: return t_ * n_shard_;
    case CommGroup::ExpertData: return etp_ * ep_;
    case CommGroup::Model:
    case CommGroup::Pair: return 0;
  }
  return 0;
}

int64_t ProcessGrid::index_in(CommGroup g, int64_t rank) const {
  const GridCoord c = coord(rank);
  const int64_t replica = c.cp + cp_ * c.dp;  // index among the d·cp ranks holding the same weights
  switch (g) {
    case CommGroup::Tensor: return c.tp;
    case CommGroup::Context: return c.cp;
    case CommGroup::Expert: return c.ep;
    case CommGroup::ExpertTensor: return c.etp;
    case CommGroup::ExpertModel: return c.etp + etp_ * c.ep;
    case CommGroup::Pipeline: return c.pp;
    case CommGroup::Gradient: return replica;
    case CommGroup::Sharding: return replica % n_shard_;
    case CommGroup::ShardReplicas: return replica / n_shard_;
    case CommGroup::Reshard: return replica % n_reshard_;
    case CommGroup::ExpertData: return c.edp;
    case CommGroup::Model: return c.tp + t_ * c.pp;
    case CommGroup::Pair: return -1;
  }
  return -1;
}

int64_t ProcessGrid::color(CommGroup g, int64_t rank) const {
  if (g == CommGroup::Pair) return -1;
  if (g == CommGroup::Model) {
    const GridCoord c = coord(rank);
    return c.cp + cp_ * c.dp;
  }
  return rank - index_in(g, rank) * stride(g);  // the group's first member
}

std::vector<int64_t> ProcessGrid::members(CommGroup g, int64_t rank, int64_t pair_pipeline_rank) const {
  std::vector<int64_t> out;
  const GridCoord c = coord(rank);
  if (g == CommGroup::Pair) {
    PTDP_ASSERT(pair_pipeline_rank >= 0 && pair_pipeline_rank < p_, "a pair names the other pipeline rank");
    const int64_t other = this->rank(c.tp, c.cp, c.dp, pair_pipeline_rank);
    out = {std::min(rank, other), std::max(rank, other)};
    return out;
  }
  if (g == CommGroup::Model) {
    for (int64_t pp = 0; pp < p_; ++pp)
      for (int64_t tp = 0; tp < t_; ++tp) out.push_back(this->rank(tp, c.cp, c.dp, pp));
    return out;
  }
  const int64_t first = color(g, rank), n = size(g), s = stride(g);
  for (int64_t k = 0; k < n; ++k) out.push_back(first + k * s);
  return out;
}

}  // namespace ptdp
