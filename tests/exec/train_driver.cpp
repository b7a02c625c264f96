// A small `ptdp train` for the multi-rank tests: run under mpirun, it trains with the options
// given on the command line and writes losses, the trained parameters and report figures as
// JSON (rank 0). Its error handling is what main() of the CLI must do (see exec/train.hpp).
//
//   exec_train_driver --t 2 --p 2 --d 1 [--v 2] [--schedule 1f1b] [--recompute none] [--sg 1] [--sp 1]
//                     [--layers 4 --hidden 32 --heads 4 --seq 16 --vocab 256 --micro 2 --global 8]
//                     [--steps 3] [--seed 7] [--lr 1e-3] [--clip 1.0] [--optimizer-sync barrier|post_validate] [--data FILE] [--checkpoint DIR]
//                     [--save-every K] [--resume] [--init FILE] [--timeout S] [--out FILE] [--trace FILE] [--pid-dir DIR]
//                     [--params 1] [--split-backward [--pre-lowered]] [--unshard-windows] [--backend cpu|cuda] [--precision fp32] [--fp8-recipe R] [--fp8-format F] [--framework F]
//                     [--groups G --mlp swiglu --norm rmsnorm --untied 1 --ffn F]   (architecture)
//                     [--pos learned|rope|none --rotary-base B --rotary-percent P --padded-vocab V] [--cp 2 --cp-comm ring|allgather]
//                     [--stage-layers 1,3 | --first-stage-layers N --last-stage-layers N | --layout "E|tt|tt|L"]   (uneven stages)
//                     [--blocking-p2p 1]   (sends waited for before the next compute: parallel.overlap_p2p false)
//                     [--zero 0..3 --sharding-group data|node --node-gpus G --offload none|optimizer|optimizer_and_params --inflight K]
//                     [--reshard true|false|N]
//                     [--overlap-grad-reduce BUCKET_PARAMETERS] [--overlap-param-gather 1] [--tp-comm-overlap 1] [--moe-comm-overlap 1]
//                     [--mtp D --mtp-scale S]   (multi-token prediction)
//                     [--experts E --topk K --expert-ffn F --moe-every N --capacity C --ep EP --etp ETP --shared-experts S --shared-ffn F --moe-dispatcher alltoall|allgather --load-balance aux_loss|aux_free]
//   exec_train_driver --stall-test S   (rank 1 never joins an all-reduce; rank 0 must time out)
//   exec_train_driver --allreduce-test N   (all-reduces of N values, polling and sleeping; exit 0 when exact)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/runtime/mpi_communicator.hpp"
#include "exec/train.hpp"
#include "model/layout.hpp"
#include "model/memory.hpp"
#include "schedules/graph.hpp"

namespace {

using namespace ptdp;
using json = nlohmann::json;

// Turns every B of a compute-only schedule into I, and adds the matching W right after the next
// action of the same rank (or at the end): a zero-bubble-style split for testing I/W.
Schedule split_backward(Schedule s) {
  for (auto& prog : s.programs) {
    std::vector<Action> out;
    std::vector<Action> pending;
    for (const Action& a : prog.actions) {
      if (a.kind == ActionKind::B) {
        out.push_back(Action{ActionKind::I, a.stage, a.microbatch});
        pending.push_back(Action{ActionKind::W, a.stage, a.microbatch});
        continue;
      }
      out.push_back(a);
      for (const Action& w : pending) out.push_back(w);
      pending.clear();
    }
    for (const Action& w : pending) out.push_back(w);
    prog.actions = std::move(out);
  }
  return s;
}

// A lowered schedule whose ranks keep each stage gathered from its first action to its last
// backward: UNSHARD s first, RESHARD s before REDUCE_GRAD s (PyTorch's pipelining with FSDP).
Schedule with_unshard_windows(Schedule s) {
  lower(s);
  for (auto& prog : s.programs) {
    std::vector<Action> out;
    for (const Action& a : prog.actions)
      if (a.kind == ActionKind::REDUCE_GRAD) out.push_back(Action{ActionKind::UNSHARD, a.stage, -1});
    for (const Action& a : prog.actions) {
      if (a.kind == ActionKind::REDUCE_GRAD) out.push_back(Action{ActionKind::RESHARD, a.stage, -1});
      out.push_back(a);
    }
    prog.actions = std::move(out);
  }
  return s;
}

int stall_test(exec::MpiSession& mpi, double timeout_s) {
  auto world = exec::make_mpi_world(timeout_s);
  double x = 1;
  world->all_reduce(&x, 1, exec::ReduceOp::Sum);  // everyone joins once
  if (mpi.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(120));  // hangs: never joins the next one
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    world->all_reduce(&x, 1, exec::ReduceOp::Sum);
  } catch (const exec::CommunicationError& e) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cerr << "error: " << e.what() << " [after " << waited << " s]\n";
    mpi.abort(1);
  }
  std::cerr << "error: the all-reduce completed although rank 1 never joined it\n";
  return 3;
}

// All-reduces of `count` floats and doubles (sum, max, min) in both wait modes; every rank
// checks every element against the value computed locally. The values are small integers, so
// every summation order gives the exact result. Exit 0, or 4 naming the first wrong element.
int allreduce_test(exec::MpiSession& mpi, size_t count) {
  auto world = exec::make_mpi_world(60);
  const int n = mpi.size(), me = mpi.rank();
  auto value = [](size_t i, int rank) { return static_cast<double>((i * 7 + static_cast<size_t>(rank) * 13) % 101); };
  int bad = 0;
  for (bool poll : {true, false}) {
    exec::set_mpi_poll_first(poll);
    std::vector<float> f(count);
    std::vector<double> d(count), mx(count), mn(count);
    for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(d[i] = mx[i] = mn[i] = value(i, me));
    world->all_reduce(f.data(), count, exec::ReduceOp::Sum);
    world->all_reduce(d.data(), count, exec::ReduceOp::Sum);
    world->all_reduce(mx.data(), count, exec::ReduceOp::Max);
    world->all_reduce(mn.data(), count, exec::ReduceOp::Min);
    for (size_t i = 0; i < count && bad == 0; ++i) {
      double sum = 0, hi = -1, lo = 1e9;
      for (int r = 0; r < n; ++r) {
        sum += value(i, r);
        hi = std::max(hi, value(i, r));
        lo = std::min(lo, value(i, r));
      }
      if (f[i] != static_cast<float>(sum) || d[i] != sum || mx[i] != hi || mn[i] != lo) {
        std::cerr << "error: rank " << me << (poll ? " (polling)" : " (sleeping)") << ": element " << i << " of " << count
                  << " reduced to " << f[i] << " / " << d[i] << " / " << mx[i] << " / " << mn[i] << ", expected " << sum
                  << " / " << hi << " / " << lo << "\n";
        bad = 1;
      }
    }
  }
  return bad ? 4 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  exec::MpiSession mpi(&argc, &argv);
  std::map<std::string, std::string> a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) continue;
    k = k.substr(2);
    if (k == "resume" || k == "overwrite" || k == "split-backward" || k == "pre-lowered" || k == "unshard-windows") a[k] = "1";
    else if (i + 1 < argc) a[k] = argv[++i];
  }
  auto get = [&](const std::string& k, const std::string& def) { return a.count(k) ? a[k] : def; };
  auto geti = [&](const std::string& k, long long def) { return std::stoll(get(k, std::to_string(def))); };
  if (a.count("stall-test")) return stall_test(mpi, std::stod(a["stall-test"]));
  if (a.count("allreduce-test")) return allreduce_test(mpi, std::stoull(a["allreduce-test"]));
  if (a.count("pid-dir")) {
    std::ofstream(a["pid-dir"] + "/rank-" + std::to_string(mpi.rank()) + ".pid") << ::getpid() << "\n";
  }

  TransformerSpec spec;
  spec.num_layers = geti("layers", 4);
  spec.hidden_size = geti("hidden", 32);
  spec.num_attention_heads = geti("heads", 4);
  spec.seq_length = geti("seq", 16);
  spec.vocab_size = geti("vocab", 256);
  spec.num_query_groups = geti("groups", 0);
  spec.ffn_hidden_size = geti("ffn", 0);
  spec.tie_embeddings = geti("untied", 0) == 0;
  spec.dropout = std::stod(get("dropout", "0"));  // the model.dropout default (GPT 0.1) only when asked
  spec.moe.num_experts = geti("experts", 0);  // mixture of experts
  spec.moe.top_k = geti("topk", 2);
  spec.moe.expert_ffn_hidden_size = geti("expert-ffn", 0);
  spec.moe.layer_frequency = geti("moe-every", 1);
  spec.moe.shared_experts = geti("shared-experts", 0);
  spec.moe.aux_free = get("load-balance", "aux_loss") == "aux_free";
  spec.moe.shared_expert_ffn_hidden_size = geti("shared-ffn", 0);
  if (a.count("capacity")) spec.moe.capacity_factor = std::stod(a["capacity"]);
  spec.head_dim_size = geti("head-dim", 0);  // model.head_dim (0: hidden / heads)
  if (a.count("mla-kv-lora")) {  // model.mla
    spec.mla.kv_lora_rank = geti("mla-kv-lora", 0);
    spec.mla.q_lora_rank = geti("mla-q-lora", 0);
    spec.mla.qk_head_dim = geti("mla-qk", 8);
    spec.mla.qk_pos_emb_head_dim = geti("mla-rope", 8);
    spec.mla.v_head_dim = geti("mla-v", 8);
  }
  spec.mtp_layers = geti("mtp", 0);  // multi-token prediction
  if (a.count("mtp-scale")) spec.mtp_loss_scale = std::stod(a["mtp-scale"]);
  ParallelPlan plan;
  if (a.count("stage-layers")) {
    std::stringstream list(a["stage-layers"]);
    for (std::string item; std::getline(list, item, ',');) plan.layers_per_stage.push_back(std::stoll(item));
  }
  if (a.count("layout"))  // Megatron's --pipeline-model-parallel-layout (model/layout.hpp)
    for (const LayoutStage& st : parse_pipeline_layout(a["layout"], "--layout")) {
      plan.layout_layers.push_back(st.layers);
      plan.layout_mtp.push_back(st.mtp);
    }
  plan.first_stage_layers = geti("first-stage-layers", 0);
  plan.last_stage_layers = geti("last-stage-layers", 0);
  plan.tensor = geti("t", 1);
  plan.pipeline = geti("p", 1);
  plan.data = geti("d", 1);
  plan.context = geti("cp", 1);
  plan.expert = geti("ep", 1);
  plan.expert_tensor = geti("etp", 0);
  if (get("moe-dispatcher", "alltoall") == "allgather") plan.moe_dispatcher = MoeDispatcher::AllGather;
  plan.virtual_stages = geti("v", 1);
  plan.micro_batch = geti("micro", 2);
  plan.global_batch = geti("global", 8);
  // Sends beside compute by default (interleaving with p = 2 needs it); --blocking-p2p 1: each
  // rank waits for its sends before its next compute (parallel.overlap_p2p false).
  plan.overlap_p2p = geti("blocking-p2p", 0) == 0;
  plan.scatter_gather = geti("sg", 1) != 0;
  plan.sequence_parallel = geti("sp", 0) != 0;
  plan.precision = Precision::FP32;  // bf16 / fp16: both back ends round the GEMM operands (--precision)
  plan.zero_stage = static_cast<int>(geti("zero", 0));
  plan.node_gpus = geti("node-gpus", 8);
  plan.max_inflight_gathers = geti("inflight", 2);
  if (a.count("overlap-grad-reduce")) {  // bucket size in parameters
    plan.overlap_grad_reduce = true;
    plan.bucket_size = geti("overlap-grad-reduce", 0);
  }
  plan.overlap_param_gather = geti("overlap-param-gather", 0) != 0;
  plan.tp_comm_overlap = geti("tp-comm-overlap", 0) != 0;
  plan.moe_comm_overlap = geti("moe-comm-overlap", 0) != 0;
  exec::TrainOptions opt;
  exec::ParameterSet params;
  try {
    plan.schedule = parse_schedule_kind(get("schedule", plan.virtual_stages > 1 ? "interleaved" : "1f1b"));
    plan.recompute = parse_recompute(get("recompute", "none"));
    plan.precision = parse_precision(get("precision", "fp32"));
    plan.fp8_recipe = parse_fp8_recipe(get("fp8-recipe", "tensorwise"));
    plan.fp8_format = parse_fp8_format(get("fp8-format", "hybrid"));
    plan.framework = parse_framework(get("framework", "megatron"));
    if (a.count("reshard")) {
      const std::string r = a["reshard"];
      plan.reshard_after_forward = r == "true" ? ParallelPlan::kReshardFull : r == "false" ? 1 : std::stoi(r);
    }
    spec.mlp = parse_mlp_kind(get("mlp", "gelu"));
    spec.normalization = parse_norm_kind(get("norm", "layernorm"));
    spec.attention = parse_attention_kind(get("attention", "flash"));
    if (get("bias", "") != "") spec.bias = get("bias", "") == "1" ? 1 : 0;
    if (get("pos", "") != "") spec.position_embedding = parse_position_kind(get("pos", ""));
    spec.rotary_base = std::stod(get("rotary-base", "10000"));
    spec.rotary_percent = std::stod(get("rotary-percent", "1"));
    if (a.count("padded-vocab")) spec.padded_vocab_size = geti("padded-vocab", 0);
    plan.context_comm = parse_context_comm(get("cp-comm", "ring"));
    plan.sharding_group = parse_sharding_group(get("sharding-group", "data"));
    plan.offload = parse_offload(get("offload", "none"));
    opt.backend = get("backend", "cpu");
    opt.steps = geti("steps", 3);
    opt.seed = static_cast<uint64_t>(geti("seed", 7));
    opt.adam.lr = std::stod(get("lr", "1e-3"));
    opt.adam.clip_grad = std::stod(get("clip", "1.0"));
    opt.adam.eps = std::stod(get("adam-eps", "1e-8"));
    opt.loss_scaling.initial_scale = std::stod(get("initial-loss-scale", "4294967296"));
    opt.loss_scaling.growth_interval = geti("loss-scale-window", 1000);
    opt.loss_scaling.hysteresis = static_cast<int>(geti("hysteresis", 2));
    plan.optimizer_sync = parse_optimizer_sync(get("optimizer-sync", "barrier"));
    opt.data_path = get("data", "");
    opt.checkpoint_dir = get("checkpoint", "");
    opt.save_every = geti("save-every", 0);
    opt.resume = a.count("resume") > 0;
    if (a.count("init")) opt.init_path = a["init"];
    opt.overwrite = a.count("overwrite") > 0;
    opt.comm_timeout_s = std::stod(get("timeout", "30"));
    if (a.count("split-backward"))
      opt.schedule = split_backward(make_1f1b(static_cast<int>(plan.pipeline), static_cast<int>(plan.num_microbatches())));
    if (opt.schedule && a.count("pre-lowered")) lower(*opt.schedule);  // as `schedule import` would hand it over
    if (a.count("unshard-windows"))
      opt.schedule = with_unshard_windows(make_1f1b(static_cast<int>(plan.pipeline), static_cast<int>(plan.num_microbatches())));
    opt.progress = [](const std::string& line) { std::cerr << line << std::endl; };
    if (geti("params", 1) != 0) opt.parameters_out = &params;
    Timeline timeline;
    const Report r = exec::train(spec, plan, opt, &timeline);
    if (mpi.rank() == 0 && a.count("trace")) write_chrome_trace(timeline, a["trace"]);
    if (mpi.rank() == 0 && a.count("out")) {
      json j;
      j["losses"] = r.losses;
      if (!r.mtp_losses.empty()) j["mtp_losses"] = r.mtp_losses;
      j["backend"] = r.backend;
      j["iteration_time_s"] = r.iteration_time_s;
      j["tokens_per_s"] = r.tokens_per_s;
      j["tflops_per_gpu"] = r.tflops_per_gpu;
      j["peak_memory_bytes"] = r.peak_memory_bytes;
      j["memory_measured_bytes"] = r.extra.at("memory_measured_bytes");
      j["host_memory_measured_bytes"] = r.extra.at("host_memory_measured_bytes");
      {  // the memory model's figures for this plan (model/memory.hpp)
        const MemoryBreakdown m = peak_memory(memory_per_rank(spec, plan, peak_inflight_activations(make_schedule(plan))));
        j["predicted_memory"] = {{"weights", m.weights_bytes}, {"gradients", m.gradients_bytes},
                                 {"optimizer", m.optimizer_bytes}, {"activations", m.activations_bytes},
                                 {"buffers", m.buffers_bytes}, {"total", m.total_bytes}, {"host", m.host_bytes}};
      }
      j["first_step"] = r.extra.at("first_step");
      j["grad_norm"] = r.extra.at("grad_norm");
      if (r.extra.count("optimizer_rollbacks")) j["optimizer_rollbacks"] = r.extra.at("optimizer_rollbacks");
      if (r.extra.count("skipped_steps")) j["skipped_steps"] = r.extra.at("skipped_steps");
      if (r.extra.count("loss_scale")) j["loss_scale"] = r.extra.at("loss_scale");
      if (r.extra.count("overlapped_gradient_buckets")) j["overlapped_gradient_buckets"] = r.extra.at("overlapped_gradient_buckets");
      j["num_events"] = timeline.events.size();
      json kinds = json::object();
      for (const auto& e : timeline.events) {
        if (!e.label.empty()) continue;  // parts of an action (TP all-reduces, all-gathers)
        const std::string k(to_string(e.action.kind));
        kinds[k] = kinds.value(k, 0) + 1;
      }
      j["event_kinds"] = kinds;
      int shard_waits = 0;
      json waits_in = json::object();  // the sharding transfers' exposed parts, by the action they wait in
      for (const auto& e : timeline.events)
        if (e.label == kShardWait) {
          ++shard_waits;
          const std::string k(to_string(e.action.kind));
          waits_in[k] = waits_in.value(k, 0) + 1;
        }
      j["shard_waits"] = shard_waits;
      j["shard_waits_in"] = waits_in;
      j["devices"] = json::array();
      for (const auto& e : timeline.events) j["devices"].push_back(e.device);
      j["params"] = params;
      std::ofstream(a["out"]) << j.dump();
    }
  } catch (const exec::CommunicationError& e) {
    std::cerr << "error: " << e.what() << std::endl;
    mpi.abort(1);
  } catch (const ConfigError& e) {
    if (mpi.rank() == 0) std::cerr << "error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    if (mpi.rank() == 0) std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
