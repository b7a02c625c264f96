// The lowering of communication (schedules/communication.hpp): what SEND/RECV, REDUCE_GRAD,
// OPTIM and UNSHARD move, against the IR's definition, and the analytic engine pricing exactly
// those steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include "model/partition.hpp"
#include "report/timeline.hpp"
#include "model/units.hpp"
#include "scenarios/scenario.hpp"
#include "schedules/communication.hpp"
#include "sim/costing.hpp"
#include "sim/simulate.hpp"
#include "topologies/collectives.hpp"
#include "tests/sim/sim_input.hpp"

namespace ptdp {
namespace {

const std::string kRoot = PTDP_SOURCE_DIR;

Scenario tiny(const std::string& file, std::vector<Override> sets) {
  return load_scenario(kRoot + "/scenarios/" + file, sets);
}

std::vector<CommStep> steps_of(const Scenario& sc, const Schedule& s, int rank, Action a) {
  return communication_steps(s, sc.plan, sc.model, rank, a);
}

const CommStep* find(const std::vector<CommStep>& steps, StepKind k, CommGroup g) {
  for (const CommStep& st : steps)
    if (st.kind == k && st.group == g) return &st;
  return nullptr;
}

// parallel.overlap_p2p false (Megatron's p2p without overlap, and its 1F1B always): each SEND
// holds its rank until the transfer is delivered; true: the transfer runs beside the next
// actions. The knob moves the prediction, by the sends' wire time, in both engines.
TEST(LoweredCommunication, BlockingSendsHoldTheirRankForTheTransfer) {
  auto run = [](bool overlap, Fidelity f) {
    const Scenario sc = load_scenario(kRoot + "/scenarios/paper/gpt-18.4b.yaml",
                                      {{"cluster.gpus", "32"}, {"parallel.pipeline", "4"}, {"parallel.data", "1"},
                                       {"training.global_batch", "16"}, {"training.micro_batch", "1"},
                                       {"parallel.scatter_gather", "false"},
                                       {"parallel.overlap_p2p", overlap ? "true" : "false"}});
    const Schedule s = make_schedule(sc.plan);
    SimulationResult r = simulate(input_of(sc), s, f, true);
    const PlanCosts c = plan_costs(sc.model, sc.plan, sc.cluster);
    double waited = 0;  // rank 0's blocking sends
    for (const TimelineEvent& e : r.timeline.events)
      if (e.pipeline_rank == 0 && e.action.kind == ActionKind::SEND_F && e.label == kBlockingSend) waited += e.end_s - e.start_s;
    return std::tuple{r.report, waited, c.send_forward_s[0], s.m};
  };
  for (Fidelity f : {Fidelity::Analytic, Fidelity::Reduced}) {
    SCOPED_TRACE(f == Fidelity::Analytic ? "analytic" : "reduced");
    const auto [blocking, waited, transfer, m] = run(false, f);
    const auto [overlapped, none, transfer2, m2] = run(true, f);
    ASSERT_GT(transfer, 5e-4);  // the 25 MB boundary crosses nodes: about a millisecond
    EXPECT_EQ(none, 0.0);
    // Rank 0 waits for each of its m forward sends' wire time.
    EXPECT_NEAR(waited, m * transfer, 0.1 * m * transfer);
    EXPECT_GT(blocking.iteration_time_s, overlapped.iteration_time_s + transfer);
    EXPECT_LT(blocking.iteration_time_s, overlapped.iteration_time_s + 2.0 * m * transfer * 4);
    EXPECT_GT(blocking.ranks[0].exposed_pp_s, overlapped.ranks[0].exposed_pp_s);
  }
  // Both engines mean the same thing.
  EXPECT_NEAR(std::get<0>(run(false, Fidelity::Reduced)).iteration_time_s,
              std::get<0>(run(false, Fidelity::Analytic)).iteration_time_s,
              0.03 * std::get<0>(run(false, Fidelity::Analytic)).iteration_time_s);
}

TEST(LoweredCommunication, PipelineTransfersCarryEachContextRanksTokens) {
  // cp 2: each context rank sends b·(s/cp)·h elements (the executor's s/cp tokens); the engines
  // priced b·s·h (cp× the bytes) before the lowering.
  const Scenario sc = tiny("tiny-gpt-cpu.yaml", {{"parallel.tensor", "1"},
                                                 {"parallel.context", "2"},
                                                 {"model.attention", "flash"}});
  const Schedule s = make_schedule(sc.plan);
  const double expected = 4.0 * (64 / 2) * 128 * 4;  // b · s/cp · h · fp32
  const auto send = steps_of(sc, s, 0, Action{ActionKind::SEND_F, 0, 0});
  ASSERT_EQ(send.size(), 1u);
  EXPECT_EQ(send[0].kind, StepKind::Send);
  EXPECT_DOUBLE_EQ(send[0].bytes, expected);
  EXPECT_DOUBLE_EQ(pipeline_boundary_bytes(sc.model, sc.plan), expected);
  const PlanCosts c = plan_costs(sc.model, sc.plan, sc.cluster);
  EXPECT_DOUBLE_EQ(c.p2p_bytes, expected);
  // Doubling cp halves the bytes and the transfer.
  const Scenario sc4 = tiny("tiny-gpt-cpu.yaml", {{"parallel.tensor", "1"}, {"parallel.context", "4"}, {"cluster.gpus", "8"},
                                                  {"model.attention", "flash"}});
  EXPECT_DOUBLE_EQ(plan_costs(sc4.model, sc4.plan, sc4.cluster).p2p_bytes, expected / 2);
  EXPECT_LT(plan_costs(sc4.model, sc4.plan, sc4.cluster).send_forward_s[0], c.send_forward_s[0]);
}

TEST(LoweredCommunication, ScatterGatherSendsATthAndGathersAtTheReceiver) {
  const Scenario sc = tiny("tiny-gpt-cpu.yaml", {});  // t 2, p 2
  const Schedule s = make_schedule(sc.plan);
  const double tensor = 4.0 * 64 * 128 * 4;
  const auto send = steps_of(sc, s, 0, Action{ActionKind::SEND_F, 0, 1});
  ASSERT_EQ(send.size(), 1u);
  EXPECT_DOUBLE_EQ(send[0].bytes, tensor / 2);
  const auto recv = steps_of(sc, s, 1, Action{ActionKind::RECV_F, 1, 1});
  ASSERT_EQ(recv.size(), 2u);
  EXPECT_EQ(recv[1].kind, StepKind::AllGather);
  EXPECT_EQ(recv[1].group, CommGroup::Tensor);
  EXPECT_DOUBLE_EQ(recv[1].bytes, tensor);
}

TEST(LoweredCommunication, ReduceGradHoldsEveryPartTheIrDefines) {
  // Sequence parallelism: the replicated gradients' TP all-reduce; tied embeddings: the pair.
  const Scenario sp = tiny("tiny-gpt-cpu.yaml", {{"parallel.sequence_parallel", "true"}, {"parallel.data", "2"}, {"cluster.gpus", "8"},
                                                 {"training.global_batch", "32"}});
  const Schedule s = make_schedule(sp.plan);
  const auto first = steps_of(sp, s, 0, Action{ActionKind::REDUCE_GRAD, 0, -1});
  const StageParameters params = stage_parameters(sp.model, sp.plan, 0);
  const CommStep* dense = find(first, StepKind::AllReduce, CommGroup::Gradient);
  ASSERT_NE(dense, nullptr);
  EXPECT_DOUBLE_EQ(dense->bytes, params.total * 4);
  const CommStep* replicated = find(first, StepKind::AllReduce, CommGroup::Tensor);
  ASSERT_NE(replicated, nullptr);
  EXPECT_DOUBLE_EQ(replicated->bytes, params.replicated * 4);
  const CommStep* tied = find(first, StepKind::AllReduce, CommGroup::Pair);
  ASSERT_NE(tied, nullptr);
  EXPECT_EQ(tied->peer_stage, 1);
  EXPECT_DOUBLE_EQ(tied->bytes, 256.0 * 128 / 2 * 4);  // the vocabulary shard (V/t × h)

  // Experts: the routed experts' gradients over their expert-data ranks, the rest over d·cp.
  const Scenario moe = tiny("tiny-moe-cpu.yaml", {{"parallel.pipeline", "1"}, {"parallel.data", "4"}});
  const Schedule ms = make_schedule(moe.plan);
  const auto reduce = steps_of(moe, ms, 0, Action{ActionKind::REDUCE_GRAD, 0, -1});
  const StageParameters mp = stage_parameters(moe.model, moe.plan, 0);
  const CommStep* expert = find(reduce, StepKind::AllReduce, CommGroup::ExpertData);
  const CommStep* rest = find(reduce, StepKind::AllReduce, CommGroup::Gradient);
  ASSERT_NE(expert, nullptr);
  ASSERT_NE(rest, nullptr);
  EXPECT_GT(mp.expert, 0);
  EXPECT_DOUBLE_EQ(expert->bytes, mp.expert * 4);
  EXPECT_DOUBLE_EQ(rest->bytes, (mp.total - mp.expert) * 4);
  EXPECT_EQ(ProcessGrid(moe.plan).size(CommGroup::ExpertData), 2);  // 4 data ranks / ep 2

  // ZeRO-1: a reduce-scatter over the sharding group; ZeRO-3: the last unit's wait; OPTIM all-gathers
  // the updated parameters at stage 1 only.
  const Scenario z1 = tiny("tiny-gpt-cpu.yaml", {{"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.zero_stage", "1"}});
  const Schedule z1s = make_schedule(z1.plan);
  EXPECT_NE(find(steps_of(z1, z1s, 0, Action{ActionKind::REDUCE_GRAD, 0, -1}), StepKind::ReduceScatter, CommGroup::Sharding), nullptr);
  EXPECT_NE(find(steps_of(z1, z1s, 0, Action{ActionKind::OPTIM, -1, -1}), StepKind::AllGather, CommGroup::Sharding), nullptr);
  const Scenario z3 = tiny("tiny-gpt-cpu.yaml", {{"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.zero_stage", "3"}});
  const Schedule z3s = make_schedule(z3.plan);
  EXPECT_NE(find(steps_of(z3, z3s, 0, Action{ActionKind::REDUCE_GRAD, 0, -1}), StepKind::Wait, CommGroup::Sharding), nullptr);
  EXPECT_EQ(find(steps_of(z3, z3s, 0, Action{ActionKind::OPTIM, -1, -1}), StepKind::AllGather, CommGroup::Sharding), nullptr);
  const auto unshard = steps_of(z3, z3s, 0, Action{ActionKind::UNSHARD, 0, -1});
  ASSERT_EQ(unshard.size(), 1u);
  EXPECT_DOUBLE_EQ(unshard[0].bytes, stage_parameters(z3.model, z3.plan, 0).total * 4);

  // DualPipe: the copy's sum folded into the reduction (reduce-scatter, pair part, all-gather).
  const Scenario dual = tiny("tiny-gpt-cpu.yaml", {{"parallel.tensor", "1"}, {"parallel.data", "2"}, {"parallel.schedule", "dualpipe"},
                                                   {"parallel.virtual_stages", "2"}, {"training.global_batch", "32"}});
  const Schedule ds = make_schedule(dual.plan);
  const auto lane = steps_of(dual, ds, 0, Action{ActionKind::REDUCE_GRAD, 0, -1});
  ASSERT_EQ(lane.size(), 3u);
  EXPECT_EQ(lane[0].kind, StepKind::ReduceScatter);
  EXPECT_EQ(lane[1].group, CommGroup::Pair);
  EXPECT_EQ(lane[1].peer_stage, 2);  // stage 0's copy in the other lane
  EXPECT_DOUBLE_EQ(lane[1].bytes, lane[0].bytes / 2);
  EXPECT_EQ(lane[2].kind, StepKind::AllGather);
}

TEST(LoweredCommunication, StageThreeGathersEachUnitWhereReshardAfterForwardSays) {
  // Stage 3's unit gathers inside F and B (plan.hpp reshard_group): every unit over the sharding
  // group in F; in B over it again (true), over N of its members (N), or not at all (false);
  // torchtitan's default leaves the head unit out of B. Each gather moves the unit's bytes.
  auto plan_of = [](std::vector<Override> extra) {
    std::vector<Override> sets = {{"parallel.tensor", "1"}, {"parallel.pipeline", "1"}, {"parallel.data", "4"},
                                  {"parallel.zero_stage", "3"}, {"model.tie_embeddings", "false"}};
    sets.insert(sets.end(), extra.begin(), extra.end());
    return tiny("tiny-gpt-cpu.yaml", sets);
  };
  auto sum = [](const std::vector<CommStep>& steps, CommGroup g, int* count) {
    double bytes = 0;
    *count = 0;
    for (const CommStep& st : steps)
      if (st.kind == StepKind::AllGather && st.group == g) bytes += st.bytes, ++*count;
    return bytes;
  };
  for (const auto& [reshard, group, size] : {std::tuple{"true", CommGroup::Sharding, 4}, std::tuple{"2", CommGroup::Reshard, 2},
                                             std::tuple{"false", CommGroup::Sharding, 0}}) {
    const Scenario sc = plan_of({{"parallel.reshard_after_forward", reshard}});
    const Schedule s = make_schedule(sc.plan);
    const StageParameters sp = stage_parameters(sc.model, sc.plan, 0);
    int n = 0;
    EXPECT_DOUBLE_EQ(sum(steps_of(sc, s, 0, Action{ActionKind::F, 0, 0}), CommGroup::Sharding, &n), sp.total * 4) << reshard;
    EXPECT_EQ(n, static_cast<int>(sp.units.size())) << reshard;
    const auto backward = steps_of(sc, s, 0, Action{ActionKind::B, 0, 0});
    const double b = sum(backward, group, &n);
    EXPECT_DOUBLE_EQ(b, size > 0 ? sp.total * 4 : 0.0) << reshard;
    EXPECT_EQ(ProcessGrid(sc.plan).size(CommGroup::Reshard), size > 0 ? size : 1) << reshard;
    if (group == CommGroup::Reshard) {
      EXPECT_EQ(sum(backward, CommGroup::Sharding, &n), 0.0);
    }
  }
  const Scenario titan = plan_of({{"training.framework", "torchtitan"}});
  const Schedule ts = make_schedule(titan.plan);
  const StageParameters tp = stage_parameters(titan.model, titan.plan, 0);
  int n = 0;
  EXPECT_DOUBLE_EQ(sum(steps_of(titan, ts, 0, Action{ActionKind::B, 0, 0}), CommGroup::Sharding, &n), (tp.total - tp.units.back()) * 4);
  EXPECT_EQ(n, static_cast<int>(tp.units.size()) - 1);
  // Not in the W of a split backward, nor inside an UNSHARD … RESHARD window.
  EXPECT_EQ(sum(steps_of(titan, ts, 0, Action{ActionKind::W, 0, 0}), CommGroup::Sharding, &n), 0.0);
  Schedule window = ts;
  window.programs[0].actions.insert(window.programs[0].actions.begin(), Action{ActionKind::UNSHARD, 0, -1});
  EXPECT_EQ(sum(steps_of(titan, window, 0, Action{ActionKind::F, 0, 0}), CommGroup::Sharding, &n), 0.0);
}

TEST(LoweredCommunication, AnalyticReduceGradIsThePricedSumOfItsSteps) {
  // The analytic REDUCE_GRAD is exactly the α-β sum of the lowering's steps (no bucketing here).
  const Scenario sc = load_scenario(kRoot + "/scenarios/paper/gpt-18.4b.yaml",
                                    {{"cluster.gpus", "128"}, {"parallel.pipeline", "4"}, {"parallel.data", "4"},
                                     {"training.global_batch", "128"}, {"parallel.sequence_parallel", "true"}});
  const PlanCosts c = plan_costs(sc.model, sc.plan, sc.cluster);
  const std::vector<int> placement = stage_placement(sc.plan);
  for (int st = 0; st < 4; ++st) {
    double sum = 0;
    for (const CommStep& step : c.reduce_grad_steps[st]) sum += comm_step_time_s(sc.cluster, sc.plan, placement, st, step);
    EXPECT_NEAR(c.reduce_grad_s[st], sum, 1e-12) << st;
    EXPECT_NE(find(c.reduce_grad_steps[st], StepKind::AllReduce, CommGroup::Tensor), nullptr) << "sequence-parallel part, stage " << st;
  }
}

TEST(LoweredCommunication, AnalyticPricesUnshardAndGathersNothingInsideItsWindow) {
  // Stage 3 with an UNSHARD … RESHARD window around a stage's compute: UNSHARD gathers the stage
  // (priced, no longer 0), the F/B inside gather no units.
  const Scenario sc = load_scenario(kRoot + "/scenarios/paper/gpt-1.7b.yaml",
                                    {{"cluster.gpus", "8"}, {"parallel.pipeline", "1"}, {"parallel.tensor", "1"}, {"parallel.zero_stage", "3"}, {"training.micro_batch", "1"}, {"training.global_batch", "16"}});
  SimulationInput in = input_of(sc);
  Schedule plain = make_schedule(sc.plan);
  Schedule window = plain;
  for (auto& prog : window.programs) {
    auto& acts = prog.actions;
    const auto first = std::find_if(acts.begin(), acts.end(), [](const Action& a) { return is_compute(a.kind); });
    acts.insert(first, Action{ActionKind::UNSHARD, 0, -1});
    const auto last = std::find_if(acts.rbegin(), acts.rend(), [](const Action& a) { return is_compute(a.kind); });
    acts.insert(last.base(), Action{ActionKind::RESHARD, 0, -1});
  }
  validate_lowered(window);
  const PlanCosts c = plan_costs(sc.model, sc.plan, sc.cluster, true, &plain);
  EXPECT_GT(c.unshard_s[0], 0);
  EXPECT_LT(c.forward_gathered_s[0], c.forward_s[0]);
  const SimulationResult res = simulate(in, window, Fidelity::Analytic, true);
  int unshards = 0, forwards = 0;
  for (const TimelineEvent& e : res.timeline.events) {
    if (e.action.kind == ActionKind::UNSHARD) {
      ++unshards;
      EXPECT_NEAR(e.end_s - e.start_s, c.unshard_s[0], 1e-12);
    }
    if (e.action.kind == ActionKind::F && e.label.empty()) {
      ++forwards;
      EXPECT_NEAR(e.end_s - e.start_s, c.forward_gathered_s[0], 1e-12);
    }
  }
  EXPECT_EQ(unshards, plain.p);
  EXPECT_EQ(forwards, plain.m * plain.p);
  EXPECT_NE(res.report.iteration_time_s, simulate(in, plain, Fidelity::Analytic, false).report.iteration_time_s);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

// IR-13: one rule decides scatter/gather for the engines, the lowering and the executor
// (model/units.hpp): a boundary tensor whose b·(s/cp)·h elements do not divide by t is sent whole.
TEST(LoweredCommunication, ScatterGatherIsOneRuleOfTheBoundaryTensor) {
  Scenario sc = tiny("tiny-gpt-cpu.yaml", {});  // t 2, p 2, b 4, s 64, h 128
  EXPECT_TRUE(scatter_gather_applies(sc.model, sc.plan));
  sc.plan.scatter_gather = false;
  EXPECT_FALSE(scatter_gather_applies(sc.model, sc.plan));
  sc.plan.scatter_gather = true;
  sc.plan.sequence_parallel = true;  // the tensor is in sequence shards already
  EXPECT_FALSE(scatter_gather_applies(sc.model, sc.plan));
  sc.plan.sequence_parallel = false;
  TransformerSpec odd = sc.model;
  odd.hidden_size = 127, sc.plan.micro_batch = 1, odd.seq_length = 63;  // 63·127 elements, t 2
  EXPECT_FALSE(scatter_gather_applies(odd, sc.plan));
  const Schedule s = make_schedule(sc.plan);
  const auto recv = communication_steps(s, sc.plan, odd, 1, Action{ActionKind::RECV_F, 1, 0});
  ASSERT_EQ(recv.size(), 1u);  // the whole tensor, no gather
  EXPECT_DOUBLE_EQ(recv[0].bytes, pipeline_boundary_bytes(odd, sc.plan));
  EXPECT_DOUBLE_EQ(plan_costs(odd, sc.plan, sc.cluster).p2p_allgather_s, 0);
}

// IR-16: a schedule placing its stages otherwise than the scenario's plan is refused, naming the
// stage, both ranks and the key, instead of pricing one placement and planning memory for another.
TEST(LoweredCommunication, AScheduleWithAnotherPlacementIsRefusedNamingTheStage) {
  const Scenario sc = tiny("tiny-gpt-cpu.yaml", {{"parallel.virtual_stages", "2"}, {"parallel.schedule", "interleaved"},
                                                 {"parallel.overlap_p2p", "true"}, {"training.global_batch", "16"}});
  Schedule s = make_schedule(sc.plan);
  EXPECT_NO_THROW(adopt_schedule(s, sc.plan, "mine.csv"));
  std::swap(s.stage_to_rank[2], s.stage_to_rank[3]);  // a V: stage 2 on rank 1, stage 3 on rank 0
  try {
    adopt_schedule(s, sc.plan, "mine.csv");
    ADD_FAILURE() << "another placement was adopted";
  } catch (const ScheduleError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("mine.csv"), std::string::npos) << m;
    EXPECT_NE(m.find("stage 2 on pipeline rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("parallel.schedule"), std::string::npos) << m;
  }
}

// IR-17: overlapped gradient reduction hides its buckets under the stage's last backward as the
// program has it — a W when the program splits the backward — in pricing as in SimGrid and the
// executor, whatever the schedule's name.
TEST(LoweredCommunication, TheLastBackwardIsReadFromTheProgram) {
  const Scenario sc = load_scenario(kRoot + "/scenarios/paper/gpt-18.4b.yaml",
                                    {{"cluster.gpus", "64"}, {"parallel.pipeline", "2"}, {"parallel.data", "4"},
                                     {"training.global_batch", "64"}, {"parallel.overlap_grad_reduce", "true"},
                                     {"parallel.schedule", "zb-h1"}});
  const Schedule zb = make_schedule(sc.plan);
  EXPECT_EQ(last_backward_kind(zb, 0), ActionKind::W);
  ParallelPlan one_f_one_b = sc.plan;
  one_f_one_b.schedule = ScheduleKind::OneFOneB;
  const Schedule plain = make_schedule(one_f_one_b);
  EXPECT_EQ(last_backward_kind(plain, 0), ActionKind::B);
  // The zb plan priced with the 1F1B program hides its buckets under a whole B (longer than a W):
  // less of the reduction is left over.
  const PlanCosts by_name = plan_costs(sc.model, sc.plan, sc.cluster);
  const PlanCosts with_w = plan_costs(sc.model, sc.plan, sc.cluster, true, &zb);
  const PlanCosts with_b = plan_costs(sc.model, sc.plan, sc.cluster, true, &plain);
  ASSERT_GT(with_w.reduce_grad_buckets[0], 1);
  EXPECT_DOUBLE_EQ(with_w.reduce_grad_s[0], by_name.reduce_grad_s[0]);
  EXPECT_LT(with_b.reduce_grad_s[0], with_w.reduce_grad_s[0]);
}

}  // namespace
}  // namespace ptdp
