#include "sim/platform.hpp"

#include <simgrid/kernel/resource/NetworkModelIntf.hpp>
#include <simgrid/kernel/routing/NetPoint.hpp>
#include <simgrid/kernel/routing/NetZoneImpl.hpp>
#include <simgrid/s4u.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "topologies/collectives.hpp"

namespace sg4 = simgrid::s4u;

namespace ptdp {

namespace {

using Dir = sg4::LinkInRoute::Direction;
namespace routing = simgrid::kernel::routing;

// The cluster's routes, computed when SimGrid asks for one instead of held in a table: a full
// zone keeps hosts² route pointers (16 384 GPUs: 2.1 GB, zeroed page by page, per simulation).
// The routes are those add_route would store for the registered pairs, link for link: for a pair
// a < b the route a → b as route_of gives it; b → a is that list reversed with each split-duplex
// link's other direction (a symmetrical route); a GPU to itself is SimGrid's loopback; any other
// pair has no route (as in a full zone without it).
class RailZone final : public routing::NetZoneImpl {
 public:
  /// A route's split-duplex links (indices into the zone's) and directions, for a < b.
  struct Hops {
    std::array<std::pair<int32_t, Dir>, 6> hop;
    size_t size = 0;
    void add(int32_t duplex, Dir dir) { hop[size++] = {duplex, dir}; }
  };
  using RouteOf = std::function<Hops(int64_t, int64_t)>;
  explicit RailZone(const std::string& name) : NetZoneImpl(name) {}

  void set_route_of(RouteOf route_of) { route_of_ = std::move(route_of); }
  // Index of the new link in the zone's (what route_of names): its directions are links 2i and 2i + 1.
  int32_t add_duplex(sg4::Link* duplex) {
    const auto* d = static_cast<const sg4::SplitDuplexLink*>(duplex);
    directed_.push_back(d->get_link_up());
    directed_.push_back(d->get_link_down());
    return static_cast<int32_t>(directed_.size() / 2 - 1);
  }

  void add_gpu(const sg4::Host* h, int64_t rank) {
    const unsigned long id = h->get_netpoint()->id();
    if (rank_of_.size() <= id) rank_of_.resize(id + 1, -1);
    rank_of_[id] = rank;
  }
  void add_pair(int64_t a, int64_t b) {
    pairs_.insert(key(a, b));
    routes_.erase((static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b));  // no longer without a route
    routes_.erase((static_cast<uint64_t>(b) << 32) | static_cast<uint64_t>(a));
  }
  // The loopback is the last link id.
  void set_loopback(sg4::Link* l) {
    loopback_ = l;
    if (l) directed_.push_back(l);
  }
  const std::vector<const sg4::Link*>& directed_links() const { return directed_; }

  // SimGrid asks again for every comm (a reduced 1T run: 65 000 comms over a few hundred routes):
  // each ordered pair's links and latencies are worked out once and kept (link latencies do not
  // change once the platform is sealed), then added link by link as before.
  void get_local_route(const routing::NetPoint* src, const routing::NetPoint* dst, routing::Route* into, double* latency) override {
    const int64_t a = rank_of(src), b = rank_of(dst);
    auto [it, fresh] = routes_.try_emplace(a < 0 || b < 0 ? ~uint64_t{0} : (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b));
    auto& [links, latencies] = it->second;
    if (fresh)
      for_each_link(a, b, [&](int32_t id) {
        const sg4::Link* l = directed_[static_cast<size_t>(id)];
        links.push_back(l->get_impl());
        latencies.push_back(l->get_latency());
      });
    into->link_list_.insert(into->link_list_.end(), links.begin(), links.end());
    if (latency)
      for (const double l : latencies) *latency += l;
  }

  // The route between global ranks a and b (either -1: not a GPU, no route), link id by link id.
  template <class Add>
  void for_each_link(int64_t a, int64_t b, Add add) const {
    if (a < 0 || b < 0) return;
    if (a == b) {
      if (loopback_) add(static_cast<int32_t>(directed_.size() - 1));
      return;
    }
    if (!pairs_.count(key(a, b))) return;
    const bool back = a > b;
    const Hops h = route_of_(std::min(a, b), std::max(a, b));
    for (size_t i = 0; i < h.size; ++i) {
      const auto& [duplex, dir] = h.hop[back ? h.size - 1 - i : i];
      add(2 * duplex + ((dir == Dir::UP) != back ? 0 : 1));  // up: 2i, down: 2i + 1
    }
  }

 private:
  static uint64_t key(int64_t a, int64_t b) {
    return (static_cast<uint64_t>(std::min(a, b)) << 32) | static_cast<uint64_t>(std::max(a, b));
  }
  int64_t rank_of(const routing::NetPoint* np) const {
    const unsigned long id = np->id();
    return id < rank_of_.size() ? rank_of_[id] : -1;
  }
  RouteOf route_of_;
  std::vector<int64_t> rank_of_;  // by NetPoint id: the GPU's global rank, -1 for other hosts
  std::unordered_set<uint64_t> pairs_;
  // (source rank, destination rank) → the route's links and their latencies, in order
  std::unordered_map<uint64_t, std::pair<std::vector<simgrid::kernel::resource::StandardLinkImpl*>, std::vector<double>>> routes_;
  std::vector<const sg4::Link*> directed_;  // by link id: each duplex's up and down, then the loopback
  sg4::Link* loopback_ = nullptr;
};

}  // namespace

PlatformShape platform_shape(const ClusterSpec& c, int64_t gpus) {
  PlatformShape s;
  s.gpus = gpus;
  s.gpus_per_node = c.gpus_per_node;
  s.leaf_radix = c.fabric.leaf_radix;
  s.nic_Bps = c.nic.bw_Bps;
  s.oversubscription = c.fabric.oversubscription;
  s.fabric_latency_s = c.fabric.switch_latency_s * std::max(1, 2 * (c.fabric.levels - 1));
  s.nvlink_Bps = c.nvlink.bw_Bps;
  s.nvlink_latency_s = c.nvlink.latency_s;
  s.nic_path_Bps = nic_path_Bps(c);
  s.nic_path_latency_s = c.nic.latency_s + c.pcie.latency_s + c.fabric.switch_latency_s;
  s.cores_per_node = c.cpu_host() ? c.cores_per_node : 0;
  return s;
}

Platform build_platform(const ClusterSpec& c, int64_t gpus, const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  Platform pf = build_hosts_and_links(platform_shape(c, gpus));
  add_routes(pf, pairs);
  set_bandwidth_factors(pf, c);
  return pf;
}

Platform build_hosts_and_links(const PlatformShape& c) {
  sg4::Engine* e = sg4::Engine::get_instance();
  Platform pf;
  const int64_t gpus = c.gpus;
  const int gpn = c.gpus_per_node;
  pf.nodes = (gpus + gpn - 1) / gpn;
  pf.leaf_groups = (pf.nodes + c.leaf_radix - 1) / c.leaf_radix;

  auto* rail_zone = new RailZone("cluster");  // SimGrid's engine owns it (the root zone)
  sg4::NetZone* zone = rail_zone->get_iface();
  auto duplex = [&](const std::string& name, double bw, double lat) {
    ++pf.links;
    return rail_zone->add_duplex(zone->create_split_duplex_link(name, bw)->set_latency(lat)->seal());
  };
  // Leaf switches per (rail, group of leaf_radix nodes); a leaf's uplink to the core carries its
  // ports' bandwidth divided by the oversubscription.
  const double fabric_lat = c.fabric_latency_s;
  std::vector<int32_t> leaf_up(static_cast<size_t>(gpn) * pf.leaf_groups);
  for (int rail = 0; rail < gpn; ++rail)
    for (int64_t g = 0; g < pf.leaf_groups; ++g) {
      const int64_t ports = std::min<int64_t>(c.leaf_radix, pf.nodes - g * c.leaf_radix);
      leaf_up[rail * pf.leaf_groups + g] =
          duplex("leaf-r" + std::to_string(rail) + "-g" + std::to_string(g) + "-up",
                 static_cast<double>(ports) * c.nic_Bps / c.oversubscription, fabric_lat / 2);
    }
  std::vector<int32_t> nvlink(gpus), nic(gpus);
  pf.gpus.reserve(gpus);
  for (int64_t r = 0; r < gpus; ++r) {
    const std::string name = "gpu-" + std::to_string(r);
    pf.gpus.push_back(zone->create_host(name, kHostSpeed)->seal());
    nvlink[r] = duplex(name + "-nvlink", c.nvlink_Bps, c.nvlink_latency_s);
    // The NIC link stands for the GPU's whole path to its leaf: PCIe, NIC and the leaf port.
    nic[r] = duplex(name + "-nic", c.nic_path_Bps, c.nic_path_latency_s);
  }
  if (c.cores_per_node > 0) {
    const int cores = std::max(1, static_cast<int>(std::lround(c.cores_per_node)));
    for (int64_t node = 0; node < pf.nodes; ++node)
      pf.node_cpus.push_back(zone->create_host("cpu-" + std::to_string(node), kHostSpeed * c.cores_per_node / cores)
                                 ->set_core_count(cores)
                                 ->seal());
  }
  const int64_t radix = c.leaf_radix, groups = pf.leaf_groups;
  rail_zone->set_route_of([gpn, gpus, radix, groups, nvlink = std::move(nvlink), nic = std::move(nic),
                           leaf_up = std::move(leaf_up)](int64_t a, int64_t b) {
    RailZone::Hops links;
    const int64_t na = a / gpn, nb = b / gpn;
    if (na == nb) {
      links.add(nvlink[a], Dir::UP);
      links.add(nvlink[b], Dir::DOWN);
      return links;
    }
    int64_t via = a;  // the GPU of a's node on b's rail
    if (a % gpn != b % gpn) {
      via = na * gpn + b % gpn;
      if (via >= gpus) {
        via = a;  // partial last node: stay on a's own rail
      } else {
        links.add(nvlink[a], Dir::UP);
        links.add(nvlink[via], Dir::DOWN);
      }
    }
    links.add(nic[via], Dir::UP);
    const int64_t ga = na / radix, gb = nb / radix;
    if (ga != gb || via % gpn != b % gpn) {
      links.add(leaf_up[(via % gpn) * groups + ga], Dir::UP);
      links.add(leaf_up[(b % gpn) * groups + gb], Dir::DOWN);
    }
    links.add(nic[b], Dir::DOWN);
    return links;
  });
  for (int64_t r = 0; r < gpus; ++r) rail_zone->add_gpu(pf.gpus[r], r);
  rail_zone->set_loopback(e->link_by_name_or_null("__loopback__"));
  zone->seal();
  // (the zone lives as long as SimGrid's engine, which outlives the platform's users)
  pf.directed_links = rail_zone->directed_links();
  pf.route = [rail_zone, gpus](int64_t a, int64_t b, std::vector<int32_t>& into) {
    into.clear();
    if (a < 0 || b < 0 || a >= gpus || b >= gpus) return;
    rail_zone->for_each_link(a, b, [&into](int32_t id) { into.push_back(id); });
  };
  pf.add_pairs = [rail_zone](const std::vector<std::pair<int64_t, int64_t>>& pairs) {
    for (auto [a, b] : pairs) rail_zone->add_pair(a, b);
  };
  return pf;
}

void add_routes(Platform& pf, const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  std::vector<std::pair<int64_t, int64_t>> unique;
  unique.reserve(pairs.size());
  for (auto [a, b] : pairs)
    if (a != b) unique.emplace_back(std::min(a, b), std::max(a, b));
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  pf.add_pairs(unique);
  pf.routes += unique.size();
}

void set_bandwidth_factors(const Platform& pf, const ClusterSpec& c) {
  sg4::Engine* e = sg4::Engine::get_instance();
  // Size-dependent bandwidth factors measured by collective benchmarks: transfers inside a node
  // follow the NVSwitch curve, transfers between nodes the InfiniBand one.
  // Each GPU's node by its NetPoint id (SimGrid asks at every comm's start: an array, not a hash).
  auto node_of_host = std::make_shared<std::vector<int64_t>>();
  for (size_t r = 0; r < pf.gpus.size(); ++r) {
    const unsigned long id = pf.gpus[r]->get_netpoint()->id();
    if (node_of_host->size() <= id) node_of_host->resize(id + 1, -1);
    (*node_of_host)[id] = static_cast<int64_t>(r) / c.gpus_per_node;
  }
  // SimGrid asks at every comm's start; a run's transfers come in a few sizes (a pipeline message,
  // a ring's share), so the last factor of each kind is kept (the curves are a pure function).
  e->get_netzone_root()->get_network_model()->set_bw_factor_cb(
      [curves = c, node_of_host, last_size = std::array<double, 2>{-1, -1}, last_factor = std::array<double, 2>{}](
          double size, const sg4::Host* src, const sg4::Host* dst, const std::vector<sg4::Link*>&,
          const std::unordered_set<sg4::NetZone*>&) mutable {
        const bool inter = node_of_host->at(src->get_netpoint()->id()) != node_of_host->at(dst->get_netpoint()->id());
        if (size != last_size[inter]) {
          last_size[inter] = size;
          last_factor[inter] = p2p_bandwidth_factor(curves, inter, size);
        }
        return last_factor[inter];
      });
}

}  // namespace ptdp
