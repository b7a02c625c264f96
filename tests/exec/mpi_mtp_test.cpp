// Multi-token prediction (model.mtp_layers; exec/model/mtp.hpp) under mpirun: every parallel
// layout trains as serial training does, the loss is the LM loss plus mtp_loss_scale / D times
// the modules' losses, the state dict names the modules' tensors as model/tensors.hpp does (and
// model.safetensors as Megatron-Core does, loading into another layout), and a resumed run
// reproduces the uninterrupted one bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "exec/io/checkpoint.hpp"
#include "tests/exec/mpi_run.hpp"

namespace {

using namespace mpi_test;

// A Llama-style tiny model (rotary positions: the executor's MTP runs without learned ones).
const std::string kDense = "--layers 2 --hidden 32 --heads 4 --groups 2 --ffn 48 --mlp swiglu --norm rmsnorm --seq 16 --vocab 256 "
                           "--micro 2 --global 8 --seed 7 --steps 3";
const std::string kMoe = kDense + " --experts 4 --topk 2 --expert-ffn 32";

// Losses, gradient norm and parameters within 1e-5 of serial training (fp32).
void expect_layouts_match_serial(const std::string& model, const std::vector<std::pair<int, std::string>>& layouts) {
  const MpiRun& serial = run_cached(1, model);
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  for (const auto& [ranks, args] : layouts) expect_same_training(serial, run_ranks(ranks, model + " " + args), model + " " + args, 1e-5, 1e-5);
}

TEST(MpiMtp, OneModuleTrainsInEveryLayoutAsSerialTrainingDoes) {
  // Tied and untied output layers: untied, the last stage keeps a copy of the word embedding for
  // the module's lookups, summed with the first stage's.
  for (const std::string tie : {"", " --untied 1"})
    expect_layouts_match_serial(kDense + " --mtp 1" + tie, {{2, "--t 2 --sp 1"},
                                                            {2, "--p 2"},
                                                            {2, "--d 2"},
                                                            {4, "--t 2 --p 2 --sp 1 --recompute full"},
                                                            {2, "--p 2 --layout 'Ett|mL'"}});
}

TEST(MpiMtp, TwoModulesTrainInEveryLayoutAsSerialTrainingDoes) {
  expect_layouts_match_serial(kDense + " --mtp 2 --untied 1", {{2, "--t 2 --sp 1"},
                                                               {4, "--p 2 --d 2"},
                                                               {2, "--p 2 --layout 'Ett|mmL' --recompute full"},
                                                               {2, "--p 2 --schedule zb-h1"}});
}

TEST(MpiMtp, DualPipeRunsTheModulesWithEachLanesLossAsSerialTrainingDoes) {
  // DeepSeek-V3's plan: DualPipe with multi-token prediction. Each lane's last stage runs the
  // modules with its lane's loss (rank p − 1 for the microbatches entering at rank 0, rank 0 for
  // the others), reading the word embedding of the first stage its rank holds for the other lane;
  // the two copies of the modules (and of the embedding) sum their gradients at REDUCE_GRAD as
  // every other stage copy does. With data and tensor parallelism, overlapped reduction, sharded
  // states, four pipeline ranks, and DualPipeV (one lane: the modules on rank 0 with the embedding).
  const std::string dualpipe = " --v 2 --schedule dualpipe";
  for (const std::string mtp : {" --mtp 1", " --mtp 2 --untied 1"}) {
    expect_layouts_match_serial(kDense + mtp, {{2, "--p 2" + dualpipe},
                                               {4, "--t 2 --sp 1 --p 2" + dualpipe},
                                               {2, "--p 2 --overlap-grad-reduce 2000" + dualpipe}});
    expect_layouts_match_serial(kDense + mtp + " --global 16", {{4, "--p 2 --d 2" + dualpipe},
                                                                {4, "--p 2 --d 2 --zero 1 --overlap-grad-reduce 2000" + dualpipe}});
    const std::string four = kDense + mtp + " --layers 4";  // a stage per rank and lane at p 4; 2p layers for dualpipev
    expect_layouts_match_serial(four + " --global 16", {{4, "--p 4" + dualpipe}});
    expect_layouts_match_serial(four, {{2, "--p 2 --v 2 --schedule dualpipev"}});
  }
  // DeepSeek-V3's model in small: multi-head latent attention, MoE layers with a shared expert and
  // the aux-loss-free bias (the module's layer routes too, its bias moved by both copies' tokens).
  const std::string v3 = "--layers 2 --hidden 32 --heads 4 --ffn 48 --mlp swiglu --norm rmsnorm --mla-kv-lora 12 --mla-qk 8 "
                         "--mla-rope 8 --mla-v 8 --mla-q-lora 16 --seq 16 --vocab 256 --micro 2 --global 16 --seed 11 --steps 3 "
                         "--adam-eps 1e-6 --experts 4 --topk 2 --expert-ffn 24 --shared-experts 1 --shared-ffn 8 "
                         "--load-balance aux_free --mtp 1 --untied 1";
  expect_layouts_match_serial(v3, {{4, "--p 2 --d 2 --ep 2" + dualpipe}, {4, "--t 2 --sp 1 --p 2" + dualpipe}});
}

TEST(MpiMtp, ContextParallelismRollsAcrossTheContextRanksAsSerialTrainingDoes) {
  // A context rank holds chunks r and 2·cp − 1 − r of each sequence: each depth's roll takes every
  // chunk's next token and label from the neighbouring rank (Megatron-Core's roll_tensor), the
  // counted positions are the whole sequence's. Ring and all-gather attention, with t 2 and
  // sequence parallelism; cp 4 has ranks with two neighbours, and chunks of 2 tokens that depth 2
  // rolls past.
  expect_layouts_match_serial(kDense + " --mtp 1", {{2, "--cp 2"},
                                                    {2, "--cp 2 --cp-comm allgather"},
                                                    {4, "--cp 2 --t 2 --sp 1"},
                                                    {4, "--cp 2 --p 2 --recompute full"}});
  expect_layouts_match_serial(kDense + " --mtp 2 --untied 1", {{2, "--cp 2"},
                                                               {4, "--cp 2 --t 2 --sp 1 --cp-comm allgather"},
                                                               {4, "--cp 4"},
                                                               {4, "--cp 4 --cp-comm allgather"}});
}

TEST(MpiMtp, MixtureOfExpertsModulesTrainInEveryLayoutAsSerialTrainingDoes) {
  // The module's layer is of the last layer's kind: an MoE layer here, its experts split like the model's.
  const MpiRun& serial = run_cached(1, kMoe + " --mtp 1 --untied 1");
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  EXPECT_TRUE(serial.result["params"].contains("mtp.layers.0.transformer_layer.mlp.experts.3.fc1.weight"));
  EXPECT_TRUE(serial.result["params"].contains("mtp.layers.0.transformer_layer.mlp.router.weight"));
  expect_layouts_match_serial(kMoe + " --mtp 1 --untied 1", {{4, "--p 2 --d 2 --ep 2"},
                                                             {4, "--t 2 --d 2 --sp 1"},
                                                             {2, "--d 2 --zero 3"},
                                                             {2, "--p 2 --layout 'Ett|mL' --recompute full"}});
}

TEST(MpiMtp, TheLossIsTheLmLossPlusTheScaledModuleLosses) {
  // Step 1 (the same initial parameters): loss(scale) = LM loss + scale / D · Σ_k loss_k, linear in
  // the scale; at scale 0 the run is the model without MTP (its shared parameters' training too).
  const MpiRun& plain = run_cached(1, kDense);
  const MpiRun& off = run_cached(1, kDense + " --mtp 2 --mtp-scale 0");
  const MpiRun& low = run_cached(1, kDense + " --mtp 2 --mtp-scale 0.1");
  const MpiRun& high = run_cached(1, kDense + " --mtp 2 --mtp-scale 0.7");
  for (const MpiRun* r : {&plain, &off, &low, &high}) ASSERT_EQ(r->exit_code, 0) << r->output;
  auto first = [](const MpiRun& r) { return r.result["losses"].get<std::vector<double>>().front(); };
  EXPECT_NEAR(first(off), first(plain), 1e-9 * first(plain));
  EXPECT_NEAR(off.result["grad_norm"].get<double>(), plain.result["grad_norm"].get<double>(), 1e-6);
  const double mtp_mean = (first(low) - first(plain)) / 0.1;  // 1/D Σ_k loss_k
  EXPECT_NEAR(mtp_mean, std::log(256.0), 0.3);                // untrained modules: about uniform
  EXPECT_NEAR(first(high), first(plain) + 0.7 * mtp_mean, 1e-6 * first(high));
  // The report gives the modules' mean loss apart (`ptdp train --json`: mtp_losses).
  ASSERT_TRUE(low.result.contains("mtp_losses")) << low.output;
  EXPECT_NEAR(low.result["mtp_losses"][0].get<double>(), mtp_mean, 1e-6 * mtp_mean);
  EXPECT_FALSE(plain.result.contains("mtp_losses"));
  // Training follows the loss: the modules' weight changes the updates.
  EXPECT_NE(low.result["losses"].get<std::vector<double>>().back() - first(low),
            high.result["losses"].get<std::vector<double>>().back() - first(high));
  // The state dict names the modules' tensors as model/tensors.hpp declares them.
  for (const std::string name : {"mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", "mtp.layers.1.eh_proj.weight",
                                 "mtp.layers.1.transformer_layer.attention.qkv.weight", "mtp.layers.1.final_layernorm.weight"})
    EXPECT_TRUE(low.result["params"].contains(name)) << name;
  EXPECT_EQ(low.result["params"]["mtp.layers.0.eh_proj.weight"].size(), 2u * 32 * 32);
}

TEST(MpiMtp, ARunResumedFromACheckpointReproducesTheUninterruptedRunBitForBit) {
  const std::string model = kDense + " --mtp 2 --untied 1 --t 2 --p 2 --sp 1";
  const std::string dir = temp_dir("mtp-ckpt");
  const MpiRun full = run_ranks(4, model + " --steps 5");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const auto all = full.result["losses"].get<std::vector<double>>();
  const MpiRun first = run_ranks(4, model + " --steps 2 --checkpoint " + dir);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const MpiRun second = run_ranks(4, model + " --steps 5 --resume --checkpoint " + dir);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(second.result["losses"].get<std::vector<double>>(), std::vector<double>(all.begin() + 2, all.end()));
  EXPECT_EQ(second.result["params"], full.result["params"]);
}

// The checkpoint names the module count: a resume with another is exit 2 naming the key (before,
// the first missing tensor), and the save stays.
TEST(MpiMtp, AResumeWithAnotherModuleCountNamesTheKeyAndKeepsTheSave) {
  const std::string dir = temp_dir("mtp-ckpt-count");
  const MpiRun first = run_ranks(2, kDense + " --mtp 1 --p 2 --steps 2 --checkpoint " + dir);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const MpiRun other = run_ranks(2, kDense + " --mtp 2 --p 2 --steps 4 --resume --checkpoint " + dir);
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("model.mtp_layers = 1, this run has 2"), std::string::npos) << other.output;
  const MpiRun same = run_ranks(2, kDense + " --mtp 1 --p 2 --steps 4 --resume --checkpoint " + dir);
  EXPECT_EQ(same.exit_code, 0) << same.output;
}

TEST(MpiMtp, TheSavedMegatronStateDictLoadsIntoAnotherLayoutWithTheModulesParametersAndLoss) {
  const std::string model = kDense + " --mtp 2 --untied 1";
  const std::string dir = temp_dir("mtp-state-dict");
  const MpiRun saved = run_ranks(4, model + " --t 2 --p 2 --sp 1 --steps 2 --save-every 2 --checkpoint " + dir);
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  std::string step;
  std::ifstream(dir + "/latest") >> step;
  const std::string file = dir + "/" + step + "/model.safetensors";
  // Megatron-Core's names; eh_proj whole ([h, 2h], column-parallel at t 2) as ptdp's transposed.
  std::map<std::string, ptdp::exec::NamedTensor> state;
  for (auto& t : ptdp::exec::decode_safetensors(ptdp::exec::read_file(file, uint64_t{1} << 26), "model.safetensors")) state[t.name] = t;
  ASSERT_TRUE(state.count("mtp.layers.1.eh_proj.weight"));
  EXPECT_EQ(state["mtp.layers.1.eh_proj.weight"].shape, (std::vector<int64_t>{32, 64}));
  const auto eh = saved.result["params"]["mtp.layers.1.eh_proj.weight"].get<std::vector<float>>();  // [2h, h]
  for (size_t o = 0; o < 32; o += 7)
    for (size_t i = 0; i < 64; i += 5) ASSERT_EQ(state["mtp.layers.1.eh_proj.weight"].values[o * 64 + i], eh[i * 32 + o]) << o << ", " << i;
  for (const std::string name : {"mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", "mtp.layers.1.final_layernorm.weight",
                                 "mtp.layers.0.transformer_layer.self_attention.linear_qkv.weight",
                                 "mtp.layers.1.transformer_layer.mlp.linear_fc1.weight"})
    EXPECT_TRUE(state.count(name)) << name;
  // Loaded (another seed; an update of 1e-30 leaves them as read) serially and at t 2: the saved
  // parameters, one loss.
  const std::string load = model + " --steps 1 --lr 1e-30 --seed 8 --init " + file;
  const MpiRun serial = run_ranks(1, load);
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  ASSERT_EQ(serial.result["params"].size(), saved.result["params"].size());
  for (const auto& [name, values] : saved.result["params"].items()) {
    ASSERT_TRUE(serial.result["params"].contains(name)) << name;
    const auto mine = serial.result["params"][name].get<std::vector<float>>(), theirs = values.get<std::vector<float>>();
    ASSERT_EQ(mine.size(), theirs.size()) << name;
    for (size_t i = 0; i < mine.size(); ++i) ASSERT_NEAR(mine[i], theirs[i], 1e-20) << name << "[" << i << "]";
  }
  expect_same_training(serial, run_ranks(2, load + " --t 2 --sp 1"), load + " --t 2 --sp 1", 1e-5, 1e-5);
  // The model of another seed has another loss: the file's modules were read.
  const MpiRun fresh = run_ranks(1, model + " --steps 1 --lr 1e-30 --seed 8");
  ASSERT_EQ(fresh.exit_code, 0) << fresh.output;
  EXPECT_NE(fresh.result["losses"][0].get<double>(), serial.result["losses"][0].get<double>());
  // Another module count: exit 2 naming the tensor.
  const MpiRun one = run_ranks(1, kDense + " --mtp 1 --untied 1 --steps 1 --init " + file);
  EXPECT_EQ(one.exit_code, 2) << one.output;
  EXPECT_GE(count(one.output, "tensor 'mtp.layers.1."), 1u) << one.output;
  // transformers' Llama has no MTP modules: --hf refuses, naming one.
  const MpiRun hf = hf_export_of(dir);
  EXPECT_EQ(hf.exit_code, 2);
  EXPECT_EQ(count(hf.output, "--hf: the model has multi-token prediction ('mtp.layers.0."), 1u) << hf.output;
}

TEST(MpiMtp, Fp8EmulatesTheProjectionAndStaysWithinTheFp8ToleranceOfFp32) {
  // training.precision fp8: eh_proj is a linear layer as the others (its [embedding; hidden]
  // input and weight cast with the recipe's scales, its own amax history), the modules' losses
  // within the README's FP8 tolerance (5e-3 relative) of fp32.
  const std::string model = kDense + " --mtp 2 --untied 1 --lr 0.01 --steps 4";
  const MpiRun& fp32 = run_cached(1, model);
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  ASSERT_TRUE(fp32.result.contains("mtp_losses")) << fp32.output;
  auto worst = [&](const MpiRun& r, const char* key, const MpiRun& of) {
    const auto a = r.result[key].get<std::vector<double>>(), b = of.result[key].get<std::vector<double>>();
    double w = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) w = std::max(w, std::abs(a[i] - b[i]) / std::abs(b[i]));
    return w;
  };
  const MpiRun& bf16 = run_cached(1, model + " --precision bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  for (const std::string recipe : {"tensorwise", "mxfp8"}) {
    SCOPED_TRACE(recipe);
    const MpiRun& fp8 = run_cached(1, model + " --precision fp8 --fp8-recipe " + recipe);
    ASSERT_EQ(fp8.exit_code, 0) << fp8.output;
    const double mtp = worst(fp8, "mtp_losses", fp32), all = worst(fp8, "losses", fp32);
    std::printf("fp8 %s with MTP: module losses within %.2e relative of fp32, losses %.2e (bf16: %.2e, %.2e)\n", recipe.c_str(), mtp,
                all, worst(bf16, "mtp_losses", fp32), worst(bf16, "losses", fp32));
    EXPECT_GT(mtp, worst(bf16, "mtp_losses", fp32)) << "the fp8 casts did not run";
    EXPECT_LT(mtp, 5e-3);
    EXPECT_LT(all, 5e-3);
    const auto losses = fp8.result["mtp_losses"].get<std::vector<double>>();
    EXPECT_LT(losses.back(), losses.front());
  }
  // At t 2 with sequence parallelism (each shard's own amax): within FP8's rounding of fp32.
  const MpiRun layout = run_ranks(2, model + " --precision fp8 --t 2 --sp 1");
  ASSERT_EQ(layout.exit_code, 0) << layout.output;
  EXPECT_LT(worst(layout, "mtp_losses", fp32), 2e-2);
}

TEST(MpiMtp, WhatTheExecutorDoesNotRunWithMtpIsOneClearError) {
  const MpiRun learned = run_ranks(1, kDense + " --mtp 1 --pos learned");
  EXPECT_EQ(learned.exit_code, 2) << learned.output;
  EXPECT_GE(count(learned.output, "model.position_embedding: with model.mtp_layers"), 1u) << learned.output;
}

}  // namespace
