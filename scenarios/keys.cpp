// Every scenario key, one line each: the loader's schema (scenario_schema, topology_schema in
// scenario.cpp) is derived from this table, and `ptdp keys` prints it. A new key is one line here
// (plus the code that reads it).
#include <algorithm>

#include "model/gpu.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp {

namespace {

// The GPU's keys come from GpuSpec's field table (model/gpu.hpp), defaults from a default GpuSpec.
std::vector<KeyInfo> gpu_keys() {
  static const char* const types[] = {"number", "integer", "bool", "bytes", "FLOP/s", "bandwidth", "time", "power"};
  const GpuSpec defaults;
  std::vector<KeyInfo> keys;
  for (const auto& f : gpu_fields())
    keys.push_back({std::string("cluster.topology.gpu.") + f.key, types[static_cast<int>(f.kind)], f.range_text,
                    gpu_field_text(defaults, f), f.help});
  return keys;
}

// The keys, in the order `ptdp keys` prints them (the GPU's go after cluster.topology.gpu.name).
const KeyInfo kKeys[] = {
      // key                                  type        range                                           default
      {"description", "text", "", "", "free text"},
      {"not_modelled", "list of text", "", "(none)",
       "what the run does that the prediction leaves out (written by ptdp import; simulate prints it)"},
      {"model.name", "text", "", "gpt", "label in reports"},
      {"model.num_layers", "integer", "1 … 100 000", "(required)", "transformer layers"},
      {"model.hidden_size", "integer", "1 … 1 000 000, divisible by num_attention_heads", "(required)", "h"},
      {"model.num_attention_heads", "integer", "1 … hidden_size", "(required)", "query heads"},
      {"model.num_query_groups", "integer", "1 … num_attention_heads, divides it", "num_attention_heads", "key/value heads (GQA; 1 = MQA)"},
      {"model.head_dim", "integer", "even, 2 … 1024", "hidden_size / num_attention_heads",
       "width of each attention head (Megatron --kv-channels; Qwen3: 128 with h/a = 64)"},
      {"model.ffn_hidden_size", "integer", "0 … 10 000 000", "0 (= 4·hidden_size)", "MLP inner size"},
      {"model.seq_length", "integer", "1 … 10 000 000", "(required)", "tokens per sample"},
      {"model.vocab_size", "integer", "1 … 100 000 000", "(required)", "vocabulary before padding"},
      {"model.vocab_divisible_by", "integer", "1 … 1 000 000", "128",
       "the vocabulary is padded to a multiple of this × tensor (Megatron's --make-vocab-size-divisible-by)"},
      {"model.padded_vocab_size", "integer", "0 or vocab_size … 100 000 000, divisible by tensor", "0",
       "the padded vocabulary itself, 0 = computed (Megatron-DeepSpeed's --pad-vocab-size-to)"},
      {"model.mlp", "choice", "gelu | swiglu", "gelu", "MLP kind"},
      {"model.normalization", "choice", "layernorm | rmsnorm", "layernorm", "normalization"},
      {"model.tie_embeddings", "bool", "true | false", "true", "output layer reuses the word embedding"},
      {"model.attention", "choice", "flash | unfused (flash: head dim a multiple of 8, ≤ 256)", "flash", "fused flash attention, or 2021 Megatron's unfused kernels over s×s scores"},
      {"model.position_embedding", "choice", "learned | rope | none", "learned (GPT), rope (swiglu/Llama-style)",
       "learned absolute positions ([s, h] table), rotary embeddings on queries and keys (Megatron's rope), or none"},
      {"model.rotary_base", "number", "> 1", "10000", "rope: the frequency base (Megatron's --rotary-base; Llama 3: 500000)"},
      {"model.rotary_percent", "number", "(0, 1]", "1", "rope: the rotated share of each head's channels (Megatron's --rotary-percent)"},
      {"model.mla.kv_lora_rank", "integer", "0 … hidden_size (required with model.mla; 0 = no MLA)", "(no MLA)",
       "multi-head latent attention (DeepSeek-V2/V3; Megatron's --multi-latent-attention): the key/value latent's width (V3: 512)"},
      {"model.mla.q_lora_rank", "integer", "0 … hidden_size", "0 (queries from h)", "MLA: the query latent's width (V3: 1536)"},
      {"model.mla.qk_head_dim", "integer", "≥ 1; + qk_pos_emb_head_dim a multiple of 8 ≤ 256 (flash)", "128", "MLA: each head's non-rotary QK width"},
      {"model.mla.qk_pos_emb_head_dim", "integer", "0 …, even ≥ 2 with rope", "64", "MLA: each head's rotary QK width (the rope key shared by the heads)"},
      {"model.mla.v_head_dim", "integer", "≥ 1; a multiple of 8 ≤ 256 (flash)", "128", "MLA: each head's value width"},
      {"model.mtp_layers", "integer", "0 … 16", "0",
       "multi-token prediction modules on the last stage (DeepSeek-V3: 1; Megatron's --mtp-num-layers)"},
      {"model.mtp_loss_scale", "number", "[0, 100]", "0.1",
       "the MTP losses' weight: loss = LM loss + mtp_loss_scale / mtp_layers × Σ MTP losses (Megatron's --mtp-loss-scaling-factor)"},
      {"model.dropout", "number", "[0, 1)", "0.1 (GPT), 0 (swiglu/Llama-style)", "attention and hidden dropout; 0 removes the dropout kernels and masks"},
      {"model.moe.num_experts", "integer", "1 … 100 000 (required with model.moe)", "(dense)", "E, routed experts of each MoE layer"},
      {"model.moe.top_k", "integer", "1 … num_experts", "2", "experts each token is routed to"},
      {"model.moe.expert_ffn_hidden_size", "integer", "≥ 1", "ffn_hidden_size", "inner size of each expert's MLP"},
      {"model.moe.shared_experts", "integer", "0 … 1000", "0", "always-on experts (DeepSeek, Qwen-MoE)"},
      {"model.moe.shared_expert_ffn_hidden_size", "integer", "≥ 1", "expert_ffn_hidden_size", "inner size of each shared expert"},
      {"model.moe.moe_layer_frequency", "integer", "≥ 1", "1 (every layer)", "every n-th layer is MoE (2: every other)"},
      {"model.moe.first_dense_layers", "integer", "0 … num_layers − 1", "0", "leading layers with a dense MLP (DeepSeek-V3: 3)"},
      {"model.moe.capacity_factor", "number or none", "> 0, or none (dropless)", "none", "expert capacity = ceil(tokens·k/E·factor)"},
      {"model.moe.router_load_balance", "choice", "aux_loss | aux_free", "aux_loss", "router load balancing"},
      {"model.moe.imbalance", "number", "1 … num_experts", "1", "dropless: the busiest expert's load over the mean"},
      {"model.bias", "bool", "true | false", "true (GPT), false (swiglu/Llama-style)", "biases in the linear layers"},
      {"cluster.topology", "text or mapping", "preset name, YAML file, or inline mapping", "(required)", "the cluster's hardware"},
      {"cluster.gpu_power_w", "power", "[gpu.power / 4, gpu.power] (e.g. 500W)", "gpu.power (the TDP)",
       "power limit of each GPU: compute-bound kernels run at the sustained clock it allows, (limit / TDP)^0.9 of peak"},
      {"cluster.gpus", "integer", "1 … 10 000 000, ≤ nodes × node.gpus", "(required)", "GPUs of the run"},
      {"parallel.tensor", "integer", "1 … cluster.gpus", "1", "t, tensor-parallel size"},
      {"parallel.pipeline", "integer", "1 … cluster.gpus", "1", "p, pipeline-parallel size"},
      {"parallel.data", "integer", "1 … cluster.gpus, t·p·d = cluster.gpus", "gpus / (t·cp·p)", "d, data-parallel size"},
      {"parallel.context", "integer", "1 … cluster.gpus (seq_length divisible by 2·context; flash attention)", "1",
       "cp, context-parallel size: sequences split over cp ranks (t·cp·p·d = cluster.gpus)"},
      {"parallel.context_comm", "choice", "ring | allgather | alltoall", "ring", "context parallelism's exchange: p2p K/V ring overlapped with attention, one K/V all-gather, or all-to-alls trading the sequence shard for a head shard (Ulysses; tensor × context must divide the heads and key/value heads)"},
      {"parallel.expert", "integer", "1 … num_experts, divides num_experts; etp·ep divides t·cp·d", "1", "ep, expert-parallel size (MoE models)"},
      {"parallel.expert_tensor", "integer", "≥ 1, divides the experts' ffn size", "parallel.tensor", "etp, tensor-parallel size of each expert"},
      {"parallel.moe_dispatcher", "choice", "alltoall | allgather | flex", "alltoall", "Megatron-Core MoE token dispatcher (flex: DeepEP)"},
      {"parallel.moe_comm_overlap", "bool", "true | false (needs expert > 1)", "false",
       "Megatron --overlap-moe-expert-parallel-comm: all-to-alls under another microbatch's compute"},
      {"parallel.virtual_stages", "integer", "1 … num_layers (> 1 only with interleaved, zb-v: 2)", "1", "model chunks per pipeline rank"},
      {"parallel.schedule", "choice", "gpipe | 1f1b | interleaved | zb-h1 | zb-h2 | zb-v | zb-auto | dualpipev | dualpipe", "1f1b", "pipeline schedule"},
      {"parallel.optimizer_sync", "choice", "barrier | post_validate (post_validate needs a zb-* schedule)", "barrier",
       "optimizer step: after the global grad-norm (barrier) or speculative, rolled back when it fails (post_validate)"},
      {"parallel.scatter_gather", "bool", "true | false", "true", "scatter/gather pipeline sends over TP ranks"},
      {"parallel.recompute", "choice", "none | selective | full", "none",
       "activation recomputation (selective: Megatron's recompute_modules, torchtitan's op-level policy)"},
      {"parallel.recompute_modules", "list of choices", "core_attn | layernorm | mlp | moe | moe_act | shared_experts | mla_up_proj (recompute selective, megatron)",
       "[core_attn]", "Megatron --recompute-modules: what selective recompute re-runs"},
      {"parallel.microbatch_group", "integer", "pipeline … microbatches per pipeline", "pipeline", "interleaved group size"},
      {"parallel.overlap_p2p", "bool", "true | false", "false", "p2p beside compute (false: each send waited for before the next compute; true lets interleaving run with pipeline 2)"},
      {"parallel.sequence_parallel", "bool", "true | false (true needs tensor > 1, seq_length divisible by tensor)", "false",
       "sequence parallelism: norms/dropouts split along the sequence, reduce-scatter + all-gather"},
      {"parallel.layers_per_stage", "list of integers", "p·v entries ≥ 1 summing to num_layers; [] = unset", "[] (from partition)", "layers of each stage"},
      {"parallel.first_stage_layers", "integer", "0 … num_layers (0 = unset)", "0", "layers of the first stage"},
      {"parallel.last_stage_layers", "integer", "0 … num_layers (0 = unset)", "0", "layers of the last stage"},
      {"parallel.pipeline_layout", "text", "Megatron's layout: E t m L per stage, | between stages, X*N and (…)*N repeats; \"\" = unset",
       "\"\" (from partition)",
       "what each of the p·v stages holds (Megatron's --pipeline-model-parallel-layout, e.g. \"Et|(tt|)*30mL\"): stages with the embedding, "
       "the MTP layers or the loss alone allowed"},
      {"parallel.account_for_embedding_in_pipeline_split", "bool", "true | false (partition uniform)", "false",
       "the embedding counts as a layer: the first stage gets one fewer (Megatron)"},
      {"parallel.account_for_loss_in_pipeline_split", "bool", "true | false (partition uniform)", "false",
       "the output layer + loss count as a layer: the last stage gets one fewer (Megatron)"},
      {"parallel.vocab_parallel_pipeline", "bool", "true | false (pipeline > 1, virtual_stages 1, vocab_size ≥ pipeline)", "false",
       "output layer + loss split over all pipeline ranks (vocabulary parallelism, Yeung et al. 2024)"},
      {"parallel.partition", "choice", "uniform | balanced", "uniform", "layers over stages"},
      {"parallel.zero_stage", "integer", "0 … 3 (> 0 needs data·context > 1; 3 with pipeline > 1 needs framework torchtitan)", "0", "ZeRO: 1 optimizer state, 2 + gradients, 3 + parameters sharded"},
      {"parallel.sharding_group", "choice", "data | node", "data", "ranks that share one copy of the sharded states"},
      {"parallel.offload", "choice", "none | optimizer | optimizer_and_params", "none", "model states kept in host memory"},
      {"parallel.fsdp", "choice", "full_shard | shard_grad_op | hybrid_shard | no_shard", "(unset)", "FSDP's name for zero_stage + sharding_group"},
      {"parallel.overlap_grad_reduce", "bool", "true | false", "false", "Megatron --overlap-grad-reduce: bucketed DP gradient reduction during the backward"},
      {"parallel.overlap_param_gather", "bool", "true | false (needs zero_stage ≥ 1, overlap_grad_reduce)", "false", "Megatron --overlap-param-gather: bucketed parameter all-gather under the next forward"},
      {"parallel.tp_comm_overlap", "bool", "true | false (needs sequence_parallel)", "false", "Megatron --tp-comm-overlap: TP all-gathers/reduce-scatters pipelined with their GEMMs"},
      {"parallel.bucket_size", "count", "≥ 0 parameters (0 = max(40M, 1M × data))", "0", "gradient/parameter bucket of the overlaps"},
      {"parallel.max_inflight_gathers", "integer", "≥ 1", "2", "stage 3: parameter all-gathers in flight"},
      {"parallel.reshard_after_forward", "bool or integer", "true | false | N (divides the sharding group, smaller; needs zero_stage 3)",
       "(framework: torchtitan with pipeline false, else true)", "FSDP2: parameters resharded after the forward and re-gathered in the backward (true), kept whole (false) or over N ranks"},
      {"training.global_batch", "integer", "1 … 10⁹, divisible by micro_batch × data", "(required)", "B, samples per iteration"},
      {"training.micro_batch", "integer", "1 … global_batch", "1", "b, samples per microbatch"},
      {"training.precision", "choice", "fp16 | bf16 | fp32 | fp8 (fp8: GPUs with FP8 tensor cores)", "bf16", "training precision; fp8 = Transformer Engine's FP8 linear layers on bf16"},
      {"training.fp8_format", "choice", "hybrid | e4m3", "hybrid", "Megatron --fp8-format (E4M3 forward, E5M2 gradients with hybrid)"},
      {"training.fp8_param_gather", "bool", "true | false (needs fp8, zero_stage ≥ 1)", "false", "Megatron --fp8-param-gather: FP8 primary weights, FP8 parameter all-gather"},
      {"training.fp8_recipe", "choice", "tensorwise | rowwise | blockwise | mxfp8 (mxfp8: gpu.mx_formats)", "tensorwise",
       "FP8 scaling: the GEMM kernel and the quantisation kernels around it"},
      {"training.framework", "choice", "megatron | torchtitan | torchtitan_compiled | deepspeed | pytorch_fsdp", "megatron",
       "which kernels exist and how they run: fused or eager element-wise ops, host dispatch, optimizer, mechanisms"},
      {"training.attention_kernel", "choice", "auto | flash | flash2 | cudnn", "auto (megatron: cudnn; the PyTorch frameworks: flash2)",
       "the attention kernel: the GPU's flash curve (FlashAttention-3 on Hopper, -2 on A100), FlashAttention-2 (PyTorch SDPA's flash backend, flash-attn 2) or cuDNN's fused attention (Transformer Engine)"},
      {"training.expandable_segments", "bool", "true | false", "true",
       "PyTorch's allocator with expandable segments (false: fragmentation reserve in the memory breakdown)"},
      {"training.train_tokens", "count", "(0, 10¹⁸] (e.g. 300B)", "(none)", "token budget for days, GPU-hours, cost"},
      {"cost.gpu_hour_price", "number (USD)", "0 … 10⁶", "(none)", "price per GPU-hour"},
      {"cost.energy_price", "number (USD/kWh)", "0 … 10⁶", "0", "price per kWh"},
      // Topology keys (also the top level of a topology file).
      {"cluster.topology.name", "text", "", "cluster", "label"},
      {"cluster.topology.description", "text", "", "", "free text"},
      {"cluster.topology.nodes", "integer", "0 (unbounded) … 10⁷", "0", "nodes available"},
      {"cluster.topology.gpu.name", "text", "", "A100-SXM4-80GB", "label"},
      {"cluster.topology.gpu.gemm_rates", "list of [m, n, k, FLOP/s]", "sides 1 … 65536, (0, 10¹⁸] FLOP/s", "[] (the efficiency curve)",
       "measured GEMM rates by shape (calibrate --backend cpu): exact at these shapes, the curve corrected near them"},
      {"cluster.topology.gpu.elementwise_bandwidth", "list of [bytes, bandwidth]", "sizes increasing in (0, 10¹⁵] B, (0, 10¹⁸] B/s",
       "[] (hbm_bandwidth · elementwise_efficiency)", "element-wise kernels' bandwidth by working set (calibrate --backend cpu)"},
      {"cluster.topology.node.gpus", "integer", "1 … 1024", "8", "GPUs per node"},
      {"cluster.topology.node.nvlink.bandwidth", "bandwidth", "(0, 10¹⁸] B/s", "(preset)", "per GPU and direction"},
      {"cluster.topology.node.nvlink.latency", "time", "[0, 1 s]", "(preset)", "NVLink latency"},
      {"cluster.topology.node.host_link.bandwidth", "bandwidth", "(0, 10¹⁸] B/s", "25GBps", "GPU ↔ host memory (offload)"},
      {"cluster.topology.node.host_link.latency", "time", "[0, 1 s]", "1us", "GPU ↔ host latency"},
      {"cluster.topology.node.host_memory", "bytes", "[0, 10¹⁸] B (0: not checked)", "0", "host memory per node"},
      {"cluster.topology.node.host_memory_bandwidth", "bandwidth", "(0, 10¹⁸] B/s", "200GBps", "host memory bandwidth per node (offloaded Adam)"},
      {"cluster.topology.node.cores", "number", "[0, 10⁶]", "0", "CPU cores the node's ranks share (CPU back end)"},
      {"cluster.topology.node.wakeup_latency", "time", "[0, 1 s]", "0", "CPU back end: a sleeping rank's late wake-up per pipeline receive, with more ranks than cores"},
      {"cluster.topology.node.power", "power", "[0, 10⁶] W", "0W", "node power besides GPUs"},
      {"cluster.topology.network.nics_per_node", "integer", "1 … 1024", "8", "compute NICs per node"},
      {"cluster.topology.network.nic.bandwidth", "bandwidth", "(0, 10¹⁸] B/s", "(preset)", "per NIC and direction"},
      {"cluster.topology.network.nic.latency", "time", "[0, 1 s]", "(preset)", "NIC latency"},
      {"cluster.topology.network.pcie.bandwidth", "bandwidth", "[0, 10¹⁸] B/s (0: no limit)", "0", "GPU–NIC path"},
      {"cluster.topology.network.pcie.latency", "time", "[0, 1 s]", "0s", "GPU–NIC latency"},
      {"cluster.topology.network.fabric.kind", "choice", "fat_tree", "fat_tree", "fabric"},
      {"cluster.topology.network.fabric.levels", "integer", "1 … 8", "3", "switch levels"},
      {"cluster.topology.network.fabric.oversubscription", "number", "[1, 1024]", "1", "leaf downlink / uplink"},
      {"cluster.topology.network.fabric.leaf_radix", "integer", "1 … 10⁶", "32", "NIC ports per leaf switch"},
      {"cluster.topology.network.fabric.switch_latency", "time", "[0, 1 s]", "0.3us", "per switch hop"},
      {"cluster.topology.calibration.measured_on.nvlink.bandwidth", "bandwidth", "(0, 10¹⁸] B/s", "(required with curves)", "link the curves were measured on"},
      {"cluster.topology.calibration.measured_on.nvlink.latency", "time", "[0, 1 s]", "0s", ""},
      {"cluster.topology.calibration.measured_on.nic.bandwidth", "bandwidth", "(0, 10¹⁸] B/s", "(required with curves)", ""},
      {"cluster.topology.calibration.measured_on.nic.latency", "time", "[0, 1 s]", "0s", ""},
      {"cluster.topology.calibration.measured_on.pcie.bandwidth", "bandwidth", "[0, 10¹⁸] B/s", "0", ""},
      {"cluster.topology.calibration.measured_on.pcie.latency", "time", "[0, 1 s]", "0s", ""},
      {"cluster.topology.calibration.measured_on.switch_latency", "time", "[0, 1 s]", "0s", ""},
      {"cluster.topology.calibration.intra_node_allreduce.small_message_time", "time", "[0, 1 s]", "0s", "latency floor"},
      {"cluster.topology.calibration.intra_node_allreduce.busbw", "list of [bytes, bandwidth]", "sizes increasing in (0, 10¹⁵] B, (0, 10¹⁸] B/s", "[] (link α-β)", "measured bus bandwidth"},
      {"cluster.topology.calibration.intra_node_allreduce.gpus_per_node", "integer", "1 … 1024", "0 (a full node)", "GPUs in the measurement"},
      {"cluster.topology.calibration.inter_node_allreduce.small_message_time", "time", "[0, 1 s]", "0s", "latency floor"},
      {"cluster.topology.calibration.inter_node_allreduce.busbw", "list of [bytes, bandwidth]", "sizes increasing in (0, 10¹⁵] B, (0, 10¹⁸] B/s", "[] (link α-β)", "measured bus bandwidth"},
      {"cluster.topology.calibration.inter_node_allreduce.gpus_per_node", "integer", "1 … 1024", "8", "GPUs per node in the measurement"},
      {"cluster.topology.calibration.intra_node_ring.small_message_time", "time", "[0, 1 s]", "0s", "ring collectives in a node: latency floor"},
      {"cluster.topology.calibration.intra_node_ring.busbw", "list of [bytes, bandwidth]", "sizes increasing in (0, 10¹⁵] B, (0, 10¹⁸] B/s", "[] (the intra-node curve)", "ring collectives (all-gather, reduce-scatter, all-reduce of ≤ 4 GPUs) when the all-reduce curve is NVLS"},
      {"cluster.topology.calibration.oversubscribed_allreduce.small_message_time", "time", "[0, 1 s]", "0s", "CPU back end, more ranks than cores: latency floor"},
      {"cluster.topology.calibration.oversubscribed_allreduce.busbw", "list of [bytes, bandwidth]", "sizes increasing in (0, 10¹⁵] B, (0, 10¹⁸] B/s", "[] (the intra-node curve)", "CPU back end, more ranks than cores: measured bus bandwidth with sleeping waits"},
};

std::vector<KeyInfo> make_table() {
  std::vector<KeyInfo> table(std::begin(kKeys), std::end(kKeys));
  const auto gpu = gpu_keys();
  const auto at = std::find_if(table.begin(), table.end(), [](const KeyInfo& k) { return k.key == "cluster.topology.gpu.name"; });
  table.insert(at + 1, gpu.begin(), gpu.end());
  return table;
}

}  // namespace

const std::vector<KeyInfo>& scenario_key_table() {
  static const std::vector<KeyInfo> table = make_table();
  return table;
}

}  // namespace ptdp
