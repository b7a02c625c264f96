// Action costs of a plan on a cluster (sim/costing.hpp): FLOPs per stage, TP all-reduces per
// layer, pipeline transfers in Megatron's rank layout, DP gradient reduction.
#include "sim/costing.hpp"

#include <gtest/gtest.h>

#include <string>

#include "scenarios/scenario.hpp"
#include "model/memory.hpp"
#include "sim/simulate.hpp"
#include "topologies/collectives.hpp"
#include "tests/sim/sim_input.hpp"

namespace ptdp {
namespace {

Scenario gpt3(const std::vector<std::string>& sets = {}) {
  return load_scenario("", parse_overrides(sets));  // built-in default: GPT-3 175B, t 8, p 16, d 8, interleaved v 2
}

PlanCosts costs_of(const Scenario& sc) { return plan_costs(sc.model, sc.plan, sc.cluster); }

TEST(SharedCores, SleepingPipelineReceivesWakeUpLateOnlyWithMoreRanksThanCores) {
  auto costs = [](const char* cores, const char* wakeup) {
    const Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml",
                                      {{"parallel.tensor", "1"}, {"parallel.pipeline", "4"}, {"parallel.data", "1"},
                                       {"cluster.topology.node.cores", cores},
                                       {"cluster.topology.node.wakeup_latency", wakeup}});
    return plan_costs(sc.model, sc.plan, sc.cluster);
  };
  // 4 ranks on 2 cores: each pipeline transfer is charged the wake-up; collectives are not.
  const PlanCosts none = costs("2", "0us"), late = costs("2", "300us"), own_cores = costs("4", "300us");
  EXPECT_NEAR(late.send_forward_s[0] - none.send_forward_s[0], 300e-6, 1e-12);
  EXPECT_DOUBLE_EQ(late.layer_forward_s, none.layer_forward_s);
  // A core per rank: the executor polls instead of sleeping, nothing is charged.
  EXPECT_DOUBLE_EQ(own_cores.wakeup_s, 0.0);
  EXPECT_DOUBLE_EQ(own_cores.send_forward_s[0], costs("4", "0us").send_forward_s[0]);
  // And the iteration follows, in both engines.
  auto iteration = [](const char* wakeup, Fidelity f) {
    const Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml",
                                      {{"parallel.tensor", "1"}, {"parallel.pipeline", "4"}, {"parallel.data", "1"},
                                       {"cluster.topology.node.cores", "2"}, {"cluster.topology.node.wakeup_latency", wakeup}});
    return simulate(input_of(sc), make_schedule(sc.plan), f, false).report.iteration_time_s;
  };
  for (Fidelity f : {Fidelity::Analytic, Fidelity::Reduced})
    EXPECT_GT(iteration("300us", f), iteration("0us", f) + 1e-3) << to_string(f);
}

TEST(SharedCores, PlansWithMoreRanksThanCoresUseTheSleepingWaitsCurve) {
  // A CPU profile with a 10× slower all-reduce measured in the waits' sleeping mode: t 2 · d 2
  // on 2 cores (4 ranks) is costed with it, on 4 cores not.
  auto layer_tp = [](const char* cores, bool sleeping_curve) {
    std::vector<Override> sets = {{"parallel.tensor", "2"}, {"parallel.pipeline", "1"}, {"parallel.data", "2"},
                                  {"cluster.topology.node.cores", cores}};
    Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml", sets);
    sc.cluster.intra_node_allreduce.points = {{4096, 1e9}, {1 << 20, 2e9}};
    sc.cluster.intra_node_allreduce.small_message_s = 2e-6;
    sc.cluster.intra_node_reference_gpus = 2;
    sc.cluster.measured_on = CalibrationLinks{sc.cluster.nvlink, sc.cluster.nic, sc.cluster.pcie, 0, true};
    if (sleeping_curve) sc.cluster.oversubscribed_allreduce = {{{4096, 1e8}, {1 << 20, 2e8}}, 2e-6};
    EXPECT_EQ(oversubscribes_cores(sc.cluster, sc.plan), std::string(cores) == "2");
    return plan_costs(sc.model, sc.plan, sc.cluster).tp_allreduce_s;
  };
  EXPECT_GT(layer_tp("2", true), 5 * layer_tp("2", false));
  EXPECT_DOUBLE_EQ(layer_tp("4", true), layer_tp("4", false));
  // A GPU cluster is seen as it is (no copy per plan_costs call in sweeps).
  const Scenario gpt3 = load_scenario("");
  EXPECT_FALSE(cluster_for_plan(gpt3.cluster, gpt3.plan).has_value());
}

TEST(SharedCores, RanksThatWaitLeaveTheirCoresToTheOthers) {
  // 4 ranks on 2 cores, computing 1 s per cycle: 2× slower without waits; a rank that also
  // blocks 0.5 s leaves its core meanwhile, so the cycle is max(1 + 0.5, 4 · 1 / 2) = 2 s.
  EXPECT_DOUBLE_EQ(shared_core_slowdown(4, 2, 1.0, 0.0), 2.0);
  EXPECT_DOUBLE_EQ(shared_core_slowdown(4, 2, 1.0, 0.5), 1.5);
  EXPECT_DOUBLE_EQ(shared_core_slowdown(4, 2, 1.0, 3.0), 1.0);  // waits longer than the others compute
  EXPECT_DOUBLE_EQ(shared_core_slowdown(2, 2, 1.0, 0.0), 1.0);  // a core each
  EXPECT_DOUBLE_EQ(shared_core_slowdown(4, 0, 1.0, 0.0), 1.0);  // a GPU (no cores given)
  // In a plan: tensor parallelism on oversubscribed cores slows the layer's compute less than
  // ranks / cores, and more cores make it faster.
  auto layer_forward = [](const char* cores) {
    const Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml",
                                      {{"parallel.tensor", "2"}, {"parallel.pipeline", "1"}, {"parallel.data", "2"},
                                       {"cluster.topology.node.cores", cores}});
    return plan_costs(sc.model, sc.plan, sc.cluster).layer_forward_s;
  };
  const double two = layer_forward("2"), four = layer_forward("4");
  EXPECT_GT(two, four);
  EXPECT_LT(two, 2 * four);
}

TEST(PlanCosts, MiddleStageFlopsAreItsLayersShareOfTheLayerFormula) {
  const Scenario sc = gpt3({"parallel.schedule=1f1b", "parallel.virtual_stages=1"});
  const PlanCosts c = costs_of(sc);
  ASSERT_EQ(c.forward_flops.size(), 16u);
  const double b = 1, s = 2048, h = 12288, t = 8, layers = 96.0 / 16;
  const double fwd = layers * (24 * b * s * h * h + 4 * b * s * s * h) / t;
  for (int st = 1; st < 15; ++st) {
    EXPECT_NEAR(c.forward_flops[st] / fwd, 1.0, 1e-12) << "stage " << st;
    EXPECT_NEAR(c.backward_flops[st] / (3 * fwd), 1.0, 1e-12) << "backward + recomputed forward, stage " << st;
  }
  // The last stage also computes the logits (2bshV/t forward, 4bshV/t backward).
  EXPECT_NEAR((c.forward_flops[15] - fwd) / (2 * b * s * h * 51200 / t), 1.0, 1e-12);
  const PlanCosts none = costs_of(gpt3({"parallel.schedule=1f1b", "parallel.virtual_stages=1", "parallel.recompute=none"}));
  EXPECT_NEAR(none.backward_flops[5] / (2 * fwd), 1.0, 1e-12);
  EXPECT_LT(none.backward_s[5], c.backward_s[5]);
}

TEST(PlanCosts, TwoTensorAllReducesPerLayerInForwardTwoInBackwardTwoMoreWhenRecomputing) {
  const Scenario sc = gpt3({"parallel.schedule=1f1b", "parallel.virtual_stages=1"});
  const PlanCosts c = costs_of(sc);
  // One all-reduce of b·s·h fp16 elements in the 8-GPU tensor-parallel group (one DGX node).
  EXPECT_DOUBLE_EQ(c.tp_allreduce_bytes, 1.0 * 2048 * 12288 * 2);
  EXPECT_DOUBLE_EQ(c.tp_allreduce_s, allreduce_time_s(sc.cluster, group_shape(sc.cluster, 8, 1), c.tp_allreduce_bytes));
  EXPECT_EQ(group_shape(sc.cluster, 8, 1).nodes, 1);
  const double layers = 6;
  EXPECT_NEAR(c.forward_tp_s[5], layers * 2 * c.tp_allreduce_s, 1e-12);
  EXPECT_NEAR(c.backward_tp_s[5], layers * 4 * c.tp_allreduce_s, 1e-12);
  EXPECT_LT(c.forward_tp_s[5], c.forward_s[5]);
  const PlanCosts none = costs_of(gpt3({"parallel.schedule=1f1b", "parallel.virtual_stages=1", "parallel.recompute=none"}));
  EXPECT_NEAR(none.backward_tp_s[5], layers * 2 * none.tp_allreduce_s, 1e-12);
  // No tensor parallelism, no TP collectives.
  const PlanCosts t1 = costs_of(gpt3({"cluster.gpus=16", "parallel.tensor=1", "parallel.pipeline=16", "parallel.schedule=1f1b",
                                      "parallel.virtual_stages=1"}));
  EXPECT_EQ(t1.tp_allreduce_s, 0.0);
  EXPECT_EQ(t1.forward_tp_s[3], 0.0);
}

TEST(PlanCosts, PipelineBoundariesFollowMegatronsRankLayout) {
  // t 2, d 1, p 8 on 16 GPUs: pipeline rank r is global rank 2r, so only stage 3 → 4 crosses
  // from node 0 (ranks 0-7) to node 1.
  const Scenario sc = gpt3({"cluster.gpus=16", "parallel.tensor=2", "parallel.pipeline=8", "parallel.schedule=1f1b",
                            "parallel.virtual_stages=1", "training.global_batch=16"});
  const PlanCosts c = costs_of(sc);
  for (int st = 0; st < 7; ++st) EXPECT_EQ(c.boundary_same_node[st], st != 3) << "boundary " << st << " → " << st + 1;
  EXPECT_LT(c.send_forward_s[2], c.send_forward_s[3]) << "NVLink is faster than the NIC";
  EXPECT_EQ(c.send_forward_s[7], 0.0) << "the last stage sends nothing forward";
  EXPECT_EQ(c.send_backward_s[0], 0.0) << "the first stage sends nothing backward";
  for (int st = 1; st < 8; ++st) EXPECT_DOUBLE_EQ(c.send_backward_s[st], c.send_forward_s[st - 1]);
  // At t 8 every pipeline boundary leaves the node.
  const PlanCosts t8 = costs_of(gpt3({"parallel.schedule=1f1b", "parallel.virtual_stages=1"}));
  for (int st = 0; st < 15; ++st) EXPECT_FALSE(t8.boundary_same_node[st]);
}

TEST(PlanCosts, ScatterGatherSendsOneTthPerNicAndAllGathersOnNvlink) {
  const PlanCosts sg = costs_of(gpt3({"parallel.scatter_gather=true"}));
  const PlanCosts plain = costs_of(gpt3({"parallel.scatter_gather=false"}));
  EXPECT_DOUBLE_EQ(sg.p2p_bytes, 2048.0 * 12288 * 2);
  EXPECT_DOUBLE_EQ(sg.p2p_wire_bytes, sg.p2p_bytes / 8);
  EXPECT_DOUBLE_EQ(plain.p2p_wire_bytes, plain.p2p_bytes);
  EXPECT_GT(sg.p2p_allgather_s, 0.0);
  EXPECT_EQ(plain.p2p_allgather_s, 0.0);
  EXPECT_LT(sg.send_forward_s[0], plain.send_forward_s[0]);
  // Without tensor parallelism there is nothing to scatter.
  const PlanCosts t1 = costs_of(gpt3({"cluster.gpus=16", "parallel.tensor=1", "parallel.pipeline=16", "parallel.schedule=1f1b",
                                      "parallel.virtual_stages=1", "parallel.scatter_gather=true"}));
  EXPECT_DOUBLE_EQ(t1.p2p_wire_bytes, t1.p2p_bytes);
}

TEST(PlanCosts, DataParallelReductionCarriesTheLocalGradients) {
  // 1.7B on 32 GPUs (t 1, p 1, d 32): one stage holds every parameter; fp16 gradients, 2 bytes.
  const Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/paper/gpt-1.7b.yaml");
  const PlanCosts c = costs_of(sc);
  ASSERT_EQ(c.grad_bytes.size(), 1u);
  EXPECT_DOUBLE_EQ(c.grad_bytes[0], 2 * parameter_count(sc.model));
  const GroupShape dp = group_shape(sc.cluster, 32, 1);
  EXPECT_EQ(dp.nodes, 4);
  EXPECT_DOUBLE_EQ(c.reduce_grad_s[0], allreduce_time_s(sc.cluster, dp, c.grad_bytes[0]));
  EXPECT_EQ(c.pair_reduce_s[0], 0.0) << "a single stage has no tied-embedding copy";
  // 3.3 GB over 4 nodes: tens of milliseconds, ring-limited by the inter-node bus bandwidth.
  EXPECT_GT(c.reduce_grad_s[0], 2 * 31.0 / 32 * c.grad_bytes[0] / 200e9);
  EXPECT_LT(c.reduce_grad_s[0], 2 * 31.0 / 32 * c.grad_bytes[0] / 100e9);
  // bf16 gradients are reduced in fp32.
  EXPECT_EQ(gradient_bytes(Precision::BF16), 4);
  EXPECT_EQ(gradient_bytes(Precision::FP16), 2);
  // No data parallelism, no reduction.
  const Scenario one = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/paper/gpt-1b-single-gpu.yaml");
  EXPECT_EQ(costs_of(one).reduce_grad_s[0], 0.0);
}

TEST(PlanCosts, FirstAndLastStagesAlsoReduceTheTiedEmbedding) {
  const PlanCosts c = costs_of(gpt3({"parallel.schedule=1f1b", "parallel.virtual_stages=1"}));
  EXPECT_GT(c.pair_reduce_s[0], 0.0);
  EXPECT_GT(c.pair_reduce_s[15], 0.0);
  EXPECT_EQ(c.pair_reduce_s[7], 0.0);
  EXPECT_GT(c.reduce_grad_s[0], c.reduce_grad_s[7]);
  ASSERT_EQ(c.optim_s.size(), 16u);
  for (double o : c.optim_s) EXPECT_GT(o, 0.0);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

// BLOOM-176B's layout (70 layers, 12 stages) on 96 A100s, t 8.
Scenario bloom(const std::vector<std::string>& sets) {
  std::vector<std::string> all = {"model.num_layers=70",      "model.hidden_size=14336", "model.num_attention_heads=112",
                                  "model.vocab_size=250880",  "model.ffn_hidden_size=57344", "cluster.gpus=96",
                                  "parallel.tensor=8",        "parallel.pipeline=12",    "parallel.data=1",
                                  "parallel.schedule=1f1b",   "parallel.virtual_stages=1", "training.global_batch=96"};
  all.insert(all.end(), sets.begin(), sets.end());
  return gpt3(all);
}

TEST(PlanCosts, UnevenStagesCostTheirOwnLayers) {
  const Scenario sc = bloom({"parallel.layers_per_stage=[4, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6]"});
  const PlanCosts c = costs_of(sc);
  ASSERT_EQ(c.forward_flops.size(), 12u);
  // A middle stage's forward FLOPs are per layer × its layers; the first stage adds no GEMMs.
  const double per_layer = c.forward_flops[5] / 6;
  EXPECT_NEAR(c.forward_flops[0] / (4 * per_layer), 1.0, 1e-12);
  EXPECT_LT(c.forward_s[0], c.forward_s[1]);
  EXPECT_LT(c.grad_bytes[0] - c.grad_bytes[1], c.grad_bytes[1]);  // fewer layers, plus the embedding
}

TEST(PlanCosts, BalancedPartitionShortensTheIterationOfAnUnevenModel) {
  // Megatron-style first/last counts put 6 layers plus the 250 880-word output layer and loss on
  // the last stage; balancing moves layers off it, and the 1F1B steady state runs faster.
  const Scenario ends = bloom({"parallel.first_stage_layers=4", "parallel.last_stage_layers=6"});
  const Scenario balanced = bloom({"parallel.partition=balanced"});
  const PlanCosts ce = costs_of(ends), cb = costs_of(balanced);
  auto slowest = [](const PlanCosts& c) {
    double m = 0;
    for (size_t s = 0; s < c.forward_s.size(); ++s) m = std::max(m, c.forward_s[s] + c.backward_s[s]);
    return m;
  };
  EXPECT_LT(slowest(cb), slowest(ce));
  auto iteration = [](const Scenario& sc) {
    return simulate(input_of(sc), make_schedule(sc.plan),
                    Fidelity::Analytic, false)
        .report.iteration_time_s;
  };
  EXPECT_LT(iteration(balanced), iteration(ends));
}

TEST(PlanCosts, ArchitectureKnobsMoveThePrediction) {
  // Each key changes the costs in its direction: GQA shrinks the QKV GEMM, SwiGLU adds a third
  // MLP GEMM, untying drops the first/last-stage embedding all-reduce and adds an output layer.
  const std::vector<std::string> base = {"parallel.schedule=1f1b", "parallel.virtual_stages=1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    return costs_of(gpt3(extra));
  };
  const PlanCosts ref = with({});
  EXPECT_LT(with({"model.num_query_groups=8"}).forward_s[5], ref.forward_s[5]);
  EXPECT_GT(with({"model.mlp=swiglu"}).forward_s[5], ref.forward_s[5]);
  const PlanCosts untied = with({"model.tie_embeddings=false"});
  EXPECT_GT(ref.pair_reduce_s[0], 0);
  EXPECT_EQ(untied.pair_reduce_s[0], 0);
  EXPECT_EQ(untied.pair_reduce_s[15], 0);
  EXPECT_EQ(untied.grad_bytes[15], ref.grad_bytes[15]);  // the last stage's head is its own now, same size
  EXPECT_LT(with({"model.normalization=rmsnorm"}).grad_bytes[5], ref.grad_bytes[5]);
}

TEST(PlanCosts, InputAndWeightGradientsAreTheBackwardsDgradAndWgradOps) {
  // The IR's I holds recompute, the input-gradient path and every TP all-reduce; W the wgrad
  // GEMMs of the weight matrices. Here, without recompute and with t = 1 (no TP): on a middle
  // stage W is exactly the time of the layers' four wgrad GEMMs, and I + W = B.
  const Scenario sc = gpt3({"parallel.schedule=1f1b", "parallel.virtual_stages=1", "parallel.recompute=none",
                            "parallel.tensor=1", "parallel.data=64"});
  const PlanCosts c = costs_of(sc);
  const GpuSpec& gpu = sc.cluster.gpu;
  double wgrad = 0, wgrad_flops = 0;
  for (const Op& op : layer_ops(sc.model, sc.plan, Pass::Backward))
    if (op.weight_gradient) {
      EXPECT_NE(op.name.find(".wgrad"), std::string::npos) << op.name;
      wgrad += op_time_s(op, gpu);
      wgrad_flops += op.flops;
    }
  const double layers = 96.0 / 16;
  for (int st = 1; st < 15; ++st) {
    EXPECT_NEAR(c.weight_backward_s[st] / (layers * wgrad), 1.0, 1e-12) << "stage " << st;
    // A whole B hides the input-gradient all-reduces under the weight-gradient GEMMs; I + W cannot.
    EXPECT_NEAR(c.input_backward_s[st] + c.weight_backward_s[st] - c.backward_hidden_tp_s[st], c.backward_s[st],
                1e-12 * c.backward_s[st]);
  }
  // The weight GEMMs (QKV, projection, FC1, FC2) are half of the layer's GEMM FLOPs outside the
  // attention products: 2·(24bsh²)/2 = 24bsh² of the 48bsh² + 8bs²h backward.
  const double b = 1, s = 2048, h = 12288;
  EXPECT_NEAR(wgrad_flops / (24 * b * s * h * h), 1.0, 1e-12);
  // W carries no communication; I does, and with recompute it also holds the recomputed forward.
  const PlanCosts tp = costs_of(gpt3({"parallel.schedule=1f1b", "parallel.virtual_stages=1"}));
  EXPECT_GT(tp.backward_tp_s[3], 0);
  EXPECT_GT(tp.input_backward_s[3], tp.forward_s[3]);  // recomputed forward + dgrad > forward
  EXPECT_NEAR(tp.input_backward_s[3] + tp.weight_backward_s[3] - tp.backward_hidden_tp_s[3], tp.backward_s[3],
              1e-12 * tp.backward_s[3]);
  // Two all-reduces per layer (QKV's and FC1's input gradients), each under its layer's wgrad,
  // and the two slow each other while both run: each hides (1 − κ) · comm (the concurrency model).
  EXPECT_NEAR(tp.backward_hidden_tp_s[3], 6 * 2 * tp.tp_allreduce_s * (1 - kCollectiveContention), 1e-9);
  Action w{ActionKind::W, 3, 0};
  double w_tp = -1;
  EXPECT_DOUBLE_EQ(action_duration_s(tp, 3, w, &w_tp), tp.weight_backward_s[3]);
  EXPECT_EQ(w_tp, 0);
}

TEST(PlanCosts, ScatterGatherSplitsEveryTransferBetweenPipelineRanksWhenTensorParallel) {
  // Megatron: with t > 1 each TP rank sends 1/t of the boundary tensor and the receiver
  // all-gathers it — inside a node as across nodes (the IR's one rule for both engines).
  const PlanCosts on = costs_of(gpt3());
  EXPECT_TRUE(on.scatter_gather);
  EXPECT_DOUBLE_EQ(on.p2p_wire_bytes * 8, on.p2p_bytes);
  EXPECT_GT(on.p2p_allgather_s, 0);
  const PlanCosts off = costs_of(gpt3({"parallel.scatter_gather=false"}));
  EXPECT_FALSE(off.scatter_gather);
  EXPECT_DOUBLE_EQ(off.p2p_wire_bytes, off.p2p_bytes);
  EXPECT_EQ(off.p2p_allgather_s, 0);
  EXPECT_GT(off.send_forward_s[0], on.send_forward_s[0]);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

TEST(PlanCosts, SequenceParallelismShortensTheForwardAndSendsShardsBetweenStages) {
  const Scenario tp = gpt3({"parallel.schedule=1f1b", "parallel.virtual_stages=1", "parallel.recompute=selective"});
  const Scenario sp = gpt3({"parallel.schedule=1f1b", "parallel.virtual_stages=1", "parallel.recompute=selective",
                            "parallel.sequence_parallel=true"});
  const PlanCosts a = costs_of(tp), b = costs_of(sp);
  // Reduce-scatter + all-gather of b·s·h each cost an all-reduce of b·s·h (ring halves).
  const GroupShape g = group_shape(sp.cluster, 8, 1);
  EXPECT_NEAR(reduce_scatter_time_s(sp.cluster, g, a.tp_allreduce_bytes) + allgather_time_s(sp.cluster, g, a.tp_allreduce_bytes),
              a.tp_allreduce_s, 1e-12);
  EXPECT_NEAR(b.forward_tp_s[5], a.forward_tp_s[5], 1e-9);
  // LayerNorm, dropout and residual work divided by t: the forward and backward get shorter.
  EXPECT_LT(b.forward_s[5], a.forward_s[5]);
  auto compute_of_b = [](const PlanCosts& c) { return c.backward_s[5] - (c.backward_tp_s[5] - c.backward_hidden_tp_s[5]); };
  EXPECT_LT(compute_of_b(b), compute_of_b(a));
  // The backward's exposed TP time differs: the reduce-scatters hide under the weight-gradient
  // GEMMs as the all-reduces did, the all-gathers of the output gradient do not.
  EXPECT_GT(b.backward_tp_s[5] - b.backward_hidden_tp_s[5], a.backward_tp_s[5] - a.backward_hidden_tp_s[5]);
  // Boundary tensors are already split: 1/t on the wire, no all-gather after the receive.
  EXPECT_DOUBLE_EQ(b.p2p_wire_bytes, b.p2p_bytes / 8);
  EXPECT_EQ(b.p2p_allgather_s, 0.0);
  EXPECT_GT(a.p2p_allgather_s, 0.0);  // scatter/gather without SP
}

TEST(PlanCosts, RecomputeTimeIsTheReRunForwardPart) {
  auto sc = [](const char* rc) {
    return gpt3({"parallel.schedule=1f1b", "parallel.virtual_stages=1", std::string("parallel.recompute=") + rc});
  };
  const PlanCosts none = costs_of(sc("none")), sel = costs_of(sc("selective")), full = costs_of(sc("full"));
  EXPECT_EQ(none.recompute_s[5], 0.0);
  EXPECT_GT(sel.recompute_s[5], 0.0);
  // Full recompute re-runs the whole forward (TP collectives included), selective only the attention core.
  EXPECT_NEAR(full.recompute_s[5], full.forward_s[5], 1e-12);
  EXPECT_LT(sel.recompute_s[5], 0.25 * full.recompute_s[5]);
  EXPECT_NEAR(sel.backward_s[5] - none.backward_s[5], sel.recompute_s[5], 1e-12);
  // The simulator's report gives each rank its recompute time: m microbatches' worth.
  const Scenario s = sc("selective");
  SimulationInput in = input_of(s);
  const Report r = simulate(in, make_schedule(s.plan), Fidelity::Analytic, false).report;
  ASSERT_EQ(r.ranks.size(), 16u);
  EXPECT_NEAR(r.ranks[5].recompute_s, static_cast<double>(s.plan.num_microbatches()) * sel.recompute_s[5], 1e-9);
  ASSERT_EQ(r.memory.size(), 16u);
  EXPECT_GT(r.memory[0].activations_bytes, r.memory[14].activations_bytes);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

TEST(MemoryPerRank, InFlightMicrobatchesFollowTheSchedule) {
  // Korthikanti et al.: with 1F1B the first pipeline rank keeps p microbatches in flight; the
  // interleaved schedule multiplies its layers' activations by 1 + (p − 1)/(p·v).
  const Scenario sc = gpt3({"parallel.schedule=1f1b", "parallel.virtual_stages=1", "parallel.recompute=selective",
                            "parallel.sequence_parallel=true"});
  const int64_t p = sc.plan.pipeline;
  const auto one = peak_inflight_activations(make_schedule(sc.plan));
  EXPECT_EQ(one[0], p);
  EXPECT_EQ(one[p - 1], 1);
  const Scenario inter = gpt3({"parallel.recompute=selective", "parallel.sequence_parallel=true"});  // interleaved v 2
  const int64_t v = inter.plan.virtual_stages;
  const auto chunks = peak_inflight_activations(make_schedule(inter.plan));
  const double layers = static_cast<double>(chunks[0]) * 96.0 / static_cast<double>(p * v);
  EXPECT_NEAR(layers / (96.0 * (1 + static_cast<double>(p - 1) / static_cast<double>(p * v))), 1.0, 1e-12);
  // The memory of each rank: its in-flight layers at the sequence-parallel selective size.
  const auto ranks = memory_per_rank(inter.model, inter.plan, chunks);
  ParallelPlan none = inter.plan;
  none.recompute = Recompute::None;
  const double recompute_peak = layer_activation_bytes(inter.model, none) - layer_activation_bytes(inter.model, inter.plan);
  EXPECT_NEAR(ranks[5].activations_bytes, chunks[5] * 3 * layer_activation_bytes(inter.model, inter.plan) + recompute_peak, 1.0);
}

// One model of concurrency (sim/costing.hpp overlapped_s): compute and a collective beside it slow
// each other by the measured contention while both run; the longer one then runs alone.
TEST(Concurrency, ComputeUnderACollectiveSlowsAndALongerCollectiveShows) {
  const double k = kCollectiveContention;
  EXPECT_NEAR(k, 0.189, 1e-12);  // kernel-and-framework facts §4: mean slowdown of overlapped compute
  // Short collective: it ends under the compute, which ran slowed while it did (1 + κ of its time).
  EXPECT_NEAR(overlapped_s(1.0, 0.5, k), 1.0 + 0.5 * k, 1e-12);
  EXPECT_NEAR(hidden_s(1.0, 0.5, k), 0.5 * (1 - k), 1e-12);
  // Long collective: it sets the time and is itself slowed while the compute runs beside it, so
  // the compute is not free ([MB-ovl]: the expert all-to-all overlap gains 1.317× where the
  // all-to-all outlasts the compute).
  EXPECT_NEAR(overlapped_s(1.0, 3.0, k), 3.0 + k, 1e-12);
  EXPECT_NEAR(hidden_s(1.0, 3.0, k), 1.0 - k, 1e-12);
  // Symmetric: which of the two is the compute does not matter.
  EXPECT_DOUBLE_EQ(overlapped_s(3.0, 1.0, k), overlapped_s(1.0, 3.0, k));
  // The two-stream step reproduces both (one job each, started together).
  const TwoStreamTimes two = run_two_streams({StreamJob{1.0, -1}}, {StreamJob{3.0, -1}}, k);
  EXPECT_NEAR(two.compute_end[0], 1.0 + k, 1e-12);
  EXPECT_NEAR(two.comm_end[0], overlapped_s(1.0, 3.0, k), 1e-12);
  // No contention: the free overlap, max(compute, comm).
  EXPECT_DOUBLE_EQ(overlapped_s(1.0, 0.5, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(hidden_s(1.0, 0.5, 0.0), 0.5);
  // More contention, longer time (the knob's direction), never longer than running them in series.
  for (double comm : {0.1, 0.5, 0.9, 1.5}) {
    EXPECT_LT(overlapped_s(1.0, comm, 0.0), overlapped_s(1.0, comm, 0.1) + (comm >= 1.0 ? 1e-12 : 0.0)) << comm;
    EXPECT_LE(overlapped_s(1.0, comm, 0.1), overlapped_s(1.0, comm, 0.4)) << comm;
    EXPECT_LT(overlapped_s(1.0, comm, 0.4), 1.0 + comm) << comm;
  }
}

TEST(Concurrency, AsyncTensorParallelismReproducesFluxsAllGatherGemm) {
  // Flux (kernel-and-framework facts §4, H800 = H100 compute, TP 8): the local GEMM
  // 4096×6144×12288 in 0.846 ms and the NCCL all-gather feeding it in 0.583 ms run fused in
  // 0.957 ms. ptdp: the GEMM in 8 chunks of 512 rows (the dgx-h100 shape model's slowdown) with
  // 7 of the 8 transfers under them and the first one exposed.
  const Scenario sc = load_scenario("", {parse_override("cluster.topology=dgx-h100")});
  const GpuSpec& gpu = sc.cluster.gpu;
  Op gemm;
  gemm.kind = OpKind::Gemm, gemm.m = 4096, gemm.n = 6144, gemm.k = 12288;
  gemm.flops = 2.0 * 4096 * 6144 * 12288;
  const double slower = async_tp_chunks_s(gemm, gpu, 8) / op_time_s(gemm, gpu);
  EXPECT_GT(slower, 1.0);
  const double gemm_ms = 0.846, gather_ms = 0.583;
  const double fused_ms = gather_ms / 8 + overlapped_s(gemm_ms * slower, gather_ms * 7 / 8, kCopyEngineContention);
  EXPECT_NEAR(fused_ms / 0.957, 1.0, 0.03) << fused_ms;
  // The exposed share of the gather: Flux 12–25 % of the raw communication.
  const double exposed = (fused_ms - gemm_ms) / gather_ms;
  EXPECT_GE(exposed, 0.12);
  EXPECT_LE(exposed, 0.25);
}

TEST(Concurrency, BucketedReductionSlowsTheBackwardItRunsUnder) {
  const double k = kCollectiveContention;
  double slowed = -1;
  double stretch = -1;
  // Buckets of 0.1 s in a backward of 4 s: three run under it (each slowing it by 0.1·κ and
  // taking 0.1·(1 + κ) itself), the last after it.
  EXPECT_NEAR(bucketed_reduction_tail_s(0.1, 4, 4.0, k, &slowed, &stretch), 0.1, 1e-12);
  EXPECT_NEAR(slowed, 3 * 0.1 * k, 1e-12);
  EXPECT_NEAR(stretch, (3 * 0.1 * (1 + k) + 0.1) / 0.4, 1e-12);
  // Without contention: nothing slowed, the old figures.
  EXPECT_NEAR(bucketed_reduction_tail_s(2.0, 4, 4.0, 0.0, &slowed), 5.0, 1e-12);
  EXPECT_DOUBLE_EQ(slowed, 0.0);
  // Comm-bound: the wire sets the end (1 s to the first bucket, then 4 × 2 s, slowed while the
  // last 3 s of backward run beside it: 3·κ); the backward under it ends later, and the tail is
  // counted from that later end.
  const double tail = bucketed_reduction_tail_s(2.0, 4, 4.0, k, &slowed);
  EXPECT_NEAR(slowed, 3 * k, 1e-12);
  EXPECT_NEAR(tail + slowed, 5.0 + 3 * k, 1e-12);
}

TEST(Concurrency, ShardGathersSlowTheUnitsTheyRunUnder) {
  const std::vector<double> g(4, 1.0), c(4, 2.0);
  std::vector<double> slowed;
  const double free = overlapped_units_s(g, c, 2);
  const double priced = overlapped_units_s(g, c, 2, nullptr, nullptr, kCollectiveContention, &slowed);
  ASSERT_EQ(slowed.size(), 4u);
  EXPECT_GT(priced, free);
  double sum = 0;
  for (double x : slowed) sum += x;
  EXPECT_NEAR(priced - free, sum, 1e-12);
  EXPECT_GT(slowed[0], 0.0);  // unit 1's gather runs under unit 0
  // Each gather under a unit's compute is slowed by it in turn (unit 0's ran alone).
  std::vector<double> stretch;
  slowed.clear();
  overlapped_units_s(g, c, 2, nullptr, nullptr, kCollectiveContention, &slowed, &stretch, nullptr);
  ASSERT_EQ(stretch.size(), 4u);
  EXPECT_DOUBLE_EQ(stretch[0], 1.0);
  for (size_t u = 1; u < 4; ++u) EXPECT_NEAR(stretch[u], 1 + kCollectiveContention, 1e-12) << u;
  // A gather longer than the unit it runs under: the unit waits for it, and both slow while both
  // run (2 s gathers under 1 s units: each unit 1 + κ, each later gather 2 + κ).
  const std::vector<double> slow_g(4, 2.0), short_c(4, 1.0);
  EXPECT_NEAR(overlapped_units_s(slow_g, short_c, 2, nullptr, nullptr, kCollectiveContention), 2.0 + 3 * (2.0 + kCollectiveContention) + 1.0,
              1e-12);
  // In series (one buffer) nothing runs under the compute: nothing slows.
  slowed.clear();
  EXPECT_DOUBLE_EQ(overlapped_units_s(g, c, 1, nullptr, nullptr, kCollectiveContention, &slowed), 4 * 3.0);
}

// Each overlap key: on, it still pays; its communication is no longer free (some of it shows, or
// the compute under it slows).
TEST(Concurrency, EveryOverlapStillPaysAndCostsWhatItCosts) {
  auto iteration = [](const std::string& path, const std::vector<std::string>& sets) {
    const Scenario sc = load_scenario(path.empty() ? "" : std::string(PTDP_SOURCE_DIR) + "/" + path, parse_overrides(sets));
    return simulate(input_of(sc), make_schedule(sc.plan), Fidelity::Analytic, false).report.iteration_time_s;
  };
  const std::string h100 = "scenarios/h100/gpt3-175b-fp8.yaml";
  for (const char* key : {"parallel.tp_comm_overlap", "parallel.overlap_param_gather"}) {
    const double with = iteration(h100, {}), without = iteration(h100, {std::string(key) + "=false"});
    EXPECT_LT(with, without) << key;
  }
  // Gradient reduction in buckets: faster than after the backward, slower than for free.
  const double buckets = iteration(h100, {"parallel.overlap_param_gather=false"});
  const double after = iteration(h100, {"parallel.overlap_param_gather=false", "parallel.overlap_grad_reduce=false"});
  EXPECT_LT(buckets, after);
  {
    const Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/" + h100, {parse_override("parallel.overlap_param_gather=false")});
    const PlanCosts c = plan_costs(sc.model, sc.plan, sc.cluster);
    double slowed = 0;
    for (double x : c.reduce_grad_slowed_s) slowed += x;
    EXPECT_GT(slowed, 0.0);
  }
  // Async TP: more exposed TP time than the first chunk's transfer alone.
  {
    const Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/" + h100, {});
    std::map<std::string, double> exposed = layer_comm_by_group(sc.model, sc.plan, sc.cluster);
    double raw = 0;
    for (Pass pass : {Pass::Forward, Pass::Backward})
      for (const Op& op : layer_ops(sc.model, sc.plan, pass, false))
        if (op.group == CommGroup::Tensor && (op.kind == OpKind::AllGather || op.kind == OpKind::ReduceScatter) &&
            op.name.find(".dgrad.") == std::string::npos)
          raw += comm_op_time_s(sc.cluster, sc.plan, op);
    EXPECT_GT(exposed["tp"], raw / static_cast<double>(sc.plan.tensor)) << raw;
  }
  // Expert all-to-all under the other microbatch (moe_comm_overlap) and the context ring: part shows.
  {
    const Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/moe/mixtral-8x7b.yaml",
                                      {parse_override("parallel.moe_comm_overlap=true"), parse_override("parallel.schedule=interleaved"),
                                       parse_override("parallel.virtual_stages=2")});
    EXPECT_GT(layer_comm_by_group(sc.model, sc.plan, sc.cluster)["ep"], 0.0);
    const double on = simulate(input_of(sc), make_schedule(sc.plan), Fidelity::Analytic, false).report.iteration_time_s;
    const Scenario off = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/moe/mixtral-8x7b.yaml",
                                       {parse_override("parallel.schedule=interleaved"), parse_override("parallel.virtual_stages=2")});
    EXPECT_LT(on, simulate(input_of(off), make_schedule(off.plan), Fidelity::Analytic, false).report.iteration_time_s);
  }
  {
    const Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/long-context/llama2-7b-128k.yaml", {});
    ASSERT_GT(sc.plan.context, 1);
    EXPECT_GT(layer_comm_by_group(sc.model, sc.plan, sc.cluster)["cp"], 0.0);
  }
}

}  // namespace
}  // namespace ptdp
