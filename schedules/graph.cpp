#include "schedules/graph.hpp"

#include <algorithm>
#include <boost/graph/compressed_sparse_row_graph.hpp>
#include <boost/graph/strong_components.hpp>
#include <boost/range/iterator_range.hpp>
#include <map>
#include <sstream>

#include "core/error.hpp"

namespace ptdp {
namespace {

using Graph = boost::compressed_sparse_row_graph<boost::directedS>;
using Vertex = boost::graph_traits<Graph>::vertex_descriptor;

// The dependency graph of a lowered schedule, with the bookkeeping to name its nodes.
struct Built {
  std::vector<size_t> offset;   // first node of each rank
  std::vector<int> node_rank;   // rank of each node
  std::vector<std::pair<Vertex, Vertex>> edges;
  std::vector<int64_t> send_to_recv;  // per node: matching RECV node for SENDs, else -1
  Graph graph;
};

const Action& action_at(const Schedule& s, const Built& b, size_t node) {
  const int r = b.node_rank[node];
  return s.programs[r].actions[node - b.offset[r]];
}

Built build(const Schedule& s) {
  Built b;
  const int stages = s.num_stages();
  b.offset.resize(s.p + 1, 0);
  for (int r = 0; r < s.p; ++r) b.offset[r + 1] = b.offset[r] + s.programs[r].actions.size();
  const size_t n = b.offset[s.p];
  b.node_rank.resize(n);
  for (int r = 0; r < s.p; ++r) std::fill(b.node_rank.begin() + b.offset[r], b.node_rank.begin() + b.offset[r + 1], r);

  // Receives indexed by (direction, receiving stage, microbatch).
  const size_t cells = static_cast<size_t>(stages) * s.m;
  std::vector<int64_t> recv_node(2 * cells, -1);
  auto key = [&](int dir, int stage, int mb) { return transfer_index(s, dir == 0, stage, mb); };
  for (int r = 0; r < s.p; ++r) {
    const auto& acts = s.programs[r].actions;
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      if (a.kind != ActionKind::RECV_F && a.kind != ActionKind::RECV_B) continue;
      const int64_t k = key(a.kind == ActionKind::RECV_F ? 0 : 1, a.stage, a.microbatch);
      if (k < 0) throw ScheduleError("rank " + std::to_string(r) + ": " + a.str() + " is out of range", r, static_cast<int64_t>(i));
      if (recv_node[k] >= 0)
        throw ScheduleError("rank " + std::to_string(r) + ": " + a.str() + " appears twice", r, static_cast<int64_t>(i));
      recv_node[k] = static_cast<int64_t>(b.offset[r] + i);
    }
  }
  b.send_to_recv.assign(n, -1);
  b.edges.reserve(2 * n);
  std::vector<char> recv_matched(2 * cells, 0);
  for (int r = 0; r < s.p; ++r) {
    const auto& acts = s.programs[r].actions;
    for (size_t i = 0; i < acts.size(); ++i) {
      const size_t node = b.offset[r] + i;
      if (i + 1 < acts.size()) b.edges.emplace_back(node, node + 1);
      const Action& a = acts[i];
      if (a.kind != ActionKind::SEND_F && a.kind != ActionKind::SEND_B) continue;
      const bool fwd = a.kind == ActionKind::SEND_F;
      const int to_stage = fwd ? a.stage + 1 : a.stage - 1;
      const int64_t k = key(fwd ? 0 : 1, to_stage, a.microbatch);
      if (k < 0 || recv_node[k] < 0) {
        const std::string want = std::to_string(to_stage) + (fwd ? "RECV_F" : "RECV_B") + std::to_string(a.microbatch);
        throw ScheduleError("deadlock: rank " + std::to_string(r) + " sends " + a.str() + " but no rank receives it (" + want +
                                " is missing)",
                            r, static_cast<int64_t>(i));
      }
      if (recv_matched[k])
        throw ScheduleError("rank " + std::to_string(r) + ": " + a.str() + " is sent twice", r, static_cast<int64_t>(i));
      recv_matched[k] = 1;
      b.send_to_recv[node] = recv_node[k];
      b.edges.emplace_back(node, static_cast<size_t>(recv_node[k]));
    }
  }
  for (size_t k = 0; k < recv_node.size(); ++k) {
    if (recv_node[k] >= 0 && !recv_matched[k]) {
      const size_t node = static_cast<size_t>(recv_node[k]);
      const Action& a = action_at(s, b, node);
      const bool fwd = a.kind == ActionKind::RECV_F;
      const int rank = b.node_rank[node];
      throw ScheduleError("deadlock: rank " + std::to_string(rank) + " waits in " + a.str() +
                              " for a send nobody makes (" + std::to_string(fwd ? a.stage - 1 : a.stage + 1) +
                              (fwd ? "SEND_F" : "SEND_B") + std::to_string(a.microbatch) + " is missing)",
                          rank, static_cast<int64_t>(node - b.offset[rank]));
    }
  }
  // Edges were appended in order of their source node, as the sorted constructor requires.
  b.graph = Graph(boost::edges_are_sorted, b.edges.begin(), b.edges.end(), n);
  return b;
}

[[noreturn]] void report_cycle(const Schedule& s, const Built& b) {
  const size_t n = b.offset.back();
  std::vector<int> component(n);
  const int count = boost::strong_components(
      b.graph, boost::make_iterator_property_map(component.begin(), boost::get(boost::vertex_index, b.graph)));
  std::vector<int> size(count, 0);
  for (int c : component) ++size[c];
  // Name the actions of the stuck cycles, grouped by rank, compute and p2p actions alike.
  std::map<int, std::vector<std::string>> by_rank;
  size_t named = 0, stuck = 0;
  int first_rank = -1;
  int64_t first_position = -1;
  for (size_t v = 0; v < n; ++v) {
    if (size[component[v]] < 2) continue;
    if (stuck == 0) {
      first_rank = b.node_rank[v];
      first_position = static_cast<int64_t>(v - b.offset[first_rank]);
    }
    ++stuck;
    if (named < 24) {
      by_rank[b.node_rank[v]].push_back(action_at(s, b, v).str());
      ++named;
    }
  }
  std::ostringstream msg;
  msg << "deadlock: " << stuck << " actions wait on each other in a cycle:";
  for (const auto& [rank, names] : by_rank) {
    msg << " rank " << rank << " [";
    for (size_t i = 0; i < names.size(); ++i) msg << (i ? " " : "") << names[i];
    msg << "]";
  }
  if (named < stuck) msg << " …";
  throw ScheduleError(msg.str(), first_rank, first_position);
}

// Kahn's algorithm over the graph: nodes left unordered sit on a cycle (a deadlock).
std::vector<Vertex> topological_order(const Schedule& s, const Built& b) {
  const size_t n = b.offset.back();
  std::vector<uint32_t> indegree(n, 0);
  for (Vertex v = 0; v < n; ++v)
    for (auto e : boost::make_iterator_range(boost::out_edges(v, b.graph))) ++indegree[boost::target(e, b.graph)];
  std::vector<Vertex> order;
  order.reserve(n);
  for (Vertex v = 0; v < n; ++v)
    if (indegree[v] == 0) order.push_back(v);
  for (size_t head = 0; head < order.size(); ++head)
    for (auto e : boost::make_iterator_range(boost::out_edges(order[head], b.graph)))
      if (--indegree[boost::target(e, b.graph)] == 0) order.push_back(boost::target(e, b.graph));
  if (order.size() != n) report_cycle(s, b);
  return order;
}

}  // namespace

namespace {

// True when the ranks' programs run to completion, each rank as far as its receives allow, with
// every transfer sent once and received once: then its transfers pair up and the dependency
// graph (program order, SEND → RECV) has no cycle — the replay is a topological order of it.
// One pass over the programs, no graph; false for anything else, which the graph then names.
bool runs_to_completion(const Schedule& s) {
  const int stages = s.num_stages();
  const size_t cells = static_cast<size_t>(stages) * s.m;
  auto key = [&](bool fwd, int receiver_stage, int mb) { return transfer_index(s, fwd, receiver_stage, mb); };
  enum : char { kNone, kSent, kReceived };
  std::vector<char> state(2 * cells, kNone);
  std::vector<size_t> pc(s.p, 0);
  size_t sends = 0, recvs = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.p; ++r) {
      const auto& acts = s.programs[r].actions;
      for (; pc[r] < acts.size(); ++pc[r]) {
        const Action& a = acts[pc[r]];
        if (a.kind == ActionKind::RECV_F || a.kind == ActionKind::RECV_B) {
          const int64_t k = key(a.kind == ActionKind::RECV_F, a.stage, a.microbatch);
          if (k < 0 || state[k] == kReceived) return false;
          if (state[k] == kNone) break;  // blocked until the sender gets there
          state[k] = kReceived;
          ++recvs;
        } else if (a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B) {
          const bool fwd = a.kind == ActionKind::SEND_F;
          const int64_t k = key(fwd, fwd ? a.stage + 1 : a.stage - 1, a.microbatch);
          if (k < 0 || state[k] != kNone) return false;
          state[k] = kSent;
          ++sends;
        }
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.p; ++r)
    if (pc[r] < s.programs[r].actions.size()) return false;
  return sends == recvs;  // each receive took a distinct send: equal counts leave no send unreceived
}

}  // namespace

void check_deadlock_free(const Schedule& s) {
  if (runs_to_completion(s)) return;
  Built b = build(s);  // throws the message naming the actions
  topological_order(s, b);
}

void throw_unrunnable(const Schedule& s) {
  check_deadlock_free(s);  // throws the message naming the actions
  throw ScheduleError("the schedule's transfers do not pair up");
}

CriticalPath critical_path(const Schedule& s, const ActionCosts& costs) {
  // Every node has at most two predecessors (the previous action of its rank; for a RECV, its
  // SEND), so the longest path is found by running the ranks' programs in turn (time_programs),
  // each as far as its receives allow — no graph is built. A malformed or deadlocking schedule
  // (some rank stays blocked, a transfer is unmatched or doubled) is reported by the graph check.
  struct Timer {
    const ActionCosts& costs;
    CriticalPath& cp;
    std::vector<size_t> offset;   // first node of each rank
    std::vector<int64_t> pred;    // per node: the node its start waited for (−1: none)
    std::vector<int64_t> sender;  // per transfer: its SEND node
    // The last action to end (the first in rank, then program order among equals), found as the
    // actions are timed rather than in a pass over all the times afterwards.
    size_t last = 0;
    double duration(int rank, const Action& a) { return costs.duration(rank, a); }
    double transfer(int rank, const Action& send) { return costs.transfer ? costs.transfer(rank, send) : 0.0; }
    void timed(int rank, size_t index, const Action& a, double start, double end, int64_t transfer, bool started_by_data) {
      const size_t v = offset[rank] + index;
      pred[v] = started_by_data ? sender[transfer] : index > 0 ? static_cast<int64_t>(v - 1) : -1;
      if (a.kind == ActionKind::SEND_F || a.kind == ActionKind::SEND_B) sender[transfer] = static_cast<int64_t>(v);
      cp.times[rank][index] = ScheduledAction{start, end};  // straight into the result (no flat copy)
      if (end > cp.makespan || (end == cp.makespan && v < last && end > 0)) {
        cp.makespan = end;
        last = v;
      }
    }
  };
  CriticalPath cp;
  Timer timer{costs, cp, std::vector<size_t>(s.p + 1, 0), {}, {}};
  for (int r = 0; r < s.p; ++r) timer.offset[r + 1] = timer.offset[r] + s.programs[r].actions.size();
  const size_t n = timer.offset[s.p];
  timer.pred.assign(n, -1);
  timer.sender.assign(2 * static_cast<size_t>(s.num_stages()) * static_cast<size_t>(s.m), -1);
  cp.times.resize(s.p);
  for (int r = 0; r < s.p; ++r) cp.times[r].resize(s.programs[r].actions.size());
  time_programs(s, timer);

  auto rank_of = [&](size_t v) {
    return static_cast<int>(std::upper_bound(timer.offset.begin(), timer.offset.end(), v) - timer.offset.begin()) - 1;
  };
  for (int64_t v = n ? static_cast<int64_t>(timer.last) : -1; v >= 0; v = timer.pred[v]) {
    const int r = rank_of(static_cast<size_t>(v));
    cp.path.emplace_back(r, static_cast<int>(v - static_cast<int64_t>(timer.offset[r])));
  }
  std::reverse(cp.path.begin(), cp.path.end());
  return cp;
}

}  // namespace ptdp
