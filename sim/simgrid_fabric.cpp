// The SimGrid engine's fabric (sim/simgrid_sim.hpp): the platform and the devices a fidelity runs,
// NCCL's rings over the data-parallel and sharding groups, which of their flows reduced fidelity
// simulates (twins, isomorphic link classes) and how the others are timed alone on their routes.
#include "sim/simgrid_sim.hpp"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "model/metrics.hpp"
#include "topologies/collectives.hpp"

namespace ptdp::sgrun {

RingPlan ring_plan(const ClusterSpec& cluster, int64_t d, int64_t stride) {
  RingPlan rp;
  const GroupShape g = group_shape(cluster, d, stride);
  const int k = (g.nodes > 1 && g.per_node > 1 && d % g.per_node == 0 && g.nodes * g.per_node == d) ? static_cast<int>(g.per_node) : 1;
  rp.channels = k;
  rp.successor.assign(k, std::vector<int>(d));
  for (int c = 0; c < k; ++c)
    for (int i = 0; i < d; ++i) {
      const int block = i / k, local = i % k;
      const int pos = ((local - c) % k + k) % k;
      rp.successor[c][i] = pos < k - 1 ? block * k + (local + 1) % k : static_cast<int>(((block + 1) % (d / k)) * k + c);
    }
  return rp;
}


bool SimgridRun::isomorphic(const std::vector<std::vector<std::pair<int64_t, int64_t>>>& classes, bool allow_idle_shared) const {
  // classes[j][f]: the GPUs (source, destination) of flow f of class j. The classes are twins
  // when, for each class j, one map of class 0's links onto class j's links (one-to-one, equal
  // bandwidth and latency) takes the route of every flow f of class 0 onto the route of flow f
  // of class j, and no link that could limit a flow carries flows of two classes: then the
  // classes are the same network with the same flows, their flows share their links alike, and
  // under SimGrid's max-min bandwidth sharing flow f ends at the same time in every class.
  //
  // With allow_idle_shared, classes may share links that never limit the collective: a shared
  // link L crossed by n flows (all classes) with capacity ≥ n · r_min, r_min the narrowest route
  // bandwidth of any flow, gives every flow crossing it at least r_min under max-min sharing,
  // so the slowest flows (which end the collective) are limited by their own links alone, and
  // the others, whose share of L changes without the twins, still run at least as fast as them.
  // This holds only while nothing else (pipeline transfers) uses the fabric.
  // Link ids (Platform::directed_links) index plain arrays: tens of thousands of flows (16 384
  // GPUs), a few links each.
  const size_t ids = pf_.directed_links.size();
  constexpr int64_t kNone = -1;
  std::vector<int64_t> owner(ids, kNone), crossing(ids, 0);  // first class crossing each link; flows crossing it, all classes
  std::vector<char> shared(ids, 0);
  std::vector<int32_t> image(ids, -1), preimage(ids, -1);  // this class's map, reset per class
  std::vector<int32_t> touched;                            // the entries set in it
  double r_min = std::numeric_limits<double>::infinity();
  std::vector<std::vector<int32_t>> first;
  std::vector<int32_t> links;
  auto link = [&](int32_t id) { return pf_.directed_links[static_cast<size_t>(id)]; };
  for (size_t j = 0; j < classes.size(); ++j) {
    for (int32_t id : touched) image[static_cast<size_t>(id)] = preimage[static_cast<size_t>(id)] = -1;
    touched.clear();
    for (size_t f = 0; f < classes[j].size(); ++f) {
      pf_.route(classes[j][f].first, classes[j][f].second, links);
      for (int32_t id : links) {
        const auto l = static_cast<size_t>(id);
        if (owner[l] == kNone) {
          owner[l] = static_cast<int64_t>(j);
          r_min = std::min(r_min, link(id)->get_bandwidth());  // the least over every link crossed
        } else if (owner[l] != static_cast<int64_t>(j)) {
          if (!allow_idle_shared) return false;
          shared[l] = 1;
        }
        ++crossing[l];
      }
      if (j == 0) {
        first.push_back(links);
        continue;
      }
      const auto& base = first[f];
      if (base.size() != links.size()) return false;
      for (size_t i = 0; i < links.size(); ++i) {
        const auto b = static_cast<size_t>(base[i]), l = static_cast<size_t>(links[i]);
        const bool new_image = image[b] < 0;
        if (new_image) {
          image[b] = links[i];
          touched.push_back(base[i]);
        }
        if (preimage[l] < 0) {
          preimage[l] = base[i];
          touched.push_back(links[i]);
        }
        if (image[b] != links[i] || preimage[l] != base[i]) return false;
        if (new_image && (link(base[i])->get_bandwidth() != link(links[i])->get_bandwidth() ||
                          link(base[i])->get_latency() != link(links[i])->get_latency()))
          return false;
      }
    }
  }
  for (size_t l = 0; l < ids; ++l)
    if (shared[l] && pf_.directed_links[l]->get_sharing_policy() != sg4::Link::SharingPolicy::FATPIPE &&
        static_cast<double>(crossing[l]) * r_min > pf_.directed_links[l]->get_bandwidth())
      return false;
  return true;
}

SimgridRun::Twins SimgridRun::ring_twins(const RingPlan& rp, int group) const {
  // The flows the reduced engine puts on the fabric for one collective over rings of `group`
  // members: every TP rank, replica, stage and channel. TP rank 0's GPUs also carry the actors'
  // pipeline transfers, so the flows kept are TP rank 0's: the flows of the other TP ranks are
  // left out when they are twins of TP rank 0's (their own links, the same network), and with
  // one pipeline stage (no transfers) the channels 1 … k − 1 when they are twins of channel 0.
  // Kept flows meet exactly the flows they met before; a ring collective ends with its last flow,
  // which a twin shares.
  const int t = static_cast<int>(in_.plan.tensor), dp = static_cast<int>(replicas_), p = static_cast<int>(in_.plan.pipeline);
  const int k = rp.channels;
  auto g = [&](int tp, int r, int pp) { return grid_.rank_at(tp, r, pp); };
  // Channel c's member i plays the part channel 0's member ((i mod k) − c) mod k of its node plays.
  auto member = [&](int base_member, int c) { return base_member / k * k + (base_member % k + c) % k; };
  auto flows = [&](int tp, int c, bool as_channel_0) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int pp = 0; pp < p; ++pp)
      for (int r = 0; r < dp; ++r) {
        const int base = r / group * group, i = as_channel_0 ? member(r - base, c) : r - base;
        out.emplace_back(g(tp, base + i, pp), g(tp, base + rp.successor[c][i], pp));
      }
    return out;
  };
  Twins tw{t, k};
  std::vector<std::vector<std::pair<int64_t, int64_t>>> classes;
  if (t > 1) {
    for (int tp = 0; tp < t; ++tp) {
      std::vector<std::pair<int64_t, int64_t>> all;
      for (int c = 0; c < k; ++c)
        for (auto& f : flows(tp, c, false)) all.push_back(f);
      classes.push_back(std::move(all));
    }
    if (isomorphic(classes, p == 1)) tw.tensor = 1;
  }
  if (k > 1 && p == 1) {
    classes.clear();
    for (int c = 0; c < k; ++c) classes.push_back(flows(0, c, true));
    if (isomorphic(classes, true)) tw.channels = 1;
  }
  return tw;
}

const SimgridRun::RouteInfo& SimgridRun::route_info(const sg4::Host* from, const sg4::Host* to) {
  const int64_t a = gpu_index_.at(from), b = gpu_index_.at(to);
  const uint64_t key = (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b);
  auto [it, fresh] = routes_.try_emplace(key);
  if (!fresh) return it->second;
  RouteInfo& info = it->second;
  std::vector<int32_t> links;
  pf_.route(a, b, links);  // as route_to, whose latency is the links' in route order
  info.bandwidth = std::numeric_limits<double>::infinity();
  for (int32_t id : links) {
    const sg4::Link* l = pf_.directed_links[static_cast<size_t>(id)];
    info.latency += l->get_latency();
    info.bandwidth = std::min(info.bandwidth, l->get_bandwidth());
    if (rep_links_[static_cast<size_t>(id)]) info.kept = true;
  }
  info.inter = a / in_.cluster.gpus_per_node != b / in_.cluster.gpus_per_node;
  return info;
}

const SimgridRun::RingSplit& SimgridRun::ring_split(Ring ring, int pp, int group,
                                                     const std::function<void(std::vector<HostPair>&)>& flows) {
  const uint64_t key = (static_cast<uint64_t>(ring) << 56) | (static_cast<uint64_t>(group) << 28) | static_cast<uint64_t>(pp);
  auto [it, fresh] = ring_splits_.try_emplace(key);
  RingSplit& split = it->second;
  if (!fresh) return split;
  std::vector<HostPair> all;
  flows(all);
  std::unordered_map<uint64_t, size_t> kept_index;  // GPU pair → its place in split.kept
  for (const auto& [from, to] : all) {
    if (from == to) continue;
    const RouteInfo& r = route_info(from, to);
    if (r.kept) {
      const uint64_t pair = (static_cast<uint64_t>(gpu_index_.at(from)) << 32) | static_cast<uint64_t>(gpu_index_.at(to));
      const auto [at, first] = kept_index.try_emplace(pair, split.kept.size());
      if (first) {
        split.kept.emplace_back(from, to);
        split.copies.push_back(0);
      }
      ++split.copies[at->second];
      continue;
    }
    const RingSplit::Alone alone{r.latency, r.bandwidth, r.inter};
    if (std::find(split.alone.begin(), split.alone.end(), alone) == split.alone.end()) split.alone.push_back(alone);
  }
  return split;
}

Flows SimgridRun::issue_ring(const RingSplit& split, uint64_t bytes) {
  std::vector<FlowSpec> kept;
  kept.reserve(split.kept.size());
  for (size_t i = 0; i < split.kept.size(); ++i) kept.push_back(FlowSpec{split.kept[i].first, split.kept[i].second, bytes * split.copies[i]});
  // Every flow carries the same bytes: the slowest alone is that of the slowest distinct route.
  const double b = static_cast<double>(bytes);
  double alone_s = 0;
  for (const RingSplit::Alone& r : split.alone)
    alone_s = std::max(alone_s, r.latency + b / (r.bandwidth * p2p_bandwidth_factor(in_.cluster, r.inter, b)));
  Flows out = issue(kept);
  if (alone_s > 0) out.until = sg4::Engine::get_clock() + alone_s;
  return out;
}

Flows SimgridRun::issue(const std::vector<FlowSpec>& specs) {
  Flows out;
  if (specs.size() <= kFlowsPerIssuer) {
    for (const FlowSpec& f : specs) out.comms.push_back(sg4::Comm::sendto_async(f.from, f.to, f.bytes));
    return out;
  }
  for (size_t first = 0; first < specs.size(); first += kFlowsPerIssuer) {
    std::vector<FlowSpec> part(specs.begin() + static_cast<long>(first),
                               specs.begin() + static_cast<long>(std::min(specs.size(), first + kFlowsPerIssuer)));
    sg4::Host* host = part.front().from;
    out.issuers.push_back(sg4::Actor::create("flows", host, [this, part = std::move(part)] {
      std::vector<sg4::CommPtr> comms;
      for (const FlowSpec& f : part) comms.push_back(sg4::Comm::sendto_async(f.from, f.to, f.bytes));
      for (auto& c : comms) {
        c->wait();
        ++activities_;
      }
    }));
  }
  return out;
}

// The platform of the GPUs that exchange data (pipeline neighbours, DP and sharding rings, the
// pairs of stages that sum gradients) and, at full fidelity, whether tensor ranks are twins;
// returns those pairs.
std::vector<std::pair<int64_t, int64_t>> SimgridRun::build_fabric() {
  const int64_t n = in_.plan.gpus();
  const int t = static_cast<int>(in_.plan.tensor), dp = static_cast<int>(replicas_), p = static_cast<int>(in_.plan.pipeline);
  // The pairs of GPUs that exchange data: pipeline neighbours, DP ring neighbours, and the
  // stages that sum gradients pairwise (costs_.pair_stage: the tied embedding's first/last
  // stage, DualPipe's copies) (reduced: pipeline traffic of replica 0 only).
  rings_ = ring_plan(in_.cluster, dp, t);
  shard_n_ = static_cast<int>(in_.plan.sharding_degree());
  shard_rings_ = ring_plan(in_.cluster, shard_n_, t);
  std::vector<std::pair<int64_t, int64_t>> pairs;
  auto g = [&](int tp, int r, int pp) { return grid_.rank_at(tp, r, pp); };
  const bool all = fidelity_ == Fidelity::Full;
  // Full fidelity: per TP rank, the flows its actors would put on the fabric (tensor_twins_).
  std::vector<std::vector<std::pair<int64_t, int64_t>>> tp_flows(static_cast<size_t>(t));
  const bool try_twins = all && t > 1 && !keep_ && !in_.cluster.cpu_host();
  auto both_ways = [&](int tp, int64_t a, int64_t b) {
    pairs.emplace_back(a, b);
    if (try_twins) {
      tp_flows[tp].emplace_back(a, b);
      tp_flows[tp].emplace_back(b, a);
    }
  };
  auto ring_hop = [&](int tp, int64_t a, int64_t b) {
    pairs.emplace_back(a, b);
    if (try_twins) tp_flows[tp].emplace_back(a, b);
  };
  for (int tp = 0; tp < t; ++tp)
    for (int r = 0; r < dp; ++r) {
      const bool rep = tp == 0 && r == 0;
      for (int st = 0; st + 1 < s_.num_stages(); ++st)
        if (all || rep) both_ways(tp, g(tp, r, s_.stage_to_rank[st]), g(tp, r, s_.stage_to_rank[st + 1]));
      for (int st = 0; st < s_.num_stages(); ++st) {  // the tied embedding's copies, DualPipe's lanes
        const int other = costs_.pair_stage[st];
        if (other > st && s_.stage_to_rank[st] != s_.stage_to_rank[other] && (all || rep))
          both_ways(tp, g(tp, r, s_.stage_to_rank[st]), g(tp, r, s_.stage_to_rank[other]));
      }
      for (int pp = 0; pp < p; ++pp) {
        for (const auto& succ : rings_.successor)
          if (dp > 1) ring_hop(tp, g(tp, r, pp), g(tp, succ[r], pp));
        if (shard_n_ > 1)  // the sharding group's rings (over the data-parallel group's when it is that)
          for (const auto& succ : shard_rings_.successor)
            if (shard_n_ < dp || try_twins) ring_hop(tp, g(tp, r, pp), g(tp, r / shard_n_ * shard_n_ + succ[r % shard_n_], pp));
      }
    }
  if (const Platform* prepared = prepared_platform(in_.cluster, n)) {
    // Its hosts and links are those build_platform would make (the same shape); the routes and
    // bandwidth factors are this plan's.
    pf_ = *prepared;
    add_routes(pf_, pairs);
    set_bandwidth_factors(pf_, in_.cluster);
  } else {
    pf_ = build_platform(in_.cluster, n, pairs);
  }
  if (try_twins) {
    for (auto& flows : tp_flows)  // flows between a GPU and itself put nothing on the fabric
      flows.erase(std::remove_if(flows.begin(), flows.end(), [](const auto& f) { return f.first == f.second; }), flows.end());
    tensor_twins_ = isomorphic(tp_flows, false);
  }
  return pairs;
}

// The actors' devices: one per pipeline rank (reduced: the representatives, and the links their
// traffic crosses), else one per GPU (one per tensor group when the tensor ranks are twins).
void SimgridRun::create_devices(const std::vector<std::pair<int64_t, int64_t>>& rep_pairs) {
  const int64_t n = in_.plan.gpus();
  const int t = static_cast<int>(in_.plan.tensor), dp = static_cast<int>(replicas_), p = static_cast<int>(in_.plan.pipeline);

  if (fidelity_ == Fidelity::Reduced) {
    for (size_t r = 0; r < pf_.gpus.size(); ++r) gpu_index_[pf_.gpus[r]] = static_cast<int64_t>(r);
    // The links the representatives' traffic crosses: every route from or to one of their GPUs.
    std::set<int64_t> reps;
    for (int pp = 0; pp < p; ++pp) reps.insert(grid_.rank_at(0, 0, pp));
    rep_links_.assign(pf_.directed_links.size(), 0);
    std::vector<int32_t> links;
    for (auto [a, b] : rep_pairs) {
      if (!reps.count(a) && !reps.count(b)) continue;
      for (auto [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
        pf_.route(x, y, links);
        for (int32_t l : links) rep_links_[static_cast<size_t>(l)] = 1;
      }
    }
    if (dp > 1) dp_twins_ = ring_twins(rings_, dp);
    // A sharding group that is the whole data-parallel group has the same rings (ring_plan of the
    // same group), so the same twins.
    if (shard_n_ > 1) shard_twins_ = shard_n_ == dp ? dp_twins_ : ring_twins(shard_rings_, shard_n_);
    for (int pp = 0; pp < p; ++pp) {
      auto d = std::make_unique<SimRank>();
      d->id = pp;
      d->coord = SimRankCoord{0, 0, pp};
      d->host = gpu(0, 0, pp);
      d->traced = keep_;
      d->representative = true;
      d->record = true;
      devices_.push_back(std::move(d));
    }
  } else {
    devices_.resize(tensor_twins_ ? n / t : n);
    for (int64_t r = 0; r < n; ++r) {
      const GridCoord at = grid_.coord(r);
      if (tensor_twins_ && at.tp != 0) continue;
      auto d = std::make_unique<SimRank>();
      d->coord = SimRankCoord{static_cast<int>(at.tp), static_cast<int>(grid_.index_in(CommGroup::Gradient, r)), static_cast<int>(at.pp)};
      d->id = device_of(d->coord.tp, d->coord.dp, d->coord.pp);
      d->host = pf_.gpus[r];
      d->traced = keep_ && d->coord.dp == 0;  // the trace shows data-parallel replica 0
      d->representative = d->coord.tp == 0 && d->coord.dp == 0;
      d->record = d->traced || d->representative;
      devices_[d->id] = std::move(d);
    }
  }
  if (fidelity_ == Fidelity::Reduced)
    optim_barriers_.push_back(sg4::Barrier::create(static_cast<unsigned>(p)));
  else
    for (int r = 0; r < dp; ++r) optim_barriers_.push_back(sg4::Barrier::create(static_cast<unsigned>((tensor_twins_ ? 1 : t) * p)));
}

}  // namespace ptdp::sgrun
