// Today's training runs (issue 20) end to end: the Llama 3 presets on H100 with flash attention,
// FP8 and Megatron's overlaps, in the analytic and the SimGrid fidelities. Every knob moves the
// prediction the way its mechanism says; refusals name their key.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "model/flops.hpp"
#include "model/memory.hpp"
#include "model/transformer.hpp"
#include "scenarios/scenario.hpp"
#include "sim/costing.hpp"
#include "sim/simulate.hpp"
#include "search/sweep.hpp"
#include "tests/sim/sim_input.hpp"
#include "topologies/collectives.hpp"

namespace ptdp {
namespace {

const std::string kRoot = PTDP_SOURCE_DIR;

// The Llama 3 preset runs the distributed optimizer with sequence parallelism and every overlap;
// the tests start from the plain plan (t 4, d 128, no overlap) and switch one thing at a time.
const std::vector<Override> kPlain = {{"parallel.sequence_parallel", "false"},  {"parallel.zero_stage", "0"},
                                      {"parallel.overlap_grad_reduce", "false"}, {"parallel.overlap_param_gather", "false"},
                                      {"parallel.tp_comm_overlap", "false"}};

Report run(const std::string& file, std::vector<Override> sets, Fidelity f = Fidelity::Analytic) {
  if (file.find("llama3-8b") != std::string::npos) sets.insert(sets.begin(), kPlain.begin(), kPlain.end());
  const Scenario sc = load_scenario(kRoot + "/" + file, sets);
  return simulate(input_of(sc), make_schedule(sc.plan), f, false).report;
}

const char* kLlama8b = "scenarios/llama3-8b.yaml";

// Expects `load` to be refused with a ConfigError that names `key` and says `words`.
void expect_refused(const std::function<void()>& load, const std::string& key, const std::string& words) {
  try {
    load();
    ADD_FAILURE() << key << " (" << words << "): accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), key) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

double shard_of(const Report& r) {
  auto it = r.exposed_comm_s.find("shard");
  return it == r.exposed_comm_s.end() ? 0.0 : it->second;
}

TEST(TodaysRuns, Llama3On512H100sFitsWithFlashAttentionAndNotWithout) {
  const Report flash = run(kLlama8b, {});
  EXPECT_LT(flash.peak_memory_bytes, 80e9);
  EXPECT_GT(flash.mfu, 0.30);  // published H100 runs of such models: roughly 40 %
  EXPECT_LT(flash.mfu, 0.60);
  // Without selective recompute the unfused kernels keep every s² score tensor.
  const Report unfused = run(kLlama8b, {{"model.attention", "unfused"}, {"parallel.recompute", "none"}});
  EXPECT_GT(unfused.peak_memory_bytes, 80e9);  // s² scores at s = 8192: does not fit
  EXPECT_GT(unfused.peak_memory_bytes, flash.peak_memory_bytes + 30e9);
  EXPECT_GT(unfused.iteration_time_s, flash.iteration_time_s);
}

TEST(TodaysRuns, Fp8IsFasterOnH100AndRefusedOnA100) {
  const Report bf16 = run(kLlama8b, {});
  const Report fp8 = run(kLlama8b, {{"training.precision", "fp8"}});
  EXPECT_LT(fp8.iteration_time_s, bf16.iteration_time_s);
  EXPECT_GT(fp8.iteration_time_s, 0.5 * bf16.iteration_time_s);  // only the linear GEMMs, casts added
  try {
    run(kLlama8b, {{"cluster.topology", "dgx-a100"}, {"training.precision", "fp8"}});
    FAIL() << "fp8 on A100 accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "training.precision");
    EXPECT_NE(std::string(e.what()).find("FP8 tensor cores"), std::string::npos) << e.what();
  }
}

TEST(TodaysRuns, OverlappedGradientReductionHidesDataParallelTimeInEveryFidelity) {
  for (Fidelity f : {Fidelity::Analytic, Fidelity::Reduced}) {
    const Report plain = run(kLlama8b, {}, f);
    const Report overlapped = run(kLlama8b, {{"parallel.overlap_grad_reduce", "true"}}, f);
    EXPECT_LT(overlapped.iteration_time_s, plain.iteration_time_s) << to_string(f);
    EXPECT_LT(overlapped.exposed_comm_s.at("dp"), 0.6 * plain.exposed_comm_s.at("dp")) << to_string(f);
    // One huge bucket cannot start before the backward ends: no gain.
    const Report one_bucket = run(kLlama8b, {{"parallel.overlap_grad_reduce", "true"}, {"parallel.bucket_size", "100B"}}, f);
    EXPECT_NEAR(one_bucket.iteration_time_s / plain.iteration_time_s, 1.0, 0.01) << to_string(f);
  }
}

TEST(TodaysRuns, ParamGatherAndTensorOverlapsHideTheirCommunication) {
  const std::vector<Override> dist = {{"parallel.zero_stage", "1"}, {"parallel.sequence_parallel", "true"}};
  auto with = [&](std::vector<Override> extra) {
    std::vector<Override> all = dist;
    all.insert(all.end(), extra.begin(), extra.end());
    return run(kLlama8b, all);
  };
  const Report base = with({});
  const Report grads = with({{"parallel.overlap_grad_reduce", "true"}});
  const Report params = with({{"parallel.overlap_grad_reduce", "true"}, {"parallel.overlap_param_gather", "true"}});
  const Report tp = with({{"parallel.tp_comm_overlap", "true"}});
  EXPECT_LT(grads.iteration_time_s, base.iteration_time_s);
  EXPECT_LT(params.iteration_time_s, grads.iteration_time_s);
  EXPECT_LT(shard_of(params), shard_of(grads));
  EXPECT_LT(tp.exposed_comm_s.at("tp"), base.exposed_comm_s.at("tp"));
  EXPECT_LT(tp.iteration_time_s, base.iteration_time_s);
  // FP8 parameter gather halves the linear layers' gather bytes.
  const Report fp8 = with({{"training.precision", "fp8"}});
  const Report fp8_gather = with({{"training.precision", "fp8"}, {"training.fp8_param_gather", "true"}});
  EXPECT_LT(shard_of(fp8_gather), shard_of(fp8));
  EXPECT_LT(fp8_gather.peak_memory_bytes, fp8.peak_memory_bytes);
}

TEST(TodaysRuns, OverlapKeysAreRefusedWhereMegatronRefusesThem) {
  try {
    run(kLlama8b, {{"parallel.tp_comm_overlap", "true"}});
    FAIL() << "tp_comm_overlap without sequence parallelism accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "parallel.tp_comm_overlap");
    EXPECT_NE(std::string(e.what()).find("--set parallel.tp_comm_overlap=true"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run(kLlama8b, {{"parallel.overlap_param_gather", "true"}}), ConfigError);  // needs zero_stage ≥ 1
  EXPECT_THROW(run(kLlama8b, {{"parallel.zero_stage", "1"}, {"parallel.overlap_param_gather", "true"}}), ConfigError);  // and grad overlap
}

TEST(TodaysRuns, BucketedReductionTailFollowsItsMechanism) {
  // Comm shorter than the backward's share: only the last bucket stays exposed.
  EXPECT_NEAR(bucketed_reduction_tail_s(0.1, 4, 4.0), 0.1, 1e-12);
  // One bucket: the whole reduction after the backward.
  EXPECT_DOUBLE_EQ(bucketed_reduction_tail_s(2.0, 1, 4.0), 2.0);
  // Comm-bound: the buckets queue up; the tail is total comm minus what the backward hid.
  EXPECT_NEAR(bucketed_reduction_tail_s(2.0, 4, 4.0), 1.0 + 8.0 - 4.0, 1e-12);
  // Parameter gathers: the first bucket always stalls the forward; a slow gather stalls more.
  EXPECT_NEAR(bucketed_gather_stall_s(0.1, 4, 4.0), 0.1, 1e-12);
  EXPECT_NEAR(bucketed_gather_stall_s(2.0, 4, 4.0), 8.0 - 3.0, 1e-12);
}

TEST(TodaysRuns, NewClustersPredictFasterIterationsOnFasterGpus) {
  const Report h100 = run(kLlama8b, {});
  const Report h200 = run(kLlama8b, {{"cluster.topology", "dgx-h200"}});
  const Report b200 = run(kLlama8b, {{"cluster.topology", "dgx-b200"}});
  const Report gb200 = run(kLlama8b, {{"cluster.topology", "gb200-nvl72"}, {"cluster.gpus", "576"}, {"parallel.data", "144"},
                                      {"training.global_batch", "576"}});
  EXPECT_LE(h200.iteration_time_s, h100.iteration_time_s);  // same compute, faster memory
  EXPECT_LT(b200.iteration_time_s, 0.75 * h100.iteration_time_s);
  EXPECT_GT(gb200.tokens_per_s / 576, b200.tokens_per_s / 512 * 0.8);
  // NVL72: a tensor group fits in a rack (72 GPUs) but not across racks.
  EXPECT_NO_THROW(run(kLlama8b, {{"cluster.topology", "gb200-nvl72"}, {"cluster.gpus", "576"}, {"parallel.tensor", "8"},
                                 {"parallel.data", "72"}, {"training.global_batch", "576"}}));
  try {
    // 144 query heads and 9 groups: t 144 divides them, but one tensor group needs two racks.
    run(kLlama8b, {{"cluster.topology", "gb200-nvl72"}, {"cluster.gpus", "576"}, {"model.num_attention_heads", "144"},
                   {"model.hidden_size", "18432"}, {"model.num_query_groups", "144"}, {"model.ffn_hidden_size", "73728"}, {"model.seq_length", "8064"}, {"parallel.tensor", "144"},
                   {"parallel.data", "4"}, {"training.global_batch", "4"}});
    FAIL() << "a 128-GPU tensor group across NVL72 racks accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "parallel.tensor");
    EXPECT_NE(std::string(e.what()).find("or racks, on rack-scale NVLink systems"), std::string::npos) << e.what();
  }
}

TEST(DualPipeV, OverlappedPairsHideTheExpertAllToAllsInEveryFidelity) {
  // Mixtral 8×7B on 64 H100s, PP 4, EP 8: DualPipeV's OVERLAP_F_B pairs run each action's
  // all-to-alls under its partner's compute; ZB-V (the same V placement, no pairs) exposes them.
  // On NVLink 4 the hidden all-to-alls (about 57 ms) weigh less than DualPipeV's larger bubble
  // against ZB-V's hand-made V order (2.51 s against 2.49 s); where the all-to-alls cost more
  // (NVLink at 100 GB/s) DualPipeV is the faster schedule (2.61 s against 2.78 s).
  for (const char* nvlink : {"450GBps", "100GBps"}) {
    const std::vector<Override> v2 = {{"parallel.virtual_stages", "2"}, {"cluster.topology.node.nvlink.bandwidth", nvlink}};
    for (Fidelity f : {Fidelity::Analytic, Fidelity::Reduced}) {
      auto with = [&](const char* kind) {
        std::vector<Override> sets = v2;
        sets.push_back({"parallel.schedule", kind});
        return run("scenarios/moe/mixtral-8x7b.yaml", sets, f);
      };
      const Report zbv = with("zb-v"), dual = with("dualpipev");
      EXPECT_LT(dual.exposed_comm_s.at("ep"), 0.5 * zbv.exposed_comm_s.at("ep")) << to_string(f) << " " << nvlink;
      if (std::string(nvlink) == "100GBps") EXPECT_LT(dual.iteration_time_s, zbv.iteration_time_s) << to_string(f);
      else EXPECT_LT(dual.iteration_time_s, 1.02 * zbv.iteration_time_s) << to_string(f);
    }
  }
  try {
    run("scenarios/moe/mixtral-8x7b.yaml", {{"parallel.virtual_stages", "2"}, {"parallel.schedule", "dualpipev"}, {"training.global_batch", "112"}});
    ADD_FAILURE() << "7 microbatches on 4 pipeline ranks accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "training.global_batch") << e.what();
    EXPECT_NE(std::string(e.what()).find("dualpipev needs at least 2 × pipeline (8) microbatches"), std::string::npos) << e.what();
  }
}

TEST(DualPipe, OverlappedPairsHideCommunicationOnGpusAndNothingOnACpuCluster) {
  // Review IR-11: an OVERLAP_F_B action hides its collectives under its partner's compute where
  // communication runs beside compute (GPUs), and nothing on a CPU cluster, whose executor runs
  // F, then B, each collective blocking its core. The partner's own exposed communication is not
  // compute to hide under.
  auto durations = [](const Scenario& sc) {
    const Schedule s = make_schedule(sc.plan);
    const PlanCosts c = plan_costs(sc.model, sc.plan, sc.cluster, true, &s);
    Action f{ActionKind::F, 0, 0}, paired = f;
    paired.overlap = 1;
    paired.overlap_kind = ActionKind::B;
    paired.overlap_stage = s.num_stages() - 1;  // rank 0's other chunk under DualPipeV
    double tp = 0;
    const double plain = action_duration_s(c, 0, f, &tp);
    return std::tuple{plain, action_duration_s(c, 0, paired), tp};
  };
  const Scenario gpu = load_scenario(kRoot + "/scenarios/moe/mixtral-8x7b.yaml",
                                     {{"parallel.virtual_stages", "2"}, {"parallel.schedule", "dualpipev"}});
  const auto [gpu_plain, gpu_paired, gpu_tp] = durations(gpu);
  ASSERT_GT(gpu_tp, 0);
  EXPECT_LT(gpu_paired, gpu_plain - 0.5 * gpu_tp) << "most of the F's all-to-alls hide under the partner's B";
  const Scenario cpu = load_scenario(kRoot + "/scenarios/tiny-gpt-cpu.yaml",
                                     {{"parallel.virtual_stages", "2"}, {"parallel.schedule", "dualpipev"}});
  const auto [cpu_plain, cpu_paired, cpu_tp] = durations(cpu);
  ASSERT_GT(cpu_tp, 0) << "t 2: the F has tensor-parallel all-reduces";
  EXPECT_EQ(cpu_paired, cpu_plain);
}

TEST(Overlaps, TensorParallelOverlapHidesOnGpusAndNothingOnACpuCluster) {
  // One rule for every overlap (ClusterSpec::overlaps_communication): a CPU rank's collective
  // blocks the core its GEMM would run on, so tp_comm_overlap's chunked collectives hide nothing
  // there; on GPUs they hide under their GEMMs.
  auto forward_tp = [](const std::string& file, std::vector<Override> sets, bool overlap) {
    sets.push_back({"parallel.tp_comm_overlap", overlap ? "true" : "false"});
    const Scenario sc = load_scenario(kRoot + "/" + file, sets);
    const PlanCosts c = plan_costs(sc.model, sc.plan, sc.cluster, true);
    return std::pair{c.forward_s[0], c.forward_tp_s[0]};
  };
  const std::vector<Override> gpu_sp = {{"parallel.sequence_parallel", "true"}};
  const auto [gpu_off, gpu_off_tp] = forward_tp(kLlama8b, gpu_sp, false);
  const auto [gpu_on, gpu_on_tp] = forward_tp(kLlama8b, gpu_sp, true);
  ASSERT_GT(gpu_off_tp, 0);
  EXPECT_LT(gpu_on_tp, 0.5 * gpu_off_tp) << "most of the forward's all-gathers and reduce-scatters hide under their GEMMs";
  EXPECT_LT(gpu_on, gpu_off);
  const std::vector<Override> cpu_sp = {{"parallel.sequence_parallel", "true"}};
  const auto [cpu_off, cpu_off_tp] = forward_tp("scenarios/tiny-gpt-cpu.yaml", cpu_sp, false);
  const auto [cpu_on, cpu_on_tp] = forward_tp("scenarios/tiny-gpt-cpu.yaml", cpu_sp, true);
  ASSERT_GT(cpu_off_tp, 0) << "t 2: the forward has tensor-parallel collectives";
  EXPECT_EQ(cpu_on_tp, cpu_off_tp);
  EXPECT_EQ(cpu_on, cpu_off);
}

// Issue 24's plan: 32 layers, h 4096, t 1, p 8, d 8, m 64, the 51 200-word vocabulary: the output
// layer and loss weigh about one layer, all on the last stage, and every schedule inherits it.
Scenario vocab_plan(std::vector<Override> extra = {}) {
  std::vector<Override> sets = {{"model.num_layers", "32"},        {"model.hidden_size", "4096"},     {"model.num_attention_heads", "32"},
                                {"cluster.gpus", "64"},            {"parallel.tensor", "1"},          {"parallel.pipeline", "8"},
                                {"parallel.virtual_stages", "1"},  {"parallel.schedule", "1f1b"},     {"parallel.recompute", "none"},
                                {"training.global_batch", "512"},  {"training.micro_batch", "1"},
                                {"parallel.overlap_p2p", "true"}};  // sends beside compute: the waits are the schedule's bubble
  for (auto& o : extra) sets.push_back(o);
  return load_scenario(kRoot + "/scenarios/gpt3-175b.yaml", sets);
}

TEST(VocabularyParallelism, SplittingTheOutputLayerOverThePipelineShrinksTheBubble) {
  const Scenario base = vocab_plan(), split = vocab_plan({{"parallel.vocab_parallel_pipeline", "true"}});
  for (Fidelity f : {Fidelity::Analytic, Fidelity::Reduced}) {
    const Report a = simulate(input_of(base), make_schedule(base.plan), f, false).report;
    const Report b = simulate(input_of(split), make_schedule(split.plan), f, false).report;
    EXPECT_LT(b.iteration_time_s, 0.95 * a.iteration_time_s) << to_string(f);
    EXPECT_LT(b.bubble_fraction, 0.7 * a.bubble_fraction) << to_string(f);
    // What is left is about 1F1B's own (p − 1)/(m + p − 1) = 9.9 %.
    EXPECT_GT(b.bubble_fraction, 0.095) << to_string(f);
  }
  // The last stage sheds 7/8 of the output layer; every other stage takes 1/8, and the
  // broadcast of the hidden states and the reductions over the pipeline group.
  const PlanCosts ca = plan_costs(base.model, base.plan, base.cluster), cb = plan_costs(split.model, split.plan, split.cluster);
  EXPECT_LT(cb.forward_s.back() + cb.backward_s.back(), ca.forward_s.back() + ca.backward_s.back());
  EXPECT_GT(cb.forward_s[3], ca.forward_s[3]);
  EXPECT_GT(cb.backward_s[3], ca.backward_s[3]);
  // Memory: the output layer's weights move off the last rank, 1/8 to each.
  const auto ma = memory_per_rank(base.model, base.plan, std::vector<int>(8, 8));
  const auto mb = memory_per_rank(split.model, split.plan, std::vector<int>(8, 8));
  const double vocab_shard = static_cast<double>(base.model.padded_vocab(1)) * 4096;
  EXPECT_NEAR(ma.back().parameters - mb.back().parameters, vocab_shard * 7 / 8, 1);
  EXPECT_NEAR(mb[3].parameters - ma[3].parameters, vocab_shard / 8, 1);
}

TEST(DualPipe, BothDirectionsHalveTheBubbleAtTwiceTheParameters) {
  // Issue 24's plan (32 layers, p 8, m 64) under DualPipe: the two lanes hold the model twice
  // (rank r: chunk r and chunk p − 1 − r, 8 layers against 1F1B's 4), half the microbatches
  // enter at each end, and each stage sums its gradients with its copy on the mirror rank.
  const std::vector<Override> v2 = {{"parallel.virtual_stages", "2"}};
  auto with = [&](const char* kind, std::vector<Override> sets) {
    sets.emplace_back("parallel.schedule", kind);
    return vocab_plan(sets);
  };
  const Scenario onefoneb = vocab_plan(), dual = with("dualpipe", v2), dualv = with("dualpipev", v2);
  for (Fidelity f : {Fidelity::Analytic, Fidelity::Reduced}) {
    const Report a = simulate(input_of(onefoneb), make_schedule(onefoneb.plan), f, false).report;
    const Report b = simulate(input_of(dual), make_schedule(dual.plan), f, false).report;
    const Report c = simulate(input_of(dualv), make_schedule(dualv.plan), f, false).report;
    std::printf("%s: iteration 1f1b %.3f s (bubble %.1f %%), dualpipe %.3f s (%.1f %%), dualpipev %.3f s (%.1f %%)\n",
                to_string(f).c_str(), a.iteration_time_s, 100 * a.bubble_fraction, b.iteration_time_s, 100 * b.bubble_fraction,
                c.iteration_time_s, 100 * c.bubble_fraction);
    EXPECT_LT(b.bubble_fraction, 0.5 * a.bubble_fraction) << to_string(f);
    EXPECT_LT(b.iteration_time_s, a.iteration_time_s) << to_string(f);
    EXPECT_GT(b.peak_memory_bytes, a.peak_memory_bytes) << to_string(f);
  }
  // Parameters: a middle rank holds two chunks of 4 layers; ranks 0 and p − 1 both hold an
  // embedding and a head (sharing the tied embedding on the rank).
  const auto ma = memory_per_rank(onefoneb.model, onefoneb.plan, std::vector<int>(8, 8));
  const auto mb = memory_per_rank(dual.model, dual.plan, std::vector<int>(8, 8));
  const double vocab_shard = static_cast<double>(onefoneb.model.padded_vocab(1)) * 4096;
  const double tied = onefoneb.model.tie_embeddings ? vocab_shard : 0.0;
  EXPECT_NEAR(mb[3].parameters, 2 * ma[3].parameters, 1);
  EXPECT_NEAR(mb[0].parameters, ma[0].parameters + ma[7].parameters - tied, 1);
  EXPECT_NEAR(mb[7].parameters, mb[0].parameters, 1);
  // REDUCE_GRAD: every stage sums its gradients with its copy's, folded into the data-parallel
  // reduction (reduce-scatter over d, the pair's exchange of 1/d, all-gather); a slower fabric
  // between the pair's nodes costs more.
  const PlanCosts cd = plan_costs(dual.model, dual.plan, dual.cluster);  // the plan's own placement, the V
  for (int st = 0; st < 16; ++st) {
    EXPECT_EQ(cd.pair_stage[static_cast<size_t>(st)], (st + 8) % 16) << st;
    EXPECT_NEAR(cd.pair_bytes[static_cast<size_t>(st)], cd.grad_bytes[static_cast<size_t>(st)] / 8, 1) << st;  // 1/d of them
    EXPECT_GT(cd.pair_reduce_s[static_cast<size_t>(st)], 0) << st;
  }
  const Scenario slow = with("dualpipe", {{"parallel.virtual_stages", "2"}, {"cluster.topology.network.nic.bandwidth", "5GBps"}});
  const PlanCosts cs = plan_costs(slow.model, slow.plan, slow.cluster);
  EXPECT_GT(cs.pair_reduce_s[3], 2 * cd.pair_reduce_s[3]);
}

TEST(DualPipe, SweepNamesTheFrameworkThatRunsIt) {
  // sweep --megatron names what a winner needs beyond Megatron-LM.
  ParallelPlan plan;
  plan.schedule = ScheduleKind::DualPipe;
  EXPECT_EQ(framework_needed(plan), "DeepSeek's DualPipe (deepseek-ai/DualPipe)");
  plan.schedule = ScheduleKind::DualPipeV;
  EXPECT_EQ(framework_needed(plan), "PyTorch pipelining (ScheduleDualPipeV)");
  plan.schedule = ScheduleKind::ZeroBubbleV;
  EXPECT_NE(framework_needed(plan).find("zero-bubble pipeline fork"), std::string::npos);
}

TEST(DualPipe, RefusalsNameTheKeyAndTheReason) {
  auto refused = [](std::vector<Override> sets, const std::string& key, const std::string& words) {
    sets.emplace_back("parallel.schedule", "dualpipe");
    sets.emplace_back("parallel.virtual_stages", "2");
    expect_refused([&] { vocab_plan(sets); }, key, words);
  };
  refused({{"parallel.pipeline", "1"}, {"parallel.data", "64"}}, "parallel.pipeline", "must be even and at least 2 (got 1)");
  refused({{"training.global_batch", "120"}}, "training.global_batch", "at least 2 × pipeline (16; got 15)");
  refused({{"training.global_batch", "8"}, {"parallel.data", "8"}}, "training.global_batch", "(16; got 1)");
  refused({{"parallel.layers_per_stage", "[4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4]"}}, "parallel.layers_per_stage", "expected one per stage: pipeline (8");
}

TEST(VocabularyParallelism, RefusalsNameTheKeyAndTheReason) {
  auto refused = [](std::vector<Override> sets, const std::string& words) {
    sets.emplace_back("parallel.vocab_parallel_pipeline", "true");
    expect_refused([&] { vocab_plan(sets); }, "parallel.vocab_parallel_pipeline", words);
  };
  refused({{"parallel.pipeline", "1"}, {"parallel.data", "64"}}, "needs pipeline > 1 (got 1)");
  refused({{"model.vocab_size", "4"}}, "model.vocab_size (4) must be at least pipeline");
  refused({{"parallel.schedule", "interleaved"}, {"parallel.virtual_stages", "2"}}, "virtual_stages 1, got 2");
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

// Issue 21 (first part): mixture-of-experts model keys. Parameter counts of the presets against
// the published totals (modern-training-facts.md §8), FLOPs on the active experts, what changes
// when a knob moves, and the refusals.
TEST(Experts, PresetParameterCountsMatchThePublishedTotals) {
  struct Row {
    const char* file;
    double total_b, active_b;
  };
  for (const Row& r : {Row{"scenarios/moe/mixtral-8x7b.yaml", 46.7, 12.9}, Row{"scenarios/moe/mixtral-8x22b.yaml", 141, 39},
                       Row{"scenarios/moe/deepseek-v3.yaml", 671, 37}, Row{"scenarios/moe/qwen2-57b-a14b.yaml", 57, 14}}) {
    const Scenario sc = load_scenario(kRoot + "/" + r.file, {});
    EXPECT_NEAR(parameter_count(sc.model) / 1e9 / r.total_b, 1.0, 0.02) << r.file << ": " << parameter_count(sc.model) / 1e9;
    // Active: within 5 % (DeepSeek-V3's attention is MHA here, not MLA: 38.7 B against 37 B).
    EXPECT_NEAR(active_parameter_count(sc.model) / 1e9 / r.active_b, 1.0, 0.05) << r.file << ": " << active_parameter_count(sc.model) / 1e9;
  }
}

// GPT-OSS-120B (issue 31, sixth session): 116.8 B parameters and 5.13 B active per token on its
// model card, which counts the output layer but not the embedding lookup; ptdp's active count has
// both tables.
TEST(Experts, GptOss120bPresetMatchesItsModelCard) {
  const Scenario sc = load_scenario(kRoot + "/scenarios/moe/gpt-oss-120b.yaml", {});
  EXPECT_NEAR(parameter_count(sc.model) / 1e9 / 116.8, 1.0, 0.01) << parameter_count(sc.model) / 1e9;
  const double embedding = static_cast<double>(sc.model.vocab_size) * static_cast<double>(sc.model.hidden_size);
  EXPECT_NEAR((active_parameter_count(sc.model) - embedding) / 1e9 / 5.13, 1.0, 0.02) << active_parameter_count(sc.model) / 1e9;
  // Its two measured layouts (scenarios/moe/nemo-moe-runs.csv) fit in memory.
  EXPECT_TRUE(run("scenarios/moe/gpt-oss-120b.yaml", {}).fits_in_memory);  // 1F1B, PP 4: no EP overlap (Megatron refuses it)
  EXPECT_TRUE(run("scenarios/moe/gpt-oss-120b.yaml", {{"cluster.topology", "gb200-nvl72"}, {"parallel.pipeline", "1"}, {"parallel.expert", "64"}})
                  .fits_in_memory);
}

TEST(Experts, FlopsCountTheActiveExpertsAndTheKnobsMoveTheCost) {
  const std::string mixtral = "scenarios/moe/mixtral-8x7b.yaml";
  const Scenario sc = load_scenario(kRoot + "/" + mixtral, {});
  // Forward FLOPs per token of an MoE layer: attention as dense, MLP of k experts (+ the router).
  TransformerSpec dense = sc.model;
  dense.moe = MoeSpec{};
  const double s = 4096, h = 4096, f = 14336;
  const double moe_flops = layer_forward_flops(sc.model, 1), dense_flops = layer_forward_flops(dense, 1);
  EXPECT_NEAR(moe_flops - dense_flops, s * (2 * 3 * h * f) + 2 * s * h * 8, 1e6);  // a second expert, and the router
  // More experts per token: more FLOPs and time; more experts in all: more memory, the same FLOPs.
  const Report base = run(mixtral, {});
  const Report k4 = run(mixtral, {{"model.moe.top_k", "4"}});
  EXPECT_GT(k4.iteration_time_s, base.iteration_time_s);
  const Report e16 = run(mixtral, {{"model.moe.num_experts", "16"}});
  EXPECT_GT(e16.peak_memory_bytes, base.peak_memory_bytes);
  // Only the router grows (h → 16 instead of 8 scores per token): the tokens still use 2 experts.
  EXPECT_NEAR(layer_forward_flops(load_scenario(kRoot + "/" + mixtral, {{"model.moe.num_experts", "16"}}).model, 1) - moe_flops,
              2 * s * h * 8, 1e6);
  // A capacity factor below the imbalance bounds the busiest expert's rows: faster.
  const Report skewed = run(mixtral, {{"model.moe.imbalance", "2"}});
  const Report capped = run(mixtral, {{"model.moe.imbalance", "2"}, {"model.moe.capacity_factor", "1.25"}});
  EXPECT_GT(skewed.iteration_time_s, base.iteration_time_s);
  EXPECT_LT(capped.iteration_time_s, skewed.iteration_time_s);
}

TEST(Experts, RefusalsNameTheKeyAndTheNumbers) {
  try {
    run("scenarios/moe/mixtral-8x7b.yaml", {{"model.moe.top_k", "9"}});
    FAIL() << "top_k 9 of 8 experts accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "model.moe.top_k");
    EXPECT_NE(std::string(e.what()).find("9 > 8"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run("scenarios/moe/mixtral-8x7b.yaml", {{"model.moe.capacity_factor", "-1"}}), ConfigError);
  EXPECT_THROW(run("scenarios/moe/mixtral-8x7b.yaml", {{"model.moe.first_dense_layers", "32"}}), ConfigError);
  EXPECT_THROW(run("scenarios/moe/mixtral-8x7b.yaml", {{"model.moe.router_load_balance", "sinkhorn2"}}), ConfigError);
}

}  // namespace
}  // namespace ptdp

namespace ptdp {
namespace {

// Issue 21: expert parallelism and context parallelism, in the cost model, memory and both
// fidelities. Mixtral 8×7B on 64 H100s at t 1 (the reference layout's EP 8) and Llama 3 8B at
// 128k tokens.
const char* kMixtral = "scenarios/moe/mixtral-8x7b.yaml";
const std::vector<Override> kMixtralT1 = {{"parallel.tensor", "1"}, {"parallel.expert", "1"}, {"parallel.sequence_parallel", "false"}};

// Exposed communication inside F/B: tensor, context and expert collectives.
double layer_comm_of(const Report& r) {
  double s = 0;
  for (const char* k : {"tp", "cp", "ep"})
    if (auto it = r.exposed_comm_s.find(k); it != r.exposed_comm_s.end()) s += it->second;
  return s;
}

Report mixtral(std::vector<Override> sets, Fidelity f = Fidelity::Analytic) {
  sets.insert(sets.begin(), kMixtralT1.begin(), kMixtralT1.end());
  return run(kMixtral, sets, f);
}

TEST(ExpertParallelism, SplitsTheExpertsStatesOverTheExpertRanks) {
  const Scenario one = load_scenario(kRoot + "/" + kMixtral, kMixtralT1);
  std::vector<Override> ep8 = kMixtralT1;
  ep8.push_back({"parallel.expert", "8"});
  const Scenario eight = load_scenario(kRoot + "/" + kMixtral, ep8);
  // Each rank holds 1 of 8 experts: the routed experts' parameters per rank fall 8×.
  const double experts = layer_expert_parameter_count(one.model);
  EXPECT_NEAR(layer_local_expert_parameter_count(one.model, one.plan), experts, 1);
  EXPECT_NEAR(layer_local_expert_parameter_count(eight.model, eight.plan), experts / 8, 1);
  EXPECT_NEAR(layer_local_parameter_count(one.model, one.plan) - layer_local_parameter_count(eight.model, eight.plan), experts * 7 / 8, 1);
  // Their gradients are reduced over the expert-data ranks: t·cp·d / (etp·ep) = 16 / 8.
  EXPECT_EQ(eight.plan.expert_data(), 2);
  const Report r1 = mixtral({}), r8 = mixtral({{"parallel.expert", "8"}});
  EXPECT_LT(r8.peak_memory_bytes, r1.peak_memory_bytes - 20e9);
  // Tokens travel: the all-to-all adds communication, while the expert GEMMs grow 8× in rows
  // (the same FLOPs): the iteration is no faster than without EP by more than the GEMM gain.
  EXPECT_GT(layer_comm_of(r8), layer_comm_of(r1));
  EXPECT_GT(r8.exposed_comm_s.at("ep"), 0.0);  // the all-to-alls, reported as expert-parallel time
  EXPECT_EQ(r1.exposed_comm_s.at("ep"), 0.0);
}

TEST(ExpertParallelism, AllToAllLeavingTheNodeRunsAtOneNicPerGpu) {
  const Scenario sc = load_scenario(kRoot + "/" + kMixtral, {});
  const ClusterSpec& c = sc.cluster;
  const double bytes = 256e6;
  const GroupShape node = group_shape(c, 8, 1), two = group_shape(c, 16, 1);
  ASSERT_EQ(node.nodes, 1);
  ASSERT_EQ(two.nodes, 2);
  const double in_node = alltoall_time_s(c, node, bytes), across = alltoall_time_s(c, two, bytes);
  EXPECT_GT(across, 2 * in_node);
  // Across nodes NCCL's all-to-all runs at one NIC's rate for all of a rank's (n − 1)/n, its node
  // peers' share included (kernel-and-framework facts §3: "cannot aggregate the bandwidth of
  // multiple NICs"): at least that bound, and within 25 % of it at this size.
  const double nic_bound = bytes * 15 / 16 / nic_path_Bps(c);
  EXPECT_GT(across, nic_bound);
  EXPECT_LT(across, 1.25 * nic_bound + 1e-3);
  // nccl-tests alltoall busbw on DGX H100 (facts §3): 320 GB/s in a node of 8, 48 GB/s over 32
  // GPUs of 8×400G nodes — reproduced within 10 % at 1 GiB.
  const double big = 1024.0 * 1024 * 1024;
  auto busbw = [&](int64_t n) { return big * static_cast<double>(n - 1) / static_cast<double>(n) / alltoall_time_s(c, group_shape(c, n, 1), big); };
  EXPECT_NEAR(busbw(8) / 320e9, 1.0, 0.10) << busbw(8);
  EXPECT_NEAR(busbw(32) / 48e9, 1.0, 0.10) << busbw(32);
  // In the iteration: EP 16 over two nodes pays more all-to-all than EP 8 inside one.
  const Report ep8 = mixtral({{"parallel.expert", "8"}}), ep16 = mixtral({{"model.moe.num_experts", "16"}, {"parallel.expert", "16"}});
  const Report ep8_16 = mixtral({{"model.moe.num_experts", "16"}, {"parallel.expert", "8"}});
  EXPECT_GT(layer_comm_of(ep16), layer_comm_of(ep8_16));
  (void)ep8;
}

TEST(ExpertParallelism, DispatcherAndExpertTensorSizeMoveThePrediction) {
  const Report a2a = mixtral({{"parallel.expert", "8"}});
  const Report gather = mixtral({{"parallel.expert", "8"}, {"parallel.moe_dispatcher", "allgather"}});
  // All-gather moves every token of the 8 ranks to each (8·T), all-to-all its 2 copies (2·T·7/8).
  EXPECT_GT(gather.iteration_time_s, a2a.iteration_time_s);
  // Experts split over 2 tensor ranks instead of spread over 2 more expert ranks: the same memory
  // per rank, more communication per token.
  const Report etp = run(kMixtral, {{"parallel.tensor", "2"}, {"parallel.expert", "4"}, {"parallel.sequence_parallel", "true"}});
  const Report ep = run(kMixtral, {{"parallel.tensor", "2"}, {"parallel.expert", "8"}, {"parallel.expert_tensor", "1"},
                                   {"parallel.sequence_parallel", "true"}});
  EXPECT_NE(etp.iteration_time_s, ep.iteration_time_s);
  // Both fidelities run an expert-parallel plan and agree within 10 %.
  const Report sim = mixtral({{"parallel.expert", "8"}}, Fidelity::Reduced);
  EXPECT_NEAR(sim.iteration_time_s / a2a.iteration_time_s, 1.0, 0.10);
}

const std::vector<Override> kInterleaved = {{"parallel.schedule", "interleaved"}, {"parallel.virtual_stages", "2"}};

TEST(ExpertParallelism, OverlappedAllToAllHidesUnderTheOtherMicrobatchsCompute) {
  const Report plain = mixtral({kInterleaved[0], kInterleaved[1], {"parallel.expert", "8"}});
  const Report overlapped = mixtral({kInterleaved[0], kInterleaved[1], {"parallel.expert", "8"}, {"parallel.moe_comm_overlap", "true"}});
  EXPECT_LT(layer_comm_of(overlapped), layer_comm_of(plain));
  EXPECT_LT(overlapped.iteration_time_s, plain.iteration_time_s);
  // Fine-grained experts (ffn 1024, top 8 of 16) across two nodes: the all-to-all outlasts the
  // experts' compute, and part of it stays exposed.
  const std::vector<Override> fine = {{"model.moe.num_experts", "16"}, {"model.moe.top_k", "8"}, {"model.moe.expert_ffn_hidden_size", "1024"},
                                      {"parallel.expert", "16"}, kInterleaved[0], kInterleaved[1]};
  std::vector<Override> fine_overlapped = fine;
  fine_overlapped.push_back({"parallel.moe_comm_overlap", "true"});
  const Report far = mixtral(fine_overlapped), far_plain = mixtral(fine);
  EXPECT_GT(layer_comm_of(far), 0.0);
  EXPECT_LT(layer_comm_of(far), layer_comm_of(far_plain));
  EXPECT_THROW(mixtral({kInterleaved[0], kInterleaved[1], {"parallel.moe_comm_overlap", "true"}}), ConfigError);  // needs expert > 1
  // Megatron-Core merges forward/backward steps with pipelining only in the interleaved schedule.
  expect_refused([] { mixtral({{"parallel.expert", "8"}, {"parallel.moe_comm_overlap", "true"}}); }, "parallel.moe_comm_overlap",
                 "only in the interleaved schedule");
  expect_refused([] { mixtral({{"parallel.expert", "8"}, {"parallel.schedule", "gpipe"}, {"parallel.moe_comm_overlap", "true"}}); },
                 "parallel.moe_comm_overlap", "got gpipe with pipeline 4");
}

// Megatron's merged forward/backward steps (schedules/generators.cpp pair_expert_overlap) hide
// each action's expert all-to-alls under its partner's compute, at the concurrency model's price,
// and nothing else: with tensor parallelism the TP collectives stay exposed; the warm-up and
// cool-down, unpaired, show their all-to-alls in full; both engines agree.
TEST(ExpertParallelism, MergedForwardBackwardStepsHideOnlyTheAllToAllsOfTheirPairs) {
  const std::vector<Override> ep8 = {{"parallel.expert", "8"}, kInterleaved[0], kInterleaved[1]};
  auto sets_of = [](std::vector<Override> v, bool overlap) {
    v.push_back({"parallel.moe_comm_overlap", overlap ? "true" : "false"});
    return v;
  };
  // The plan with the overlap, as mixtral() loads it (kMixtralT1, then `extra`).
  auto overlapped = [&](const std::vector<Override>& extra) {
    std::vector<Override> v = kMixtralT1;
    for (const Override& o : sets_of(extra, true)) v.push_back(o);
    return load_scenario(kRoot + "/" + kMixtral, v);
  };
  // The interleaved schedule's pairs gain, by less than the all-to-alls the pairs hold.
  const Report on = mixtral(sets_of(ep8, true)), off = mixtral(sets_of(ep8, false));
  EXPECT_LT(on.iteration_time_s, off.iteration_time_s);
  const Scenario sc = overlapped(ep8);
  const PlanCosts c = plan_costs(sc.model, sc.plan, sc.cluster);
  EXPECT_FALSE(c.pairs_hide_tp_stream);
  double a2a = 0;  // the all-to-alls of every paired action on the slowest rank, at most
  const Schedule s = make_schedule(sc.plan);
  for (const RankProgram& prog : s.programs) {
    double mine = 0;
    for (const Action& a : prog.actions)
      if (a.overlap != 0) mine += a.kind == ActionKind::F ? c.forward_ep_s[a.stage] : c.backward_ep_s[a.stage];
    a2a = std::max(a2a, mine);
  }
  ASSERT_GT(a2a, 0.0);
  EXPECT_LT(off.iteration_time_s - on.iteration_time_s, a2a);
  // Each paired action hides (1 − κ) · min(its all-to-alls, the partner's compute), no more.
  for (const RankProgram& prog : s.programs)
    for (size_t i = 0; i < prog.actions.size(); ++i) {
      const Action& a = prog.actions[i];
      if (a.overlap == 0) continue;
      Action single = a;
      single.overlap = 0;
      const double saved = action_duration_s(c, 0, single) - action_duration_s(c, 0, a);
      const double comm = a.kind == ActionKind::F ? c.forward_ep_s[a.stage] : c.backward_ep_s[a.stage];
      Action partner{a.overlap_kind, a.overlap_stage, a.microbatch};
      double ptp = 0, pshard = 0;
      const double partner_compute = action_duration_s(c, 0, partner, &ptp, &pshard) - ptp - pshard;
      EXPECT_NEAR(saved, hidden_s(partner_compute, comm, kCollectiveContention), 1e-12);
      EXPECT_GT(saved, 0.0);
    }
  // With tensor parallelism the TP collectives are not what the pairs hide.
  const std::vector<Override> tp2 = {{"parallel.tensor", "2"}, {"parallel.expert", "4"}, {"parallel.sequence_parallel", "true"},
                                     kInterleaved[0], kInterleaved[1]};
  const Scenario t2 = overlapped(tp2);
  const PlanCosts ct = plan_costs(t2.model, t2.plan, t2.cluster);
  ASSERT_GT(ct.forward_tp_s[0], ct.forward_ep_s[0]);
  Action f{ActionKind::F, 0, 5};
  f.overlap = 1, f.overlap_kind = ActionKind::B, f.overlap_stage = 0;
  Action lone = f;
  lone.overlap = 0;
  EXPECT_LE(action_duration_s(ct, 0, lone) - action_duration_s(ct, 0, f), ct.forward_ep_s[0] + 1e-12);
  // Both engines price the pairs alike.
  const Report reduced = mixtral(sets_of(ep8, true), Fidelity::Reduced);
  EXPECT_NEAR(reduced.iteration_time_s / on.iteration_time_s, 1.0, 0.05);
}

TEST(ExpertParallelism, ADroplessRunWhoseWorstCaseLoadWouldNotFitIsReportedAsSuch) {
  const Scenario sc = load_scenario(kRoot + "/" + kMixtral, {});
  const SimulationResult dropless = simulate(input_of(sc), make_schedule(sc.plan), Fidelity::Analytic, false);
  EXPECT_TRUE(dropless.report.fits_in_memory);
  bool said = false;
  for (const auto& w : dropless.warnings) said = said || w.find("dropless routing") != std::string::npos;
  EXPECT_TRUE(said);
  // With a capacity factor the busiest expert is bounded: nothing to say.
  const Scenario capped = load_scenario(kRoot + "/" + kMixtral, {{"model.moe.capacity_factor", "1.25"}});
  for (const auto& w : simulate(input_of(capped), make_schedule(capped.plan), Fidelity::Analytic, false).warnings)
    EXPECT_EQ(w.find("dropless routing"), std::string::npos) << w;
}

TEST(ExpertParallelism, RefusalsNameTheKeyAndTheNumbers) {
  auto refused = [](std::vector<Override> sets, const std::string& key, const std::string& words) {
    expect_refused([&] { mixtral(sets); }, key, words);
  };
  refused({{"parallel.expert", "3"}}, "parallel.expert", "num_experts (8)");
  refused({{"parallel.expert", "8"}, {"parallel.pipeline", "32"}}, "parallel.expert", "must divide tensor × context × data");
  refused({{"parallel.tensor", "2"}, {"parallel.expert", "2"}}, "parallel.sequence_parallel", "needs sequence parallelism");
  refused({{"parallel.moe_dispatcher", "deepep"}}, "parallel.moe_dispatcher", "alltoall, allgather or flex");
  refused({{"parallel.moe_dispatcher", "deepep"}}, "parallel.moe_dispatcher", "DeepEP as its flex dispatcher");
  try {
    run(kLlama8b, {{"parallel.expert", "2"}});
    ADD_FAILURE() << "EP on a dense model accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key_path(), "parallel.expert");
  }
}

// Llama 3 8B at 128k tokens on 64 GPUs: context parallelism against tensor parallelism.
Report long_context(std::vector<Override> sets, Fidelity f = Fidelity::Analytic) {
  std::vector<Override> base = {{"model.seq_length", "131072"}, {"training.global_batch", "64"}, {"cluster.gpus", "64"},
                                {"parallel.recompute", "full"}};
  base.insert(base.end(), sets.begin(), sets.end());
  return run(kLlama8b, base, f);
}

TEST(ContextParallelism, SplitsActivationsAndAddsTheRingExchange) {
  const Report cp1 = long_context({{"parallel.tensor", "2"}});
  const Report cp4 = long_context({{"parallel.tensor", "2"}, {"parallel.context", "4"}});
  // Each rank holds s/4 tokens: the activations fall (the model states do not).
  EXPECT_LT(cp4.peak_memory_bytes, cp1.peak_memory_bytes);
  // The same work over 4× the GPUs (d falls from 32 to 8): the iteration takes about as long
  // with 4× fewer microbatches per rank... here d stays 32/4 with the same global batch.
  const Scenario sc = load_scenario(kRoot + "/" + std::string(kLlama8b),
                                    {{"model.seq_length", "131072"}, {"training.global_batch", "64"}, {"cluster.gpus", "64"},
                                     {"parallel.tensor", "2"}, {"parallel.context", "4"}});
  EXPECT_EQ(sc.plan.data, 8);
  EXPECT_EQ(sc.plan.gradient_ranks(), 32);
  // Per layer and rank, the attention kernel does a quarter of the causal work.
  const auto fwd1 = layer_ops(sc.model, load_scenario(kRoot + "/" + std::string(kLlama8b),
                                                      {{"model.seq_length", "131072"}, {"training.global_batch", "64"},
                                                       {"cluster.gpus", "64"}, {"parallel.tensor", "2"}}).plan, Pass::Forward);
  const auto fwd4 = layer_ops(sc.model, sc.plan, Pass::Forward);
  double att1 = 0, att4 = 0, ring_bytes = 0;
  for (const Op& op : fwd1)
    if (op.kind == OpKind::Attention) att1 += op.flops;
  for (const Op& op : fwd4) {
    if (op.kind == OpKind::Attention) att4 += op.flops;
    if (op.kind == OpKind::RingExchange) ring_bytes = op.bytes * static_cast<double>(op.ring_steps);
  }
  EXPECT_NEAR(att4 / att1, 0.25, 1e-9);
  // The ring moves (cp − 1) K/V chunks of s/cp tokens: 3 · b · s/4 · 2 · kv / t · 2 bytes.
  const double kv = static_cast<double>(sc.model.kv_width());
  EXPECT_NEAR(ring_bytes, 3 * 131072.0 / 4 * 2 * kv / 2 * 2, 1);
}

TEST(ContextParallelism, TheRingHidesItsTransfersBehindAttentionAndTheAllGatherDoesNot) {
  const Report ring = long_context({{"parallel.tensor", "2"}, {"parallel.context", "4"}});
  const Report gather = long_context({{"parallel.tensor", "2"}, {"parallel.context", "4"}, {"parallel.context_comm", "allgather"}});
  EXPECT_LT(layer_comm_of(ring), layer_comm_of(gather));
  EXPECT_LT(ring.exposed_comm_s.at("cp"), gather.exposed_comm_s.at("cp"));  // reported as context-parallel time
  EXPECT_GT(gather.exposed_comm_s.at("cp"), 0.0);
  EXPECT_LT(ring.iteration_time_s, gather.iteration_time_s);
  // SimGrid places the context ranks between tensor and data ranks and agrees within 10 %.
  const Report sim = long_context({{"parallel.tensor", "2"}, {"parallel.context", "4"}}, Fidelity::Reduced);
  EXPECT_NEAR(sim.iteration_time_s / ring.iteration_time_s, 1.0, 0.10);
}

TEST(ContextParallelism, RefusalsNameTheKeyAndTheNumbers) {
  auto refused = [](std::vector<Override> sets, const std::string& key, const std::string& words) {
    expect_refused([&] { long_context(sets); }, key, words);
  };
  refused({{"parallel.context", "3"}}, "parallel.context", "must divide cluster.gpus");
  refused({{"parallel.context", "4"}, {"model.seq_length", "131076"}}, "parallel.context", "must be divisible by it");
  refused({{"parallel.context", "2"}, {"model.attention", "unfused"}}, "parallel.context", "flash");
  refused({{"parallel.context_comm", "a2a"}}, "parallel.context_comm", "ring, allgather or alltoall");
  // Ulysses gives each context rank 1/cp of a tensor rank's heads: Llama 3 8B's 8 key/value heads
  // do not split over t 2 × cp 8.
  refused({{"parallel.tensor", "2"}, {"parallel.context", "8"}, {"parallel.context_comm", "alltoall"}}, "parallel.context_comm",
          "must divide the attention heads (32) and the key/value heads (8)");
  refused({{"parallel.tensor", "2"}, {"parallel.context", "4"}, {"parallel.context_comm", "alltoall"}, {"training.framework", "torchtitan"}},
          "parallel.context_comm", "no all-to-all (Ulysses)");
  refused({{"parallel.tensor", "2"}, {"parallel.context", "4"}, {"training.framework", "deepspeed"}, {"parallel.zero_stage", "1"}},
          "parallel.context", "parallel.context_comm: alltoall");
}

TEST(ContextParallelism, UlyssesTradesTheSequenceShardForAHeadShard) {
  // Llama 3 8B at 128k, t 2 · cp 4: the attention core between two all-to-alls over the context
  // group (Q, K, V in; the output back), the kernel on the whole sequence with 1/cp of the tensor
  // rank's heads, and the same causal work as the ring's blocks.
  auto scenario = [](const char* comm) {
    return load_scenario(kRoot + "/" + std::string(kLlama8b), {{"model.seq_length", "131072"}, {"training.global_batch", "64"},
                                                               {"cluster.gpus", "64"}, {"parallel.tensor", "2"}, {"parallel.context", "4"},
                                                               {"parallel.context_comm", comm}});
  };
  const Scenario ulysses = scenario("alltoall"), ring = scenario("ring");
  const TransformerSpec& m = ulysses.model;
  const double s = 131072, t = 2, cp = 4, e = 2, q = static_cast<double>(m.q_width()), kv = static_cast<double>(m.kv_width());
  auto attention_flops = [](const std::vector<Op>& ops) {
    double f = 0;
    for (const Op& op : ops) f += op.kind == OpKind::Attention ? op.flops : 0.0;
    return f;
  };
  for (Pass pass : {Pass::Forward, Pass::Backward}) {
    const std::vector<Op> ops = layer_ops(m, ulysses.plan, pass);
    std::vector<double> alltoall;
    for (const Op& op : ops) {
      EXPECT_NE(op.kind, OpKind::RingExchange) << op.name;
      if (op.kind == OpKind::AllToAll) {
        EXPECT_EQ(op.group, CommGroup::Context) << op.name;
        alltoall.push_back(op.bytes);
      }
      if (op.kind == OpKind::Attention) {
        EXPECT_EQ(op.seq, 131072) << op.name;
        EXPECT_EQ(op.batch, m.num_attention_heads / 8) << op.name;  // b 1 · 32 heads / (t · cp)
        EXPECT_FALSE(op.causal_blocks) << op.name;
      }
    }
    // Per rank: its s/cp tokens' q, k and v (the tensor rank's 1/t of them), then the output.
    ASSERT_EQ(alltoall.size(), 2u) << static_cast<int>(pass);
    const double qkv = e * s / cp * (q + 2 * kv) / t, out = e * s / cp * q / t;
    EXPECT_DOUBLE_EQ(pass == Pass::Forward ? alltoall[0] : alltoall[1], qkv);
    EXPECT_DOUBLE_EQ(pass == Pass::Forward ? alltoall[1] : alltoall[0], out);
    EXPECT_NEAR(attention_flops(ops) / attention_flops(layer_ops(ring.model, ring.plan, pass)), 1.0, 1e-12);
  }
  // The knob moves the prediction: the all-to-alls are exposed context-parallel time where the
  // ring hides its steps under the blocks; the whole-sequence kernel runs at the single-GPU
  // kernel's efficiency where the ring's blocks run slower.
  const Report r_ring = long_context({{"parallel.tensor", "2"}, {"parallel.context", "4"}});
  const Report r_ulysses = long_context({{"parallel.tensor", "2"}, {"parallel.context", "4"}, {"parallel.context_comm", "alltoall"}});
  EXPECT_GT(r_ulysses.exposed_comm_s.at("cp"), r_ring.exposed_comm_s.at("cp"));
  EXPECT_NE(r_ulysses.iteration_time_s, r_ring.iteration_time_s);
  // Wider key/value heads (multi-head attention: 32 groups) move more bytes through the all-to-alls.
  const Report mha = long_context({{"parallel.tensor", "2"}, {"parallel.context", "4"}, {"parallel.context_comm", "alltoall"},
                                   {"model.num_query_groups", "32"}});
  EXPECT_GT(mha.exposed_comm_s.at("cp"), r_ulysses.exposed_comm_s.at("cp"));
  // SimGrid runs the lowered all-to-alls and agrees within 10 %.
  const Report sim = long_context({{"parallel.tensor", "2"}, {"parallel.context", "4"}, {"parallel.context_comm", "alltoall"}}, Fidelity::Reduced);
  EXPECT_NEAR(sim.iteration_time_s / r_ulysses.iteration_time_s, 1.0, 0.10);
}

}  // namespace
}  // namespace ptdp
