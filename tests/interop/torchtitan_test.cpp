// torchtitan's train.toml in and out (interop/torchtitan.cpp) and the TOML reader under it
// (interop/toml.cpp): values and their locations, a config of each feature, round trips.
#include <gtest/gtest.h>

#include <algorithm>

#include <fstream>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "interop/interop.hpp"
#include "interop/toml.hpp"
#include "interop/torchtitan_py.hpp"
#include "model/partition.hpp"
#include "scenarios/scenario.hpp"

namespace ptdp {
namespace {

TEST(Toml, ValuesTablesAndComments) {
  const auto doc = parse_toml(
      "top = 1  # comment\n"
      "[a]\n"
      "s = \"x\\ty\\u00e9\"\n"
      "lit = 'C:\\path'\n"
      "n = -1_000\n"
      "h = 0x1F\n"
      "f = 3e-4\n"
      "b = true\n"
      "arr = [1, 2,\n  3,  # trailing comma\n]\n"
      "[a.c]\n"
      "\"quoted key\" = { x = 1, y = [\"p\"] }\n"
      "ml = \"\"\"\nline1\nline2\"\"\"\n",
      "t.toml");
  EXPECT_EQ(doc.at("top").integer, 1);
  EXPECT_EQ(doc.at("a.s").text, "x\ty\xc3\xa9");
  EXPECT_EQ(doc.at("a.lit").text, "C:\\path");
  EXPECT_EQ(doc.at("a.n").integer, -1000);
  EXPECT_EQ(doc.at("a.h").integer, 31);
  EXPECT_DOUBLE_EQ(doc.at("a.f").number, 3e-4);
  EXPECT_TRUE(doc.at("a.b").boolean);
  ASSERT_EQ(doc.at("a.arr").items.size(), 3u);
  EXPECT_EQ(doc.at("a.arr").items[2].integer, 3);
  EXPECT_EQ(doc.at("a.c.quoted key").table.at("y").items[0].text, "p");
  EXPECT_EQ(doc.at("a.c.ml").text, "line1\nline2");
  EXPECT_EQ(doc.at("a.f").where.line, 7);
  EXPECT_EQ(doc.at("a.f").where.column, 5);
}

TEST(Toml, MalformedInputIsAConfigErrorAtItsLineAndColumn) {
  auto where = [](const std::string& text) {
    try {
      parse_toml(text, "t.toml");
    } catch (const ConfigError& e) {
      return std::to_string(e.where().line) + ":" + std::to_string(e.where().column) + " " + e.message();
    }
    return std::string("accepted");
  };
  EXPECT_EQ(where("a = 1\na = 2\n").substr(0, 4), "2:1 ");               // duplicate key
  EXPECT_EQ(where("[t]\nx = 1\n[t]\n").substr(0, 4), "3:1 ");             // table twice
  EXPECT_EQ(where("x = \"open\n").substr(0, 4), "1:5 ");                  // unterminated string
  EXPECT_EQ(where("x = llama3\n").substr(0, 4), "1:5 ");                  // string without quotes
  EXPECT_EQ(where("x = 99999999999999999999\n").substr(0, 4), "1:5 ");    // out of range
  EXPECT_EQ(where("x = [1, 2\n").substr(0, 4), "1:5 ");                   // unterminated array
  EXPECT_EQ(where("[[runs]]\n").substr(0, 4), "1:1 ");                    // array of tables
  EXPECT_EQ(where("x = 1 2\n").substr(0, 4), "1:7 ");                     // junk after the value
  EXPECT_EQ(where(std::string(200, '[')).substr(0, 3), "1:1");             // nesting refused, not a crash
  EXPECT_NE(where("x = " + std::string(200, '[')).find("nested more than 64 deep"), std::string::npos);
  EXPECT_EQ(where("a = true\n[a]\n").substr(0, 4), "2:1 ");             // a key redefined as a table
}

// torchtitan's own pipeline split (0.1's generate_split_points, 0.2/0.3's
// generate_llm_fqn_per_model_part): the embedding and the output layer weigh a layer each unless
// first/last_stage_less_layers say otherwise; a given module list or split points are taken as they are.
TEST(ImportTorchtitan, PipelineStagesAreSplitAsTorchtitanSplitsThem) {
  ImportOptions options;
  options.gpus = 256;
  auto split = [&](const std::string& extra) {
    const std::string text = "[model]\nflavor = \"70B\"\n[parallelism]\ntensor_parallel_degree = 8\npipeline_parallel_degree = 4\n" + extra;
    return load_scenario_text(import_torchtitan(text, "train.toml", options).yaml, "imported").plan;
  };
  // 1F1B: 82 effective layers over 4 stages: 21, 21, 20, 20, less the embedding and the output.
  ParallelPlan p = split("");
  EXPECT_EQ(p.layers_per_stage, (std::vector<int64_t>{20, 21, 20, 19}));
  EXPECT_EQ(p.schedule, ScheduleKind::OneFOneB);
  // Interleaved without layers_per_stage: 2 stages per rank, 82 over 8: 11, 11, 10 × 6.
  p = split("pipeline_parallel_schedule = \"Interleaved1F1B\"\n");
  EXPECT_EQ(p.virtual_stages, 2);
  EXPECT_EQ(p.layers_per_stage, (std::vector<int64_t>{10, 11, 10, 10, 10, 10, 10, 9}));
  // Weights 0: even.
  p = split("pipeline_parallel_first_stage_less_layers = 0\npipeline_parallel_last_stage_less_layers = 0\n");
  EXPECT_TRUE(p.layers_per_stage.empty());
  // 0.1's split points and 0.2's module lists.
  p = split("pipeline_parallel_split_points = [\"layers.19\", \"layers.40\", \"layers.61\"]\n");
  EXPECT_EQ(p.layers_per_stage, (std::vector<int64_t>{19, 21, 21, 19}));
  std::string parts = "module_fqns_per_model_part = [";
  for (int s = 0, l = 0; s < 4; ++s) {
    parts += s ? ", [" : "[\"tok_embeddings\", ";
    for (int k = 0; k < 20; ++k) parts += (k ? ", " : "") + std::string("\"layers.") + std::to_string(l++) + "\"";
    parts += s == 3 ? ", \"norm\", \"output\"]" : "]";
  }
  p = split(parts + "]\n");
  EXPECT_TRUE(p.layers_per_stage.empty());
  // What torchtitan refuses is refused: 82 effective layers at 10 per stage are 9 stages, not a
  // multiple of 4; split points out of order; a module list that skips a layer.
  auto refusal = [&](const std::string& extra) {
    try {
      split(extra);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal("pipeline_parallel_schedule = \"Interleaved1F1B\"\npipeline_parallel_layers_per_stage = 10\n").find("9 pipeline stages do not divide over 4 ranks"),
            std::string::npos);
  EXPECT_NE(refusal("pipeline_parallel_split_points = [\"layers.40\", \"layers.19\", \"layers.61\"]\n").find("train.toml:6:"), std::string::npos);
  const std::string skipped = refusal("module_fqns_per_model_part = [[\"tok_embeddings\", \"layers.0\"], [\"layers.2\"]]\n");
  EXPECT_NE(skipped.find("expected layers.1 (each layer once, in order)"), std::string::npos) << skipped;
}

TEST(ImportTorchtitan, ALlama3ConfigBecomesItsPlan) {
  const std::string text =
      "[model]\nname = \"llama3\"\nflavor = \"70B\"\nconverters = [\"float8\"]\n"
      "[training]\nlocal_batch_size = 16\nglobal_batch_size = 128\nseq_len = 8192\nsteps = 1000\n"
      "[parallelism]\ndata_parallel_shard_degree = -1\ntensor_parallel_degree = 8\npipeline_parallel_degree = 4\n"
      "pipeline_parallel_schedule = \"Interleaved1F1B\"\npipeline_parallel_microbatch_size = 2\npipeline_parallel_layers_per_stage = 10\n"
      "pipeline_parallel_first_stage_less_layers = 0\npipeline_parallel_last_stage_less_layers = 0\n"
      "enable_async_tensor_parallel = true\n"
      "[activation_checkpoint]\nmode = \"full\"\n"
      "[float8]\nenable_fsdp_float8_all_gather = true\n"
      "[compile]\nenable = true\n"
      "[optimizer]\nlr = 1.5e-4\n"
      "[mystery]\nx = 1\n";
  ImportOptions options;
  options.gpus = 256;
  options.topology = "dgx-h100";  // FP8 tensor cores
  const ImportResult r = import_torchtitan(text, "train.toml", options);
  const Scenario sc = load_scenario_text(r.yaml, "imported");
  EXPECT_EQ(sc.model.num_layers, 80);
  EXPECT_EQ(sc.model.hidden_size, 8192);
  EXPECT_EQ(sc.model.query_groups(), 8);
  EXPECT_EQ(sc.model.vocab_size, 128256);
  EXPECT_EQ(sc.model.seq_length, 8192);
  EXPECT_EQ(sc.gpus, 256);
  EXPECT_EQ(sc.plan.tensor, 8);
  EXPECT_EQ(sc.plan.pipeline, 4);
  EXPECT_EQ(sc.plan.data, 8);  // -1: the rest of 256 GPUs
  EXPECT_EQ(sc.plan.schedule, ScheduleKind::Interleaved);
  EXPECT_EQ(sc.plan.virtual_stages, 2);  // 80 layers / (4 ranks × 10 per stage), the embedding and output not weighted
  EXPECT_TRUE(sc.plan.layers_per_stage.empty());  // even
  EXPECT_EQ(sc.plan.micro_batch, 2);
  EXPECT_EQ(sc.plan.global_batch, 128);
  EXPECT_EQ(sc.plan.zero_stage, 3);  // FSDP with PP: gradients reduced once per step,
  EXPECT_EQ(reshard_group(sc.plan), 1);  // parameters kept gathered (reshard "default")
  EXPECT_TRUE(stage_held_unsharded(sc.plan));
  EXPECT_EQ(sc.plan.recompute, Recompute::Full);
  EXPECT_TRUE(sc.plan.sequence_parallel);
  EXPECT_TRUE(sc.plan.tp_comm_overlap);
  EXPECT_EQ(sc.plan.precision, Precision::FP8);
  EXPECT_TRUE(sc.plan.fp8_param_gather);
  ASSERT_TRUE(sc.train_tokens.has_value());
  EXPECT_DOUBLE_EQ(*sc.train_tokens, 1000.0 * 128 * 8192);
  // torch.compile is the framework now (fused element-wise kernels), not a note.
  EXPECT_EQ(sc.plan.framework, Framework::TorchtitanCompiled);
  EXPECT_EQ(sc.plan.fp8_recipe, Fp8Recipe::Tensorwise);
  EXPECT_TRUE(sc.not_modelled.empty());
  ASSERT_EQ(r.unknown.size(), 1u);
  EXPECT_EQ(r.unknown[0], "mystery.x = 1");
  EXPECT_FALSE(r.no_effect.empty());  // optimizer.lr
}

// The refusal of an import of `text` ("accepted" when there is none).
std::string refusal(const std::string& text, const ImportOptions& options) {
  try {
    import_torchtitan(text, "train.toml", options);
  } catch (const ConfigError& e) {
    return std::string(e.what());
  }
  return std::string("accepted");
}

TEST(ImportTorchtitan, BadValuesNameTheKeyAndTheLine) {
  ImportOptions options;
  auto message = [&](const std::string& text) { return refusal(text, options); };
  EXPECT_NE(message("[model]\nflavor = \"3B\"\n").find("train.toml:2:10: model.flavor: no shape known for llama3 3B"), std::string::npos)
      << message("[model]\nflavor = \"3B\"\n");
  EXPECT_NE(message("[model]\nflavor = \"8B\"\n[training]\nseq_len = \"long\"\n").find("train.toml:4:11: training.seq_len: expected an integer"),
            std::string::npos);
  EXPECT_NE(message("[model]\nflavor = \"8B\"\n").find("--gpus"), std::string::npos);  // shard degree -1 by default
  options.gpus = 8;
  EXPECT_NE(message("[model]\nflavor = \"8B\"\n[parallelism]\ntensor_parallel_degree = 3\n").find("not a multiple"), std::string::npos);
  EXPECT_NE(message("[model]\nflavor = \"8B\"\n[activation_checkpoint]\nmode = \"some\"\n").find("expected none, selective or full"),
            std::string::npos);
}

// Issue 36: degrees of 2^23 each multiply to 2^69, which wrapped to 0 (then gpus % 0: SIGFPE);
// steps × batch × sequence wrapped to 4.6e17 tokens. Both are named errors now.
TEST(ImportTorchtitan, ProductsOfValuesAreChecked) {
  ImportOptions options;
  auto message = [&](const std::string& text) { return refusal(text, options); };
  options.gpus = 8;
  const std::string degrees = message(
      "[model]\nflavor = \"8B\"\n[parallelism]\ntensor_parallel_degree = 8388608\npipeline_parallel_degree = 8388608\n"
      "context_parallel_degree = 8388608\n");
  EXPECT_NE(degrees.find("parallelism"), std::string::npos) << degrees;
  EXPECT_NE(degrees.find("does not fit in a 64-bit integer"), std::string::npos) << degrees;
  options.gpus = 0;
  const std::string tokens = message(
      "[model]\nflavor = \"8B\"\n[parallelism]\ndata_parallel_shard_degree = 1000000\n"
      "[training]\nlocal_batch_size = 1000000\nseq_len = 1000000\nsteps = 1000000000\n");
  EXPECT_NE(tokens.find("training.steps"), std::string::npos) << tokens;
}

TEST(ExportTorchtitan, FsdpPlansImportBackToTheSamePlan) {
  struct Case {
    const char* name;
    std::vector<Override> sets;
  };
  const std::vector<Case> cases = {
      {"full shard", {{"parallel.zero_stage", "3"}}},
      {"hybrid shard in a node", {{"parallel.zero_stage", "3"}, {"parallel.sharding_group", "node"}, {"parallel.tensor", "2"}}},
      {"shard grad op", {{"parallel.zero_stage", "2"}, {"parallel.recompute", "full"}}},
      {"ddp", {{"parallel.zero_stage", "0"}, {"parallel.overlap_param_gather", "false"}}},
      {"pipeline zb-v", {{"parallel.zero_stage", "2"}, {"parallel.pipeline", "4"}, {"parallel.tensor", "1"}, {"parallel.schedule", "zb-v"}, {"parallel.virtual_stages", "2"},
        {"parallel.sequence_parallel", "false"}, {"parallel.tp_comm_overlap", "false"}}},
      {"context", {{"parallel.zero_stage", "3"}, {"parallel.context", "2"}, {"parallel.context_comm", "allgather"}}},
      {"float8 all-gather", {{"parallel.zero_stage", "3"}, {"cluster.topology", "dgx-h100"}, {"training.precision", "fp8"},
        {"training.fp8_param_gather", "true"}}},
      {"float8 rowwise, compiled", {{"parallel.zero_stage", "3"}, {"cluster.topology", "dgx-h100"}, {"training.framework", "torchtitan_compiled"},
        {"training.precision", "fp8"}, {"training.fp8_recipe", "rowwise"}}},
      {"uneven stages", {{"parallel.zero_stage", "2"}, {"parallel.pipeline", "4"}, {"parallel.layers_per_stage", "[7, 9, 9, 7]"}}},
      {"compiled without async TP", {{"parallel.zero_stage", "3"}, {"parallel.tp_comm_overlap", "false"}, {"training.framework", "torchtitan_compiled"}}},
  };
  for (const auto& c : cases)
   for (const std::string version : {"0.1", "0.2", "0.3"}) {
    const Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/llama3-8b.yaml", c.sets);
    std::vector<std::string> caveats;
    const std::string toml = export_torchtitan(sc, &caveats, version);
    // Each release's own names: 0.2 refuses 0.1's enable_checkpoint and [float8], and the other way round.
    if (version != "0.3") {
      EXPECT_EQ(toml.find(version == "0.1" ? "\nenable = true" : "enable_checkpoint"), std::string::npos) << c.name << " " << version;
    } else {
      EXPECT_NE(toml.find("def llama3_ptdp() -> Trainer.Config:"), std::string::npos) << toml;
    }
    if (sc.plan.precision == Precision::FP8 && version != "0.3") {
      EXPECT_NE(toml.find(version == "0.1" ? "[float8]" : "[quantize.linear.float8]"), std::string::npos) << toml;
    }
    ImportOptions options;
    options.gpus = sc.gpus;
    options.topology = sc.topology_ref;
    const ImportResult r = import_torchtitan(toml, "export.toml", options);
    EXPECT_TRUE(r.unknown.empty()) << c.name << ": " << r.unknown.front();
    const Scenario back = load_scenario_text(r.yaml, "back");
    EXPECT_EQ(back.model.num_layers, sc.model.num_layers) << c.name;
    EXPECT_EQ(back.model.ffn(), sc.model.ffn()) << c.name;
    EXPECT_EQ(back.gpus, sc.gpus) << c.name;
    EXPECT_EQ(back.plan.tensor, sc.plan.tensor) << c.name;
    EXPECT_EQ(back.plan.pipeline, sc.plan.pipeline) << c.name;
    EXPECT_EQ(back.plan.data, sc.plan.data) << c.name;
    EXPECT_EQ(back.plan.context, sc.plan.context) << c.name;
    EXPECT_EQ(back.plan.context_comm, sc.plan.context_comm) << c.name;
    // torchtitan has no ZeRO-2 with pipelines: its FSDP there is stage 3 reducing once per step.
    EXPECT_EQ(back.plan.zero_stage, sc.plan.pipeline > 1 && sc.plan.zero_stage == 2 ? 3 : sc.plan.zero_stage) << c.name;
    if (back.plan.zero_stage == 3) {
      EXPECT_EQ(reshard_group(back.plan), sc.plan.zero_stage == 2 ? 1 : reshard_group(sc.plan)) << c.name;
    }
    EXPECT_EQ(back.plan.sharding_group, sc.plan.sharding_group) << c.name;
    EXPECT_EQ(back.plan.schedule, sc.plan.pipeline > 1 ? sc.plan.schedule : back.plan.schedule) << c.name;
    EXPECT_EQ(back.plan.recompute, sc.plan.recompute) << c.name;
    if (sc.plan.pipeline > 1) {  // the plan's split, not torchtitan's own
      EXPECT_EQ(stage_layers(back.model, back.plan), stage_layers(sc.model, sc.plan)) << c.name << " " << version;
    }
    EXPECT_EQ(back.plan.global_batch, sc.plan.global_batch) << c.name;
    EXPECT_EQ(back.plan.micro_batch, sc.plan.micro_batch) << c.name;
    EXPECT_EQ(back.plan.precision, sc.plan.precision) << c.name;
    // torch.compile is in the file when the plan runs under it or has async TP (which needs it);
    // the FP8 recipe too (0.3's converter is rowwise whatever the plan says).
    const bool async_tp = sc.plan.tensor > 1 && sc.plan.tp_comm_overlap;
    EXPECT_EQ(back.plan.framework == Framework::TorchtitanCompiled, async_tp || sc.plan.framework == Framework::TorchtitanCompiled)
        << c.name << " " << version;
    if (sc.plan.precision == Precision::FP8) {
      EXPECT_EQ(back.plan.fp8_recipe, version == "0.3" ? Fp8Recipe::Rowwise : sc.plan.fp8_recipe) << c.name << " " << version;
    }
    // 0.3's Float8 converter has no FP8 all-gather: the export says so, the import reads none.
    EXPECT_EQ(back.plan.fp8_param_gather, version != "0.3" && sc.plan.fp8_param_gather) << c.name << " " << version;
    if (version == "0.3" && sc.plan.fp8_param_gather) {
      EXPECT_NE(std::find_if(caveats.begin(), caveats.end(), [](const std::string& n) { return n.find("enable_fsdp_float8_all_gather") != std::string::npos; }),
                caveats.end());
    }
  }
  // An unknown version is refused by name.
  const Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/llama3-8b.yaml", {});
  for (const char* version : {"0.4", "1.0"}) {
    try {
      export_torchtitan(sc, nullptr, version);
      ADD_FAILURE() << version << " accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--torchtitan-version"), std::string::npos) << e.what();
    }
  }
}

// The fields of torchtitan's JobConfig in the tables the export writes, as torchtitan 0.1.0
// (torchtitan/config_manager.py) and 0.2.2 (torchtitan/config/job_config.py) define them. 0.2
// refuses a key that is not one of them; 0.1 ignores it silently (so a misspelt key is lost).
const std::set<std::string>& job_config_fields(const std::string& version) {
  auto split = [](const std::string& text) {
    std::set<std::string> out;
    std::istringstream words(text);
    for (std::string w; words >> w;) out.insert(w);
    return out;
  };
  static const std::set<std::string> v01 = split(
      "job.config_file job.dump_folder job.description job.use_for_integration_test job.print_args model.name "
      "model.flavor model.tokenizer_path model.converters model.print_after_conversion optimizer.name optimizer.lr "
      "optimizer.beta1 optimizer.beta2 optimizer.eps optimizer.weight_decay optimizer.implementation "
      "optimizer.early_step_in_backward lr_scheduler.warmup_steps lr_scheduler.decay_ratio lr_scheduler.decay_type "
      "lr_scheduler.lr_min training.dataset training.dataset_path training.local_batch_size "
      "training.global_batch_size training.seq_len training.max_norm training.steps training.enable_cpu_offload "
      "training.mixed_precision_param training.mixed_precision_reduce training.compile training.gc_freq "
      "training.gc_debug training.seed training.deterministic parallelism.data_parallel_replicate_degree "
      "parallelism.enable_compiled_autograd parallelism.data_parallel_shard_degree "
      "parallelism.fsdp_reshard_after_forward parallelism.tensor_parallel_degree parallelism.disable_loss_parallel "
      "parallelism.enable_async_tensor_parallel parallelism.pipeline_parallel_degree "
      "parallelism.pipeline_parallel_split_points parallelism.pipeline_parallel_layers_per_stage "
      "parallelism.pipeline_parallel_schedule parallelism.pipeline_parallel_schedule_csv "
      "parallelism.pipeline_parallel_microbatch_size parallelism.context_parallel_degree "
      "parallelism.context_parallel_rotate_method checkpoint.enable_checkpoint checkpoint.folder "
      "checkpoint.initial_load_path checkpoint.initial_load_model_weights_only checkpoint.interval "
      "checkpoint.last_save_model_weights_only checkpoint.export_dtype checkpoint.create_seed_checkpoint "
      "checkpoint.async_mode checkpoint.keep_latest_k checkpoint.load_step checkpoint.exclude_from_loading "
      "activation_checkpoint.mode activation_checkpoint.selective_ac_option float8.enable_fsdp_float8_all_gather "
      "float8.precompute_float8_dynamic_scale_for_fsdp float8.force_recompute_fp8_weight_in_bwd float8.recipe_name "
      "float8.filter_fqns float8.emulate");
  static const std::set<std::string> v02 = split(
      "job.config_file job.dump_folder job.description job.print_config job.save_config_file "
      "job.custom_config_module model.name model.flavor model.hf_assets_path model.tokenizer_path model.converters "
      "model.print_after_conversion optimizer.name optimizer.lr optimizer.beta1 optimizer.beta2 optimizer.eps "
      "optimizer.weight_decay optimizer.implementation optimizer.early_step_in_backward lr_scheduler.warmup_steps "
      "lr_scheduler.total_steps lr_scheduler.decay_ratio lr_scheduler.decay_type lr_scheduler.min_lr_factor "
      "training.dataset training.dataset_path training.local_batch_size training.global_batch_size training.seq_len "
      "training.max_norm training.steps training.enable_cpu_offload training.dtype training.mixed_precision_param "
      "training.mixed_precision_reduce training.gc_freq training.gc_debug training.dataloader.num_workers "
      "training.dataloader.persistent_workers training.dataloader.pin_memory training.dataloader.prefetch_factor "
      "parallelism.data_parallel_replicate_degree parallelism.data_parallel_shard_degree "
      "parallelism.fsdp_reshard_after_forward parallelism.tensor_parallel_degree parallelism.disable_loss_parallel "
      "parallelism.enable_async_tensor_parallel parallelism.pipeline_parallel_degree "
      "parallelism.module_fqns_per_model_part parallelism.pipeline_parallel_first_stage_less_layers "
      "parallelism.pipeline_parallel_last_stage_less_layers parallelism.pipeline_parallel_layers_per_stage "
      "parallelism.pipeline_parallel_schedule parallelism.pipeline_parallel_schedule_csv "
      "parallelism.pipeline_parallel_microbatch_size parallelism.pipeline_parallel_expert_parallel_overlap "
      "parallelism.context_parallel_degree parallelism.context_parallel_load_balancer "
      "parallelism.context_parallel_rotate_method parallelism.expert_parallel_degree "
      "parallelism.expert_tensor_parallel_degree parallelism.expert_parallel_comm_backend checkpoint.enable "
      "checkpoint.enable_ft_dataloader_checkpoints checkpoint.folder checkpoint.interval "
      "checkpoint.initial_load_path checkpoint.initial_load_model_only checkpoint.initial_load_in_hf "
      "checkpoint.initial_load_in_hf_quantized checkpoint.last_save_model_only checkpoint.last_save_in_hf "
      "checkpoint.export_dtype checkpoint.async_mode checkpoint.keep_latest_k checkpoint.load_step "
      "checkpoint.exclude_from_loading checkpoint.enable_first_step_checkpoint checkpoint.create_seed_checkpoint "
      "checkpoint.load_only activation_checkpoint.mode activation_checkpoint.selective_ac_option "
      "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns activation_checkpoint.early_stop "
      "activation_checkpoint.memory_budget activation_checkpoint.visualize_memory_budget_pareto "
      "activation_checkpoint.preserve_rng_state activation_checkpoint.determinism_check activation_checkpoint.debug "
      "compile.enable compile.components compile.backend quantize.linear.float8.enable_fsdp_float8_all_gather "
      "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp quantize.linear.float8.recipe_name "
      "quantize.linear.float8.filter_fqns quantize.linear.float8.emulate "
      "quantize.linear.mx.mxfp8_dim1_cast_kernel_choice quantize.linear.mx.recipe_name "
      "quantize.linear.mx.filter_fqns quantize.grouped_mm.float8.fqns quantize.grouped_mm.mx.recipe_name "
      "quantize.grouped_mm.mx.fqns");
  return version == "0.1" ? v01 : v02;
}

TEST(ImportTorchtitan, EveryKeyOfTheReleasesIsRead) {
  // Each release's JobConfig with every field at its default (torchtitan 0.1.0's and 0.2.2's own
  // values, flavor 8B): every key is read, listed without effect, or not modelled — none unknown.
  for (const char* version : {"0.1.0", "0.2.2"}) {
    const std::string path = std::string(PTDP_SOURCE_DIR) + "/tests/fuzz/corpus/torchtitan/jobconfig-defaults-" + version + ".toml";
    std::ifstream in(path);
    ASSERT_TRUE(in) << path;
    std::stringstream text;
    text << in.rdbuf();
    ImportOptions options;
    options.gpus = 8;  // data_parallel_shard_degree -1: the rest
    const ImportResult r = import_torchtitan(text.str(), path, options);
    EXPECT_TRUE(r.unknown.empty()) << version << ": " << r.unknown.front();
    const Scenario sc = load_scenario_text(r.yaml, "defaults");
    EXPECT_EQ(sc.plan.data, 8) << version;
    EXPECT_EQ(sc.plan.recompute, Recompute::Selective) << version;  // mode selective, option 2: listed as not modelled
    // The keys of an idle feature say why they have no effect.
    EXPECT_NE(std::find_if(r.no_effect.begin(), r.no_effect.end(),
                           [](const std::string& n) { return n == "parallelism.pipeline_parallel_schedule = \"1F1B\" (pipeline_parallel_degree 1)"; }),
              r.no_effect.end()) << version;
  }
  // What changes the job beyond the plan is not modelled, by name.
  ImportOptions options;
  options.gpus = 8;
  const ImportResult r = import_torchtitan(
      "[model]\nflavor = \"8B\"\n[parallelism]\ntensor_parallel_degree = 8\ndisable_loss_parallel = true\n"
      "[experimental]\ncustom_import = \"my.model\"\n",
      "train.toml", options);
  ASSERT_EQ(r.unsupported.size(), 3u);  // selective option 2, loss parallel, custom import
  EXPECT_EQ(r.unsupported[1].find("parallelism.disable_loss_parallel = true"), 0u) << r.unsupported[1];
  EXPECT_EQ(r.unsupported[2].find("experimental.custom_import = \"my.model\""), 0u) << r.unsupported[2];
}

TEST(ExportTorchtitan, WritesOnlyTheReleasesOwnKeys) {
  // Every feature the TOML export writes, each in both releases' names: a key outside the
  // release's JobConfig is refused by 0.2 and dropped without a word by 0.1.
  const std::vector<std::vector<Override>> plans = {
      {{"parallel.zero_stage", "3"}, {"parallel.sharding_group", "node"}, {"parallel.offload", "optimizer_and_params"}, {"parallel.recompute", "selective"}},
      {{"parallel.zero_stage", "3"}, {"parallel.context", "2"}, {"parallel.context_comm", "allgather"}, {"training.framework", "torchtitan_compiled"}},
      {{"parallel.zero_stage", "3"}, {"cluster.topology", "dgx-h100"}, {"training.framework", "torchtitan_compiled"}, {"training.precision", "fp8"},
       {"training.fp8_recipe", "rowwise"}, {"training.fp8_param_gather", "true"}},
      {{"parallel.zero_stage", "2"}, {"parallel.pipeline", "4"}, {"parallel.schedule", "interleaved"}, {"parallel.virtual_stages", "2"}},
  };
  for (const std::string version : {"0.1", "0.2"})
    for (const auto& sets : plans) {
      const Scenario sc = load_scenario(std::string(PTDP_SOURCE_DIR) + "/scenarios/llama3-8b.yaml", sets);
      const std::string toml = export_torchtitan(sc, nullptr, version);
      const auto doc = parse_toml(toml, "export.toml");
      for (const auto& [key, value] : doc)
        EXPECT_TRUE(job_config_fields(version).count(key)) << "torchtitan " << version << " has no " << key << "\n" << toml;
      EXPECT_TRUE(doc.count(version == "0.1" ? "model.tokenizer_path" : "model.hf_assets_path")) << toml;
      const bool compiled = sc.plan.framework == Framework::TorchtitanCompiled || (sc.plan.tensor > 1 && sc.plan.tp_comm_overlap);
      EXPECT_EQ(doc.count(version == "0.1" ? "training.compile" : "compile.enable"), compiled ? 1u : 0u) << toml;
    }
}

// ---- torchtitan 0.3: Python config_registry functions, read as text ----

std::string registry_03() {
  std::ifstream in(std::string(PTDP_SOURCE_DIR) + "/tests/fuzz/corpus/torchtitan/llama3-registry-0.3.py");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

ImportResult import_03(const std::string& text, const std::string& function, int64_t gpus, const std::string& topology = "dgx-a100") {
  ImportOptions options;
  options.gpus = gpus;
  options.topology = topology;
  options.config_function = function;
  return import_torchtitan(text, "config_registry.py", options);
}

std::string refusal_03(const std::string& text, const std::string& function) {
  try {
    import_03(text, function, 64);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

// The shipped llama3 jobs of 0.3 (in its registry's form): each imports as its plan, or is
// refused by name.
TEST(ImportTorchtitan03, RegistryConfigsImportAsTheirPlans) {
  const std::string text = registry_03();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(torchtitan_python_configs(text, "config_registry.py"),
            (std::vector<std::string>{"llama3_debugmodel", "llama3_8b", "llama3_70b", "llama3_405b"}));
  {  // 8B: FSDP over 8 GPUs (shard degree -1), selective AC, 1 × 8192 tokens per rank, 1000 steps
    const ImportResult r = import_03(text, "llama3_8b", 8);
    EXPECT_TRUE(r.unknown.empty()) << r.unknown.front();
    const Scenario sc = load_scenario_text(r.yaml, "8b");
    EXPECT_EQ(sc.model.num_layers, 32);
    EXPECT_EQ(sc.model.seq_length, 8192);
    EXPECT_EQ(sc.plan.data, 8);
    EXPECT_EQ(sc.plan.zero_stage, 3);
    EXPECT_EQ(sc.plan.recompute, Recompute::Selective);
    EXPECT_EQ(sc.plan.micro_batch, 1);
    EXPECT_EQ(sc.plan.global_batch, 8);
    ASSERT_TRUE(sc.train_tokens.has_value());
    EXPECT_DOUBLE_EQ(*sc.train_tokens, 1000.0 * 8 * 8192);
  }
  {  // 70B: TP 8, full AC, local batch 8
    const Scenario sc = load_scenario_text(import_03(text, "llama3_70b", 64).yaml, "70b");
    EXPECT_EQ(sc.model.num_layers, 80);
    EXPECT_EQ(sc.plan.tensor, 8);
    EXPECT_EQ(sc.plan.data, 8);
    EXPECT_EQ(sc.plan.recompute, Recompute::Full);
    EXPECT_EQ(sc.plan.micro_batch, 8);
  }
  {  // 405B: TP 8, Float8 (rowwise: 0.3's default recipe) through the converter list, compiled
     // with async TP (a local name, compile_config, resolved)
    const Scenario sc = load_scenario_text(import_03(text, "llama3_405b", 128, "dgx-h100").yaml, "405b");
    EXPECT_EQ(sc.model.num_layers, 126);
    EXPECT_EQ(sc.plan.tensor, 8);
    EXPECT_EQ(sc.plan.precision, Precision::FP8);
    EXPECT_EQ(sc.plan.fp8_recipe, Fp8Recipe::Rowwise);
    EXPECT_TRUE(sc.plan.tp_comm_overlap);
    EXPECT_EQ(sc.plan.recompute, Recompute::Full);
  }
  // Refused by name: a flavour without a known shape, a config derived in code, a missing one,
  // and a file of several configs without --config.
  EXPECT_NE(refusal_03(text, "llama3_debugmodel").find("no shape known for llama3 debugmodel"), std::string::npos);
  std::string why = refusal_03(text, "llama3_8b_mxfp8");
  EXPECT_NE(why.find("config_registry.py:60:"), std::string::npos) << why;  // config = llama3_8b()
  EXPECT_NE(why.find("llama3_8b_mxfp8 derives its config from 'llama3_8b()' and changes it in code"), std::string::npos) << why;
  why = refusal_03(text, "llama3_1t");
  EXPECT_NE(why.find("no function 'llama3_1t' (configs: llama3_debugmodel, llama3_8b, llama3_70b, llama3_405b)"), std::string::npos) << why;
  why = refusal_03(text, "");
  EXPECT_NE(why.find("defines 4 configs (llama3_debugmodel, llama3_8b, llama3_70b, llama3_405b): name one with --config NAME"),
            std::string::npos) << why;
}

// A value the import needs that is Python to run, not a literal, is refused naming its key and
// line; a syntax error names its line; what has no effect may be any expression.
TEST(ImportTorchtitan03, ValuesThatAreNotLiteralsAreRefusedByKey) {
  auto job = [](const std::string& training) {
    return "def llama3_job() -> Trainer.Config:\n"
           "    return Trainer.Config(\n"
           "        model_spec=model_registry(\"8B\"),\n"
           "        optimizer=default_adamw(lr=3e-4 * 2),\n"
           "        training=TrainingConfig(" + training + "),\n"
           "    )\n";
  };
  EXPECT_EQ(refusal_03(job("local_batch_size=1, seq_len=4096"), ""), "accepted");
  std::string why = refusal_03(job("local_batch_size=1, seq_len=4096 * 2"), "");
  EXPECT_NE(why.find("config_registry.py:5:"), std::string::npos) << why;
  EXPECT_NE(why.find("training.seq_len: not a literal"), std::string::npos) << why;
  why = refusal_03(job("1, seq_len=4096"), "");
  EXPECT_NE(why.find("positional arguments to TrainingConfig"), std::string::npos) << why;
  why = refusal_03(job("seq_len=\"4096"), "");
  EXPECT_NE(why.find("config_registry.py:5:"), std::string::npos) << why;
  EXPECT_NE(why.find("a string that does not end"), std::string::npos) << why;
  why = refusal_03("def llama3_job() -> Trainer.Config:\n    return Trainer.Config(activation_checkpoint=MemoryBudgetAC.Config())\n", "");
  EXPECT_NE(why.find("'MemoryBudgetAC.Config' is not modelled"), std::string::npos) << why;
  // A TOML file with --config: the option is 0.3's.
  EXPECT_NE(refusal_03("[training]\nseq_len = 2048\n", "llama3_8b").find("is a TOML file"), std::string::npos);
}

}  // namespace
}  // namespace ptdp
