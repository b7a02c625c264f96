// Checkpoints under mpirun: resume bit for bit, Megatron's state dict, sharded checkpoints, faults
// during saves, killed and hung ranks, and the MPI communicator's timeouts.
#include <gtest/gtest.h>

#include "tests/exec/mpi_run.hpp"

namespace {

using namespace mpi_test;

std::string latest_of(const std::string& dir) {
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  return name;
}

// Every file of the directory: no temporaries, and only the published step directory.
std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(MpiTraining, ResumedRunReproducesTheUninterruptedRunBitForBit) {
  const std::string dir = temp_dir("ckpt");
  const std::string base = kTiny + " --t 2 --p 2 --checkpoint " + dir;
  const MpiRun full = run_ranks(4, kTiny + " --t 2 --p 2 --steps 8");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const auto all = full.result["losses"].get<std::vector<double>>();

  const MpiRun first = run_ranks(4, base + " --steps 3 --save-every 2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(first.result["losses"].get<std::vector<double>>(), std::vector<double>(all.begin(), all.begin() + 3));
  const std::string name = latest_of(dir);
  EXPECT_EQ(name.rfind("step-00000003-", 0), 0u) << name;
  EXPECT_TRUE(fs::exists(dir + "/" + name + "/rank-00003.safetensors"));
  EXPECT_EQ(entries_of(dir), (std::vector<std::string>{"latest", name}));  // older saves removed

  const MpiRun second = run_ranks(4, base + " --steps 6 --resume");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(second.result["first_step"].get<double>(), 3);
  EXPECT_EQ(second.result["losses"].get<std::vector<double>>(), std::vector<double>(all.begin() + 3, all.begin() + 6));

  // A fresh run into a directory holding a checkpoint is refused; the checkpoint stays.
  const MpiRun fresh = run_ranks(4, base + " --steps 2");
  EXPECT_EQ(fresh.exit_code, 2) << fresh.output;
  EXPECT_EQ(count(fresh.output, "holds the checkpoint of another run (latest: step-00000006-"), 1u) << fresh.output;
  EXPECT_EQ(count(fresh.output, "--overwrite"), 1u) << fresh.output;
  EXPECT_EQ(latest_of(dir).rfind("step-00000006-", 0), 0u);

  // Temporaries and unpublished step directories of killed saves (ptdp's: its owner file) are
  // removed at start.
  std::ofstream(dir + "/latest.tmp.4242") << "step-00000099-00000000deadbeef\n";
  fs::create_directories(dir + "/step-00000007-deadbeefdeadbeef");
  std::ofstream(dir + "/step-00000007-deadbeefdeadbeef/.ptdp-checkpoint") << "ptdp checkpoint step-00000007-deadbeefdeadbeef\n";
  std::ofstream(dir + "/step-00000007-deadbeefdeadbeef/rank-00000.safetensors.tmp.4242") << "partial";
  const MpiRun third = run_ranks(4, base + " --steps 8 --resume");
  ASSERT_EQ(third.exit_code, 0) << third.output;
  EXPECT_EQ(third.result["losses"].get<std::vector<double>>(), std::vector<double>(all.begin() + 6, all.end()));
  EXPECT_TRUE(third.result["params"] == full.result["params"]) << "resumed parameters differ from the uninterrupted run";
  EXPECT_EQ(entries_of(dir), (std::vector<std::string>{"latest", latest_of(dir)}));

  // --overwrite starts afresh; the old checkpoint is replaced at the first save.
  const MpiRun over = run_ranks(4, base + " --steps 2 --overwrite");
  ASSERT_EQ(over.exit_code, 0) << over.output;
  EXPECT_EQ(over.result["losses"].get<std::vector<double>>(), std::vector<double>(all.begin(), all.begin() + 2));
  EXPECT_EQ(latest_of(dir).rfind("step-00000002-", 0), 0u);
}

// A safetensors file read from the format's documented layout alone (8-byte little-endian header
// length, a JSON header of dtype / shape / data offsets, the data): name → (shape, F32 values).
using StateDict = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;
StateDict read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_GE(bytes.size(), 8u) << path;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  const json header = json::parse(bytes.substr(8, n));
  StateDict out;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(t["dtype"], "F32") << name;
    const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
    std::vector<float> v((end - begin) / 4);
    std::memcpy(v.data(), bytes.data() + 8 + n + begin, end - begin);
    out[name] = {t["shape"].get<std::vector<int64_t>>(), v};
  }
  return out;
}

// Megatron-LM's GPT forward (Megatron Core's GPTModel, local layer spec), written from its state
// dict's documented names and layouts only — pre-norm blocks; linear_qkv rows per query group:
// its query heads, key, value; linear_fc1 of SwiGLU = [gate; up]; weights [out, in]; GELU in tanh
// form; norm ε 1e-5; with rope (no position table in the state dict: Megatron's Llama) the first
// rotary_dim channels of each query and key head rotated after linear_qkv, Megatron's
// apply_rotary_pos_emb: t·cos + rotate_half(t)·sin, rotate_half(x) = [−x2, x1] of the two halves,
// angle position·base^(−2i/rotary_dim) — in double. The mean cross-entropy of the samples, the
// softmax over every row of the (padded) word embedding or output layer, as Megatron's
// vocab-parallel cross entropy takes it.
double megatron_loss(const StateDict& w, int heads, int groups, const std::vector<std::vector<int32_t>>& inputs,
                     const std::vector<std::vector<int32_t>>& targets, int top_k = 2, int rotary_dim = 0, double rotary_base = 10000) {
  auto get = [&](const std::string& name) -> const std::vector<float>* {
    const auto it = w.find(name);
    return it == w.end() ? nullptr : &it->second.second;
  };
  const auto& emb = w.at("embedding.word_embeddings.weight");
  const int64_t h = emb.first[1], V = emb.first[0];
  int layers = 0;
  while (get("decoder.layers." + std::to_string(layers) + ".self_attention.linear_qkv.weight")) ++layers;
  const int d = static_cast<int>(h / heads), per_group = heads / groups;
  using Mat = std::vector<std::vector<double>>;
  auto norm = [&](const Mat& x, const std::string& name) {
    const std::vector<float>& g = *get(name + ".weight");
    const std::vector<float>* b = get(name + ".bias");  // LayerNorm; RMSNorm has none
    Mat y = x;
    for (auto& row : y) {
      double mean = 0, var = 0;
      if (b) {
        for (double v : row) mean += v;
        mean /= h;
      }
      for (double v : row) var += (v - mean) * (v - mean);
      var /= h;
      for (int64_t i = 0; i < h; ++i) row[i] = (row[i] - mean) / std::sqrt(var + 1e-5) * g[i] + (b ? (*b)[i] : 0.0);
    }
    return y;
  };
  auto linear = [&](const Mat& x, const std::string& name) {  // y = x Wᵀ + b, W [out, in]
    const auto& W = w.at(name + ".weight");
    const int64_t out = W.first[0], in = W.first[1];
    const std::vector<float>* b = get(name + ".bias");
    Mat y(x.size(), std::vector<double>(static_cast<size_t>(out)));
    for (size_t r = 0; r < x.size(); ++r)
      for (int64_t o = 0; o < out; ++o) {
        double acc = b ? (*b)[o] : 0.0;
        for (int64_t i = 0; i < in; ++i) acc += x[r][i] * W.second[o * in + i];
        y[r][o] = acc;
      }
    return y;
  };
  const std::vector<float>& E = emb.second;
  const std::vector<float>* P = get("embedding.position_embeddings.weight");  // learned positions only
  const std::vector<float>& head = get("output_layer.weight") ? *get("output_layer.weight") : E;
  double total = 0;
  size_t count = 0;
  for (size_t sample = 0; sample < inputs.size(); ++sample) {
    const size_t s = inputs[sample].size();
    Mat x(s, std::vector<double>(static_cast<size_t>(h)));
    for (size_t t = 0; t < s; ++t)
      for (int64_t i = 0; i < h; ++i) x[t][i] = E[inputs[sample][t] * h + i] + (P ? (*P)[t * h + i] : 0.0);
    for (int l = 0; l < layers; ++l) {
      const std::string L = "decoder.layers." + std::to_string(l) + ".";
      Mat qkv = linear(norm(x, L + "input_layernorm"), L + "self_attention.linear_qkv");
      if (rotary_dim > 0) {
        const int half = rotary_dim / 2;
        for (size_t t = 0; t < s; ++t)
          for (int g = 0; g < groups; ++g)
            for (int head = 0; head < per_group + 1; ++head) {  // the group's queries and its key
              double* v = qkv[t].data() + (g * (per_group + 2) + head) * d;
              for (int i = 0; i < half; ++i) {
                const double angle = static_cast<double>(t) * std::pow(rotary_base, -2.0 * i / rotary_dim);
                const double x1 = v[i], x2 = v[i + half];
                v[i] = x1 * std::cos(angle) - x2 * std::sin(angle);
                v[i + half] = x2 * std::cos(angle) + x1 * std::sin(angle);
              }
            }
      }
      Mat ctx(s, std::vector<double>(static_cast<size_t>(heads * d)));
      for (int j = 0; j < heads; ++j) {
        const int base = (j / per_group) * (per_group + 2) * d, q = base + (j % per_group) * d, k = base + per_group * d,
                  v = k + d;
        for (size_t a = 0; a < s; ++a) {
          std::vector<double> p(a + 1);
          double mx = -1e300, sum = 0;
          for (size_t b = 0; b <= a; ++b) {
            double dot = 0;
            for (int e = 0; e < d; ++e) dot += qkv[a][q + e] * qkv[b][k + e];
            p[b] = dot / std::sqrt(static_cast<double>(d));
            mx = std::max(mx, p[b]);
          }
          for (double& z : p) sum += (z = std::exp(z - mx));
          for (size_t b = 0; b <= a; ++b)
            for (int e = 0; e < d; ++e) ctx[a][j * d + e] += p[b] / sum * qkv[b][v + e];
        }
      }
      const Mat attn = linear(ctx, L + "self_attention.linear_proj");
      for (size_t t = 0; t < s; ++t)
        for (int64_t i = 0; i < h; ++i) x[t][i] += attn[t][i];
      auto mlp_of = [&](const Mat& in, const std::string& prefix) {  // linear_fc1, activation, linear_fc2
        Mat fc1 = linear(in, prefix + "linear_fc1");
        const bool swiglu = get(prefix + "linear_fc1.weight")->size() == 2 * get(prefix + "linear_fc2.weight")->size();
        for (auto& row : fc1) {
          if (swiglu) {
            const size_t f = row.size() / 2;
            for (size_t i = 0; i < f; ++i) row[i] = row[i] / (1 + std::exp(-row[i])) * row[f + i];
            row.resize(f);
          } else {
            for (double& z : row) z = 0.5 * z * (1 + std::tanh(0.7978845608028654 * (z + 0.044715 * z * z * z)));
          }
        }
        return linear(fc1, prefix + "linear_fc2");
      };
      const Mat y = norm(x, L + "pre_mlp_layernorm");
      Mat mlp;
      if (!get(L + "mlp.router.weight")) {
        mlp = mlp_of(y, L + "mlp.");
      } else {
        // Mixture of experts: the top_k largest router logits (ties: the lower expert), a softmax
        // over them, the chosen experts' outputs weighted by it (dropless).
        const Mat logits = linear(y, L + "mlp.router");
        const size_t E = logits[0].size();
        mlp.assign(s, std::vector<double>(static_cast<size_t>(h)));
        for (size_t t = 0; t < s; ++t) {
          std::vector<size_t> order(E);
          for (size_t e = 0; e < E; ++e) order[e] = e;
          std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[t][a] > logits[t][b]; });
          double sum = 0;
          for (int j = 0; j < top_k; ++j) sum += std::exp(logits[t][order[j]] - logits[t][order[0]]);
          for (int j = 0; j < top_k; ++j) {
            const double pj = std::exp(logits[t][order[j]] - logits[t][order[0]]) / sum;
            const Mat out = mlp_of(Mat{y[t]}, L + "mlp.experts.local_experts." + std::to_string(order[j]) + ".");
            for (int64_t i = 0; i < h; ++i) mlp[t][i] += pj * out[0][i];
          }
        }
      }
      for (size_t t = 0; t < s; ++t)
        for (int64_t i = 0; i < h; ++i) x[t][i] += mlp[t][i];
    }
    const Mat y = norm(x, "decoder.final_layernorm");
    for (size_t t = 0; t < s; ++t) {
      std::vector<double> logits(static_cast<size_t>(V));
      double mx = -1e300, sum = 0;
      for (int64_t c = 0; c < V; ++c) {
        for (int64_t i = 0; i < h; ++i) logits[c] += y[t][i] * head[c * h + i];
        mx = std::max(mx, logits[c]);
      }
      for (double z : logits) sum += std::exp(z - mx);
      total += -(logits[targets[sample][t]] - mx - std::log(sum));
      ++count;
    }
  }
  return total / static_cast<double>(count);
}

// The global batch of iteration `step` (0-based), as the executor samples it (exec/io/data.hpp).
std::pair<std::vector<std::vector<int32_t>>, std::vector<std::vector<int32_t>>> batch_of(int64_t step, int global, int seq,
                                                                                       int64_t vocab, uint64_t seed) {
  static std::map<int64_t, ptdp::exec::TokenCorpus> corpora;
  const ptdp::exec::TokenCorpus& corpus = corpora.try_emplace(vocab, ptdp::exec::TokenCorpus::synthetic(vocab)).first->second;
  const ptdp::exec::BatchSampler sampler(corpus, seq, seed);
  std::vector<std::vector<int32_t>> in(global, std::vector<int32_t>(seq)), out(global, std::vector<int32_t>(seq));
  for (int i = 0; i < global; ++i) sampler.sample(step, i, in[i].data(), out[i].data());
  return {in, out};
}

TEST(MpiTraining, CheckpointsHoldMegatronsStateDictWithRealShapes) {
  struct Arch {
    std::string what, flags;
    int groups;
    std::string sharded;  // the other layout: d 2 · t 2, sharded where the executor shards this model
    int64_t vocab = 256;  // padded to 256 rows at t 1 and 2
    int rotary_dim = 0;   // rope: rotated channels of each head (of 8); 0: learned positions
    double rotary_base = 10000;
  };
  // Llama: rope by default, and a vocabulary of 200 whose 56 padding rows are in the softmax.
  for (const Arch& arch : {Arch{"GPT (LayerNorm, GELU, biases, tied, learned positions)", "", 4, " --zero 3"},
                           Arch{"Llama (GQA 2 groups, SwiGLU, RMSNorm, untied, rope)", " --groups 2 --mlp swiglu --norm rmsnorm --untied 1 --vocab 200", 2,
                                " --zero 3", 200, 8},
                           Arch{"Mixtral-style (4 experts, top 2, every other layer, rope on half the channels, base 500)",
                                " --groups 2 --mlp swiglu --norm rmsnorm --untied 1 --experts 4 --topk 2 --moe-every 2 --rotary-percent 0.5 --rotary-base 500",
                                2, "", 256, 4, 500}}) {
    SCOPED_TRACE(arch.what);
    const std::string dir = temp_dir("ckpt-megatron"), zdir = temp_dir("ckpt-megatron-zero");
    // A large learning rate takes the weights far from their small initial values, where a
    // mistaken layout (gate and up swapped, say) no longer cancels out to first order.
    const std::string base = kTiny + arch.flags + " --lr 0.03";
    // Saved at step 3 by t 2 · p 2, then resumed for step 4: its loss is the loss of the saved weights.
    const MpiRun saved = run_ranks(4, base + " --t 2 --p 2 --steps 3 --checkpoint " + dir);
    ASSERT_EQ(saved.exit_code, 0) << saved.output;
    const std::string step_dir = dir + "/" + latest_of(dir);
    const StateDict model = read_safetensors(step_dir + "/model.safetensors");
    const StateDict moments = read_safetensors(step_dir + "/optimizer.safetensors");
    // `ptdp checkpoint --hf` writes GPT-2 (the GPT one, read back below) and Llama-style models
    // (LlamaForCausalLM); the Mixtral-style one (experts, rope on half the channels) is refused.
    const std::string hf_dir = dir + "/hf";
    const int hf = std::system(("timeout 60 " + std::string(PTDP_BINARY) + " checkpoint " + dir + " --hf " + hf_dir + " > " + dir +
                                "/hf.out 2>&1").c_str());
    const std::string hf_out = [&] {
      std::ifstream in(dir + "/hf.out");
      return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }();
    const bool gpt2 = arch.groups == 4, converts = arch.flags.find("--experts") == std::string::npos;
    EXPECT_EQ(exit_code_of(hf), converts ? 0 : 2) << hf_out;
    if (!converts) {
      EXPECT_EQ(count(hf_out, "error: --hf: "), 1u) << hf_out;
    } else if (!gpt2) {
      EXPECT_EQ(count(hf_out, "LlamaForCausalLM.from_pretrained"), 1u) << hf_out;
    }
    const std::string model_file = dir + "/model-step-3.safetensors";  // the resumed run's save removes the step's directory
    fs::copy_file(step_dir + "/model.safetensors", model_file);
    const MpiRun resumed = run_ranks(4, base + " --t 2 --p 2 --steps 4 --resume --checkpoint " + dir);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;

    // Names and shapes of Megatron's state dict (h 32, 4 heads of 8, ffn 128, padded vocabulary 256).
    const bool llama = arch.groups == 2;
    const int64_t qkv_rows = (4 + 2 * arch.groups) * 8;
    EXPECT_EQ(model.at("embedding.word_embeddings.weight").first, (std::vector<int64_t>{256, 32}));
    // Learned positions have their table; rope has none (Megatron's Llama).
    if (arch.rotary_dim == 0) {
      EXPECT_EQ(model.at("embedding.position_embeddings.weight").first, (std::vector<int64_t>{16, 32}));
    } else {
      EXPECT_EQ(model.count("embedding.position_embeddings.weight"), 0u);
    }
    EXPECT_EQ(model.at("decoder.layers.3.self_attention.linear_qkv.weight").first, (std::vector<int64_t>{qkv_rows, 32}));
    EXPECT_EQ(model.at("decoder.layers.3.self_attention.linear_proj.weight").first, (std::vector<int64_t>{32, 32}));
    EXPECT_EQ(model.at("decoder.layers.1.mlp.linear_fc1.weight").first, (std::vector<int64_t>{llama ? 256 : 128, 32}));
    EXPECT_EQ(model.at("decoder.layers.1.mlp.linear_fc2.weight").first, (std::vector<int64_t>{32, 128}));
    const bool moe = arch.sharded.empty();
    if (moe) {  // layers 0 and 2: a router and four experts instead of the MLP
      EXPECT_EQ(model.count("decoder.layers.0.mlp.linear_fc1.weight"), 0u);
      EXPECT_EQ(model.at("decoder.layers.2.mlp.router.weight").first, (std::vector<int64_t>{4, 32}));
      EXPECT_EQ(model.at("decoder.layers.2.mlp.experts.local_experts.3.linear_fc1.weight").first, (std::vector<int64_t>{256, 32}));
      EXPECT_EQ(model.at("decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight").first, (std::vector<int64_t>{32, 128}));
    }
    EXPECT_EQ(model.at("decoder.layers.2.input_layernorm.weight").first, (std::vector<int64_t>{32}));
    EXPECT_EQ(model.count("decoder.layers.2.input_layernorm.bias"), llama ? 0u : 1u);
    EXPECT_EQ(model.count("decoder.layers.2.self_attention.linear_qkv.bias"), llama ? 0u : 1u);
    EXPECT_EQ(model.count("output_layer.weight"), llama ? 1u : 0u);
    // Embeddings, 4 layers (an MoE layer: router and 4 × 2 expert weights for its MLP's 2), final
    // norm (and the output layer).
    EXPECT_EQ(model.size(), moe ? 41u : llama ? 27u : 52u);
    EXPECT_EQ(moments.size(), 2 * model.size());
    EXPECT_EQ(moments.at("decoder.layers.1.mlp.linear_fc2.weight.exp_avg_sq").first, (std::vector<int64_t>{32, 128}));

    // Megatron's forward on those tensors gives the loss ptdp trained with.
    const auto [in1, out1] = batch_of(3, 8, 16, arch.vocab, 7);
    const double reference = megatron_loss(model, 4, arch.groups, in1, out1, 2, arch.rotary_dim, arch.rotary_base);
    const double measured = resumed.result["losses"][0].get<double>();
    EXPECT_NEAR(measured, reference, 2e-5 * reference) << "the state dict's forward is not the model ptdp trained";
    if (gpt2) {
      // Hugging Face's GPT-2 layout, undone from its documentation alone: Conv1D weights [in, out];
      // c_attn's columns all queries, then all keys, then all values; wte cut to the vocabulary.
      const StateDict g = read_safetensors(hf_dir + "/model.safetensors");
      StateDict back;
      auto from_conv1d = [&](const std::string& name) {  // [in, out] → [out, in]
        const auto& [shape, v] = g.at(name);
        std::vector<float> t(v.size());
        for (int64_t i = 0; i < shape[0]; ++i)
          for (int64_t o = 0; o < shape[1]; ++o) t[o * shape[0] + i] = v[i * shape[1] + o];
        return std::pair{std::vector<int64_t>{shape[1], shape[0]}, t};
      };
      back["embedding.word_embeddings.weight"] = g.at("transformer.wte.weight");
      back["embedding.position_embeddings.weight"] = g.at("transformer.wpe.weight");
      back["decoder.final_layernorm.weight"] = g.at("transformer.ln_f.weight");
      back["decoder.final_layernorm.bias"] = g.at("transformer.ln_f.bias");
      for (int l = 0; l < 4; ++l) {
        const std::string H = "transformer.h." + std::to_string(l) + ".", M = "decoder.layers." + std::to_string(l) + ".";
        for (const char* b : {"weight", "bias"}) {
          back[M + "input_layernorm." + b] = g.at(H + "ln_1." + b);
          back[M + "pre_mlp_layernorm." + b] = g.at(H + "ln_2." + b);
        }
        back[M + "self_attention.linear_proj.weight"] = from_conv1d(H + "attn.c_proj.weight");
        back[M + "self_attention.linear_proj.bias"] = g.at(H + "attn.c_proj.bias");
        back[M + "mlp.linear_fc1.weight"] = from_conv1d(H + "mlp.c_fc.weight");
        back[M + "mlp.linear_fc1.bias"] = g.at(H + "mlp.c_fc.bias");
        back[M + "mlp.linear_fc2.weight"] = from_conv1d(H + "mlp.c_proj.weight");
        back[M + "mlp.linear_fc2.bias"] = g.at(H + "mlp.c_proj.bias");
        // Megatron's rows per head (q, k, v) from GPT-2's [Q | K | V] columns.
        const auto qkv = from_conv1d(H + "attn.c_attn.weight");
        const auto& qkv_b = g.at(H + "attn.c_attn.bias").second;
        std::vector<float> w(qkv.second.size()), b(qkv_b.size());
        for (int j = 0; j < 4; ++j)
          for (int part = 0; part < 3; ++part)
            for (int e = 0; e < 8; ++e) {
              const int hf_row = part * 32 + j * 8 + e, meg_row = (j * 3 + part) * 8 + e;
              b[meg_row] = qkv_b[hf_row];
              for (int c = 0; c < 32; ++c) w[meg_row * 32 + c] = qkv.second[hf_row * 32 + c];
            }
        back[M + "self_attention.linear_qkv.weight"] = {qkv.first, w};
        back[M + "self_attention.linear_qkv.bias"] = {{96}, b};
      }
      EXPECT_EQ(g.at("transformer.wte.weight").first, (std::vector<int64_t>{256, 32}));
      EXPECT_EQ(g.at("transformer.h.2.attn.c_attn.weight").first, (std::vector<int64_t>{32, 96}));
      EXPECT_EQ(g.size(), 52u);  // wte, wpe, 4 × 12, ln_f (tied: no lm_head)
      EXPECT_NEAR(megatron_loss(back, 4, 4, in1, out1), measured, 2e-5 * reference) << "the GPT-2 export is not the model ptdp trained";
      const json config = json::parse(std::ifstream(hf_dir + "/config.json"));
      EXPECT_EQ(config["activation_function"], "gelu_new");
      EXPECT_EQ(config["n_inner"], 128);
      EXPECT_EQ(config["vocab_size"], 256);
    }

    // ZeRO-3 at d 2 · t 2 (the MoE model: unsharded, which the executor runs it with) saves the
    // same tensors (its shards gathered) and moments.
    const MpiRun zero = run_ranks(4, base + " --d 2 --t 2" + arch.sharded + " --steps 3 --checkpoint " + zdir);
    ASSERT_EQ(zero.exit_code, 0) << zero.output;
    const std::string zstep = zdir + "/" + latest_of(zdir);
    for (const auto& [file, ref] : {std::pair{std::string("/model.safetensors"), &model}, std::pair{std::string("/optimizer.safetensors"), &moments}}) {
      const StateDict z = read_safetensors(zstep + file);
      ASSERT_EQ(z.size(), ref->size()) << file;
      for (const auto& [name, t] : *ref) {
        ASSERT_TRUE(z.count(name)) << name;
        ASSERT_EQ(z.at(name).first, t.first) << name;
        // Relative to the tensor's norm: Adam's first steps turn rounding-sized gradient
        // differences near zero into update differences of up to 2·lr, one element at a time; a
        // tensor out of place differs by its whole norm.
        double diff = 0, norm = 0;
        for (size_t i = 0; i < t.second.size(); ++i) {
          const double a = t.second[i], b = z.at(name).second[i];
          diff += (a - b) * (a - b);
          norm += a * a;
        }
        EXPECT_LE(std::sqrt(diff), 1e-2 * std::sqrt(norm)) << file << " " << name;
      }
    }

    // --init starts another layout (d 2 · t 2) from the file: its first loss is the reference's.
    const MpiRun init = run_ranks(4, base + " --d 2 --t 2" + arch.sharded + " --steps 1 --init " + model_file);
    ASSERT_EQ(init.exit_code, 0) << init.output;
    const auto [in0, out0] = batch_of(0, 8, 16, arch.vocab, 7);
    EXPECT_NEAR(init.result["losses"][0].get<double>(), megatron_loss(model, 4, arch.groups, in0, out0, 2, arch.rotary_dim, arch.rotary_base),
                2e-5 * reference);
    // The position embedding must match the file's: learned ⇄ rope is exit 2 naming the table.
    const MpiRun other = run_ranks(2, base + " --p 2 --steps 1 --pos " + (arch.rotary_dim == 0 ? "rope" : "learned") + " --init " + model_file);
    EXPECT_EQ(other.exit_code, 2) << other.output;
    EXPECT_EQ(count(other.output, "error: --init: " + model_file), 1u) << other.output;
    EXPECT_EQ(count(other.output, "'embedding.position_embeddings.weight'"), 1u) << other.output;
    EXPECT_EQ(count(other.output, arch.rotary_dim == 0 ? "holds learned absolute position embeddings, but this model has model.position_embedding: rope"
                                                       : "it was saved by a model with rotary or no position embeddings"),
              1u)
        << other.output;
    if (arch.rotary_dim > 0) {  // rope ⇄ none: no tensor differs; the file's metadata says it
      const MpiRun none = run_ranks(2, base + " --p 2 --steps 1 --pos none --init " + model_file);
      EXPECT_EQ(none.exit_code, 2) << none.output;
      EXPECT_EQ(count(none.output, "was saved by a model with model.position_embedding: rope (its metadata 'ptdp_position_embedding')"), 1u)
          << none.output;
    }
  }
}

TEST(MpiTraining, InitFromAStateDictThatDoesNotFitIsOneClearError) {
  const std::string dir = temp_dir("ckpt-init-bad");
  const MpiRun llama = run_ranks(2, kTiny + " --groups 2 --mlp swiglu --norm rmsnorm --untied 1 --p 2 --steps 1 --checkpoint " + dir);
  ASSERT_EQ(llama.exit_code, 0) << llama.output;
  const std::string file = dir + "/" + latest_of(dir) + "/model.safetensors";
  // A GPT model (learned positions) from a Llama state dict (rope): the position table it lacks is named.
  const MpiRun gpt = run_ranks(2, kTiny + " --p 2 --steps 1 --init " + file);
  EXPECT_EQ(gpt.exit_code, 2) << gpt.output;
  EXPECT_EQ(count(gpt.output, "error: --init: " + file + " has no tensor 'embedding.position_embeddings.weight'"), 1u) << gpt.output;
  // With rope it gets past the positions: the first tensor it lacks is named.
  const MpiRun gpt_rope = run_ranks(2, kTiny + " --pos rope --p 2 --steps 1 --init " + file);
  EXPECT_EQ(gpt_rope.exit_code, 2) << gpt_rope.output;
  EXPECT_EQ(count(gpt_rope.output, "error: --init: " + file + ": tensor '"), 1u) << gpt_rope.output;
  EXPECT_EQ(count(gpt_rope.output, "is not a parameter of this model"), 1u) << gpt_rope.output;
  // Another hidden size: the shape is named.
  const MpiRun wide = run_ranks(2, kTiny + " --hidden 64 --groups 2 --mlp swiglu --norm rmsnorm --untied 1 --p 2 --steps 1 --init " + file);
  EXPECT_EQ(wide.exit_code, 2) << wide.output;
  EXPECT_EQ(count(wide.output, "has shape [256, 32], this model's is [256, 64]"), 1u) << wide.output;
  // A truncated file, a missing one, and --init with --resume.
  const std::string cut = dir + "/cut.safetensors";
  {
    std::ifstream in(file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() - 100);
  }
  const MpiRun truncated = run_ranks(2, kTiny + " --groups 2 --mlp swiglu --norm rmsnorm --untied 1 --p 2 --steps 1 --init " + cut);
  EXPECT_EQ(truncated.exit_code, 2) << truncated.output;
  EXPECT_EQ(count(truncated.output, cut + " is truncated or corrupt"), 1u) << truncated.output;
  const MpiRun missing = run_ranks(2, kTiny + " --p 2 --steps 1 --init " + dir + "/nothing.safetensors");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  const MpiRun both = run_ranks(2, kTiny + " --groups 2 --mlp swiglu --norm rmsnorm --untied 1 --p 2 --steps 2 --resume --checkpoint " +
                                       dir + " --init " + file);
  EXPECT_EQ(both.exit_code, 2) << both.output;
  EXPECT_EQ(count(both.output, "--resume continues a checkpoint (give one of them)"), 1u) << both.output;
}

TEST(MpiTraining, ShardedCheckpointsResumeBitForBitAndAtAnotherStage) {
  const std::string dir = temp_dir("ckpt-zero");
  // Uninterrupted runs of 6 iterations at each stage.
  struct Layout {
    int np;
    std::string args;
  };
  const std::vector<Layout> layouts = {{2, "--d 2 --zero 3"},
                                       {4, "--p 2 --d 2 --zero 1"},
                                       {4, "--d 4 --zero 2 --sharding-group node --node-gpus 2"},
                                       {2, "--d 2 --zero 1 --offload optimizer"}};
  for (const Layout& l : layouts) {
    const std::string d = temp_dir("ckpt-zero-same");
    const MpiRun full = run_ranks(l.np, kTiny + " --steps 6 " + l.args);
    ASSERT_EQ(full.exit_code, 0) << full.output;
    const auto all = full.result["losses"].get<std::vector<double>>();
    const MpiRun first = run_ranks(l.np, kTiny + " --steps 3 --checkpoint " + d + " " + l.args);
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const MpiRun second = run_ranks(l.np, kTiny + " --steps 6 --resume --checkpoint " + d + " " + l.args);
    ASSERT_EQ(second.exit_code, 0) << l.args << ":\n" << second.output;
    EXPECT_EQ(second.result["losses"].get<std::vector<double>>(), std::vector<double>(all.begin() + 3, all.end()))
        << l.args;
    EXPECT_TRUE(second.result["params"] == full.result["params"]) << l.args << ": resumed parameters differ";
  }
  // Across stages on the same d: the parameters and moments are reassembled from the shards.
  const MpiRun ref = run_ranks(2, kTiny + " --steps 6 --d 2");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const auto all = ref.result["losses"].get<std::vector<double>>();
  int saved_at = 0;
  std::map<int, uintmax_t> shard_bytes;  // rank 0's file per saved stage
  for (int next : {3, 1, 0, 2}) {
    const std::string save_args = " --d 2 --zero " + std::to_string(saved_at);
    const std::string d = temp_dir("ckpt-zero-" + std::to_string(saved_at) + "-" + std::to_string(next));
    ASSERT_EQ(run_ranks(2, kTiny + " --steps 3 --params 0 --checkpoint " + d + save_args).exit_code, 0);
    shard_bytes[saved_at] = fs::file_size(d + "/" + latest_of(d) + "/rank-00000.safetensors");
    const json meta = json::parse(std::ifstream(d + "/" + latest_of(d) + "/meta.json"));
    EXPECT_EQ(meta["sharding"]["zero_stage"], saved_at);
    EXPECT_EQ(meta["sharding"]["group_size"], saved_at > 0 ? 2 : 1);
    const MpiRun r = run_ranks(2, kTiny + " --steps 6 --resume --checkpoint " + d + " --d 2 --zero " + std::to_string(next));
    const std::string what = "saved at stage " + std::to_string(saved_at) + ", resumed at " + std::to_string(next);
    ASSERT_EQ(r.exit_code, 0) << what << ":\n" << r.output;
    const auto got = r.result["losses"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), 3u) << what;
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(got[i], all[3 + i], 1e-5 * all[3 + i]) << what << " step " << i + 4;
    saved_at = next;
  }
  // Each rank saves its shard only: about half of the states at d = 2.
  for (int z : {1, 3}) EXPECT_LT(shard_bytes[z], 0.6 * shard_bytes[0]) << "zero stage " << z;
  // Another d is another layout: refused by name, before any training.
  ASSERT_EQ(run_ranks(2, kTiny + " --steps 3 --params 0 --d 2 --zero 3 --checkpoint " + dir).exit_code, 0);
  const MpiRun other_d = run_ranks(4, kTiny + " --steps 6 --params 0 --d 4 --zero 3 --resume --checkpoint " + dir);
  EXPECT_EQ(other_d.exit_code, 2) << other_d.output;
  EXPECT_EQ(count(other_d.output, "parallel.data = 2, this run has 4 (resuming needs the same parallel layout)"), 1u)
      << other_d.output;
}

TEST(MpiTraining, CheckpointsKnowTheirPartitionAndArchitecture) {
  const std::string dir = temp_dir("ckpt-partition");
  const std::string base = kTiny + " --p 2 --checkpoint " + dir;
  const MpiRun first = run_ranks(2, base + " --steps 2 --save-every 2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Another partition of the same layers, or another architecture, is refused by name.
  const MpiRun uneven = run_ranks(2, base + " --steps 3 --resume --stage-layers 1,3");
  EXPECT_EQ(uneven.exit_code, 2) << uneven.output;
  EXPECT_EQ(count(uneven.output, "parallel.stage_layers = [2,2], this run has [1,3] (resuming needs the same parallel layout)"),
            1u)
      << uneven.output;
  const MpiRun swiglu = run_ranks(2, base + " --steps 3 --resume --mlp swiglu");
  EXPECT_EQ(swiglu.exit_code, 2) << swiglu.output;
  EXPECT_EQ(count(swiglu.output, "model.mlp = \"gelu\", this run has \"swiglu\""), 1u) << swiglu.output;
  // A checkpoint written before these keys existed (a GPT with uniform stages) still resumes.
  const std::string meta_path = dir + "/" + latest_of(dir) + "/meta.json";
  json meta = json::parse(std::ifstream(meta_path));
  for (const char* k : {"num_query_groups", "mlp", "normalization", "tie_embeddings"}) meta["model"].erase(k);
  meta["parallel"].erase("stage_layers");
  meta["format"] = 2;  // saves before manifest.json (issue 36) had none
  std::ofstream(meta_path) << meta.dump(2);
  std::filesystem::remove(dir + "/" + latest_of(dir) + "/manifest.json");
  const MpiRun resumed = run_ranks(2, base + " --steps 3 --resume");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(resumed.result["first_step"].get<double>(), 2);
}

// FP8's delayed scaling (tensorwise: each use scaled by the previous use's amax) is state beside
// the tensors: a resumed FP8 run equals the uninterrupted one only when the amax histories are
// restored. A checkpoint saved before they were kept resumes (with a warning) from empty histories.
TEST(MpiTraining, ResumedFp8RunRestoresTheAmaxHistoriesBitForBit) {
  // The experts' GEMMs keep histories of their own (one per expert weight and role).
  for (const std::string layout : {"--t 2", "--p 2", "--d 2 --zero 1", "--d 2 --ep 2 --experts 4 --topk 2"}) {
    const std::string fp8 = kTiny + " --precision fp8 --fp8-recipe tensorwise " + layout;
    const MpiRun full = run_ranks(2, fp8 + " --steps 6");
    ASSERT_EQ(full.exit_code, 0) << full.output;
    const auto all = full.result["losses"].get<std::vector<double>>();
    const std::string dir = temp_dir("ckpt-fp8");
    const MpiRun first = run_ranks(2, fp8 + " --steps 3 --checkpoint " + dir);
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const std::string step_dir = dir + "/" + latest_of(dir);
    const json meta = json::parse(std::ifstream(step_dir + "/meta.json"));
    EXPECT_EQ(meta["fp8_amax_history"], json({{"length", 1}, {"algorithm", "most_recent"}})) << meta.dump();
    if (layout.find("--experts") != std::string::npos) {
      std::ifstream shard(step_dir + "/rank-00001.safetensors", std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(shard)), std::istreambuf_iterator<char>());
      for (const char* name : {"mlp.experts.2.fc1.weight#fp8_amax_input", "mlp.experts.3.fc2.weight#fp8_amax_output_grad"})
        EXPECT_NE(bytes.find(name), std::string::npos) << name;
    }
    // A copy as ptdp wrote it before: no fp8_amax_history in meta.json (nor a manifest).
    const std::string old_dir = temp_dir("ckpt-fp8-old");
    fs::copy(dir, old_dir, fs::copy_options::recursive);
    json old_meta = meta;
    old_meta.erase("fp8_amax_history");
    old_meta["format"] = 2;
    std::ofstream(old_dir + "/" + latest_of(dir) + "/meta.json") << old_meta.dump(2);
    fs::remove(old_dir + "/" + latest_of(dir) + "/manifest.json");

    const MpiRun second = run_ranks(2, fp8 + " --steps 6 --resume --checkpoint " + dir);
    ASSERT_EQ(second.exit_code, 0) << layout << ":\n" << second.output;
    EXPECT_EQ(second.result["losses"].get<std::vector<double>>(), std::vector<double>(all.begin() + 3, all.end())) << layout;
    EXPECT_TRUE(second.result["params"] == full.result["params"]) << layout << ": resumed parameters differ";

    const MpiRun old = run_ranks(2, fp8 + " --steps 6 --resume --checkpoint " + old_dir);
    ASSERT_EQ(old.exit_code, 0) << layout << ":\n" << old.output;
    EXPECT_EQ(count(old.output, "has no FP8 amax history (saved by a ptdp that did not keep it)"), 1u) << old.output;
    // Without the histories the first resumed step scales by the current amaxes: other numerics.
    EXPECT_FALSE(old.result["params"] == full.result["params"]) << layout;
    const auto got = old.result["losses"].get<std::vector<double>>();
    ASSERT_EQ(got.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(got[i], all[3 + i], 5e-3 * all[3 + i]) << layout << " step " << i + 4;
  }
}

TEST(MpiTraining, CorruptOrMismatchedCheckpointIsOneClearError) {
  const std::string dir = temp_dir("bad-ckpt");
  const MpiRun save = run_ranks(2, kTiny + " --p 2 --steps 2 --params 0 --checkpoint " + dir);
  ASSERT_EQ(save.exit_code, 0) << save.output;
  const std::string step = dir + "/" + latest_of(dir);

  const MpiRun other_layout = run_ranks(2, kTiny + " --t 2 --steps 4 --params 0 --resume --checkpoint " + dir);
  EXPECT_EQ(other_layout.exit_code, 2) << other_layout.output;
  EXPECT_EQ(count(other_layout.output, "parallel.pipeline = 2, this run has 1 (resuming needs the same parallel layout)"),
            1u)
      << other_layout.output;
  const MpiRun other_seed = run_ranks(2, kTiny + " --p 2 --steps 4 --params 0 --resume --seed 8 --checkpoint " + dir);
  EXPECT_EQ(other_seed.exit_code, 2) << other_seed.output;
  EXPECT_EQ(count(other_seed.output, "saved with seed = 7"), 1u) << other_seed.output;

  // Swapped shards: each records its rank and coordinates.
  fs::rename(step + "/rank-00000.safetensors", step + "/swap");
  fs::rename(step + "/rank-00001.safetensors", step + "/rank-00000.safetensors");
  fs::rename(step + "/swap", step + "/rank-00001.safetensors");
  const MpiRun swapped = run_ranks(2, kTiny + " --p 2 --steps 4 --params 0 --resume --checkpoint " + dir);
  EXPECT_EQ(swapped.exit_code, 2) << swapped.output;
  EXPECT_EQ(count(swapped.output, "rank-00000.safetensors does not belong here: it is the shard of rank 1 (tp 0, pp 1, dp 0), "
                                  "this is rank 0 (tp 0, pp 0, dp 0)"),
            1u)
      << swapped.output;
  fs::rename(step + "/rank-00000.safetensors", step + "/swap");
  fs::rename(step + "/rank-00001.safetensors", step + "/rank-00000.safetensors");
  fs::rename(step + "/swap", step + "/rank-00001.safetensors");

  // A shard of another save of the same step (e.g. copied from an older run) is refused too.
  const std::string other = temp_dir("other-ckpt");
  ASSERT_EQ(run_ranks(2, kTiny + " --p 2 --steps 2 --params 0 --checkpoint " + other).exit_code, 0);
  fs::copy_file(other + "/" + latest_of(other) + "/rank-00001.safetensors", step + "/rank-00001.safetensors",
                fs::copy_options::overwrite_existing);
  const MpiRun foreign = run_ranks(2, kTiny + " --p 2 --steps 4 --params 0 --resume --checkpoint " + dir);
  EXPECT_EQ(foreign.exit_code, 2) << foreign.output;
  EXPECT_EQ(count(foreign.output, "rank-00001.safetensors does not belong here: it was written by save "), 1u) << foreign.output;
  ASSERT_EQ(run_ranks(2, kTiny + " --p 2 --steps 2 --params 0 --overwrite --checkpoint " + dir).exit_code, 0);
  const std::string step2 = dir + "/" + latest_of(dir);

  {  // flip one byte in the middle of rank 1's shard
    const std::string shard = step2 + "/rank-00001.safetensors";
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(fs::file_size(shard) / 2));
    f.write(&c, 1);
  }
  const MpiRun corrupt = run_ranks(2, kTiny + " --p 2 --steps 4 --params 0 --resume --checkpoint " + dir);
  EXPECT_EQ(corrupt.exit_code, 2) << corrupt.output;
  EXPECT_EQ(count(corrupt.output, "rank-00001.safetensors is corrupt (checksum mismatch)"), 1u) << corrupt.output;
  EXPECT_EQ(count(corrupt.output, "step 3/4"), 0u);

  const MpiRun nothing = run_ranks(2, kTiny + " --p 2 --steps 4 --params 0 --resume --checkpoint " + temp_dir("empty"));
  EXPECT_EQ(nothing.exit_code, 2) << nothing.output;
  EXPECT_EQ(count(nothing.output, "no checkpoint in"), 1u) << nothing.output;
}

// Runs the driver with PTDP_CHECKPOINT_FAULT set (exported to every rank).
MpiRun run_with_fault(int np, const std::string& fault, const std::string& args) {
  ::setenv("PTDP_CHECKPOINT_FAULT", fault.c_str(), 1);
  MpiRun r = run_ranks(np, args, "-x PTDP_CHECKPOINT_FAULT");
  ::unsetenv("PTDP_CHECKPOINT_FAULT");
  return r;
}

// After a failed or killed save: `latest` is absent or names a complete checkpoint.
void expect_published_checkpoint_is_complete(const std::string& dir, int ranks, const std::string& what) {
  if (!fs::exists(dir + "/latest")) return;
  const std::string name = latest_of(dir);
  ASSERT_TRUE(fs::is_directory(dir + "/" + name)) << what << ": latest names " << name;
  EXPECT_TRUE(fs::exists(dir + "/" + name + "/meta.json")) << what;
  for (int r = 0; r < ranks; ++r) {
    char file[32];
    std::snprintf(file, sizeof file, "/rank-%05d.safetensors", r);
    EXPECT_TRUE(fs::exists(dir + "/" + name + file)) << what << ": " << name << file;
  }
}

TEST(MpiTraining, KillDuringSaveAtRandomPointsAlwaysResumesBitForBit) {
  // Killed runs save after steps 2 and 4; the run after the kill continues to step 6.
  const std::string args = kTiny + " --p 2 --steps 4", args6 = kTiny + " --p 2 --steps 6";
  const MpiRun full = run_ranks(2, args6);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const auto all = full.result["losses"].get<std::vector<double>>();
  // Each save each save passes a few dozen fault points on rank 0 (directory,
  // chunks of its shard, meta.json, latest) and about ten on rank 1.
  const unsigned seed = static_cast<unsigned>(std::chrono::system_clock::now().time_since_epoch().count());
  std::mt19937 rng(seed);
  int kills = 0, attempts = 0, resumed = 0, restarted = 0;
  while (kills < 20 && attempts < 60) {
    ++attempts;
    const int rank = static_cast<int>(rng() % 2);
    const int point = 1 + static_cast<int>(rng() % (rank == 0 ? 44 : 22));
    const std::string fault = "kill:" + std::to_string(point) + "@" + std::to_string(rank);
    const std::string what = "seed " + std::to_string(seed) + ", " + fault;
    const std::string dir = temp_dir("kill");
    const MpiRun killed = run_with_fault(2, fault, args + " --params 0 --save-every 2 --checkpoint " + dir);
    if (killed.exit_code == 0) continue;  // the point lies beyond the run's last save
    ASSERT_NE(killed.exit_code, 124) << what << ": the job hung";
    ++kills;
    expect_published_checkpoint_is_complete(dir, 2, what);
    const bool has_latest = fs::exists(dir + "/latest");
    const MpiRun again = run_ranks(2, args6 + " --checkpoint " + dir + (has_latest ? " --resume" : ""));
    ASSERT_EQ(again.exit_code, 0) << what << ":\n" << again.output;
    const auto first = static_cast<size_t>(again.result["first_step"].get<double>());
    (has_latest ? resumed : restarted) += 1;
    if (has_latest) {
      EXPECT_TRUE(first == 2 || first == 4) << what;
    }
    EXPECT_EQ(again.result["losses"].get<std::vector<double>>(), std::vector<double>(all.begin() + first, all.end()))
        << what;
    EXPECT_TRUE(again.result["params"] == full.result["params"]) << what << ": parameters differ after resuming";
    EXPECT_EQ(entries_of(dir), (std::vector<std::string>{"latest", latest_of(dir)})) << what;
  }
  EXPECT_GE(kills, 20) << "seed " << seed;
  std::printf("kill points: %d (%d resumed from a checkpoint, %d restarted), seed %u\n", kills, resumed, restarted, seed);
}

TEST(MpiTraining, DiskFullDuringSaveKeepsThePreviousCheckpoint) {
  const std::string args = kTiny + " --p 2 --steps 4";
  const MpiRun full = run_ranks(2, args);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const auto all = full.result["losses"].get<std::vector<double>>();
  // Rank 1's shard is written in a few chunks per save: its 3rd write is in the second save.
  for (const std::string fault : {"enospc:1@1", "enospc:3@1", "enospc:8@0"}) {
    const std::string dir = temp_dir("full");
    const MpiRun failed = run_with_fault(2, fault, args + " --params 0 --save-every 2 --checkpoint " + dir);
    EXPECT_EQ(failed.exit_code, 1) << fault << ":\n" << failed.output;
    EXPECT_EQ(count(failed.output, "No space left on device"), 1u) << fault << ":\n" << failed.output;
    expect_published_checkpoint_is_complete(dir, 2, fault);
    for (const auto& e : fs::recursive_directory_iterator(dir))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << fault << ": left " << e.path();
    const bool has_latest = fs::exists(dir + "/latest");
    const MpiRun again = run_ranks(2, args + " --checkpoint " + dir + (has_latest ? " --resume" : ""));
    ASSERT_EQ(again.exit_code, 0) << fault << ":\n" << again.output;
    const auto first = static_cast<size_t>(again.result["first_step"].get<double>());
    EXPECT_EQ(again.result["losses"].get<std::vector<double>>(), std::vector<double>(all.begin() + first, all.end()))
        << fault;
    EXPECT_TRUE(again.result["params"] == full.result["params"]) << fault;
  }
}

TEST(MpiTraining, BadLaunchOrDataIsOneClearErrorOnEveryRank) {
  // (ranks, arguments, the message every rank agrees on; printed once, exit 2)
  const std::vector<std::tuple<int, std::string, std::string>> cases = {
      {3, " --t 2 --params 0", "launch with mpirun -np 2"},
      {2, " --t 2 --params 0 --data /nonexistent/corpus.bin", "/nonexistent/corpus.bin: training data file not found"},
      {2, " --t 2 --params 0 --data /dev/zero", "/dev/zero: training data file is a character device, expected a regular file"},
      {2, " --t 2 --params 0 --lr nan", "--lr: must be in (0, 10] (got nan)"},
      {2, " --t 2 --params 0 --lr -1", "--lr: must be in (0, 10] (got -1)"},
  };
  for (const auto& [np, args, message] : cases) {
    const MpiRun r = run_ranks(np, kTiny + args);
    EXPECT_EQ(r.exit_code, 2) << args << ":\n" << r.output;
    EXPECT_EQ(count(r.output, message), 1u) << args << ":\n" << r.output;
  }

  const MpiRun small_vocab = run_ranks(1, "--vocab 100 --params 0 --data /usr/share/common-licenses/GPL-3");
  EXPECT_EQ(small_vocab.exit_code, 2) << small_vocab.output;
  EXPECT_EQ(count(small_vocab.output, "model.vocab_size: is 100"), 1u) << small_vocab.output;
}

// Starts a long run, waits for iteration `after`, sends `sig` to rank 1 and returns how long the
// job took to end afterwards, its exit code and output.
struct FaultRun {
  double seconds_after_signal = 0;
  int exit_code = -1;
  std::string output;
};

FaultRun signal_rank_mid_run(int sig, const std::string& extra) {
  const std::string pids = temp_dir("pids-" + std::to_string(sig));
  FILE* pipe = ::popen(command(2, kTiny + " --p 2 --steps 1000000 --params 0 --pid-dir " + pids + " " + extra).c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  FaultRun f;
  char buf[4096];
  bool signalled = false;
  std::chrono::steady_clock::time_point at;
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) {
    f.output += buf;
    if (!signalled && std::string(buf).rfind("step 20/", 0) == 0) {
      std::ifstream pid_file(pids + "/rank-1.pid");
      pid_t pid = 0;
      pid_file >> pid;
      EXPECT_GT(pid, 0);
      if (pid > 0) ::kill(pid, sig);
      at = std::chrono::steady_clock::now();
      signalled = true;
    }
  }
  f.exit_code = exit_code_of(::pclose(pipe));
  f.seconds_after_signal = std::chrono::duration<double>(std::chrono::steady_clock::now() - at).count();
  EXPECT_TRUE(signalled) << f.output;
  return f;
}

TEST(MpiTraining, KilledRankMakesTheOthersExitWithinAMinute) {
  const FaultRun f = signal_rank_mid_run(SIGKILL, "");
  EXPECT_NE(f.exit_code, 0) << f.output;
  EXPECT_NE(f.exit_code, 124) << "the job hung until the test's timeout";
  EXPECT_LT(f.seconds_after_signal, 60.0) << f.output;
}

TEST(MpiTraining, HungRankMakesTheOthersAbortAfterTheCommunicationTimeout) {
  // A stopped process is not dead: mpirun does not notice, only the executor's deadline can.
  const FaultRun f = signal_rank_mid_run(SIGSTOP, "--timeout 3");
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_LT(f.seconds_after_signal, 60.0) << f.output;
  EXPECT_GE(f.seconds_after_signal, 3.0) << f.output;
  EXPECT_NE(f.output.find("made no progress for 3 s; a peer rank probably died or hangs"), std::string::npos) << f.output;
}

TEST(MpiCommunicator, BlockingCollectiveThrowsAfterItsTimeoutInsteadOfHanging) {
  const auto start = std::chrono::steady_clock::now();
  const MpiRun r = run_ranks(2, "--stall-test 2");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("all-reduce over the world made no progress for 2 s"), std::string::npos) << r.output;
  EXPECT_LT(seconds, 30.0);
}

TEST(MpiCommunicator, LargeAllReducesGoInPiecesAndStayExact) {
  // 1 000 003 values: several pieces in both wait modes (512 KiB polling, 4 MiB sleeping) and
  // an odd tail, as floats and doubles, with each reduce op; 3 ranks so that every element
  // comes from a reduction of more than a pair.
  const MpiRun r = run_ranks(3, "--allreduce-test 1000003");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const MpiRun small = run_ranks(2, "--allreduce-test 5");
  EXPECT_EQ(small.exit_code, 0) << small.output;
}

}  // namespace
