// Conformance: the executor sends what the engines price. Each plan of the matrix is trained for
// one iteration by `ptdp train --comm-ledger` under mpirun; every rank's ledger (what its process
// groups really sent, booked to the action running) must equal the lowering of communication
// (schedules/communication.hpp) for that rank's SEND/RECV, REDUCE_GRAD, OPTIM and UNSHARD actions:
// the same steps, groups, group sizes and bytes. Mutations of the lowering (a step dropped, a
// byte count doubled) must fail the comparison.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "exec/runtime/ledger.hpp"
#include "scenarios/scenario.hpp"
#include "schedules/communication.hpp"
#include "sim/costing.hpp"
#include "tests/support/temp_dir.hpp"

namespace ptdp {
namespace {

namespace fs = std::filesystem;
const std::string kRoot = PTDP_SOURCE_DIR;
// ZeRO pieces and DualPipe's reduce-scatter pad a tensor to equal parts: a few floats per rank.
constexpr double kSlackBytes = 1024;

// A known divergence between the description and the executor inside compute actions: the
// traffic of `group` of kinds `kinds` in actions of kind `pass` is compared apart and must still
// differ (when it agrees, the divergence is fixed and its entry goes).
struct Divergence {
  ActionKind pass;
  CommGroup group;
  std::vector<StepKind> kinds;
  std::string why;
};

struct Case {
  std::string name;
  std::string file;  // under scenarios/
  std::vector<Override> sets;
  bool import_csv = false;  // train the plan's schedule exported as a compute-only CSV
  std::vector<Divergence> divergences = {};
};

struct PlanRun {
  int exit_code = -1;
  std::string output;
  Schedule schedule;
  Scenario scenario;
  std::vector<std::vector<exec::LedgerEntry>> ledgers;  // per world rank
  std::vector<int> pipeline_rank;
};

std::string run_command(const std::string& cmd, int* exit_code) {
  std::string out;
  FILE* pipe = ::popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) out += buf;
  const int status = ::pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

PlanRun run_case(const Case& c) {
  PlanRun r;
  const fs::path dir = ptdp::testing::scratch_dir("ptdp-conformance") / c.name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string scenario = kRoot + "/scenarios/" + c.file;
  std::string sets;
  for (const Override& o : c.sets) sets += " --set " + o.key + "=" + o.value;
  r.scenario = load_scenario(scenario, c.sets);
  std::string schedule_flag;
  if (c.import_csv) {
    const std::string csv = (dir / "schedule.csv").string();
    int code = 0;
    const std::string out = run_command(std::string(PTDP_BINARY) + " schedule export " + scenario + sets + " --csv " + csv +
                                            " --format compute",
                                        &code);
    EXPECT_EQ(code, 0) << out;
    std::ifstream in(csv);
    std::stringstream text;
    text << in.rdbuf();
    r.schedule = adopt_schedule(from_csv(text.str(), csv), r.scenario.plan, csv);
    schedule_flag = " --schedule " + csv;
  } else {
    r.schedule = make_costed_schedule(r.scenario.model, r.scenario.plan, r.scenario.cluster);
  }
  const int ranks = static_cast<int>(r.scenario.plan.gpus());
  const std::string prefix = (dir / "ledger").string();
  r.output = run_command("timeout 150 " + std::string(PTDP_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " +
                             std::to_string(ranks) + " " + PTDP_BINARY + " train " + scenario + sets + schedule_flag +
                             " --steps 1 --comm-ledger " + prefix,
                         &r.exit_code);
  for (int g = 0; g < ranks && r.exit_code == 0; ++g) {
    const std::string path = prefix + ".rank" + std::to_string(g) + ".json";
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    r.ledgers.push_back(exec::ledger_from_json(text.str(), path));
    r.pipeline_rank.push_back(ProcessGrid(r.scenario.plan).coord(g).pp);
  }
  return r;
}

// The cases of the matrix, run once each (several tests read them).
const PlanRun& run_of(const Case& c) {
  static std::map<std::string, PlanRun> runs;
  auto it = runs.find(c.name);
  if (it == runs.end()) it = runs.emplace(c.name, run_case(c)).first;
  return it->second;
}

const std::vector<Case>& matrix() {
  static const std::vector<Case> cases = {
      {"tensor-pipeline-scatter-gather", "tiny-gpt-cpu.yaml", {}},
      {"data-pipeline", "tiny-gpt-cpu.yaml", {{"parallel.tensor", "1"}, {"parallel.data", "2"}}},
      {"sequence-parallel", "tiny-gpt-cpu.yaml",
       {{"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.sequence_parallel", "true"}}},
      // tp_comm_overlap: the sequence-parallel collectives in the members' blocks under their
      // GEMMs move what the whole ones move.
      {"sequence-parallel-chunked", "tiny-gpt-cpu.yaml",
       {{"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.sequence_parallel", "true"}, {"parallel.tp_comm_overlap", "true"}}},
      {"zero-1", "tiny-gpt-cpu.yaml", {{"parallel.tensor", "1"}, {"parallel.data", "2"}, {"parallel.zero_stage", "1"}}},
      // Stage 3: each unit's parameters gathered over the sharding group in F and again in B. With
      // tied embeddings at p 1 the word embedding is gathered once per pass and held from the
      // embedding to the head (forward) and back (backward), counted in the embedding's unit.
      {"zero-3", "tiny-gpt-cpu.yaml",
       {{"cluster.gpus", "2"}, {"parallel.tensor", "1"}, {"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.zero_stage", "3"}}},
      {"zero-3-tied-reshard-2", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.pipeline", "1"}, {"parallel.data", "4"}, {"parallel.zero_stage", "3"},
        {"parallel.reshard_after_forward", "2"}}},
      {"zero-3-untied", "tiny-gpt-cpu.yaml",
       {{"cluster.gpus", "2"}, {"parallel.tensor", "1"}, {"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.zero_stage", "3"},
        {"model.tie_embeddings", "false"}}},
      // FSDP2's reshard_after_forward: false keeps every unit whole to its backward (no gather
      // there); N = 2 of 4 keeps half of it, re-gathered in the backward over those 2 ranks;
      // torchtitan's default keeps the head unit whole (the backward gathers the others).
      {"zero-3-kept", "tiny-gpt-cpu.yaml",
       {{"cluster.gpus", "2"}, {"parallel.tensor", "1"}, {"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.zero_stage", "3"},
        {"model.tie_embeddings", "false"}, {"parallel.reshard_after_forward", "false"}}},
      {"zero-3-reshard-2", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.pipeline", "1"}, {"parallel.data", "4"}, {"parallel.zero_stage", "3"},
        {"model.tie_embeddings", "false"}, {"parallel.reshard_after_forward", "2"}}},
      {"zero-3-torchtitan-tied", "tiny-gpt-cpu.yaml",
       {{"cluster.gpus", "2"}, {"parallel.tensor", "1"}, {"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.zero_stage", "3"},
        {"training.framework", "torchtitan"}}},
      {"zero-3-torchtitan", "tiny-gpt-cpu.yaml",
       {{"cluster.gpus", "2"}, {"parallel.tensor", "1"}, {"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.zero_stage", "3"},
        {"model.tie_embeddings", "false"}, {"training.framework", "torchtitan"}}},
      // torchtitan's FSDP with pipelines: one gather per stage and step (UNSHARD), one
      // reduce-scatter per stage and step (REDUCE_GRAD).
      {"fsdp-pipeline", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.data", "2"}, {"parallel.zero_stage", "3"}, {"training.framework", "torchtitan"}}},
      {"overlap-grad-reduce", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.data", "2"}, {"parallel.overlap_grad_reduce", "true"}, {"parallel.bucket_size", "40000"}}},
      // The distributed optimizer's overlaps: the buckets' reduce-scatters started in the last
      // backward (booked to REDUCE_GRAD), the parameter all-gathers started in OPTIM and waited
      // for in the next forwards.
      {"zero-1-overlaps", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.data", "2"}, {"parallel.zero_stage", "1"}, {"parallel.overlap_grad_reduce", "true"},
        {"parallel.overlap_param_gather", "true"}, {"parallel.bucket_size", "40000"}}},
      // Hybrid sharding: each bucket's shard all-reduced over the replicas once its
      // reduce-scatter completed (booked to REDUCE_GRAD as the buckets are).
      {"zero-1-hybrid-overlap", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.pipeline", "1"}, {"parallel.data", "4"}, {"parallel.zero_stage", "1"},
        {"parallel.sharding_group", "node"}, {"cluster.topology.node.gpus", "2"}, {"parallel.overlap_grad_reduce", "true"},
        {"parallel.bucket_size", "40000"}}},
      {"interleaved", "tiny-gpt-cpu.yaml",
       {{"cluster.gpus", "2"}, {"parallel.tensor", "1"}, {"parallel.schedule", "interleaved"}, {"parallel.virtual_stages", "2"},
        {"parallel.overlap_p2p", "true"}, {"training.global_batch", "8"}}},
      {"zb-v", "tiny-gpt-cpu.yaml",
       {{"cluster.gpus", "2"}, {"parallel.tensor", "1"}, {"parallel.schedule", "zb-v"}, {"parallel.virtual_stages", "2"}}},
      {"dualpipe", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.data", "2"}, {"parallel.schedule", "dualpipe"}, {"parallel.virtual_stages", "2"},
        {"training.global_batch", "32"}}},
      // overlap_grad_reduce: at stage 0 the copies' sum stays folded into REDUCE_GRAD's reduction
      // (nothing bucketed); at stage 1 the first pipeline rank's reduce-scatters run in buckets.
      {"dualpipe-overlap", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.data", "2"}, {"parallel.schedule", "dualpipe"}, {"parallel.virtual_stages", "2"},
        {"training.global_batch", "32"}, {"parallel.overlap_grad_reduce", "true"}, {"parallel.bucket_size", "40000"}}},
      {"dualpipe-zero-1-overlap", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.data", "2"}, {"parallel.schedule", "dualpipe"}, {"parallel.virtual_stages", "2"},
        {"training.global_batch", "32"}, {"parallel.zero_stage", "1"}, {"parallel.overlap_grad_reduce", "true"},
        {"parallel.bucket_size", "40000"}}},
      // Multi-head latent attention at t 2 with sequence parallelism: the latents gathered once
      // for the up projections, their input gradient reduce-scattered once, the replicated down
      // projections' and latent norms' gradients summed over the tensor group.
      {"mla-sequence-parallel", "tiny-gpt-cpu.yaml",
       {{"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.sequence_parallel", "true"}, {"model.position_embedding", "rope"},
        {"model.normalization", "rmsnorm"}, {"model.mla.q_lora_rank", "48"}, {"model.mla.kv_lora_rank", "32"},
        {"model.mla.qk_head_dim", "24"}, {"model.mla.qk_pos_emb_head_dim", "8"}, {"model.mla.v_head_dim", "16"}}},
      {"mla-tensor", "tiny-gpt-cpu.yaml",
       {{"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"model.position_embedding", "rope"}, {"model.mla.q_lora_rank", "0"},
        {"model.mla.kv_lora_rank", "32"}, {"model.mla.qk_head_dim", "24"}, {"model.mla.qk_pos_emb_head_dim", "8"},
        {"model.mla.v_head_dim", "16"}}},
      {"context", "tiny-gpt-cpu.yaml", {{"parallel.tensor", "1"}, {"parallel.context", "2"}, {"model.attention", "flash"}}},
      // The all-gather variant: each rank's keys and values gathered (not its queries), gathered
      // again in the backward and their gradients reduce-scattered home.
      {"context-allgather", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.context", "2"}, {"parallel.context_comm", "allgather"}, {"model.attention", "flash"},
        {"model.num_query_groups", "2"}}},
      // Ulysses: Q, K, V to the head shard and the output back (an all-to-all each), the two the
      // other way in the backward; selective recompute runs the forward's two again.
      {"context-alltoall", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.context", "2"}, {"parallel.context_comm", "alltoall"}, {"model.attention", "flash"},
        {"parallel.recompute", "selective"}}},
      {"experts", "tiny-moe-cpu.yaml", {}},
      // Sequence parallelism: each tensor rank routes its own part of the sequence; the rows it
      // receives are gathered over the expert-tensor group and the outputs reduce-scattered back.
      {"experts-sequence-parallel", "tiny-moe-cpu.yaml",
       {{"parallel.tensor", "2"}, {"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.sequence_parallel", "true"}}},
      // Folded (expert_tensor 1 at tensor 2): the expert group is each data rank's tensor pair,
      // each rank runs whole experts, their gradients reduce over the expert-data group.
      {"experts-folded", "tiny-moe-cpu.yaml",
       {{"parallel.tensor", "2"}, {"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.sequence_parallel", "true"},
        {"parallel.expert_tensor", "1"}}},
      // Sharded states with expert parallelism: the experts' states shard over their expert-data
      // group (here 2 of the 4 data ranks), where the norm sums their shards and the updated
      // weights gather; the dense ones over all 4.
      {"experts-zero-1", "tiny-moe-cpu.yaml", {{"parallel.pipeline", "1"}, {"parallel.data", "4"}, {"parallel.zero_stage", "1"}}},
      // overlap_grad_reduce with expert parallelism: the dense buckets all-reduce over the data
      // group, the routed experts' over their expert-data group (both booked to REDUCE_GRAD).
      {"experts-overlap", "tiny-moe-cpu.yaml",
       {{"parallel.pipeline", "1"}, {"parallel.data", "4"}, {"parallel.overlap_grad_reduce", "true"}, {"parallel.bucket_size", "20000"}}},
      // Multi-token prediction on the last stage, untied: that stage keeps a copy of the word
      // embedding for the modules' lookups, summed with the first stage's at REDUCE_GRAD.
      {"mtp-untied", "tiny-gpt-cpu.yaml",
       {{"model.mtp_layers", "2"}, {"model.tie_embeddings", "false"}, {"model.position_embedding", "rope"},
        {"parallel.sequence_parallel", "true"}}},
      {"mtp-tied", "tiny-gpt-cpu.yaml", {{"model.mtp_layers", "1"}, {"model.position_embedding", "rope"}}},
      {"mtp-experts", "tiny-moe-cpu.yaml", {{"model.mtp_layers", "1"}, {"model.tie_embeddings", "false"}}},
      // Context parallelism: each depth's roll sends one [token, label] pair per sequence to the
      // neighbouring context rank in the forward (mtp.roll), beside ring attention's blocks; with
      // the all-gather variant they are the context group's only sends (its all-gathers move keys
      // and values, as Transformer Engine's all_gather variant and the lowering do).
      {"mtp-context", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.context", "2"}, {"model.attention", "flash"}, {"model.mtp_layers", "2"},
        {"model.position_embedding", "rope"}}},
      {"mtp-context-allgather", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.pipeline", "1"}, {"parallel.data", "2"}, {"parallel.context", "2"},
        {"parallel.context_comm", "allgather"}, {"model.attention", "flash"}, {"model.mtp_layers", "1"},
        {"model.position_embedding", "rope"}, {"model.tie_embeddings", "false"}}},
      // DualPipe with multi-token prediction (DeepSeek-V3's plan): each lane's last stage runs the
      // modules, reading the embedding of the other lane's first stage on its rank (no copy, no
      // tied-embedding step); the modules' two copies are summed with the rest of their stages'.
      {"mtp-dualpipe", "tiny-gpt-cpu.yaml",
       {{"parallel.tensor", "1"}, {"parallel.data", "2"}, {"parallel.schedule", "dualpipe"}, {"parallel.virtual_stages", "2"},
        {"training.global_batch", "32"}, {"model.mtp_layers", "2"}, {"model.tie_embeddings", "false"},
        {"model.position_embedding", "rope"}}},
      {"mtp-dualpipe-tensor", "tiny-gpt-cpu.yaml",
       {{"parallel.schedule", "dualpipe"}, {"parallel.virtual_stages", "2"}, {"parallel.sequence_parallel", "true"},
        {"model.mtp_layers", "1"}, {"model.position_embedding", "rope"}}},
      {"imported-csv", "tiny-gpt-cpu.yaml", {{"cluster.gpus", "2"}, {"parallel.tensor", "1"}}, true},
  };
  return cases;
}

// Traffic split by the case's known divergences: (the rest, the divergent part).
std::pair<exec::Traffic, exec::Traffic> split(const exec::Traffic& t, const std::vector<Divergence>& divergences) {
  std::pair<exec::Traffic, exec::Traffic> out;
  for (const auto& [k, bytes] : t) {
    bool divergent = false;
    for (const Divergence& d : divergences)
      divergent |= k.group == d.group && std::find(d.kinds.begin(), d.kinds.end(), k.kind) != d.kinds.end() &&
                   parse_action(k.action).kind == d.pass;
    (divergent ? out.second : out.first)[k] = bytes;
  }
  return out;
}

std::vector<std::string> mismatches_of(const PlanRun& r, int world_rank, const exec::Traffic* expected_override = nullptr,
                                       const std::vector<Divergence>& divergences = {}) {
  const int pp = r.pipeline_rank[world_rank];
  const exec::Traffic expected =
      expected_override ? *expected_override : exec::expected_traffic(r.schedule, r.scenario.plan, r.scenario.model, pp);
  const exec::Traffic booked = exec::booked_traffic(r.ledgers[world_rank]);
  auto [expected_rest, expected_divergent] = split(expected, divergences);
  auto [booked_rest, booked_divergent] = split(booked, divergences);
  std::vector<std::string> bad = exec::traffic_mismatches(expected_rest, booked_rest, kSlackBytes);
  if (!divergences.empty() && exec::traffic_mismatches(expected_divergent, booked_divergent, kSlackBytes).empty())
    bad.push_back("a known divergence agrees now: remove it from the matrix (" + divergences.front().why + ")");
  return bad;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Conformance : public ::testing::TestWithParam<Case> {};

TEST_P(Conformance, TheExecutorSendsWhatTheLoweringSays) {
  const PlanRun& r = run_of(GetParam());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(r.ledgers.size(), static_cast<size_t>(r.scenario.plan.gpus()));
  size_t steps = 0;
  for (size_t g = 0; g < r.ledgers.size(); ++g) {
    const auto bad = mismatches_of(r, static_cast<int>(g), nullptr, GetParam().divergences);
    steps += exec::expected_traffic(r.schedule, r.scenario.plan, r.scenario.model, r.pipeline_rank[g]).size();
    std::string text;
    for (const auto& line : bad) text += "\n  " + line;
    EXPECT_TRUE(bad.empty()) << "rank " << g << ":" << text;
  }
  EXPECT_GT(steps, 0u) << "the plan communicates: the lowering must say so";
}

INSTANTIATE_TEST_SUITE_P(Plans, Conformance, ::testing::ValuesIn(matrix()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n = info.param.name;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

TEST(ConformanceExperts, EachPipelineRankRoutesTheBytesTheLoweringSays) {
  // The dispatchers' traffic (all-to-all over the expert group, the expert-tensor gathers and
  // reduce-scatters) depends on the routing rank by rank; summed over the ranks of a pipeline
  // rank it is fixed, and must equal the lowering's per action. A doubled step must fail it.
  int cases = 0;
  for (const Case& c : matrix()) {
    if (!load_scenario(kRoot + "/scenarios/" + c.file, c.sets).model.has_moe()) continue;
    const PlanRun& r = run_of(c);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ++cases;
    for (int pp = 0; pp < static_cast<int>(r.scenario.plan.pipeline); ++pp) {
      exec::Traffic expected, booked;
      for (size_t g = 0; g < r.ledgers.size(); ++g) {
        if (r.pipeline_rank[g] != pp) continue;
        for (const auto& [k, b] : exec::expected_routed_traffic(r.schedule, r.scenario.plan, r.scenario.model, pp)) expected[k] += b;
        for (const auto& [k, b] : exec::booked_routed_traffic(r.ledgers[g])) booked[k] += b;
      }
      ASSERT_FALSE(expected.empty()) << c.name << ": the experts communicate, the lowering must say so";
      std::string text;
      for (const auto& line : exec::traffic_mismatches(expected, booked, kSlackBytes)) text += "\n  " + line;
      EXPECT_TRUE(text.empty()) << c.name << ", pipeline rank " << pp << ":" << text;
      exec::Traffic doubled = expected;
      doubled.begin()->second *= 2;
      EXPECT_FALSE(exec::traffic_mismatches(doubled, booked, kSlackBytes).empty()) << c.name;
    }
  }
  EXPECT_EQ(cases, 6);  // experts, their SP, folded, ZeRO-1 and overlap cases, and mtp-experts (the MTP layer routes too)
}

TEST(ConformanceBuckets, TheExecutorOverlapsTheReductionsTheLoweringMarksBucketable) {
  // overlap_grad_reduce: what the executor launches in buckets (during the last backward, or
  // flushed at REDUCE_GRAD) must be the steps the lowering marks bucketable — the ones the
  // engines hide under the backward — group for group: the dense all-reduce or reduce-scatter,
  // the routed experts' over their expert-data group, the shard replicas' all-reduce.
  int cases = 0;
  for (const Case& c : matrix()) {
    const Scenario sc = load_scenario(kRoot + "/scenarios/" + c.file, c.sets);
    if (!sc.plan.overlap_grad_reduce) continue;
    const PlanRun& r = run_of(c);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (size_t g = 0; g < r.ledgers.size(); ++g) {
      const exec::Traffic expected = exec::expected_bucketed_traffic(r.schedule, r.scenario.plan, r.scenario.model, r.pipeline_rank[g]);
      const exec::Traffic booked = exec::booked_bucketed_traffic(r.ledgers[g]);
      std::string text;
      for (const auto& line : exec::traffic_mismatches(expected, booked, kSlackBytes)) text += "\n  " + line;
      EXPECT_TRUE(text.empty()) << c.name << ", rank " << g << ":" << text;
    }
    ++cases;
  }
  EXPECT_GE(cases, 5);
}

TEST(ConformanceMutations, ADroppedStepOrADoubledByteCountFails) {
  // data × pipeline: transfers, data-parallel and tied reductions; tensor × pipeline: the layers',
  // embedding's and loss's tensor-parallel collectives inside F and B, scatter/gather.
  for (const int c : {1, 0}) {
    const PlanRun& r = run_of(matrix()[static_cast<size_t>(c)]);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const exec::Traffic expected = exec::expected_traffic(r.schedule, r.scenario.plan, r.scenario.model, 0);
    ASSERT_TRUE(mismatches_of(r, 0, &expected).empty());
    int mutated = 0, compute = 0;
    for (const auto& [key, bytes] : expected) {
      exec::Traffic dropped = expected;
      dropped.erase(key);
      EXPECT_FALSE(mismatches_of(r, 0, &dropped).empty()) << "dropping " << key.action << " went unnoticed";
      exec::Traffic doubled = expected;
      doubled[key] = 2 * bytes;
      EXPECT_FALSE(mismatches_of(r, 0, &doubled).empty()) << "doubling " << key.action << " went unnoticed";
      ++mutated;
      compute += is_compute(parse_action(key.action).kind);
    }
    EXPECT_GT(mutated, 3);
    if (c == 0) { EXPECT_GT(compute, 0) << "the tensor-parallel plan's F and B hold collectives"; }
  }
}

}  // namespace
}  // namespace ptdp
