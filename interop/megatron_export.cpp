// Megatron-LM and Megatron-DeepSpeed arguments out (megatron_arguments, export_megatron); in: megatron.cpp.
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

// A launch line's arguments, `--name value` each.
struct ArgLine {
  std::vector<std::string> args;
  void operator()(const std::string& name, const std::string& value = "") { args.push_back("--" + name + (value.empty() ? "" : " " + value)); }
};
std::string num(int64_t v) { return std::to_string(v); }

// The model's shape, positions and vocabulary.
void export_model(const TransformerSpec& m, bool lm, ArgLine& add, std::vector<std::string>& notes) {
  add("num-layers", num(m.num_layers));
  add("hidden-size", num(m.hidden_size));
  add("num-attention-heads", num(m.num_attention_heads));
  if (m.head_dim_size > 0 && m.head_dim_size * m.num_attention_heads != m.hidden_size) add("kv-channels", num(m.head_dim()));
  if (m.query_groups() != m.num_attention_heads) {
    if (lm) {
      add("group-query-attention");
      add("num-query-groups", num(m.query_groups()));
    } else {
      add("num-key-value-heads", num(m.query_groups()));
    }
  }
  if (m.ffn_hidden_size > 0 || m.mlp == MlpKind::SwiGLU) add("ffn-hidden-size", num(m.ffn()));
  if (m.mlp == MlpKind::SwiGLU) add("swiglu");
  if (m.normalization == NormKind::RMSNorm) add("normalization", lm ? "RMSNorm" : "rmsnorm");
  if (!m.tie_embeddings) add("untie-embeddings-and-output-weights");
  add("seq-length", num(m.seq_length));
  add("max-position-embeddings", num(m.seq_length));
  switch (m.position_kind()) {
    case PositionKind::Learned: add("position-embedding-type", lm ? "learned_absolute" : "absolute"); break;
    case PositionKind::Rope: add("position-embedding-type", lm ? "rope" : "rotary"); break;
    case PositionKind::None:
      if (lm) add("position-embedding-type", "none");
      else add("no-position-embedding");
      break;
  }
  if (m.position_kind() == PositionKind::Rope) {
    std::ostringstream percent;  // Megatron-LM parses --rotary-base as an integer
    percent << m.rotary_percent;
    if (m.rotary_base != 10000) add("rotary-base", num(static_cast<int64_t>(std::llround(m.rotary_base))));
    if (m.rotary_percent != 1) add("rotary-percent", percent.str());
  }
  if (m.vocab_size == 50257) {
    add("tokenizer-type", "GPT2BPETokenizer");
    add("vocab-file", "gpt2-vocab.json");
    add("merge-file", "gpt2-merges.txt");
  } else {
    add("tokenizer-type", "NullTokenizer");
    add("vocab-size", num(m.vocab_size));
    notes.push_back("vocabulary " + num(m.vocab_size) + ": NullTokenizer stands in for the model's tokenizer (replace it with yours)");
  }
  if (m.vocab_divisible_by != 128) add("make-vocab-size-divisible-by", num(m.vocab_divisible_by));
  if (m.padded_vocab_size > 0)
    notes.push_back("padded vocabulary " + num(m.padded_vocab_size) + ": Megatron-LM has no --pad-vocab-size-to (Megatron-DeepSpeed has); "
                    "the line pads to a multiple of " + num(m.vocab_divisible_by) + " × t");
}

// The layers of each stage without a layout: equal virtual stages, or Megatron's uneven first
// and last stage (the nearest such placement, said in a note).
void export_stage_layers(const TransformerSpec& m, const ParallelPlan& plan, ArgLine& add, std::vector<std::string>& notes) {
  const auto stages = stage_layers(m, plan);
  const bool uneven = std::adjacent_find(stages.begin(), stages.end(), std::not_equal_to<>()) != stages.end();
  if (plan.schedule == ScheduleKind::Interleaved) {
    if (uneven) notes.push_back("interleaved with uneven stages: Megatron-LM needs equal layers per virtual stage");
    add("num-layers-per-virtual-pipeline-stage", num(m.num_layers / (plan.pipeline * plan.virtual_stages)));
    if (plan.microbatch_group > 0) add("microbatch-group-size-per-virtual-pipeline-stage", num(plan.microbatch_group));
  } else if (plan.schedule != ScheduleKind::OneFOneB) {
    notes.push_back("schedule " + to_string(plan.schedule) + ": Megatron-LM runs 1F1B (or interleaved); the line runs 1F1B");
  }
  if (uneven && plan.schedule != ScheduleKind::Interleaved) {
    const int64_t inner = static_cast<int64_t>(stages.size()) > 2 ? stages[1] : 0;
    bool expressible = stages.size() >= 2;
    for (size_t s = 1; s + 1 < stages.size(); ++s) expressible = expressible && stages[s] == inner;
    if (expressible) {
      if (stages.size() == 2 || stages.front() != inner) add("decoder-first-pipeline-num-layers", num(stages.front()));
      if (stages.size() == 2 || stages.back() != inner) add("decoder-last-pipeline-num-layers", num(stages.back()));
    } else {
      // Megatron-LM places equal inner stages with an uneven first and last only: the nearest
      // such layout (inner stages at the plan's most common inner size, the rest split between
      // the end stages in the plan's proportion), said in a note.
      const int64_t p = static_cast<int64_t>(stages.size());
      std::map<int64_t, int> inner_counts;
      for (size_t s = 1; s + 1 < stages.size(); ++s) ++inner_counts[stages[s]];
      int64_t w = std::max_element(inner_counts.begin(), inner_counts.end(),
                                   [](const auto& a, const auto& b) { return a.second < b.second; })->first;
      int64_t rest = m.num_layers - w * (p - 2);
      while (rest < 2 && w > 1) rest = m.num_layers - --w * (p - 2);
      const std::string plan_layers = [&] {
        std::string s;
        for (auto l : stages) s += (s.empty() ? "" : ",") + num(l);
        return s;
      }();
      if (rest >= 2) {
        const double share = static_cast<double>(stages.front()) / static_cast<double>(stages.front() + stages.back());
        const int64_t first = std::clamp<int64_t>(std::llround(share * static_cast<double>(rest)), 1, rest - 1);
        add("decoder-first-pipeline-num-layers", num(first));
        add("decoder-last-pipeline-num-layers", num(rest - first));
        notes.push_back("layers per stage " + plan_layers + ": Megatron-LM places equal inner stages with an uneven first and last only; the line uses " +
                        num(first) + ", " + num(w) + " × " + num(p - 2) + ", " + num(rest - first));
      } else {
        notes.push_back("layers per stage " + plan_layers + ": Megatron-LM places uniform stages with an uneven first and last only");
      }
    }
  }
}

// Tensor and pipeline sizes, the schedule and the layers of each stage.
void export_pipeline(const TransformerSpec& m, const ParallelPlan& plan, bool lm, ArgLine& add, std::vector<std::string>& notes) {
  add("tensor-model-parallel-size", num(plan.tensor));
  add("pipeline-model-parallel-size", num(plan.pipeline));
  if (!plan.layout_layers.empty()) {
    // Megatron-Core's layout places every stage (and sets the virtual stages from their count).
    if (lm) add("pipeline-model-parallel-layout", "\"" + format_pipeline_layout(plan.layout_layers, plan.layout_mtp) + "\"");
    else notes.push_back("parallel.pipeline_layout: Megatron-DeepSpeed has no layout; the line places the layers uniformly");
    if (plan.schedule == ScheduleKind::Interleaved && plan.microbatch_group > 0)
      add("microbatch-group-size-per-virtual-pipeline-stage", num(plan.microbatch_group));
    if (plan.schedule != ScheduleKind::Interleaved && plan.schedule != ScheduleKind::OneFOneB)
      notes.push_back("schedule " + to_string(plan.schedule) + ": Megatron-LM runs 1F1B (or interleaved); the line runs 1F1B");
  } else {
    export_stage_layers(m, plan, add, notes);
  }
  // Current Megatron-LM overlaps interleaved p2p by default and has no flag to turn it on.
  if (lm && plan.schedule == ScheduleKind::Interleaved && !plan.overlap_p2p) add("no-overlap-p2p-communication");
  if (plan.schedule != ScheduleKind::Interleaved && plan.overlap_p2p)
    notes.push_back("overlap_p2p without interleaving: Megatron-LM overlaps p2p only in the interleaved schedule");
  if (!plan.scatter_gather) add("no-scatter-gather-tensors-in-pipeline");
}

// Megatron-Core's mixture-of-experts arguments.
void export_moe(const TransformerSpec& m, const ParallelPlan& plan, ArgLine& add, std::vector<std::string>& notes) {
  add("num-experts", num(m.moe.num_experts));
  add("moe-router-topk", num(m.moe.top_k));
  add("moe-ffn-hidden-size", num(m.expert_ffn()));
  if (m.moe.shared_experts > 0) add("moe-shared-expert-intermediate-size", num(m.moe.shared_experts * m.shared_expert_ffn()));
  if (m.moe.layer_frequency > 1) add("moe-layer-freq", num(m.moe.layer_frequency));
  if (m.moe.first_dense_layers > 0)
    notes.push_back("model.moe.first_dense_layers " + num(m.moe.first_dense_layers) + ": give Megatron-LM --moe-layer-freq as a list "
                    "([0]*" + num(m.moe.first_dense_layers) + "+[1]*" + num(m.num_layers - m.moe.first_dense_layers) + ")");
  if (m.moe.capacity_factor > 0) {
    char cf[32];
    std::snprintf(cf, sizeof cf, "%g", m.moe.capacity_factor);
    add("moe-expert-capacity-factor", cf);
  }
  add("moe-grouped-gemm");
  if (plan.expert > 1) add("expert-model-parallel-size", num(plan.expert));
  if (plan.expert_tensor > 0) add("expert-tensor-parallel-size", num(plan.expert_tensor));
  add("moe-token-dispatcher-type", to_string(plan.moe_dispatcher));
  if (plan.moe_comm_overlap) add("overlap-moe-expert-parallel-comm");
}

}  // namespace

std::vector<std::string> megatron_arguments(const Scenario& sc, MegatronDialect dialect, std::vector<std::string>& notes) {
  const bool lm = dialect == MegatronDialect::MegatronLM;
  const auto& m = sc.model;
  const auto& plan = sc.plan;
  ArgLine add;
  export_model(m, lm, add, notes);
  export_pipeline(m, plan, lm, add, notes);
  if (plan.recompute == Recompute::Full) {
    add("recompute-granularity", "full");
    add("recompute-method", "uniform");
    add("recompute-num-layers", "1");
  } else if (plan.recompute == Recompute::Selective) {
    add("recompute-granularity", "selective");
  }
  // Keys other helpers add (sequence parallelism, ZeRO) are read from the resolved JSON.
  const auto cfg = nlohmann::json::parse(sc.config_json);
  const auto& par = cfg.at("parallel");
  if (par.contains("sequence_parallel") && par.at("sequence_parallel").is_boolean() && par.at("sequence_parallel").get<bool>()) add("sequence-parallel");
  if (par.contains("zero_stage") && par.at("zero_stage").is_number_integer()) {
    const int64_t z = par.at("zero_stage").get<int64_t>();
    if (!lm) {
      add("zero-stage", num(z));  // with --deepspeed --deepspeed_config, which the caller adds
    } else {
      if (z >= 1) add("use-distributed-optimizer");
      if (z >= 2)
        notes.push_back("zero_stage " + num(z) + ": Megatron-LM's distributed optimizer shards optimizer state only (ZeRO-1); "
                        "ptdp export deepspeed writes this plan for Megatron-DeepSpeed");
    }
  }
  if (!lm) {
    // Megatron-DeepSpeed has none of current Megatron-LM's overlaps, context or expert
    // parallelism, Transformer Engine: the DeepSpeed config carries the gradient overlap.
    if (plan.tp_comm_overlap || plan.overlap_param_gather) notes.push_back("tp_comm_overlap / overlap_param_gather: not in Megatron-DeepSpeed");
    if (plan.context > 1 && plan.context_comm == ContextComm::AllToAll) add("ds-sequence-parallel-size", num(plan.context));
    else if (plan.context > 1)
      notes.push_back("context parallelism: Megatron-DeepSpeed has Ulysses (--ds-sequence-parallel-size, parallel.context_comm: "
                      "alltoall), not Megatron's ring or all-gather; the line has none");
    if (m.has_moe()) notes.push_back("mixture of experts: Megatron-DeepSpeed's MoE arguments differ; the line has none");
    if (plan.precision == Precision::FP8) notes.push_back("fp8: Megatron-DeepSpeed has no Transformer Engine FP8; the line trains in bf16");
  }
  if (lm && plan.overlap_grad_reduce) add("overlap-grad-reduce");
  if (lm && plan.overlap_param_gather) add("overlap-param-gather");
  if (lm && plan.tp_comm_overlap) add("tp-comm-overlap");
  if (lm && plan.context > 1) {
    add("context-parallel-size", num(plan.context));
    add("cp-comm-type", plan.context_comm == ContextComm::Ring ? "p2p" : plan.context_comm == ContextComm::AllGather ? "all_gather" : "a2a");
  }
  if (lm && m.has_moe()) export_moe(m, plan, add, notes);
  if (!lm && (m.has_mla() || m.mtp_layers > 0))
    notes.push_back("multi-head latent attention / multi-token prediction: Megatron-DeepSpeed has neither; the line has none");
  if (lm && m.has_mla()) {
    add("multi-latent-attention");
    if (m.mla.q_lora_rank > 0) add("q-lora-rank", num(m.mla.q_lora_rank));
    add("kv-lora-rank", num(m.mla.kv_lora_rank));
    add("qk-head-dim", num(m.mla.qk_head_dim));
    add("qk-pos-emb-head-dim", num(m.mla.qk_pos_emb_head_dim));
    add("v-head-dim", num(m.mla.v_head_dim));
  }
  if (lm && m.mtp_layers > 0) add("mtp-num-layers", num(m.mtp_layers));
  if (lm && m.mtp_layers > 0 && m.mtp_loss_scale != 0.1) {
    std::ostringstream scale;
    scale << m.mtp_loss_scale;
    add("mtp-loss-scaling-factor", scale.str());
  }
  if (lm && plan.bucket_size > 0) add("ddp-bucket-size", num(plan.bucket_size));
  if (!m.has_bias()) add("disable-bias-linear");
  {
    std::ostringstream rate;
    rate << m.dropout_rate();
    add("attention-dropout", rate.str());
    add("hidden-dropout", rate.str());
  }
  if (lm && m.attention == AttentionKind::Unfused) add("attention-backend", "unfused");
  if (!lm && m.attention == AttentionKind::Flash) add("use-flash-attn");  // Megatron-DeepSpeed: opt-in
  add("micro-batch-size", num(plan.micro_batch));
  add("global-batch-size", num(plan.global_batch));
  if (plan.precision == Precision::FP16) add("fp16");
  if (plan.precision == Precision::BF16 || plan.precision == Precision::FP8) add("bf16");
  if (lm && plan.precision == Precision::FP8) add("fp8-format", to_string(plan.fp8_format));
  if (lm && plan.fp8_param_gather) add("fp8-param-gather");
  if (sc.train_tokens) add("train-samples", num(static_cast<int64_t>(std::ceil(*sc.train_tokens / static_cast<double>(m.seq_length)))));
  else add("train-iters", "1000");  // placeholder: Megatron needs a length (marked FILL IN by the caller)
  return add.args;
}

std::pair<int64_t, int64_t> launch_layout(const Scenario& sc) {
  const int64_t per_node = std::min<int64_t>(sc.gpus, sc.cluster.gpus_per_node);
  return {per_node, (sc.gpus + per_node - 1) / per_node};
}

std::string launch_script(const Scenario& sc, const std::string& tool, const std::string& preamble, const std::string& launcher,
                          std::vector<std::string> arguments, const std::vector<std::string>& placeholders) {
  arguments.push_back("\"${DATA_ARGS[@]}\"");
  arguments.push_back("\"${TRAINING_ARGS[@]}\"");
  std::ostringstream out;
  out << "#!/bin/bash\n# " << sc.model.name << " on " << sc.gpus << " GPUs: the plan of " << (sc.source.empty() ? "the default scenario" : sc.source)
      << ", written by ptdp export " << tool << ".\n"
      << "# FILL IN before a real run: the arrays marked FILL IN hold placeholders (data, tokenizer, learning rate,\n"
      << "# checkpoints, length of the run); as written the run trains on mock data for 1000 iterations or the scenario's tokens.\n";
  for (const auto& line : placeholders) out << line << "\n";
  // Every NVIDIA example sets it: Megatron-LM's validate_args refuses tensor or context
  // parallelism without it (one hardware queue keeps the communication kernels in issue order,
  // which the overlap of TP/CP communication with compute relies on).
  out << "export CUDA_DEVICE_MAX_CONNECTIONS=1\n";
  out << preamble << launcher;
  for (const auto& arg : arguments) out << " \\\n    " << arg;
  out << "\n";
  return out.str();
}

std::string export_megatron(const Scenario& sc, std::vector<std::string>* caveats) {
  std::vector<std::string> notes;
  const std::vector<std::string> a = megatron_arguments(sc, MegatronDialect::MegatronLM, notes);
  const auto [per_node, nodes] = launch_layout(sc);
  const std::string text = launch_script(
      sc, "megatron", "",
      "torchrun --nproc_per_node " + std::to_string(per_node) + " --nnodes " + std::to_string(nodes) + " pretrain_gpt.py", a,
      {"DATA_ARGS=(--mock-data)    # FILL IN: (--data-path PREFIX --split 949,50,1) and your tokenizer's arguments",
       "TRAINING_ARGS=(--lr 1.0e-4 --min-lr 1.0e-5 --lr-decay-style cosine --lr-warmup-fraction 0.01 --weight-decay 0.1 --clip-grad 1.0 "
       "--save checkpoints --load checkpoints --save-interval 1000 --log-interval 10)    # FILL IN"});
  if (caveats) caveats->insert(caveats->end(), notes.begin(), notes.end());
  return text;
}

}  // namespace ptdp
