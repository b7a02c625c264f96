// Sharded data parallelism (ZeRO stages 1–3, FSDP strategies, offload): the memory formulas of
// sharding-sp-zb-facts.md, the rules the frameworks impose, and that every knob moves the
// prediction the way the mechanism says.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "model/cost.hpp"
#include "model/measured_kernels.hpp"
#include "model/memory.hpp"
#include "schedules/communication.hpp"
#include "schedules/schedule.hpp"
#include "scenarios/scenario.hpp"
#include "sim/costing.hpp"
#include "sim/simulate.hpp"
#include "tests/sim/sim_input.hpp"

namespace ptdp {
namespace {

// GPT-3 175B on 1024 A100s, t 8, p 1, d 128 (FSDP-style: no pipeline), unless sets say otherwise.
Scenario fsdp_plan(std::vector<std::string> sets = {}) {
  sets.insert(sets.begin(), {"parallel.pipeline=1", "parallel.tensor=8", "parallel.virtual_stages=1", "parallel.schedule=1f1b",
                             "training.global_batch=1536", "parallel.recompute=full"});
  return load_scenario("", parse_overrides(sets));
}

SimulationResult predict(const Scenario& sc) {
  SimulationInput in = input_of(sc);
  return simulate(in, make_costed_schedule(sc.model, sc.plan, sc.cluster), Fidelity::Analytic, false);
}

MemoryBreakdown states(const Scenario& sc) { return memory_per_rank(sc.model, sc.plan, {1})[0]; }

std::string config_error(const std::vector<std::string>& sets) {
  try {
    fsdp_plan(sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ShardedMemory, ModelStatesFollowTheZeroFormulas) {
  // fp16: 2 B weights, 2 B gradients, K = 12 B optimizer state per parameter.
  for (int z = 0; z <= 3; ++z) {
    const Scenario sc = fsdp_plan({"training.precision=fp16", "parallel.zero_stage=" + std::to_string(z)});
    const MemoryBreakdown m = states(sc);
    const double psi = m.parameters, n = 128;
    const double expected[] = {16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n};
    EXPECT_NEAR((m.weights_bytes + m.gradients_bytes + m.optimizer_bytes) / expected[z], 1.0, 1e-12) << "stage " << z;
    EXPECT_EQ(sc.plan.sharding_degree(), z == 0 ? 1 : 128);
  }
  // bf16 keeps fp32 gradients (Megatron): stage 1 holds 2Ψ + 4Ψ + 12Ψ/N.
  const MemoryBreakdown bf = states(fsdp_plan({"training.precision=bf16", "parallel.zero_stage=1"}));
  EXPECT_NEAR((bf.weights_bytes + bf.gradients_bytes + bf.optimizer_bytes) / (6 * bf.parameters + 12 * bf.parameters / 128), 1.0,
              1e-12);
}

TEST(ShardedMemory, BuffersHoldTheGatheredUnitsInFlight) {
  const MemoryBreakdown two = states(fsdp_plan({"parallel.zero_stage=3"}));
  const MemoryBreakdown four = states(fsdp_plan({"parallel.zero_stage=3", "parallel.max_inflight_gathers=4"}));
  const Scenario sc = fsdp_plan({"parallel.zero_stage=3"});
  const double unit = largest_unit_parameter_count(sc.model, sc.plan);
  // Each further gathered unit costs one unit's bf16 parameters.
  EXPECT_NEAR((four.buffers_bytes - two.buffers_bytes) / (2 * unit * 2), 1.0, 1e-12);
  EXPECT_EQ(states(fsdp_plan({"parallel.zero_stage=1"})).buffers_bytes, 0);
  EXPECT_GT(states(fsdp_plan({"parallel.zero_stage=2"})).buffers_bytes, 0);  // one unit's gradients
}

TEST(ShardedMemory, OffloadMovesOptimizerStateAndParametersToTheHost) {
  const MemoryBreakdown on_gpu = states(fsdp_plan({"parallel.zero_stage=3"}));
  const MemoryBreakdown opt = states(fsdp_plan({"parallel.zero_stage=3", "parallel.offload=optimizer"}));
  const MemoryBreakdown all = states(fsdp_plan({"parallel.zero_stage=3", "parallel.offload=optimizer_and_params"}));
  EXPECT_EQ(opt.optimizer_bytes, 0);
  EXPECT_EQ(opt.host_bytes, on_gpu.optimizer_bytes + on_gpu.parameters / 128 * 4);  // + fp32 gradient shard
  EXPECT_LT(opt.total_bytes, on_gpu.total_bytes);
  EXPECT_EQ(all.weights_bytes, 0);
  EXPECT_EQ(all.host_bytes, opt.host_bytes + on_gpu.weights_bytes);
}

TEST(ShardedMemory, NodeShardingSplitsOverTheNodesDataParallelRanksOnly) {
  const Scenario sc = fsdp_plan({"parallel.tensor=2", "parallel.data=512", "parallel.fsdp=hybrid_shard"});
  EXPECT_EQ(sc.plan.zero_stage, 3);
  EXPECT_EQ(sc.plan.sharding_degree(), 4);  // 8 GPUs per node / t 2
  const MemoryBreakdown hybrid = states(sc);
  const MemoryBreakdown full = states(fsdp_plan({"parallel.tensor=2", "parallel.data=512", "parallel.fsdp=full_shard"}));
  EXPECT_NEAR(hybrid.optimizer_bytes / full.optimizer_bytes, 512.0 / 4, 1e-9);
}

TEST(ShardedMemory, DataOneWithContextShardsOverTheContextRanks) {
  // torchtitan FSDP 1 × CP 8, Megatron's distributed optimizer at CP 8: the d·cp ranks that hold
  // the same weights share the states, so data 1 with context 8 shards eight ways.
  const Scenario cp = fsdp_plan({"model.attention=flash", "parallel.zero_stage=1", "parallel.data=1", "parallel.context=8",
                                 "parallel.tensor=1", "cluster.gpus=8", "training.global_batch=8"});
  EXPECT_EQ(cp.plan.sharding_degree(), 8);
  const Scenario unsharded = fsdp_plan({"model.attention=flash", "parallel.zero_stage=0", "parallel.data=1", "parallel.context=8",
                                        "parallel.tensor=1", "cluster.gpus=8", "training.global_batch=8"});
  EXPECT_NEAR(states(cp).optimizer_bytes / states(unsharded).optimizer_bytes, 1.0 / 8, 1e-12);
}

TEST(ShardingRules, BadCombinationsNameTheKeyAndWhy) {
  EXPECT_NE(config_error({"parallel.zero_stage=5"}).find("parallel.zero_stage: must be 0"), std::string::npos);
  EXPECT_NE(config_error({"parallel.zero_stage=1", "parallel.data=1", "cluster.gpus=8"}).find("needs data > 1"),
            std::string::npos);
  EXPECT_NE(config_error({"parallel.offload=optimizer"}).find("parallel.offload"), std::string::npos);
  EXPECT_NE(config_error({"parallel.zero_stage=2", "parallel.offload=optimizer_and_params"}).find("zero_stage 3"),
            std::string::npos);
  // t 8 on 8-GPU nodes: one data-parallel rank per node, nothing to shard inside it.
  EXPECT_NE(config_error({"parallel.fsdp=hybrid_shard"}).find("parallel.sharding_group"), std::string::npos);
  // t 2: 4 data-parallel ranks per node, d = 6 is not a multiple.
  EXPECT_NE(config_error({"parallel.tensor=2", "parallel.data=6", "cluster.gpus=12", "parallel.fsdp=hybrid_shard"})
                .find("must be a multiple"),
            std::string::npos);
  EXPECT_NE(config_error({"parallel.zero_stage=3", "parallel.pipeline=2", "parallel.data=64"}).find("pipeline"),
            std::string::npos);
  EXPECT_NE(config_error({"parallel.fsdp=full_shard", "parallel.zero_stage=3"}).find("either fsdp"), std::string::npos);
  EXPECT_NE(config_error({"parallel.fsdp=fully_shard"}).find("did you mean"), std::string::npos);
  // reshard_after_forward: FSDP's stage 3 only; an int divides the sharding group and is smaller.
  EXPECT_NE(config_error({"parallel.zero_stage=2", "parallel.reshard_after_forward=false"}).find("parallel.reshard_after_forward"),
            std::string::npos);
  EXPECT_NE(config_error({"parallel.zero_stage=3", "parallel.reshard_after_forward=3"}).find("divides the sharding group"),
            std::string::npos);
  EXPECT_NE(config_error({"parallel.zero_stage=3", "parallel.reshard_after_forward=128"}).find("smaller"), std::string::npos);
  EXPECT_NE(config_error({"parallel.zero_stage=3", "parallel.reshard_after_forward=maybe"}).find("expected true, false or a group size"),
            std::string::npos);
  // Stage 3 with pipelines: torchtitan runs it, Megatron does not.
  EXPECT_NO_THROW(fsdp_plan({"parallel.zero_stage=3", "parallel.pipeline=2", "parallel.data=64", "training.framework=torchtitan"}));
  // Stage 1 and 2 compose with pipeline parallelism.
  EXPECT_NO_THROW(fsdp_plan({"parallel.zero_stage=2", "parallel.pipeline=2", "parallel.data=64"}));
}

// FSDP2's reshard_after_forward (kernel-and-framework facts K11e): true re-gathers each unit in
// the backward (ZeRO-3), false keeps the unsharded parameters from forward to backward (no second
// gather, more memory), an int N keeps them sharded over N ranks (a cheaper re-gather).
TEST(ShardedTime, ReshardAfterForwardTradesTheBackwardGatherForMemory) {
  const Scenario regather = fsdp_plan({"parallel.zero_stage=3", "parallel.reshard_after_forward=true"});
  const Scenario kept = fsdp_plan({"parallel.zero_stage=3", "parallel.reshard_after_forward=false"});
  const Scenario by8 = fsdp_plan({"parallel.zero_stage=3", "parallel.reshard_after_forward=8"});
  // The default for Megatron-style frameworks is true (ZeRO-3).
  EXPECT_EQ(reshard_group(fsdp_plan({"parallel.zero_stage=3"}).plan), 128);
  EXPECT_EQ(reshard_group(regather.plan), 128);
  EXPECT_EQ(reshard_group(kept.plan), 1);
  EXPECT_EQ(reshard_group(by8.plan), 8);
  const SimulationResult t = predict(regather), f = predict(kept), e = predict(by8);
  EXPECT_LT(f.report.iteration_time_s, t.report.iteration_time_s);
  EXPECT_LT(f.report.exposed_comm_s.at("shard"), t.report.exposed_comm_s.at("shard"));
  EXPECT_LE(e.report.iteration_time_s, t.report.iteration_time_s);
  const PlanCosts ct = plan_costs(regather.model, regather.plan, regather.cluster);
  const PlanCosts ce = plan_costs(by8.model, by8.plan, by8.cluster);
  const PlanCosts cf = plan_costs(kept.model, kept.plan, kept.cluster);
  EXPECT_LT(ce.units[0][1].backward_gather_s, ct.units[0][1].backward_gather_s);  // 8 ranks instead of 128
  EXPECT_EQ(cf.units[0][1].backward_gather_s, 0);
  EXPECT_EQ(ct.units[0][1].backward_gather_s, ct.units[0][1].gather_s);
  // Memory: false holds every unit whole (Ψ·2 B on top), N holds 1/N of them besides the shards.
  const MemoryBreakdown mt = states(regather), mf = states(kept), me = states(by8);
  EXPECT_NEAR((mf.buffers_bytes - mt.buffers_bytes) / (mt.parameters * 2), 1.0, 0.1);
  EXPECT_NEAR((me.buffers_bytes - mt.buffers_bytes) / (mt.parameters * 2 / 8), 1.0, 1e-9);
  EXPECT_GT(f.report.peak_memory_bytes, e.report.peak_memory_bytes);
  EXPECT_GT(e.report.peak_memory_bytes, t.report.peak_memory_bytes);
}

// torchtitan's default policy keeps its last unit (final norm + output layer) whole after its
// forward — its backward follows at once — so that unit is not gathered again, and its
// parameters are held meanwhile; reshard_after_forward: true (torchtitan's "always") reshards it
// too, and other frameworks always do.
TEST(ShardedTime, TorchtitansLastUnitStaysWholeAfterItsForward) {
  const std::vector<std::string> titan = {"parallel.zero_stage=3", "training.framework=torchtitan", "training.precision=bf16",
                                          "model.tie_embeddings=false"};
  auto with = [](std::vector<std::string> v, const std::string& s) {
    v.push_back(s);
    return v;
  };
  const Scenario dflt = fsdp_plan(titan);
  const Scenario always = fsdp_plan(with(titan, "parallel.reshard_after_forward=true"));
  const Scenario megatron = fsdp_plan({"parallel.zero_stage=3", "training.precision=bf16", "model.tie_embeddings=false"});
  EXPECT_TRUE(last_unit_kept_whole(dflt.plan));
  EXPECT_FALSE(last_unit_kept_whole(always.plan));
  EXPECT_FALSE(last_unit_kept_whole(megatron.plan));
  const PlanCosts cd = plan_costs(dflt.model, dflt.plan, dflt.cluster);
  const PlanCosts ca = plan_costs(always.model, always.plan, always.cluster);
  ASSERT_GE(cd.units[0].size(), 3u);
  const auto& head = cd.units[0].back();
  EXPECT_TRUE(head.kept_whole);
  EXPECT_EQ(head.backward_gather_s, 0);
  EXPECT_GT(ca.units[0].back().backward_gather_s, 0);
  EXPECT_EQ(cd.units[0][1].backward_gather_s, ca.units[0][1].backward_gather_s);  // the layers reshard alike
  // The backward's gather of the output layer (12 288 × 51 200 / 8 parameters) is saved …
  EXPECT_LT(predict(dflt).report.exposed_comm_s.at("shard"), predict(always).report.exposed_comm_s.at("shard"));
  // … and its parameters are held whole meanwhile.
  const MemoryBreakdown md = states(dflt), ma = states(always);
  const double head_params = 12288.0 * 51200 / 8 + 2 * 12288;  // output layer shard, final norm
  EXPECT_NEAR((md.buffers_bytes - ma.buffers_bytes) / (head_params * 2), 1.0, 0.01);
}

// torchtitan runs FSDP with pipeline parallelism (PyTorch's pipeline stages with FSDP2): by
// default the parameters stay whole across the step (gathered once, UNSHARD … RESHARD around each
// stage), every backward but the stage's last skips the gradient synchronisation, so the
// unsharded gradients are held across the step and reduce-scattered once, at REDUCE_GRAD.
TEST(ShardedTime, TorchtitanFsdpWithPipelinesReducesOncePerStep) {
  const std::vector<std::string> piped = {"parallel.zero_stage=3", "parallel.pipeline=4", "parallel.data=32",
                                          "training.framework=torchtitan", "training.precision=bf16"};
  const Scenario sc = fsdp_plan(piped);
  EXPECT_TRUE(gradients_reduced_once_per_step(sc.plan));
  EXPECT_TRUE(stage_held_unsharded(sc.plan));
  EXPECT_EQ(reshard_group(sc.plan), 1);  // torchtitan's "default" policy with pipelines
  // The lowering: each stage gathered once, its gradients reduce-scattered once.
  const Schedule s = make_schedule(sc.plan);
  int unshard = 0, reshard = 0;
  for (const Action& a : s.programs[0].actions) unshard += a.kind == ActionKind::UNSHARD, reshard += a.kind == ActionKind::RESHARD;
  EXPECT_EQ(unshard, 1);
  EXPECT_EQ(reshard, 1);
  const std::vector<CommStep> steps = communication_steps(s, sc.plan, sc.model, 0, Action{ActionKind::REDUCE_GRAD, 0, -1});
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.front().kind, StepKind::ReduceScatter);
  EXPECT_EQ(steps.front().group, CommGroup::Sharding);
  const PlanCosts c = plan_costs(sc.model, sc.plan, sc.cluster);
  for (const auto& u : c.units[0]) EXPECT_EQ(u.reduce_scatter_s, 0);  // none per microbatch
  EXPECT_GT(c.reduce_grad_s[0], 0);
  // Memory: the whole gradients (fp32 with bf16) and parameters of the rank, held.
  const Scenario always = fsdp_plan({"parallel.zero_stage=3", "parallel.pipeline=4", "parallel.data=32", "training.framework=torchtitan",
                                     "training.precision=bf16", "parallel.reshard_after_forward=true"});
  EXPECT_FALSE(stage_held_unsharded(always.plan));
  const MemoryBreakdown held = memory_per_rank(sc.model, sc.plan, {4, 3, 2, 1})[0];
  const MemoryBreakdown regather = memory_per_rank(always.model, always.plan, {4, 3, 2, 1})[0];
  EXPECT_GT(held.buffers_bytes, held.parameters * (2 + 4) * 0.99);
  EXPECT_GT(held.buffers_bytes, regather.buffers_bytes);
  // Gathering once per step beats re-gathering in every microbatch's forward and backward.
  EXPECT_LT(predict(sc).report.iteration_time_s, predict(always).report.iteration_time_s);
  // Stage 2 with pipelines (Megatron's distributed optimizer) is unchanged: per-microbatch scatters.
  EXPECT_FALSE(gradients_reduced_once_per_step(fsdp_plan({"parallel.zero_stage=2", "parallel.pipeline=4", "parallel.data=32",
                                                          "training.framework=torchtitan"}).plan));
}

TEST(ShardedTime, StageOneMovesTheSameBytesAsTheAllReduce) {
  // A ring all-reduce is a reduce-scatter plus an all-gather: stage 1's REDUCE_GRAD and its
  // parameter all-gather in OPTIM take the all-reduce's time between them.
  const Scenario z0 = fsdp_plan(), z1 = fsdp_plan({"parallel.zero_stage=1"});
  const PlanCosts c0 = plan_costs(z0.model, z0.plan, z0.cluster), c1 = plan_costs(z1.model, z1.plan, z1.cluster);
  EXPECT_NEAR((c1.reduce_grad_s[0] + c1.optim_shard_s[0]) / c0.reduce_grad_s[0], 1.0, 0.02);
  EXPECT_LT(c1.optim_s[0] - c1.optim_shard_s[0], c0.optim_s[0]);  // Adam on 1/N of the parameters
}

TEST(ShardedTime, StagesOneAndTwoPriceTheCopyOfTheUpdatedShardBeforeItsGather) {
  // OPTIM's computation at stages 1-2: Adam on the shard, then the member's updated block copied
  // out of the parameters for the all-gather (4 bytes read, the weight's bytes written per shard
  // element, at the element-wise rate of that working set); stage 3 updates its shard in place.
  for (const char* z : {"1", "2", "3"}) {
    const Scenario sc = fsdp_plan({std::string("parallel.zero_stage=") + z});
    const PlanCosts c = plan_costs(sc.model, sc.plan, sc.cluster);
    const GpuSpec& gpu = sc.cluster.gpu;
    const double shard = rank_parameter_counts(sc.model, sc.plan)[0] / static_cast<double>(sc.plan.data);
    const double adam = optimizer_time_s(shard, parameter_tensor_count(sc.model, static_cast<double>(sc.model.num_layers)), gpu,
                                         sc.plan.precision, sc.plan.framework);
    const double bytes = shard * (4 + bytes_per_element(sc.plan.precision));
    const double copy = std::string(z) == "3" ? 0.0 : bytes / elementwise_bandwidth(gpu, bytes) + gpu.kernel_launch_s;
    const double computation = c.optim_s[0] - c.optim_shard_s[0] - c.grad_norm_allreduce_s - gpu.iteration_overhead_s;
    EXPECT_NEAR(computation, adam + copy, 1e-9 + 1e-6 * computation) << "zero stage " << z;
  }
}

TEST(ShardedTime, StageThreeExposesGathersAndPrefetchHidesSome) {
  const SimulationResult z0 = predict(fsdp_plan());
  const SimulationResult z3 = predict(fsdp_plan({"parallel.zero_stage=3"}));
  EXPECT_EQ(z0.report.exposed_comm_s.at("shard"), 0);
  EXPECT_GT(z3.report.exposed_comm_s.at("shard"), 0);
  EXPECT_GT(z3.report.iteration_time_s, z0.report.iteration_time_s);  // 3Ψ per microbatch instead of 2Ψ per iteration
  EXPECT_LT(z3.report.peak_memory_bytes, z0.report.peak_memory_bytes / 10);
  // One gathered unit at a time: no overlap, slower; more in flight: at least as fast.
  const double serial = predict(fsdp_plan({"parallel.zero_stage=3", "parallel.max_inflight_gathers=1"})).report.iteration_time_s;
  const double four = predict(fsdp_plan({"parallel.zero_stage=3", "parallel.max_inflight_gathers=4"})).report.iteration_time_s;
  EXPECT_GT(serial, z3.report.iteration_time_s);
  EXPECT_LE(four, z3.report.iteration_time_s);
}

TEST(ShardedTime, FasterNetworkShortensTheGathers) {
  const double base = predict(fsdp_plan({"parallel.zero_stage=3"})).report.iteration_time_s;
  const double fast = predict(fsdp_plan({"parallel.zero_stage=3", "cluster.topology.network.nic.bandwidth=100GBps",
                                         "cluster.topology.network.pcie.bandwidth=128GBps"}))
                          .report.iteration_time_s;
  EXPECT_LT(fast, base * 0.8);
}

TEST(ShardedTime, NodeShardingTradesMemoryForNVLinkGathers) {
  const SimulationResult full = predict(fsdp_plan({"parallel.tensor=2", "parallel.data=512", "parallel.fsdp=full_shard"}));
  const SimulationResult node = predict(fsdp_plan({"parallel.tensor=2", "parallel.data=512", "parallel.fsdp=hybrid_shard"}));
  EXPECT_LT(node.report.exposed_comm_s.at("shard"), full.report.exposed_comm_s.at("shard"));
  EXPECT_GT(node.report.exposed_comm_s.at("dp"), full.report.exposed_comm_s.at("dp"));  // the replicas' all-reduce
  EXPECT_GT(node.report.peak_memory_bytes, full.report.peak_memory_bytes);
}

TEST(ShardedTime, OffloadPaysPcieAndTheHostOptimizer) {
  const Scenario on = fsdp_plan({"parallel.zero_stage=3"});
  const Scenario off = fsdp_plan({"parallel.zero_stage=3", "parallel.offload=optimizer"});
  const Scenario slow = fsdp_plan({"parallel.zero_stage=3", "parallel.offload=optimizer",
                                   "cluster.topology.node.host_link.bandwidth=5GBps",
                                   "cluster.topology.node.host_memory_bandwidth=50GBps"});
  const PlanCosts c_on = plan_costs(on.model, on.plan, on.cluster), c_off = plan_costs(off.model, off.plan, off.cluster),
                  c_slow = plan_costs(slow.model, slow.plan, slow.cluster);
  EXPECT_GT(c_off.optim_s[0], c_on.optim_s[0]);
  EXPECT_GT(c_slow.optim_s[0], c_off.optim_s[0]);
  // The copies: the gradient shard down, the parameter shard up, at the host link's bandwidth.
  const double shard = rank_parameter_count(off.model, off.plan, 0) / 128;
  const double bytes = gradient_bytes(off.plan.precision) + bytes_per_element(off.plan.precision);
  EXPECT_NEAR(c_off.optim_shard_s[0] / (shard * bytes / 25e9), 1.0, 0.01);
}

TEST(ShardedTime, CpuRanksDoNotOverlapTheirBlockingCollectives) {
  // The CPU back end (node.cores set): each gather and reduce-scatter is waited for in full.
  const Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml",
                                    {{"parallel.tensor", "1"}, {"parallel.pipeline", "1"}, {"parallel.data", "4"},
                                     {"parallel.zero_stage", "3"}});
  const PlanCosts c = plan_costs(sc.model, sc.plan, sc.cluster);
  double gathers = 0, scatters = 0;
  for (const auto& u : c.units[0]) gathers += u.gather_s, scatters += u.reduce_scatter_s;
  EXPECT_NEAR(c.forward_shard_s[0] / gathers, 1.0, 1e-9);
  EXPECT_NEAR(c.backward_shard_s[0] / (gathers + scatters), 1.0, 1e-9);
}

TEST(OverlappedUnits, GathersHideBehindComputeUpToTheInFlightLimit) {
  const std::vector<double> g(4, 1.0), c(4, 2.0);
  EXPECT_DOUBLE_EQ(overlapped_units_s(g, c, 2), 1.0 + 4 * 2.0);  // only the first gather shows
  EXPECT_DOUBLE_EQ(overlapped_units_s(g, c, 1), 4 * 3.0);        // one buffer: no overlap
  EXPECT_DOUBLE_EQ(overlapped_units_s({}, c, 1), 8.0);
  const std::vector<double> slow(4, 3.0);
  EXPECT_DOUBLE_EQ(overlapped_units_s(slow, c, 2), 4 * 3.0 + 2.0);  // communication-bound
  double tail = 0;
  const std::vector<double> rs(4, 1.0);
  EXPECT_DOUBLE_EQ(overlapped_units_s({}, c, 2, &rs, &tail), 8.0);
  EXPECT_DOUBLE_EQ(tail, 1.0);  // the last reduce-scatter is left for REDUCE_GRAD
}

}  // namespace
}  // namespace ptdp
