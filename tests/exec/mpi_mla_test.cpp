// Multi-rank training of attention wider or narrower than the hidden size, run through mpirun:
// heads × head_dim ≠ hidden_size (Qwen3) and multi-head latent attention (DeepSeek-V2/V3), each
// parallel layout and recompute mode against serial training, the state dict against the
// declared tensors (model/tensors.hpp) and a checkpoint round trip.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "exec/io/checkpoint.hpp"
#include "model/tensors.hpp"
#include "tests/exec/mpi_run.hpp"

namespace {

using namespace mpi_test;

// Losses, gradient norm and parameters within 1e-5 of serial training (fp32). The models train
// with Adam's epsilon at 1e-6: Adam's first steps move a parameter by ≈ lr·g/(|g| + eps), so with
// Megatron's 1e-8 an element whose gradient happens to be ~1e-8 moves by a fraction of lr that
// rounding decides (measured: one kv_up element 2.5e-5 apart at t 2 while its gradient agreed to
// 1e-9); at 1e-6 every element's update is well-conditioned and the comparison checks them all.
constexpr double kTol = 1e-5;

// t 2 with and without sequence parallelism, p 2, d 2, and serial training under full and
// selective recompute, each against the serial run without recompute.
void expect_layouts_match_serial(const std::string& model, const std::string& name) {
  const MpiRun& serial = run_cached(1, model);
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  const auto losses = serial.result["losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_NEAR(losses[0], std::log(256.0), 0.1) << name;  // untrained: uniform over the vocabulary
  EXPECT_LT(losses[2], losses[0]) << name;
  struct Layout {
    int np;
    const char* args;
  };
  for (Layout l : {Layout{2, " --t 2"}, Layout{2, " --t 2 --sp 1"}, Layout{2, " --p 2"}, Layout{2, " --d 2"},
                   Layout{1, " --recompute full"}, Layout{1, " --recompute selective"}})
    expect_same_training(serial, run_ranks(l.np, model + l.args), name + l.args, kTol, kTol);
}

// A tiny Qwen3-like model: 4 query heads of width 16 in 2 groups on hidden 32, so the queries
// and the attention output are 64 wide; rotary embeddings over the 16-wide heads.
const std::string kWideHeads = "--layers 2 --hidden 32 --heads 4 --groups 2 --head-dim 16 --ffn 48 --mlp swiglu --norm rmsnorm "
                               "--seq 16 --vocab 256 --micro 2 --global 8 --seed 7 --steps 3 --adam-eps 1e-6";

// Tiny DeepSeek-like models: 4 heads of QK width 8 + 8 (non-rotary + rotary) and value width 8,
// a key/value latent of 12, a query latent of 16 (or none).
const std::string kMla = "--layers 2 --hidden 32 --heads 4 --ffn 48 --mlp swiglu --norm rmsnorm --mla-kv-lora 12 --mla-qk 8 "
                         "--mla-rope 8 --mla-v 8 --seq 16 --vocab 256 --micro 2 --global 8 --seed 7 --steps 3 --adam-eps 1e-6";
const std::string kMlaQLora = kMla + " --mla-q-lora 16";

TEST(MpiTraining, HeadsWiderThanTheHiddenSizeMatchSerialTraining) {
  expect_layouts_match_serial(kWideHeads, "head_dim 16 × 4 heads on hidden 32");
  const MpiRun& serial = run_cached(1, kWideHeads);
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  // QKV h → (heads + 2·groups)·head_dim, projection heads·head_dim → h.
  EXPECT_EQ(serial.result["params"]["layers.0.attention.qkv.weight"].size(), 32u * (4 + 2 * 2) * 16);
  EXPECT_EQ(serial.result["params"]["layers.0.attention.proj.weight"].size(), 4u * 16 * 32);
}

TEST(MpiTraining, MultiHeadLatentAttentionMatchesSerialTraining) {
  expect_layouts_match_serial(kMlaQLora, "MLA, q_lora 16");
  expect_layouts_match_serial(kMla, "MLA, queries from h");
  // Context parallelism (ring and all-gather) takes the narrower values; with layernorm latents
  // and half the rotary channels too.
  const MpiRun& serial = run_cached(1, kMlaQLora);
  expect_same_training(serial, run_ranks(2, kMlaQLora + " --cp 2"), "MLA, cp 2", kTol, kTol);
  expect_same_training(serial, run_ranks(4, kMlaQLora + " --cp 2 --t 2 --cp-comm allgather"), "MLA, cp 2 allgather, t 2", kTol, kTol);
  const std::string ln = kMla + " --norm layernorm --rotary-percent 0.5 --attention unfused";
  expect_same_training(run_cached(1, ln), run_ranks(4, ln + " --t 2 --sp 1 --p 2"), "MLA layernorm, t 2 sp, p 2", kTol, kTol);
}

// The state dict holds exactly the tensors model/tensors.hpp declares for the model, at their
// global shapes.
TEST(MpiTraining, MultiHeadLatentAttentionStateDictIsTheDeclaredTensors) {
  for (int q_lora : {16, 0}) {
    ptdp::TransformerSpec spec;
    spec.num_layers = 2;
    spec.hidden_size = 32;
    spec.num_attention_heads = 4;
    spec.ffn_hidden_size = 48;
    spec.mlp = ptdp::MlpKind::SwiGLU;
    spec.normalization = ptdp::NormKind::RMSNorm;
    spec.seq_length = 16;
    spec.vocab_size = 256;
    spec.mla = {q_lora, 12, 8, 8, 8};
    const MpiRun& run = run_cached(1, q_lora > 0 ? kMlaQLora : kMla);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto& params = run.result["params"];
    size_t declared = 0;
    for (int layer = 0; layer < 2; ++layer)
      for (const ptdp::ParamTensor& t : ptdp::layer_tensors(spec, layer)) {
        const std::string name = ptdp::tensor_name(t, layer);
        ++declared;
        ASSERT_TRUE(params.contains(name)) << name;
        EXPECT_EQ(params[name].size(), static_cast<size_t>(t.count())) << name;
      }
    EXPECT_TRUE(params.contains("layers.1.attention.kv_up.weight"));
    EXPECT_EQ(params.contains("layers.0.attention.q_down.weight"), q_lora > 0);
    EXPECT_FALSE(params.contains("layers.0.attention.qkv.weight"));
    // The layers' and the embedding's and head's (word embedding, final norm): nothing else.
    EXPECT_EQ(params.size(), declared + 2) << params.dump().substr(0, 400);
  }
}

TEST(MpiTraining, MultiHeadLatentAttentionCheckpointResumesBitForBit) {
  const std::string dir = temp_dir("mla-ckpt");
  const std::string model = kMlaQLora + " --t 2 --p 2";
  const MpiRun full = run_ranks(4, model + " --steps 4");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const auto all = full.result["losses"].get<std::vector<double>>();
  const MpiRun first = run_ranks(4, model + " --steps 2 --save-every 2 --checkpoint " + dir);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // The saved model is Megatron-Core's MLASelfAttention state dict: [out, in] weights of the
  // declared widths, kv_up's rows per head [k_nope (8) | v (8)] as ptdp's columns.
  std::string step;
  std::ifstream(dir + "/latest") >> step;
  std::map<std::string, ptdp::exec::NamedTensor> saved;
  for (auto& t : ptdp::exec::decode_safetensors(ptdp::exec::read_file(dir + "/" + step + "/model.safetensors", uint64_t{1} << 26),
                                                "model.safetensors"))
    saved[t.name] = t;
  const std::string sa = "decoder.layers.1.self_attention.";
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"linear_q_down_proj.weight", {16, 32}}, {"q_layernorm.weight", {16}},      {"linear_q_up_proj.weight", {4 * 16, 16}},
      {"linear_kv_down_proj.weight", {12 + 8, 32}}, {"kv_layernorm.weight", {12}}, {"linear_kv_up_proj.weight", {4 * 16, 12}},
      {"linear_proj.weight", {32, 4 * 8}}};
  for (const auto& [name, shape] : shapes) {
    ASSERT_TRUE(saved.count(sa + name)) << sa + name;
    EXPECT_EQ(saved[sa + name].shape, shape) << name;
  }
  EXPECT_FALSE(saved.count(sa + "linear_qkv.weight"));
  const auto kv_up = first.result["params"]["layers.1.attention.kv_up.weight"].get<std::vector<float>>();  // [12, 64]
  const auto& meg = saved[sa + "linear_kv_up_proj.weight"].values;                                        // [64, 12]
  ASSERT_EQ(kv_up.size(), meg.size());
  for (size_t r = 0; r < 64; ++r)
    for (size_t c = 0; c < 12; ++c) ASSERT_EQ(meg[r * 12 + c], kv_up[c * 64 + r]) << r << ", " << c;
  // No transformers class is written for it: one clear error naming the tensor.
  const MpiRun hf = hf_export_of(dir);
  EXPECT_EQ(hf.exit_code, 2);
  const std::string& hf_text = hf.output;
  EXPECT_EQ(count(hf_text, "error: --hf: the model has multi-head latent attention (decoder.layers.0.self_attention.linear_kv_down_proj.weight)"),
            1u) << hf_text;
  const MpiRun second = run_ranks(4, model + " --steps 4 --resume --checkpoint " + dir);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(second.result["losses"].get<std::vector<double>>(), std::vector<double>(all.begin() + 2, all.end()));
  EXPECT_TRUE(second.result["params"] == full.result["params"]) << "resumed parameters differ from the uninterrupted run";
}


// What the executor does not run with MLA is one clear error naming the key (on every rank).
TEST(MpiTraining, MultiHeadLatentAttentionRefusalsNameTheKey) {
  const std::vector<std::tuple<int, std::string, std::string>> refused = {
      {1, " --backend cuda",
       "model.mla.v_head_dim: the cuda back end's attention kernels take values as wide as the queries and keys "
       "(qk_head_dim + qk_pos_emb_head_dim = 16, v_head_dim 8)"},
      {2, " --t 2 --sp 1 --tp-comm-overlap 1",
       "parallel.tp_comm_overlap: the executor runs multi-head latent attention's sequence-parallel collectives whole"}};
  for (const auto& [np, args, message] : refused) {
    const MpiRun run = run_ranks(np, kMla + args);
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_GE(count(run.output, message), 1u) << run.output;
  }
}

}  // namespace
