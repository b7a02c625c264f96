// Megatron-LM and Megatron-DeepSpeed arguments in (import_megatron); out in megatron_export.cpp.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/checked.hpp"
#include "core/error.hpp"
#include "interop/common.hpp"
#include "interop/interop.hpp"
#include "model/layout.hpp"
#include "model/partition.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp {
namespace {

// ---------------------------------------------------------------------------------------------
// Megatron-LM arguments.

enum class Arg { Int, Flag, Text, NoEffect, NoEffectFlag, Unsupported, UnsupportedFlag, Launcher };

struct ArgSpec {
  Arg kind;
  const char* why = "";  // Unsupported: what ptdp does not model
};

const std::map<std::string, ArgSpec>& megatron_args() {
  static const std::map<std::string, ArgSpec> table = {
      {"num-layers", {Arg::Int}},
      {"hidden-size", {Arg::Int}},
      {"num-attention-heads", {Arg::Int}},
      {"ffn-hidden-size", {Arg::Int}},
      {"seq-length", {Arg::Int}},
      {"max-position-embeddings", {Arg::Int}},
      {"num-query-groups", {Arg::Int}},
      {"kv-channels", {Arg::Int}},  // the head dimension (default hidden-size / num-attention-heads)
      {"num-key-value-heads", {Arg::Int}},  // Megatron-DeepSpeed: grouped-query attention
      {"group-query-attention", {Arg::Flag}},
      {"vocab-size", {Arg::Int}},
      {"padded-vocab-size", {Arg::Int}},
      {"make-vocab-size-divisible-by", {Arg::Int}},
      {"pad-vocab-size-to", {Arg::Int}},  // Megatron-DeepSpeed
      {"pp-partition-method", {Arg::Text}},  // Megatron-DeepSpeed: uniform | parameters | type:transformer
      {"tokenizer-type", {Arg::Text}},
      {"swiglu", {Arg::Flag}},
      {"normalization", {Arg::Text}},
      {"untie-embeddings-and-output-weights", {Arg::Flag}},
      {"tensor-model-parallel-size", {Arg::Int}},
      {"pipeline-model-parallel-size", {Arg::Int}},
      {"num-layers-per-virtual-pipeline-stage", {Arg::Int}},
      {"num-virtual-stages-per-pipeline-rank", {Arg::Int}},
      {"microbatch-group-size-per-virtual-pipeline-stage", {Arg::Int}},
      {"decoder-first-pipeline-num-layers", {Arg::Int}},
      {"pipeline-model-parallel-layout", {Arg::Text}},
      {"decoder-last-pipeline-num-layers", {Arg::Int}},
      {"overlap-p2p-communication", {Arg::Flag}},
      {"no-overlap-p2p-communication", {Arg::Flag}},
      {"no-scatter-gather-tensors-in-pipeline", {Arg::Flag}},
      {"micro-batch-size", {Arg::Int}},
      {"global-batch-size", {Arg::Int}},
      {"recompute-granularity", {Arg::Text}},
      {"recompute-activations", {Arg::Flag}},
      {"checkpoint-activations", {Arg::Flag}},  // older Megatron-LM, Megatron-DeepSpeed: full recompute
      {"sequence-parallel", {Arg::Flag}},
      {"use-distributed-optimizer", {Arg::Flag}},
      {"fp16", {Arg::Flag}},
      {"bf16", {Arg::Flag}},
      {"train-iters", {Arg::Int}},
      {"train-samples", {Arg::Int}},
      // Launchers (torchrun, python -m torch.distributed.launch): the world size.
      {"nproc_per_node", {Arg::Launcher}},
      {"nproc-per-node", {Arg::Launcher}},
      {"nnodes", {Arg::Launcher}},
      {"num_gpus", {Arg::Launcher}},   // the deepspeed launcher: GPUs per node
      {"num_nodes", {Arg::Launcher}},
      {"no-pipeline-parallel", {Arg::Flag}},  // Megatron-DeepSpeed: pipeline size 1
      {"node_rank", {Arg::NoEffect}},
      {"node-rank", {Arg::NoEffect}},
      {"master_addr", {Arg::NoEffect}},
      {"master-addr", {Arg::NoEffect}},
      {"master_port", {Arg::NoEffect}},
      {"master-port", {Arg::NoEffect}},
      {"rdzv_backend", {Arg::NoEffect}},
      {"rdzv_endpoint", {Arg::NoEffect}},
      {"rdzv_id", {Arg::NoEffect}},
      // Optimizer, data, logging, checkpointing: no effect on the plan's time or memory.
      {"lr", {Arg::NoEffect}},
      {"min-lr", {Arg::NoEffect}},
      {"lr-decay-style", {Arg::NoEffect}},
      {"lr-decay-iters", {Arg::NoEffect}},
      {"lr-decay-samples", {Arg::NoEffect}},
      {"lr-warmup-fraction", {Arg::NoEffect}},
      {"lr-warmup-iters", {Arg::NoEffect}},
      {"lr-warmup-samples", {Arg::NoEffect}},
      {"weight-decay", {Arg::NoEffect}},
      {"clip-grad", {Arg::NoEffect}},
      {"adam-beta1", {Arg::NoEffect}},
      {"adam-beta2", {Arg::NoEffect}},
      {"adam-eps", {Arg::NoEffect}},
      {"optimizer", {Arg::NoEffect}},
      {"init-method-std", {Arg::NoEffect}},
      {"attention-dropout", {Arg::Text}},
      {"hidden-dropout", {Arg::Text}},
      {"attention-backend", {Arg::Text}},
      {"fp8-format", {Arg::Text}},
      {"fp8-param-gather", {Arg::Flag}},
      {"fp8-recipe", {Arg::Text}},
      {"disable-bias-linear", {Arg::Flag}},
      {"overlap-grad-reduce", {Arg::Flag}},
      {"overlap-param-gather", {Arg::Flag}},
      {"tp-comm-overlap", {Arg::Flag}},
      {"ddp-bucket-size", {Arg::Int}},
      {"fp8-recipe", {Arg::NoEffect}},
      {"fp8-amax-history-len", {Arg::NoEffect}},
      {"fp8-amax-compute-algo", {Arg::NoEffect}},
      {"seed", {Arg::NoEffect}},
      {"log-interval", {Arg::NoEffect}},
      {"save-interval", {Arg::NoEffect}},
      {"eval-interval", {Arg::NoEffect}},
      {"eval-iters", {Arg::NoEffect}},
      {"exit-interval", {Arg::NoEffect}},
      {"save", {Arg::NoEffect}},
      {"load", {Arg::NoEffect}},
      {"data-path", {Arg::NoEffect}},
      {"data-cache-path", {Arg::NoEffect}},
      {"split", {Arg::NoEffect}},
      {"vocab-file", {Arg::NoEffect}},
      {"merge-file", {Arg::NoEffect}},
      {"tokenizer-model", {Arg::Text}},
      {"tensorboard-dir", {Arg::NoEffect}},
      {"wandb-project", {Arg::NoEffect}},
      {"distributed-backend", {Arg::NoEffect}},
      {"position-embedding-type", {Arg::Text}},
      {"use-rotary-position-embeddings", {Arg::Flag}},  // older Megatron-LM and Megatron-DeepSpeed
      {"no-position-embedding", {Arg::Flag}},
      {"rotary-base", {Arg::Text}},
      {"rotary-percent", {Arg::Text}},
      {"transformer-impl", {Arg::NoEffect}},
      {"use-mcore-models", {Arg::NoEffectFlag}},
      {"use-flash-attn", {Arg::Flag}},
      {"no-masked-softmax-fusion", {Arg::NoEffectFlag}},
      {"no-bias-gelu-fusion", {Arg::NoEffectFlag}},
      {"no-gradient-accumulation-fusion", {Arg::NoEffectFlag}},
      {"log-throughput", {Arg::NoEffectFlag}},
      {"log-timers-to-tensorboard", {Arg::NoEffectFlag}},
      {"use-checkpoint-args", {Arg::NoEffectFlag}},
      {"no-load-optim", {Arg::NoEffectFlag}},
      {"no-load-rng", {Arg::NoEffectFlag}},
      {"mock-data", {Arg::NoEffectFlag}},
      // They change time or memory, and ptdp does not model them.
      {"recompute-method", {Arg::Text}},       // uniform | block, with --recompute-granularity full
      {"recompute-num-layers", {Arg::Int}},
      {"activations-checkpoint-method", {Arg::Text}},     // 2021: uniform | block, full recomputation
      {"activations-checkpoint-num-layers", {Arg::Int}},
      {"distribute-checkpointed-activations", {Arg::UnsupportedFlag, "saved activations split over tensor-parallel ranks are not modelled"}},
      {"distribute-saved-activations", {Arg::UnsupportedFlag, "saved activations split over tensor-parallel ranks are not modelled"}},
      {"context-parallel-size", {Arg::Int}},
      {"cp-comm-type", {Arg::Text}},
      {"ds-sequence-parallel-size", {Arg::Int}},  // Megatron-DeepSpeed's Ulysses
      {"expert-model-parallel-size", {Arg::Int}},
      {"num-experts", {Arg::Int}},
      {"moe-router-topk", {Arg::Int}},
      {"multi-latent-attention", {Arg::Flag}},
      {"q-lora-rank", {Arg::Int}},
      {"kv-lora-rank", {Arg::Int}},
      {"qk-head-dim", {Arg::Int}},
      {"qk-pos-emb-head-dim", {Arg::Int}},
      {"v-head-dim", {Arg::Int}},
      {"mtp-num-layers", {Arg::Int}},
      {"mtp-loss-scaling-factor", {Arg::Text}},
      {"moe-ffn-hidden-size", {Arg::Int}},
      {"moe-shared-expert-intermediate-size", {Arg::Int}},
      {"moe-expert-capacity-factor", {Arg::Text}},
      {"moe-layer-freq", {Arg::Int}},
      {"moe-router-load-balancing-type", {Arg::Text}},
      {"moe-grouped-gemm", {Arg::NoEffectFlag}},
      {"moe-token-dispatcher-type", {Arg::Text}},
      {"overlap-moe-expert-parallel-comm", {Arg::Flag}},
      {"expert-tensor-parallel-size", {Arg::Int}},
      {"deepspeed", {Arg::Flag}},  // Megatron-DeepSpeed; the ZeRO stage is --zero-stage
      {"deepspeed_config", {Arg::Unsupported, "Megatron-DeepSpeed: import it with `ptdp import deepspeed`"}},
      {"deepspeed-config", {Arg::Unsupported, "Megatron-DeepSpeed: import it with `ptdp import deepspeed`"}},
      {"zero-stage", {Arg::Text}},  // Megatron-DeepSpeed: 0 … 3
  };
  return table;
}

bool takes_value(Arg k) {
  return k == Arg::Int || k == Arg::Text || k == Arg::NoEffect || k == Arg::Unsupported || k == Arg::Launcher;
}

// An integer as Python's int() reads it (Megatron's argparse type): `_` allowed between digits
// (220_000_000).
int64_t to_int(const std::string& arg, const std::string& value, const std::string& source) {
  std::string digits;
  bool grouped_ok = true;
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] != '_') {
      digits += value[i];
      continue;
    }
    grouped_ok = grouped_ok && i > 0 && i + 1 < value.size() && std::isdigit(static_cast<unsigned char>(value[i - 1])) &&
                 std::isdigit(static_cast<unsigned char>(value[i + 1]));
  }
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(digits.c_str(), &end, 10);
  if (!grouped_ok || digits.empty() || end == digits.c_str() || *end != '\0' || errno != 0) {
    const std::string hint = value.find('$') != std::string::npos ? " (a shell variable the script does not set)" : "";
    throw ConfigError("--" + arg, "expected an integer (got '" + printable(value) + "')" + hint, SourceLocation{source, 0, 0});
  }
  return v;
}

}  // namespace

const std::vector<RemovedMegatronFlag>& removed_megatron_flags() {
  static const std::vector<RemovedMegatronFlag> list = {
      {"overlap-p2p-communication", "2024",
       "overlap is the default with interleaving; --no-overlap-p2p-communication turns it off"},
      {"checkpoint-activations", "2022, with selective recomputation", "--recompute-granularity full --recompute-method uniform"},
      {"activations-checkpoint-method", "2022, with selective recomputation", "--recompute-method"},
      {"activations-checkpoint-num-layers", "2022, with selective recomputation", "--recompute-num-layers"},
      {"distribute-checkpointed-activations", "2022, with selective recomputation", "--distribute-saved-activations"},
  };
  return list;
}

namespace {

// The launch line's Megatron-LM arguments: values by name (the last one wins, as in argparse)
// and flags given.
struct MegatronArgs {
  std::map<std::string, std::string> values;
  std::set<std::string> flags;
  std::string source;

  bool has(const std::string& name) const { return values.count(name) > 0; }
  int64_t get(const std::string& name) const { return to_int(name, values.at(name), source); }
  SourceLocation at() const { return SourceLocation{source, 0, 0}; }
};

// Reads `args` against Megatron-LM's argument table: what has no effect, is not supported or is
// unknown goes to `r`; a missing or malformed value is a ConfigError naming the argument.
MegatronArgs read_megatron_args(const std::vector<std::string>& args, const std::string& source, ImportResult& r) {
  const auto& table = megatron_args();
  MegatronArgs a{{}, {}, source};
  auto& values = a.values;  // last one wins, as in argparse
  auto& flags = a.flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word.rfind("--", 0) != 0 || word.size() == 2) continue;  // torchrun, pretrain_gpt.py, …
    std::string name = word.substr(2), value;
    bool inline_value = false;
    if (const auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const auto it = table.find(name);
    const bool next_is_value = i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0;
    if (it == table.end()) {
      // Unknown: take the next word as its value when it is not an option.
      if (!inline_value && next_is_value) value = args[++i], inline_value = true;
      r.unknown.push_back("--" + name + (inline_value ? " " + value : ""));
      continue;
    }
    for (const auto& removed : removed_megatron_flags())
      if (name == removed.flag)
        r.notes.push_back("--" + name + ": an older spelling, not accepted by current Megatron-LM (removed " + removed.removed + "; now " +
                          removed.replacement + ")");
    const Arg kind = it->second.kind;
    if (takes_value(kind) && !inline_value) {
      if (!next_is_value) throw ConfigError("--" + name, "missing value", SourceLocation{source, 0, 0});
      value = args[++i];
    }
    if (!takes_value(kind) && inline_value)
      throw ConfigError("--" + name, "is a flag and takes no value (got '" + printable(value) + "')", SourceLocation{source, 0, 0});
    switch (kind) {
      case Arg::Int:
      case Arg::Launcher:
        // Sizes, counts and launcher values: positive (a 0 or negative one would divide by zero
        // or become a GPU count).
        if (to_int(name, value, source) < 1)
          throw ConfigError("--" + name, "must be a positive integer (got " + printable(value) + ")", SourceLocation{source, 0, 0});
        values[name] = value;
        break;
      case Arg::Text: values[name] = value; break;
      case Arg::Flag: flags.insert(name); break;
      case Arg::NoEffect: r.no_effect.push_back("--" + name + " " + value); break;
      case Arg::NoEffectFlag: r.no_effect.push_back("--" + name); break;
      case Arg::Unsupported: r.unsupported.push_back("--" + name + " " + value + ": " + it->second.why); break;
      case Arg::UnsupportedFlag: r.unsupported.push_back("--" + name + ": " + it->second.why); break;
    }
  }
  return a;
}

// The vocabulary: --vocab-size, --padded-vocab-size, or the size of a tokenizer known by name.
int64_t megatron_vocab(MegatronArgs& a, ImportResult& r) {
  const auto& values = a.values;
  int64_t vocab = 50257;
  if (a.has("vocab-size")) {
    vocab = a.get("vocab-size");
  } else if (a.has("padded-vocab-size")) {
    vocab = a.get("padded-vocab-size");
  } else {
    const std::string tok = values.count("tokenizer-type") ? values.at("tokenizer-type") : "GPT2BPETokenizer";
    // The vocabulary of a tokenizer known by name: Megatron's type, else the model the
    // --tokenizer-model path or Hugging Face name refers to.
    std::string named = values.count("tokenizer-model") ? values.at("tokenizer-model") : "";
    for (auto& c : named) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    auto names = [&](std::initializer_list<const char*> parts) {
      for (const char* part : parts)
        if (named.find(part) != std::string::npos) return true;
      return false;
    };
    int64_t known = 0;
    if (tok == "Llama3Tokenizer" || names({"llama-3", "llama3"})) known = 128256;
    else if (tok == "Llama2Tokenizer" || names({"llama-2", "llama2", "mistral", "mixtral"})) known = 32000;
    if (known > 0) {
      vocab = known;
      r.notes.push_back("vocab_size " + std::to_string(known) + ": the vocabulary of tokenizer " + tok +
                        (named.empty() ? "" : " " + values.at("tokenizer-model")) + " (give --vocab-size if yours differs)");
    } else if (tok != "GPT2BPETokenizer")
      r.notes.push_back("vocab_size 50257 assumed: the vocabulary of tokenizer " + tok + " is not known here (set model.vocab_size)");
    else
      r.notes.push_back("vocab_size 50257: the GPT-2 BPE tokenizer's");
  }
  return vocab;
}

void megatron_positions(MegatronArgs& a, ImportResult& r, std::vector<std::pair<std::string, std::string>>& model) {
  const auto& values = a.values;
  const auto& flags = a.flags;
  // Positions: --position-embedding-type (Megatron-LM: learned_absolute, its default, rope, none;
  // Megatron-DeepSpeed: absolute, rotary), the older --use-rotary-position-embeddings and
  // --no-position-embedding flags; the rotary base and the rotated fraction of each head.
  {
    std::string pos;
    if (a.has("position-embedding-type")) {
      const std::string& kind = values.at("position-embedding-type");
      if (kind == "learned_absolute" || kind == "absolute") pos = "learned";
      else if (kind == "rope" || kind == "rotary") pos = "rope";
      else if (kind == "none") pos = "none";
      else
        throw ConfigError("--position-embedding-type", "'" + printable(kind) + "' is not modelled (ptdp runs learned_absolute, rope and none)",
                          a.at());
    }
    if (flags.count("use-rotary-position-embeddings")) {
      if (!pos.empty() && pos != "rope")
        throw ConfigError("--use-rotary-position-embeddings", "contradicts --position-embedding-type " +
                                                                  printable(values.at("position-embedding-type")),
                          a.at());
      pos = "rope";
    }
    if (flags.count("no-position-embedding") && pos != "rope") pos = "none";
    if (pos.empty()) {
      pos = "learned";
      if (flags.count("swiglu"))
        r.notes.push_back("no --position-embedding-type: Megatron-LM's default learned_absolute (a position table) is imported, "
                          "not rope, ptdp's default for SwiGLU models");
    }
    model.emplace_back("position_embedding", pos);
    auto positive = [&](const std::string& flag, double lo, double hi) {
      char* end = nullptr;
      const std::string& text = values.at(flag);
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !(v > lo && v <= hi))
        throw ConfigError("--" + flag, "expected a number in (" + std::to_string(static_cast<int64_t>(lo)) + ", " +
                                           std::to_string(static_cast<int64_t>(hi)) + "] (got '" + printable(text) + "')",
                          a.at());
      std::ostringstream out;
      out << v;
      return out.str();
    };
    if (a.has("rotary-base")) model.emplace_back("rotary_base", positive("rotary-base", 0, 1e12));
    if (a.has("rotary-percent")) model.emplace_back("rotary_percent", positive("rotary-percent", 0, 1));
    if (pos != "rope" && (a.has("rotary-base") || a.has("rotary-percent")))
      r.notes.push_back("--rotary-base / --rotary-percent without rotary embeddings: Megatron-LM ignores them");
  }
}

void megatron_moe(MegatronArgs& a, ImportResult& r, std::vector<std::pair<std::string, std::string>>& model) {
  const auto& values = a.values;
  // Mixture of experts: Megatron-Core's MoE arguments (the shared experts' intermediate size is
  // their total width: one shared expert of that size).
  if (a.has("num-experts")) {
    std::vector<std::pair<std::string, std::string>> moe = {{"num_experts", std::to_string(a.get("num-experts"))}};
    moe.emplace_back("top_k", std::to_string(a.has("moe-router-topk") ? a.get("moe-router-topk") : 2));
    if (a.has("moe-ffn-hidden-size")) moe.emplace_back("expert_ffn_hidden_size", std::to_string(a.get("moe-ffn-hidden-size")));
    if (a.has("moe-shared-expert-intermediate-size")) {
      moe.emplace_back("shared_experts", "1");
      moe.emplace_back("shared_expert_ffn_hidden_size", std::to_string(a.get("moe-shared-expert-intermediate-size")));
    }
    if (a.has("moe-layer-freq")) moe.emplace_back("moe_layer_frequency", std::to_string(a.get("moe-layer-freq")));
    if (a.has("moe-expert-capacity-factor")) {
      char* end = nullptr;
      const std::string& text = values.at("moe-expert-capacity-factor");
      const double f = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !(f > 0 && f <= 1000))
        throw ConfigError("--moe-expert-capacity-factor", "expected a positive number (got '" + printable(text) + "')", a.at());
      std::ostringstream v;
      v << f;
      moe.emplace_back("capacity_factor", v.str());
    }
    if (a.has("moe-router-load-balancing-type")) {
      const std::string lb = values.at("moe-router-load-balancing-type");
      if (lb == "aux_loss" || lb == "seq_aux_loss" || lb == "global_aux_loss") moe.emplace_back("router_load_balance", "aux_loss");
      else if (lb == "none") moe.emplace_back("router_load_balance", "aux_free");
      else r.unsupported.push_back("--moe-router-load-balancing-type " + printable(lb) + ": modelled as aux_loss");
    }
    model.emplace_back("moe", yaml_list(moe));
  } else if (a.has("moe-router-topk") || a.has("moe-ffn-hidden-size")) {
    throw ConfigError(a.has("moe-router-topk") ? "--moe-router-topk" : "--moe-ffn-hidden-size", "needs --num-experts", a.at());
  }
}

// Multi-head latent attention (--multi-latent-attention and its widths, Megatron-LM's defaults:
// no query latent, key/value latent 32, QK heads 128 + 64, value heads 128) and multi-token
// prediction (--mtp-num-layers).
void megatron_mla_mtp(MegatronArgs& a, ImportResult& r, std::vector<std::pair<std::string, std::string>>& model) {
  if (a.flags.count("multi-latent-attention")) {
    auto width = [&](const char* flag, int64_t fallback) { return std::to_string(a.has(flag) ? a.get(flag) : fallback); };
    model.emplace_back("mla", yaml_list({{"q_lora_rank", width("q-lora-rank", 0)},
                                         {"kv_lora_rank", width("kv-lora-rank", 32)},
                                         {"qk_head_dim", width("qk-head-dim", 128)},
                                         {"qk_pos_emb_head_dim", width("qk-pos-emb-head-dim", 64)},
                                         {"v_head_dim", width("v-head-dim", 128)}}));
  } else {
    for (const char* flag : {"q-lora-rank", "kv-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim"})
      if (a.has(flag)) r.notes.push_back(std::string("--") + flag + " without --multi-latent-attention: Megatron-LM ignores it, so does this import");
  }
  if (a.has("mtp-num-layers")) model.emplace_back("mtp_layers", std::to_string(a.get("mtp-num-layers")));
  // The loader's key table checks the number (model.mtp_loss_scale).
  if (a.has("mtp-loss-scaling-factor")) model.emplace_back("mtp_loss_scale", a.values.at("mtp-loss-scaling-factor"));
}

void megatron_biases_dropout_attention(MegatronArgs& a, ImportResult& r, std::vector<std::pair<std::string, std::string>>& model) {
  const auto& values = a.values;
  const auto& flags = a.flags;
  // Megatron-LM's defaults differ from ptdp's Llama-style ones: biases on unless
  // --disable-bias-linear, dropout 0.1 unless set; attention fused (flash) unless the backend says
  // otherwise.
  model.emplace_back("bias", flags.count("disable-bias-linear") ? "false" : "true");
  {
    auto rate = [&](const char* arg) -> double {
      if (!a.has(arg)) return 0.1;
      const std::string& text = values.at(arg);
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !(v >= 0 && v < 1))
        throw ConfigError(std::string("--") + arg, "expected a probability in [0, 1) (got '" + printable(text) + "')", a.at());
      return v;
    };
    const double attention = rate("attention-dropout"), hidden = rate("hidden-dropout");
    if (attention != hidden)
      r.notes.push_back("model.dropout = " + std::to_string(std::max(attention, hidden)) + ": ptdp models one rate for --attention-dropout (" +
                        std::to_string(attention) + ") and --hidden-dropout (" + std::to_string(hidden) + "); the larger is kept");
    std::ostringstream d;
    d << std::max(attention, hidden);
    model.emplace_back("dropout", d.str());
  }
  if (a.has("attention-backend")) {
    const std::string b = values.at("attention-backend");
    if (flags.count("use-flash-attn") && (b == "unfused" || b == "local"))
      throw ConfigError("--use-flash-attn", "contradicts --attention-backend " + printable(b) + ": give one of them", a.at());
    if (b == "unfused" || b == "local") model.emplace_back("attention", "unfused");
    else if (b == "flash" || b == "fused" || b == "auto") model.emplace_back("attention", "flash");
    else
      throw ConfigError("--attention-backend", "expected flash, fused, unfused, local or auto (got '" + printable(b) + "')", a.at());
  } else {
    model.emplace_back("attention", "flash");
  }
}

// The model keys of the arguments (sizes, vocabulary and its padding, MLP and norm kinds, experts,
// biases, dropout, attention kind), `seq` its sequence length; --num-layers, --hidden-size and
// --num-attention-heads required. Megatron-DeepSpeed's --num-key-value-heads becomes
// --num-query-groups with --group-query-attention in `a`.
std::vector<std::pair<std::string, std::string>> megatron_model(MegatronArgs& a, ImportResult& r, int64_t& seq) {
  auto& values = a.values;
  auto& flags = a.flags;
  const std::string& source = a.source;
  auto get = [&](const std::string& name) { return to_int(name, values.at(name), source); };
  auto has = [&](const std::string& name) { return values.count(name) > 0; };
  auto require = [&](const std::string& name) {
    if (!has(name)) throw ConfigError("--" + name, "missing (required to describe the model)", SourceLocation{source, 0, 0});
    return get(name);
  };

  // model
  std::vector<std::pair<std::string, std::string>> model = {{"name", "megatron-import"}};
  const int64_t layers = require("num-layers");
  model.emplace_back("num_layers", std::to_string(layers));
  model.emplace_back("hidden_size", std::to_string(require("hidden-size")));
  model.emplace_back("num_attention_heads", std::to_string(require("num-attention-heads")));
  if (has("kv-channels")) model.emplace_back("head_dim", std::to_string(get("kv-channels")));
  if (has("num-key-value-heads")) {  // Megatron-DeepSpeed's spelling: grouped-query attention on
    if (!has("num-query-groups")) values["num-query-groups"] = values.at("num-key-value-heads");
    flags.insert("group-query-attention");
  }
  if (flags.count("group-query-attention") || has("num-query-groups")) {
    if (!has("num-query-groups")) throw ConfigError("--num-query-groups", "missing (required with --group-query-attention)", SourceLocation{source, 0, 0});
    if (!flags.count("group-query-attention"))
      r.notes.push_back("--num-query-groups without --group-query-attention: Megatron-LM ignores it, so does this import");
    else
      model.emplace_back("num_query_groups", std::to_string(get("num-query-groups")));
  }
  if (has("ffn-hidden-size")) model.emplace_back("ffn_hidden_size", std::to_string(get("ffn-hidden-size")));
  seq = 0;
  if (has("seq-length")) {
    seq = get("seq-length");
  } else if (has("max-position-embeddings")) {
    seq = get("max-position-embeddings");
    r.notes.push_back("seq_length = --max-position-embeddings (no --seq-length)");
  } else {
    throw ConfigError("--seq-length", "missing (required to describe the model)", SourceLocation{source, 0, 0});
  }
  model.emplace_back("seq_length", std::to_string(seq));
  const int64_t vocab = megatron_vocab(a, r);
  model.emplace_back("vocab_size", std::to_string(vocab));
  // Vocabulary padding: to a multiple of N × t (Megatron's default N 128), or to a given size.
  if (has("make-vocab-size-divisible-by")) model.emplace_back("vocab_divisible_by", std::to_string(get("make-vocab-size-divisible-by")));
  if (has("pad-vocab-size-to")) {
    if (get("pad-vocab-size-to") < vocab)
      throw ConfigError("--pad-vocab-size-to", std::to_string(get("pad-vocab-size-to")) + " is smaller than the vocabulary (" +
                                                   std::to_string(vocab) + ")",
                        SourceLocation{source, 0, 0});
    model.emplace_back("padded_vocab_size", std::to_string(get("pad-vocab-size-to")));
  }
  if (flags.count("swiglu")) model.emplace_back("mlp", "swiglu");
  if (has("normalization")) {
    const std::string n = values.at("normalization");
    // Megatron-LM spells the choices LayerNorm / RMSNorm, Megatron-DeepSpeed layernorm / rmsnorm.
    if (n == "RMSNorm" || n == "rmsnorm") model.emplace_back("normalization", "rmsnorm");
    else if (n != "LayerNorm" && n != "layernorm")
      throw ConfigError("--normalization", "expected LayerNorm or RMSNorm (got '" + printable(n) + "')", SourceLocation{source, 0, 0});
  }
  if (flags.count("untie-embeddings-and-output-weights")) model.emplace_back("tie_embeddings", "false");
  megatron_positions(a, r, model);
  megatron_moe(a, r, model);
  megatron_mla_mtp(a, r, model);
  megatron_biases_dropout_attention(a, r, model);

  return model;
}

// Megatron-Core's --pipeline-model-parallel-layout into parallel.pipeline_layout: its stages
// over the pipeline size give the virtual stages (Megatron sets them so); the layout is checked
// here for its syntax and against the pipeline size, and against the model when the scenario loads.
int64_t megatron_layout(const MegatronArgs& a, int64_t p, int64_t v, std::vector<std::pair<std::string, std::string>>& parallel) {
  const std::string flag = "--pipeline-model-parallel-layout";
  const SourceLocation at{a.source, 0, 0};
  const std::string& text = a.values.at("pipeline-model-parallel-layout");
  std::vector<LayoutStage> stages;
  try {
    stages = parse_pipeline_layout(text, flag);
  } catch (const ConfigError& e) {
    throw ConfigError(flag, e.message(), at);
  }
  for (const char* other : {"decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers", "num-layers-per-virtual-pipeline-stage"})
    if (a.values.count(other))
      throw ConfigError(flag, std::string("together with --") + other + ": the layout places every layer already; give one of them", at);
  for (const char* other : {"account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split"})
    if (a.flags.count(other))
      throw ConfigError(flag, std::string("together with --") + other + ": the layout places the embedding and the loss already", at);
  const int64_t n = static_cast<int64_t>(stages.size());
  if (p < 1 || n % p != 0)
    throw ConfigError(flag, "has " + std::to_string(n) + " stages, not a multiple of --pipeline-model-parallel-size " + std::to_string(p), at);
  if (a.values.count("num-virtual-stages-per-pipeline-rank") && v != n / p)
    throw ConfigError(flag, "has " + std::to_string(n) + " stages: " + std::to_string(n / p) + " per pipeline rank, but "
                            "--num-virtual-stages-per-pipeline-rank is " + std::to_string(v), at);
  parallel.emplace_back("pipeline_layout", "\"" + text + "\"");  // E t m L | ( ) * digits and commas only: no escaping
  return n / p;
}

// Megatron-DeepSpeed's --pp-partition-method as stage layer counts (or a note on what it means
// for ptdp's placement), into `parallel`.
void megatron_partition(const MegatronArgs& a, int64_t layers, int64_t p, std::vector<std::pair<std::string, std::string>>& parallel,
                        ImportResult& r) {
  const auto& values = a.values;
  if (values.count("pp-partition-method")) {
    // Megatron-DeepSpeed's layer placement: transformer layers evenly, or balanced by parameters
    // (its default; ptdp balances the costed stage times, embedding and output layer included).
    const std::string method = values.at("pp-partition-method");
    std::string lowered = method;
    for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::vector<std::string> types;  // type:A|B — the layer classes that count (a regex each, searched case-blind)
    if (lowered.rfind("type:", 0) == 0)
      for (size_t from = 5; from <= lowered.size();) {
        const size_t bar = std::min(lowered.find('|', from), lowered.size());
        types.push_back(lowered.substr(from, bar - from));
        from = bar + 1;
      }
    const auto counts = [&](const char* cls) {
      return std::any_of(types.begin(), types.end(), [&](const std::string& t) { return !t.empty() && std::string(cls).find(t) != std::string::npos; });
    };
    const bool typed = !types.empty() && counts("paralleltransformerlayerpipe") &&
                       std::all_of(types.begin(), types.end(), [](const std::string& t) {
                         return t == "transformer" || t == "embedding" || t == "embed" || t == "transformerlayer";
                       });
    if (lowered == "uniform" || (typed && !counts("embeddingpipe"))) {
      parallel.emplace_back("partition", "uniform");
    } else if (typed) {
      // The embedding pipes count as layers too: DeepSpeed spreads the transformer layers and the
      // two embeddings (input, and the tied one before the head) evenly, the first `rest` stages
      // one item more, so the first and last stage hold one transformer layer less.
      const int64_t items = layers + 2, base = items / std::max<int64_t>(1, p), rest = items % std::max<int64_t>(1, p);
      auto part = [&](int64_t stage) { return base + (stage < rest ? 1 : 0); };
      bool inner_equal = true;
      for (int64_t st = 2; st + 1 < p; ++st) inner_equal = inner_equal && part(st) == part(1);
      if (p < 2 || part(0) < 2 || part(p - 1) < 2 || !inner_equal) {
        r.unsupported.push_back("--pp-partition-method " + method + ": " + std::to_string(items) + " layers and embeddings over " +
                                std::to_string(p) + " stages give stage sizes ptdp's first/last-stage keys cannot express (placed uniformly)");
        parallel.emplace_back("partition", "uniform");
      } else {
        parallel.emplace_back("first_stage_layers", std::to_string(part(0) - 1));
        if (p > 2) parallel.emplace_back("last_stage_layers", std::to_string(part(p - 1) - 1));
        r.notes.push_back("--pp-partition-method " + method + ": the embedding pipes count as layers, so the first stage holds " +
                          std::to_string(part(0) - 1) + " transformer layers, the last " + std::to_string(part(p - 1) - 1) +
                          (p > 2 ? ", the others " + std::to_string(part(1)) : std::string()));
      }
    } else if (lowered == "parameters") {
      parallel.emplace_back("partition", "balanced");
      r.notes.push_back("--pp-partition-method parameters: partition balanced (ptdp balances the stages' costed times, which the "
                        "embedding and output layer weigh in as their parameters do)");
    } else {
      r.unsupported.push_back("--pp-partition-method " + method + ": not modelled (uniform, parameters, type:transformer and "
                              "type:transformer|embedding are)");
    }
  }
}

// Activation recomputation: none, selective or full, from today's --recompute-granularity,
// --recompute-method/--recompute-num-layers and the older --checkpoint-activations,
// --recompute-activations and --activations-checkpoint-method spellings; what ptdp models
// differently goes to `r`; the recompute key into `parallel`.
std::string megatron_recompute(MegatronArgs& a, int64_t layers, int64_t p, std::vector<std::pair<std::string, std::string>>& parallel,
                               ImportResult& r) {
  auto& values = a.values;  // the older spellings are read as today's
  const auto& flags = a.flags;
  const std::string& source = a.source;
  auto get = [&](const std::string& name) { return to_int(name, values.at(name), source); };
  auto has = [&](const std::string& name) { return values.count(name) > 0; };
  // The 2021 spelling (the SC'21 runs): --activations-checkpoint-method uniform|block alone turned
  // full recomputation on, as --recompute-granularity full --recompute-method does now.
  if (has("activations-checkpoint-method")) {
    if (has("recompute-method"))
      throw ConfigError("--activations-checkpoint-method", "together with --recompute-method: give one of them", SourceLocation{source, 0, 0});
    values["recompute-method"] = values.at("activations-checkpoint-method");
    if (!has("recompute-granularity") && !flags.count("checkpoint-activations") && !flags.count("recompute-activations"))
      values["recompute-granularity"] = "full";
    r.notes.push_back("--activations-checkpoint-method " + values.at("activations-checkpoint-method") +
                      " (2021 spelling): full recomputation, as --recompute-granularity full --recompute-method " +
                      values.at("activations-checkpoint-method"));
  }
  if (has("activations-checkpoint-num-layers")) {
    if (has("recompute-num-layers"))
      throw ConfigError("--activations-checkpoint-num-layers", "together with --recompute-num-layers: give one of them", SourceLocation{source, 0, 0});
    values["recompute-num-layers"] = values.at("activations-checkpoint-num-layers");
  }
  std::string recompute = "none";
  if (flags.count("recompute-activations")) recompute = "selective";
  if (flags.count("checkpoint-activations")) {
    if (flags.count("recompute-activations") || has("recompute-granularity"))
      throw ConfigError("--checkpoint-activations", "contradicts --recompute-activations / --recompute-granularity: give one of them",
                        SourceLocation{source, 0, 0});
    recompute = "full";
    r.notes.push_back("--checkpoint-activations (older Megatron-LM spelling): full recompute of every layer");
  }
  if (has("recompute-granularity")) {
    if (flags.count("recompute-activations") && values.at("recompute-granularity") != "selective")
      throw ConfigError("--recompute-activations", "contradicts --recompute-granularity " + printable(values.at("recompute-granularity")) +
                                                       " (--recompute-activations means selective): give one of them",
                        SourceLocation{source, 0, 0});
    recompute = values.at("recompute-granularity");
    if (recompute != "full" && recompute != "selective")
      throw ConfigError("--recompute-granularity", "expected full or selective (got '" + printable(recompute) + "')", SourceLocation{source, 0, 0});
  }
  parallel.emplace_back("recompute", recompute);
  // --recompute-method with full granularity: `uniform` recomputes every layer, checkpointing the
  // input of each chunk of N layers (N = 1: each layer's, what ptdp models); `block` recomputes
  // N layers of each stage only (partial recomputation). Without full granularity Megatron
  // ignores both.
  if (has("recompute-method") || has("recompute-num-layers")) {
    const std::string method = has("recompute-method") ? values.at("recompute-method") : "";
    const int64_t chunk = has("recompute-num-layers") ? get("recompute-num-layers") : 1;
    if (!method.empty() && method != "uniform" && method != "block")
      throw ConfigError("--recompute-method", "expected uniform or block (got '" + printable(method) + "')", SourceLocation{source, 0, 0});
    const std::string shown = (method.empty() ? "" : "--recompute-method " + method + " ") + "--recompute-num-layers " + std::to_string(chunk);
    const int64_t per_stage = layers / std::max<int64_t>(1, p);
    if (recompute != "full") {
      r.no_effect.push_back(shown + ": Megatron-LM reads them with --recompute-granularity full only");
    } else if (method == "block" && chunk < per_stage) {
      r.unsupported.push_back(shown + ": partial recomputation (" + std::to_string(chunk) + " of about " + std::to_string(per_stage) +
                              " layers per stage); ptdp recomputes every layer");
    } else if (method == "uniform" && chunk > 1) {
      r.unsupported.push_back(shown + ": one checkpoint per " + std::to_string(chunk) +
                              " layers (less activation memory than ptdp's one per layer; the same recomputation)");
    } else {
      r.notes.push_back(shown + ": every layer recomputed from its own checkpoint (ptdp's full recompute)");
    }
  }
  return recompute;
}

// The training keys: batch sizes (the global batch defaults to micro × data), precision (FP8
// from Transformer Engine's flags), train_tokens from --train-iters or --train-samples; DeepSpeed's
// BF16 optimizer as zero_stage 1 into `parallel`.
std::vector<std::pair<std::string, std::string>> megatron_training(const MegatronArgs& a, int64_t t, int64_t p, int64_t gpus, int64_t seq,
                                                                   std::vector<std::pair<std::string, std::string>>& parallel,
                                                                   ImportResult& r) {
  const auto& values = a.values;
  const auto& flags = a.flags;
  const std::string& source = a.source;
  auto get = [&](const std::string& name) { return to_int(name, values.at(name), source); };
  auto has = [&](const std::string& name) { return values.count(name) > 0; };
  const int64_t micro = has("micro-batch-size") ? get("micro-batch-size") : 1;
  const int64_t tp = checked_mul(t, p, "--pipeline-model-parallel-size", SourceLocation{source, 0, 0});
  const int64_t d = (tp > 0 && gpus % tp == 0) ? gpus / tp : 1;
  int64_t global = 0;
  if (has("global-batch-size")) {
    global = get("global-batch-size");
  } else {
    global = micro * d;
    r.notes.push_back("global_batch = micro_batch × data = " + std::to_string(global) + " (Megatron-LM's default without --global-batch-size)");
  }
  std::string precision = "fp32";
  if (flags.count("fp16") && flags.count("bf16"))
    throw ConfigError("--bf16", "--fp16 and --bf16 together (Megatron-LM refuses them too)", SourceLocation{source, 0, 0});
  if (flags.count("fp16")) precision = "fp16";
  if (flags.count("bf16")) precision = "bf16";
  if (precision == "fp32") r.notes.push_back("precision fp32: neither --fp16 nor --bf16 given");
  if (flags.count("deepspeed") && !flags.count("use-distributed-optimizer") &&
      std::none_of(parallel.begin(), parallel.end(), [](const auto& kv) { return kv.first == "zero_stage"; }) &&
      deepspeed_zero_stage(0, precision == "bf16", r.notes) == 1)
    parallel.emplace_back("zero_stage", "1");  // DeepSpeed's BF16 optimizer, as `ptdp import deepspeed` reads it
  std::vector<std::pair<std::string, std::string>> training = {{"global_batch", std::to_string(global)}, {"micro_batch", std::to_string(micro)}};
  if (has("fp8-format")) {
    // Transformer Engine's FP8 on top of --bf16 (or --fp16): the linear layers' GEMMs.
    const std::string f = values.at("fp8-format");
    if (f != "hybrid" && f != "e4m3")
      throw ConfigError("--fp8-format", "expected hybrid or e4m3 (got '" + printable(f) + "')", SourceLocation{source, 0, 0});
    precision = "fp8";
    training.emplace_back("fp8_format", f);
  }
  training.emplace_back("precision", precision);
  training.emplace_back("framework", "megatron");
  // TE's flash backend (--attention-backend flash) and --use-flash-attn run flash-attn 2 (3 only where installed).
  if ((has("attention-backend") && values.at("attention-backend") == "flash") || flags.count("use-flash-attn")) training.emplace_back("attention_kernel", "flash2");
  if (has("fp8-recipe")) {
    // Megatron's --fp8-recipe: delayed and tensorwise scale per tensor; blockwise; mxfp8.
    const std::string f = values.at("fp8-recipe");
    if (f == "delayed" || f == "tensorwise") training.emplace_back("fp8_recipe", "tensorwise");
    else if (f == "blockwise" || f == "mxfp8") training.emplace_back("fp8_recipe", f);
    else
      throw ConfigError("--fp8-recipe", "expected delayed, tensorwise, blockwise or mxfp8 (got '" + printable(f) + "')", SourceLocation{source, 0, 0});
  }
  if (flags.count("fp8-param-gather")) training.emplace_back("fp8_param_gather", "true");
  const SourceLocation at{source, 0, 0};
  if (has("train-iters"))
    training.emplace_back("train_tokens", std::to_string(checked_mul(checked_mul(get("train-iters"), global, "--train-iters", at), seq, "--train-iters", at)));
  else if (has("train-samples"))
    training.emplace_back("train_tokens", std::to_string(checked_mul(get("train-samples"), seq, "--train-samples", at)));
  return training;
}

}  // namespace

ImportResult import_megatron(const std::vector<std::string>& args, const std::string& source, const ImportOptions& options) {
  ImportResult r;
  MegatronArgs a = read_megatron_args(args, source, r);
  auto& values = a.values;
  auto& flags = a.flags;
  auto get = [&](const std::string& name) { return to_int(name, values.at(name), source); };
  auto has = [&](const std::string& name) { return values.count(name) > 0; };


  int64_t seq = 0;
  std::vector<std::pair<std::string, std::string>> model = megatron_model(a, r, seq);
  const int64_t layers = get("num-layers");

  // parallel
  const int64_t t = has("tensor-model-parallel-size") ? get("tensor-model-parallel-size") : 1;
  const int64_t p = has("pipeline-model-parallel-size") ? get("pipeline-model-parallel-size") : 1;
  int64_t gpus = options.gpus;
  if (gpus == 0 && (has("nproc_per_node") || has("nproc-per-node"))) {
    const int64_t per_node = has("nproc_per_node") ? get("nproc_per_node") : get("nproc-per-node");
    gpus = checked_mul(per_node, has("nnodes") ? get("nnodes") : 1, "--nnodes", SourceLocation{source, 0, 0});
  }
  if (gpus == 0 && has("num_gpus"))  // deepspeed --num_nodes N --num_gpus G
    gpus = checked_mul(get("num_gpus"), has("num_nodes") ? get("num_nodes") : 1, "--num_nodes", SourceLocation{source, 0, 0});
  if (flags.count("no-pipeline-parallel") && p > 1)
    throw ConfigError("--no-pipeline-parallel", "contradicts --pipeline-model-parallel-size " + std::to_string(p), SourceLocation{source, 0, 0});
  if (gpus == 0) {
    gpus = checked_mul(t, p, "--pipeline-model-parallel-size", SourceLocation{source, 0, 0});
    r.notes.push_back("cluster.gpus = t·p = " + std::to_string(gpus) +
                      " (data-parallel size 1): Megatron-LM takes the world size from the launcher; give --gpus N");
  }
  std::vector<std::pair<std::string, std::string>> parallel = {{"tensor", std::to_string(t)}, {"pipeline", std::to_string(p)}};
  int64_t v = 1;
  if (has("num-virtual-stages-per-pipeline-rank")) v = get("num-virtual-stages-per-pipeline-rank");
  if (has("num-virtual-stages-per-pipeline-rank") && has("num-layers-per-virtual-pipeline-stage"))  // Megatron-LM refuses the pair too
    throw ConfigError("--num-layers-per-virtual-pipeline-stage",
                      "together with --num-virtual-stages-per-pipeline-rank: give one of them (Megatron-LM refuses both)",
                      SourceLocation{source, 0, 0});
  if (has("num-layers-per-virtual-pipeline-stage")) {
    const int64_t per = get("num-layers-per-virtual-pipeline-stage");
    if (per <= 0 || p <= 0 || layers % checked_mul(per, p, "--num-layers-per-virtual-pipeline-stage", SourceLocation{source, 0, 0}) != 0)
      throw ConfigError("--num-layers-per-virtual-pipeline-stage",
                        "must divide num_layers / pipeline (" + std::to_string(layers) + " / " + std::to_string(p) + ", got " + std::to_string(per) + ")",
                        SourceLocation{source, 0, 0});
    v = layers / (per * p);
  }
  if (has("pipeline-model-parallel-layout")) v = megatron_layout(a, p, v, parallel);
  if (v > 1) {
    parallel.emplace_back("virtual_stages", std::to_string(v));
    parallel.emplace_back("schedule", "interleaved");
  } else {
    parallel.emplace_back("schedule", "1f1b");
  }
  // Context and expert parallelism (Megatron-Core): cp ranks between tensor and data in the rank
  // order, ep (and etp) carved from the t·cp·d ranks.
  if (has("context-parallel-size") && get("context-parallel-size") != 1)
    parallel.emplace_back("context", std::to_string(get("context-parallel-size")));
  // Megatron-DeepSpeed's sequence parallelism is DeepSpeed-Ulysses over that many ranks.
  if (has("ds-sequence-parallel-size") && get("ds-sequence-parallel-size") != 1) {
    if (has("context-parallel-size") && get("context-parallel-size") != 1)
      throw ConfigError("--ds-sequence-parallel-size", "and --context-parallel-size both split the sequence: give one",
                        SourceLocation{source, 0, 0});
    parallel.emplace_back("context", std::to_string(get("ds-sequence-parallel-size")));
    parallel.emplace_back("context_comm", "alltoall");
  }
  if (values.count("cp-comm-type")) {
    const std::string& kind = values.at("cp-comm-type");
    if (kind == "p2p") parallel.emplace_back("context_comm", "ring");
    else if (kind == "all_gather") parallel.emplace_back("context_comm", "allgather");
    else if (kind == "a2a") parallel.emplace_back("context_comm", "alltoall");
    else if (kind == "a2a+p2p") {
      parallel.emplace_back("context_comm", "alltoall");
      r.unsupported.push_back("--cp-comm-type a2a+p2p: the hierarchical exchange (all-to-all inside a sub-group, the ring between "
                              "them) is not modelled; the plan uses the all-to-all (Ulysses) over the whole context group");
    }
    else
      throw ConfigError("--cp-comm-type", "expected p2p, all_gather, a2a or a2a+p2p (got '" + printable(kind) + "')", SourceLocation{source, 0, 0});
  }
  if (has("expert-model-parallel-size") && get("expert-model-parallel-size") != 1)
    parallel.emplace_back("expert", std::to_string(get("expert-model-parallel-size")));
  if (flags.count("overlap-moe-expert-parallel-comm")) parallel.emplace_back("moe_comm_overlap", "true");
  if (has("expert-tensor-parallel-size")) parallel.emplace_back("expert_tensor", std::to_string(get("expert-tensor-parallel-size")));
  if (values.count("moe-token-dispatcher-type")) {
    const std::string& kind = values.at("moe-token-dispatcher-type");
    if (kind == "alltoall" || kind == "allgather") parallel.emplace_back("moe_dispatcher", kind);
    else if (kind == "flex" || kind == "alltoall_seq")
      r.unsupported.push_back("--moe-token-dispatcher-type " + kind + ": priced as alltoall (DeepEP's deduplication of cross-node tokens is not modelled)"),
          parallel.emplace_back("moe_dispatcher", "alltoall");
    else
      throw ConfigError("--moe-token-dispatcher-type", "expected alltoall, allgather or flex (got '" + printable(kind) + "')", SourceLocation{source, 0, 0});
  } else if (has("num-experts")) {
    parallel.emplace_back("moe_dispatcher", "allgather");  // Megatron-Core's default
  }
  if (has("microbatch-group-size-per-virtual-pipeline-stage"))
    parallel.emplace_back("microbatch_group", std::to_string(get("microbatch-group-size-per-virtual-pipeline-stage")));
  if (has("decoder-first-pipeline-num-layers")) parallel.emplace_back("first_stage_layers", std::to_string(get("decoder-first-pipeline-num-layers")));
  megatron_partition(a, layers, p, parallel, r);
  if (has("decoder-last-pipeline-num-layers")) parallel.emplace_back("last_stage_layers", std::to_string(get("decoder-last-pipeline-num-layers")));
  if (flags.count("overlap-p2p-communication") && flags.count("no-overlap-p2p-communication"))
    throw ConfigError("--no-overlap-p2p-communication", "contradicts --overlap-p2p-communication: give one of them", SourceLocation{source, 0, 0});
  // Current Megatron-LM overlaps the interleaved schedule's p2p by default
  // (--no-overlap-p2p-communication turns it off) and never overlaps without interleaving.
  if (v > 1) {
    const bool overlap = !flags.count("no-overlap-p2p-communication");
    parallel.emplace_back("overlap_p2p", overlap ? "true" : "false");
    if (overlap && !flags.count("overlap-p2p-communication"))
      r.notes.push_back("overlap_p2p true: Megatron-LM overlaps the interleaved schedule's p2p by default (older versions needed "
                        "--overlap-p2p-communication; give --no-overlap-p2p-communication for those)");
  } else if (flags.count("overlap-p2p-communication")) {
    r.notes.push_back("--overlap-p2p-communication without interleaving: Megatron-LM does not overlap then, neither does this import");
  }
  if (flags.count("no-scatter-gather-tensors-in-pipeline")) parallel.emplace_back("scatter_gather", "false");
  const std::string recompute = megatron_recompute(a, layers, p, parallel, r);
  auto mapped_flag = [&](const char* flag, const char* key, const char* value, const char* what) {
    if (!flags.count(flag)) return;
    if (has_key(key))
      parallel.emplace_back(std::string(key).substr(9), value);
    else
      r.unsupported.push_back(std::string("--") + flag + ": " + what + " is not yet supported by this ptdp (no key " + key + ")");
  };
  if (flags.count("sequence-parallel") && t == 1) {
    // Megatron-LM turns sequence parallelism off at tensor-parallel size 1 (with a warning).
    flags.erase("sequence-parallel");
    r.notes.push_back("--sequence-parallel at --tensor-model-parallel-size 1: disabled, as Megatron-LM does");
  }
  mapped_flag("sequence-parallel", "parallel.sequence_parallel", "true", "sequence parallelism");
  {
    // Megatron-LM runs the distributed optimizer over one data-parallel rank (t 8 on 8 GPUs):
    // sharding over one rank is no sharding, imported as zero_stage 0.
    const int64_t cp = has("context-parallel-size") ? get("context-parallel-size") : 1;
    const int64_t model_ranks = checked_mul(checked_mul(t, p, "--pipeline-model-parallel-size", SourceLocation{source, 0, 0}), cp,
                                            "--context-parallel-size", SourceLocation{source, 0, 0});
    if (flags.count("use-distributed-optimizer") && model_ranks > 0 && gpus == model_ranks && !values.count("zero-stage")) {
      flags.erase("use-distributed-optimizer");
      r.notes.push_back("--use-distributed-optimizer with one data-parallel rank: nothing to shard (zero_stage 0), as Megatron-LM runs it");
    }
  }
  mapped_flag("use-distributed-optimizer", "parallel.zero_stage", "1", "the distributed optimizer (ZeRO-1)");
  if (values.count("zero-stage")) {
    const std::string z = values.at("zero-stage");
    if (z != "0" && z != "1" && z != "2" && z != "3")
      throw ConfigError("--zero-stage", "expected 0, 1, 2 or 3 (got '" + printable(z) + "')", SourceLocation{source, 0, 0});
    if (flags.count("use-distributed-optimizer"))
      throw ConfigError("--zero-stage", "together with --use-distributed-optimizer: give one of them", SourceLocation{source, 0, 0});
    if (z != "0") parallel.emplace_back("zero_stage", z);
  }
  mapped_flag("overlap-grad-reduce", "parallel.overlap_grad_reduce", "true", "--overlap-grad-reduce");
  mapped_flag("overlap-param-gather", "parallel.overlap_param_gather", "true", "--overlap-param-gather");
  mapped_flag("tp-comm-overlap", "parallel.tp_comm_overlap", "true", "--tp-comm-overlap");
  if (has("ddp-bucket-size")) parallel.emplace_back("bucket_size", std::to_string(get("ddp-bucket-size")));

  const auto training = megatron_training(a, t, p, gpus, seq, parallel, r);

  std::ostringstream y;
  y << "# imported from Megatron-LM arguments (" << source << ") by ptdp import megatron\n";
  y << "model:    " << yaml_list(model) << "\n";
  y << "cluster:  " << yaml_list({{"topology", options.topology}, {"gpus", std::to_string(gpus)}}) << "\n";
  y << "parallel: " << yaml_list(parallel) << "\n";
  y << "training: " << yaml_list(training) << "\n";
  finish_import(r, y.str(), source);
  return r;
}

}  // namespace ptdp
