#include "exec/runtime/ledger.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace ptdp::exec {

void CommLedger::add(CommGroup g, int size, StepKind kind, double bytes) {
  if (!enabled_ || size <= 1) return;
  entries_.push_back(LedgerEntry{current_, g, size, kind, bytes, bucketed_});
}

std::string CommLedger::to_json(int rank, int pipeline_rank) const {
  nlohmann::json j;
  j["rank"] = rank;
  j["pipeline_rank"] = pipeline_rank;
  j["entries"] = nlohmann::json::array();
  for (const LedgerEntry& e : entries_) {
    nlohmann::json x;
    x["action"] = e.action ? e.action->str() : std::string();
    x["group"] = std::string(to_string(e.group));
    x["size"] = e.group_size;
    x["kind"] = std::string(to_string(e.kind));
    x["bytes"] = e.bytes;
    if (e.bucketed) x["bucketed"] = true;
    j["entries"].push_back(std::move(x));
  }
  return j.dump(1);
}

namespace {

template <typename E>
E enum_named(const std::string& name, int count, const std::string& source) {
  for (int i = 0; i < count; ++i)
    if (to_string(static_cast<E>(i)) == name) return static_cast<E>(i);
  throw ConfigError(source, "unknown name '" + name + "' in the communication ledger");
}

}  // namespace

std::vector<LedgerEntry> ledger_from_json(const std::string& text, const std::string& source) {
  std::vector<LedgerEntry> out;
  try {
    const auto j = nlohmann::json::parse(text);
    for (const auto& x : j.at("entries")) {
      LedgerEntry e;
      const std::string action = x.at("action").get<std::string>();
      if (!action.empty()) e.action = parse_action(action);
      e.group = enum_named<CommGroup>(x.at("group").get<std::string>(), static_cast<int>(CommGroup::Pair) + 1, source);
      e.group_size = x.at("size").get<int>();
      e.kind = enum_named<StepKind>(x.at("kind").get<std::string>(), static_cast<int>(StepKind::AllToAll) + 1, source);
      e.bytes = x.at("bytes").get<double>();
      e.bucketed = x.value("bucketed", false);
      out.push_back(std::move(e));
    }
  } catch (const nlohmann::json::exception& ex) {
    throw ConfigError(source, std::string("not a communication ledger: ") + ex.what());
  }
  return out;
}

namespace {

// The traffic inside compute actions that is a function of the description: the tensor and
// context collectives of the layers, embedding and loss, and stage 3's per-unit parameter
// gathers (over the sharding and reshard groups). Not checked there: the MoE dispatch (routing
// decides its bytes), stages 2–3's per-unit gradient reduce-scatters and the gradient buckets
// (booked to REDUCE_GRAD).
bool checked_in_compute(CommGroup g, StepKind kind) {
  if (g == CommGroup::Sharding || g == CommGroup::Reshard) return kind == StepKind::AllGather;
  return g == CommGroup::Tensor || g == CommGroup::Context;
}
bool routed(CommGroup g) { return g == CommGroup::Expert || g == CommGroup::ExpertTensor || g == CommGroup::ExpertModel; }

}  // namespace

Traffic expected_traffic(const Schedule& s, const ParallelPlan& plan, const TransformerSpec& spec, int pipeline_rank) {
  const Lowering lowering(s, plan, spec);
  const ProcessGrid& grid = lowering.grid();
  Traffic t;
  for (const Action& a : s.programs[static_cast<size_t>(pipeline_rank)].actions) {
    for (const CommStep& step : lowering.steps(pipeline_rank, a)) {
      if (step.kind == StepKind::Wait) continue;  // completes earlier traffic: nothing new moves
      if (is_compute(a.kind) && !checked_in_compute(step.group, step.kind)) continue;
      t[TrafficKey{a.str(), step.group, static_cast<int>(grid.size(step.group)), step.kind}] += step.bytes;
    }
  }
  return t;
}

Traffic expected_routed_traffic(const Schedule& s, const ParallelPlan& plan, const TransformerSpec& spec, int pipeline_rank) {
  const Lowering lowering(s, plan, spec);
  const ProcessGrid& grid = lowering.grid();
  Traffic t;
  for (const Action& a : s.programs[static_cast<size_t>(pipeline_rank)].actions) {
    if (!is_compute(a.kind)) continue;
    for (const CommStep& step : lowering.steps(pipeline_rank, a))
      if (step.kind != StepKind::Wait && routed(step.group))
        t[TrafficKey{a.str(), step.group, static_cast<int>(grid.size(step.group)), step.kind}] += step.bytes;
  }
  return t;
}

Traffic booked_routed_traffic(const std::vector<LedgerEntry>& booked) {
  Traffic t;
  for (const LedgerEntry& e : booked)
    if (e.action && is_compute(e.action->kind) && routed(e.group))
      t[TrafficKey{e.action->str(), e.group, e.group_size, e.kind}] += e.bytes;
  return t;
}

Traffic expected_bucketed_traffic(const Schedule& s, const ParallelPlan& plan, const TransformerSpec& spec, int pipeline_rank) {
  const Lowering lowering(s, plan, spec);
  const ProcessGrid& grid = lowering.grid();
  Traffic t;
  if (!plan.reduces_in_buckets(pipeline_rank)) return t;
  for (const Action& a : s.programs[static_cast<size_t>(pipeline_rank)].actions) {
    if (a.kind != ActionKind::REDUCE_GRAD) continue;
    for (const CommStep& step : lowering.steps(pipeline_rank, a))
      if (step.bucketable && grid.size(step.group) > 1)
        t[TrafficKey{a.str(), step.group, static_cast<int>(grid.size(step.group)), step.kind}] += step.bytes;
  }
  return t;
}

Traffic booked_bucketed_traffic(const std::vector<LedgerEntry>& booked) {
  Traffic t;
  for (const LedgerEntry& e : booked)
    if (e.bucketed && e.action) t[TrafficKey{e.action->str(), e.group, e.group_size, e.kind}] += e.bytes;
  return t;
}

Traffic booked_traffic(const std::vector<LedgerEntry>& booked) {
  Traffic t;
  for (const LedgerEntry& e : booked) {
    if (!e.action) continue;
    if (is_compute(e.action->kind) && !checked_in_compute(e.group, e.kind)) continue;
    t[TrafficKey{e.action->str(), e.group, e.group_size, e.kind}] += e.bytes;
  }
  return t;
}

std::vector<std::string> traffic_mismatches(const Traffic& expected, const Traffic& booked, double slack_bytes) {
  std::vector<std::string> out;
  auto name = [](const TrafficKey& k) {
    return k.action + ": " + std::string(to_string(k.kind)) + " over " + std::string(to_string(k.group)) + " (" +
           std::to_string(k.group_size) + " ranks)";
  };
  auto bytes = [](double b) {
    char s[32];
    std::snprintf(s, sizeof s, "%.0f bytes", b);
    return std::string(s);
  };
  for (const auto& [k, b] : expected) {
    const auto it = booked.find(k);
    if (it == booked.end()) out.push_back(name(k) + ": " + bytes(b) + " expected, nothing booked");
    else if (std::abs(it->second - b) > std::min(slack_bytes, 0.25 * b)) out.push_back(name(k) + ": " + bytes(b) + " expected, " + bytes(it->second) + " booked");
  }
  for (const auto& [k, b] : booked)
    if (!expected.count(k)) out.push_back(name(k) + ": " + bytes(b) + " booked, not in the lowering");
  return out;
}

namespace {

class RecordingCommunicator final : public Communicator {
 public:
  RecordingCommunicator(std::unique_ptr<Communicator> inner, CommGroup g, CommLedger& ledger)
      : inner_(std::move(inner)), group_(g), ledger_(ledger) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

  void all_reduce(float* data, size_t count, ReduceOp op) override {
    book(StepKind::AllReduce, count * sizeof(float));
    inner_->all_reduce(data, count, op);
  }
  void all_reduce(double* data, size_t count, ReduceOp op) override {
    book(StepKind::AllReduce, count * sizeof(double));
    inner_->all_reduce(data, count, op);
  }
  void all_gather(const float* send, float* recv, size_t count) override {
    book(StepKind::AllGather, count * sizeof(float) * static_cast<size_t>(size()));
    inner_->all_gather(send, recv, count);
  }
  std::unique_ptr<Request> start_all_gather(const float* send, float* recv, size_t count) override {
    book(StepKind::AllGather, count * sizeof(float) * static_cast<size_t>(size()));
    return inner_->start_all_gather(send, recv, count);
  }
  std::unique_ptr<Request> start_all_reduce(float* data, size_t count, ReduceOp op) override {
    book(StepKind::AllReduce, count * sizeof(float));
    return inner_->start_all_reduce(data, count, op);
  }
  size_t all_reduce_piece() const override { return inner_->all_reduce_piece(); }
  void reduce_scatter(const float* send, float* recv, size_t count) override {
    book(StepKind::ReduceScatter, count * sizeof(float) * static_cast<size_t>(size()));
    inner_->reduce_scatter(send, recv, count);
  }
  // A chunked collective's blocks add up to the collective.
  std::unique_ptr<Request> start_gather_block(float* data, size_t count, int root) override {
    book(StepKind::AllGather, count * sizeof(float));
    return inner_->start_gather_block(data, count, root);
  }
  std::unique_ptr<Request> start_reduce_block(const float* send, float* recv, size_t count, int root) override {
    book(StepKind::ReduceScatter, count * sizeof(float));
    return inner_->start_reduce_block(send, recv, count, root);
  }
  std::unique_ptr<Request> start_reduce_scatter(const float* send, float* recv, size_t count) override {
    book(StepKind::ReduceScatter, count * sizeof(float) * static_cast<size_t>(size()));
    return inner_->start_reduce_scatter(send, recv, count);
  }
  void all_to_all_v(const float* send, const std::vector<size_t>& send_counts, float* recv,
                    const std::vector<size_t>& recv_counts) override {
    size_t total = 0;
    for (size_t c : send_counts) total += c;
    book(StepKind::AllToAll, total * sizeof(float));
    inner_->all_to_all_v(send, send_counts, recv, recv_counts);
  }
  void all_gather_v(const float* send, float* recv, const std::vector<size_t>& counts) override {
    size_t total = 0;
    for (size_t c : counts) total += c;
    book(StepKind::AllGather, total * sizeof(float));
    inner_->all_gather_v(send, recv, counts);
  }
  void reduce_scatter_v(const float* send, float* recv, const std::vector<size_t>& counts) override {
    size_t total = 0;
    for (size_t c : counts) total += c;
    book(StepKind::ReduceScatter, total * sizeof(float));
    inner_->reduce_scatter_v(send, recv, counts);
  }
  void broadcast(void* bytes, size_t size, int root) override { inner_->broadcast(bytes, size, root); }
  std::vector<std::vector<char>> gather_bytes(const std::vector<char>& mine, int root) override {
    return inner_->gather_bytes(mine, root);
  }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<Request> isend(const float* data, size_t count, int peer, int tag) override {
    book(StepKind::Send, count * sizeof(float));
    return inner_->isend(data, count, peer, tag);
  }
  std::unique_ptr<Request> irecv(float* data, size_t count, int peer, int tag) override {
    book(StepKind::Recv, count * sizeof(float));
    return inner_->irecv(data, count, peer, tag);
  }
  int max_tag() const override { return inner_->max_tag(); }

 private:
  void book(StepKind kind, size_t bytes) { ledger_.add(group_, size(), kind, static_cast<double>(bytes)); }

  std::unique_ptr<Communicator> inner_;
  CommGroup group_;
  CommLedger& ledger_;
};

}  // namespace

std::unique_ptr<Communicator> make_recording_communicator(std::unique_ptr<Communicator> inner, CommGroup g, CommLedger& ledger) {
  if (!inner) return inner;
  return std::make_unique<RecordingCommunicator>(std::move(inner), g, ledger);
}

void record_traffic(ProcessGroups& groups, CommLedger& ledger) {
  auto wrap = [&](std::unique_ptr<Communicator>& c, CommGroup g) { c = make_recording_communicator(std::move(c), g, ledger); };
  wrap(groups.tensor, CommGroup::Tensor);
  wrap(groups.pipeline, CommGroup::Pipeline);
  wrap(groups.data, CommGroup::Gradient);
  wrap(groups.model, CommGroup::Model);
  wrap(groups.embedding, CommGroup::Pair);
  wrap(groups.sharding, CommGroup::Sharding);
  wrap(groups.replicas, CommGroup::ShardReplicas);
  wrap(groups.reshard, CommGroup::Reshard);
  wrap(groups.context, CommGroup::Context);
  wrap(groups.expert, CommGroup::Expert);
  wrap(groups.expert_data, CommGroup::ExpertData);
  wrap(groups.expert_tensor, CommGroup::ExpertTensor);
  wrap(groups.expert_model, CommGroup::ExpertModel);
  wrap(groups.mirror, CommGroup::Pair);
}

}  // namespace ptdp::exec
