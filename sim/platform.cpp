#include "sim/platform.hpp"

#include <simgrid/kernel/resource/NetworkModelIntf.hpp>
#include <simgrid/s4u.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <unordered_map>

#include "topologies/collectives.hpp"

namespace sg4 = simgrid::s4u;

namespace ptdp {

Platform build_platform(const ClusterSpec& c, int64_t gpus, const std::vector<std::pair<int64_t, int64_t>>& pairs) {
  sg4::Engine* e = sg4::Engine::get_instance();
  Platform pf;
  const int gpn = c.gpus_per_node;
  pf.nodes = (gpus + gpn - 1) / gpn;
  pf.leaf_groups = (pf.nodes + c.fabric.leaf_radix - 1) / c.fabric.leaf_radix;

  auto* zone = sg4::create_full_zone("cluster");
  auto duplex = [&](const std::string& name, double bw, double lat) {
    ++pf.links;
    return zone->create_split_duplex_link(name, bw)->set_latency(lat)->seal();
  };
  // Leaf switches per (rail, group of leaf_radix nodes); a leaf's uplink to the core carries its
  // ports' bandwidth divided by the oversubscription.
  const double fabric_lat = c.fabric.switch_latency_s * std::max(1, 2 * (c.fabric.levels - 1));
  std::vector<sg4::Link*> leaf_up(static_cast<size_t>(gpn) * pf.leaf_groups);
  for (int rail = 0; rail < gpn; ++rail)
    for (int64_t g = 0; g < pf.leaf_groups; ++g) {
      const int64_t ports = std::min<int64_t>(c.fabric.leaf_radix, pf.nodes - g * c.fabric.leaf_radix);
      leaf_up[rail * pf.leaf_groups + g] =
          duplex("leaf-r" + std::to_string(rail) + "-g" + std::to_string(g) + "-up",
                 static_cast<double>(ports) * c.nic.bw_Bps / c.fabric.oversubscription, fabric_lat / 2);
    }
  std::vector<sg4::Link*> nvlink(gpus), nic(gpus);
  pf.gpus.reserve(gpus);
  for (int64_t r = 0; r < gpus; ++r) {
    const std::string name = "gpu-" + std::to_string(r);
    pf.gpus.push_back(zone->create_host(name, kHostSpeed)->seal());
    nvlink[r] = duplex(name + "-nvlink", c.nvlink.bw_Bps, c.nvlink.latency_s);
    // The NIC link stands for the GPU's whole path to its leaf: PCIe, NIC and the leaf port.
    nic[r] = duplex(name + "-nic", nic_path_Bps(c), c.nic.latency_s + c.pcie.latency_s + c.fabric.switch_latency_s);
  }
  if (c.cpu_host()) {
    const int cores = std::max(1, static_cast<int>(std::lround(c.cores_per_node)));
    for (int64_t node = 0; node < pf.nodes; ++node)
      pf.node_cpus.push_back(zone->create_host("cpu-" + std::to_string(node), kHostSpeed * c.cores_per_node / cores)
                                 ->set_core_count(cores)
                                 ->seal());
  }
  using Dir = sg4::LinkInRoute::Direction;
  auto route_of = [&](int64_t a, int64_t b) {
    std::vector<sg4::LinkInRoute> links;
    const int64_t na = a / gpn, nb = b / gpn;
    if (na == nb) {
      links = {{nvlink[a], Dir::UP}, {nvlink[b], Dir::DOWN}};
      return links;
    }
    int64_t via = a;  // the GPU of a's node on b's rail
    if (a % gpn != b % gpn) {
      via = na * gpn + b % gpn;
      if (via >= gpus) via = a;  // partial last node: stay on a's own rail
      else links = {{nvlink[a], Dir::UP}, {nvlink[via], Dir::DOWN}};
    }
    links.emplace_back(nic[via], Dir::UP);
    const int64_t ga = na / c.fabric.leaf_radix, gb = nb / c.fabric.leaf_radix;
    if (ga != gb || via % gpn != b % gpn) {
      links.emplace_back(leaf_up[(via % gpn) * pf.leaf_groups + ga], Dir::UP);
      links.emplace_back(leaf_up[(b % gpn) * pf.leaf_groups + gb], Dir::DOWN);
    }
    links.emplace_back(nic[b], Dir::DOWN);
    return links;
  };
  std::vector<std::pair<int64_t, int64_t>> unique;
  unique.reserve(pairs.size());
  for (auto [a, b] : pairs)
    if (a != b) unique.emplace_back(std::min(a, b), std::max(a, b));
  std::sort(unique.begin(), unique.end());
  unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
  for (auto [a, b] : unique)
    zone->add_route(pf.gpus[a]->get_netpoint(), pf.gpus[b]->get_netpoint(), nullptr, nullptr, route_of(a, b), true);
  pf.routes = unique.size();
  zone->seal();

  // Size-dependent bandwidth factors measured by collective benchmarks: transfers inside a node
  // follow the NVSwitch curve, transfers between nodes the InfiniBand one.
  auto node_of_host = std::make_shared<std::unordered_map<const sg4::Host*, int64_t>>();
  for (size_t r = 0; r < pf.gpus.size(); ++r) (*node_of_host)[pf.gpus[r]] = static_cast<int64_t>(r) / c.gpus_per_node;
  e->get_netzone_root()->get_network_model()->set_bw_factor_cb(
      [curves = c, node_of_host](double size, const sg4::Host* src, const sg4::Host* dst, const std::vector<sg4::Link*>&,
                                 const std::unordered_set<sg4::NetZone*>&) {
        const bool inter = node_of_host->at(src) != node_of_host->at(dst);
        return p2p_bandwidth_factor(curves, inter, size);
      });
  return pf;
}

}  // namespace ptdp
