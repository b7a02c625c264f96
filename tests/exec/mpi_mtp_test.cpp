// Multi-token prediction (model.mtp_layers; exec/model/mtp.hpp) under mpirun: every parallel
// layout trains as serial training does, the loss is the LM loss plus mtp_loss_scale / D times
// the modules' losses, the state dict names the modules' tensors as model/tensors.hpp does, and
// a resumed run reproduces the uninterrupted one bit for bit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

TEST(MpiMtp, WhatTheExecutorDoesNotRunWithMtpIsOneClearError) {
  const MpiRun cp = run_ranks(2, kDense + " --mtp 1 --cp 2");
  EXPECT_EQ(cp.exit_code, 2) << cp.output;
  EXPECT_GE(count(cp.output, "parallel.context: with model.mtp_layers"), 1u) << cp.output;
  const MpiRun learned = run_ranks(1, kDense + " --mtp 1 --pos learned");
  EXPECT_EQ(learned.exit_code, 2) << learned.output;
  EXPECT_GE(count(learned.output, "model.position_embedding: with model.mtp_layers"), 1u) << learned.output;
}

}  // namespace
