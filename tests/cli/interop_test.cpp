// Megatron-LM and DeepSpeed configurations in and out (`ptdp import`, `ptdp export`) and the key
// table (`ptdp keys`), run as users run them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <sqlite3.h>

#include "run_ptdp.hpp"

namespace {
using namespace ptdp_cli_test;
using nlohmann::json;

class Interop : public Cli {
 protected:
  // The resolved configuration of a scenario file (simulate --json's "config").
  json config(const std::string& scenario) {
    const Outcome r = ptdp({"simulate", scenario, "--json", file("r.json")});
    EXPECT_EQ(r.status, 0) << r.err;
    return json::parse(slurp(file("r.json"))).at("config");
  }
};

const std::vector<std::string> kMegatronArgs = {
    "--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
    "--max-position-embeddings", "2048", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4",
    "--num-layers-per-virtual-pipeline-stage", "3", "--micro-batch-size", "2", "--global-batch-size", "512",
    "--recompute-granularity", "full", "--recompute-method", "uniform", "--sequence-parallel", "--use-distributed-optimizer",
    "--fp16", "--lr", "1.5e-4", "--train-iters", "1000", "--my-custom-flag", "7"};

TEST_F(Interop, MegatronArgumentsBecomeAScenario) {
  std::vector<std::string> args = {"import", "megatron", "--gpus", "64", "--out", file("m.yaml")};
  args.insert(args.end(), kMegatronArgs.begin(), kMegatronArgs.end());
  const Outcome r = ptdp(args);
  ASSERT_EQ(r.status, 0) << r.err;
  const json c = config(file("m.yaml"));
  EXPECT_EQ(c["model"]["num_layers"], 24);
  EXPECT_EQ(c["model"]["hidden_size"], 2048);
  EXPECT_EQ(c["model"]["num_attention_heads"], 16);
  EXPECT_EQ(c["model"]["seq_length"], 2048);
  EXPECT_EQ(c["parallel"]["tensor"], 2);
  EXPECT_EQ(c["parallel"]["pipeline"], 4);
  EXPECT_EQ(c["parallel"]["data"], 8);  // 64 GPUs / (2 × 4)
  EXPECT_EQ(c["parallel"]["virtual_stages"], 2);  // 24 layers / (4 ranks × 3 layers)
  EXPECT_EQ(c["parallel"]["schedule"], "interleaved");
  EXPECT_EQ(c["parallel"]["recompute"], "full");
  EXPECT_EQ(c["parallel"]["sequence_parallel"], true);  // --sequence-parallel
  EXPECT_EQ(c["training"]["micro_batch"], 2);
  EXPECT_EQ(c["training"]["global_batch"], 512);
  EXPECT_EQ(c["training"]["precision"], "fp16");
  EXPECT_DOUBLE_EQ(c["training"]["train_tokens"].get<double>(), 1000.0 * 512 * 2048);
  // Nothing is dropped silently: the unknown, unsupported and no-effect arguments are listed.
  const std::string yaml = slurp(file("m.yaml"));
  EXPECT_TRUE(contains(yaml, "--my-custom-flag 7")) << yaml;
  EXPECT_TRUE(contains(yaml, "--recompute-method uniform")) << yaml;
  EXPECT_TRUE(contains(yaml, "--lr 1.5e-4")) << yaml;
  for (const char* flag : {"--sequence-parallel", "--use-distributed-optimizer"}) {
    // Either carried over as a scenario key or listed as not supported.
    EXPECT_TRUE(contains(yaml, flag) || contains(yaml, "sequence_parallel: true") || contains(yaml, "zero_stage: 1")) << flag << "\n" << yaml;
  }
  EXPECT_TRUE(contains(r.err, "unknown")) << r.err;
  // The distributed optimizer is ZeRO stage 1.
  EXPECT_EQ(c["parallel"]["zero_stage"], 1);
}

// What Megatron-LM and Megatron-DeepSpeed accept: `_` in integers, lower-case normalization,
// --num-key-value-heads, --checkpoint-activations, --no-overlap-p2p-communication, and
// --sequence-parallel at tensor-parallel size 1 (Megatron disables it).
TEST_F(Interop, MegatronDeepSpeedSpellingsAndWhatMegatronAccepts) {
  const Outcome r = ptdp({"import", "megatron", "--gpus", "16", "--out", file("d.yaml"), "--num-layers", "32", "--hidden-size", "4096",
                          "--num-attention-heads", "32", "--num-key-value-heads", "8", "--ffn-hidden-size", "11_008", "--swiglu",
                          "--normalization", "rmsnorm", "--seq-length", "4096", "--vocab-size", "32000", "--tensor-model-parallel-size", "1",
                          "--pipeline-model-parallel-size", "4", "--sequence-parallel", "--checkpoint-activations",
                          "--no-overlap-p2p-communication", "--micro-batch-size", "1", "--global-batch-size", "1_024", "--bf16"});
  ASSERT_EQ(r.status, 0) << r.err;
  const json c = config(file("d.yaml"));
  EXPECT_EQ(c["model"]["num_query_groups"], 8);
  EXPECT_EQ(c["model"]["ffn_hidden_size"], 11008);
  EXPECT_EQ(c["model"]["normalization"], "rmsnorm");
  EXPECT_EQ(c["training"]["global_batch"], 1024);
  EXPECT_EQ(c["parallel"]["recompute"], "full");
  EXPECT_EQ(c["parallel"]["overlap_p2p"], false);
  EXPECT_EQ(c["parallel"]["sequence_parallel"], false);  // t 1: Megatron turns it off
  EXPECT_TRUE(contains(slurp(file("d.yaml")), "--sequence-parallel at --tensor-model-parallel-size 1: disabled")) << slurp(file("d.yaml"));
  // The vocabulary of a tokenizer named by its model (Llama 3: 128 256; Llama 2: 32 000).
  for (const auto& [type, model, vocab] : {std::tuple{"HuggingFaceTokenizer", "meta-llama/Meta-Llama-3-8B", 128256},
                                           std::tuple{"Llama2Tokenizer", "/data/tokenizer.model", 32000}}) {
    const Outcome t = ptdp({"import", "megatron", "--out", file("t.yaml"), "--num-layers", "2", "--hidden-size", "256",
                            "--num-attention-heads", "4", "--seq-length", "128", "--tokenizer-type", type, "--tokenizer-model", model});
    ASSERT_EQ(t.status, 0) << t.err;
    EXPECT_EQ(config(file("t.yaml"))["model"]["vocab_size"], vocab) << model;
  }
  // A misplaced `_` is not an integer for Python either.
  const Outcome bad = ptdp({"import", "megatron", "--num-layers", "_24", "--hidden-size", "4096", "--num-attention-heads", "32",
                            "--seq-length", "4096"});
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(contains(bad.err, "--num-layers: expected an integer (got '_24')")) << bad.err;
}

TEST_F(Interop, MegatronMissingValueOrBadNumberIsExit2NamingTheArgument) {
  Outcome r = ptdp({"import", "megatron", "--num-layers", "24", "--hidden-size", "--num-attention-heads", "16"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "--hidden-size: missing value")) << r.err;
  r = ptdp({"import", "megatron", "--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "--seq-length: missing value")) << r.err;
  r = ptdp({"import", "megatron", "--num-layers", "many", "--hidden-size", "1024"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "--num-layers: expected an integer (got 'many')")) << r.err;
  r = ptdp({"import", "megatron", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "128"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "--num-layers: missing")) << r.err;
}

TEST_F(Interop, MegatronLaunchScriptWithVariablesArraysAndContinuations) {
  const std::string script = write("pretrain.sh",
                                   "#!/bin/bash\n"
                                   "# GPT 1.3B on 2 nodes\n"
                                   "GPUS_PER_NODE=8\n"
                                   "export NNODES=2\n"
                                   "DISTRIBUTED_ARGS=\"--nproc_per_node $GPUS_PER_NODE --nnodes ${NNODES} --master_addr localhost\"\n"
                                   "GPT_ARGS=(\n"
                                   "    --num-layers 24   # comment\n"
                                   "    --hidden-size 2048\n"
                                   "    --num-attention-heads 16\n"
                                   ")\n"
                                   "torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \\\n"
                                   "    ${GPT_ARGS[@]} \\\n"
                                   "    --seq-length 1024 --tensor-model-parallel-size 2 \\\n"
                                   "    --micro-batch-size 4 --global-batch-size 256 --bf16 \\\n"
                                   "    --data-path 'my data/text_document'\n");
  const Outcome r = ptdp({"import", "megatron", script, "--out", file("s.yaml")});
  ASSERT_EQ(r.status, 0) << r.err;
  const json c = config(file("s.yaml"));
  EXPECT_EQ(c["cluster"]["gpus"], 16);  // 8 per node × 2 nodes, from torchrun's arguments
  EXPECT_EQ(c["model"]["num_layers"], 24);
  EXPECT_EQ(c["model"]["hidden_size"], 2048);
  EXPECT_EQ(c["parallel"]["tensor"], 2);
  EXPECT_EQ(c["parallel"]["data"], 8);
  EXPECT_EQ(c["training"]["global_batch"], 256);
  EXPECT_EQ(c["training"]["precision"], "bf16");
  EXPECT_TRUE(contains(slurp(file("s.yaml")), "--data-path my data/text_document")) << slurp(file("s.yaml"));
}

TEST_F(Interop, MegatronLaunchScriptBranchOnTheEnvironmentNeedsEnv) {
  // The model is chosen by MODEL_SIZE, which the script reads from the environment.
  const std::string script = write("select.sh",
                                   "#!/bin/bash\n"
                                   "if [ \"$MODEL_SIZE\" == \"1.7\" ]; then\n"
                                   "  L=24; H=2304; A=24\n"
                                   "elif [[ $MODEL_SIZE == 1T ]]; then\n"
                                   "  L=128; H=25600; A=160\n"
                                   "fi\n"
                                   "torchrun pretrain_gpt.py --num-layers $L --hidden-size $H --num-attention-heads $A \\\n"
                                   "    --seq-length 2048 --micro-batch-size 1 --global-batch-size 64\n");
  const Outcome refused = ptdp({"import", "megatron", script});
  EXPECT_EQ(refused.status, 2);
  EXPECT_TRUE(contains(refused.err, "select.sh:2")) << refused.err;
  EXPECT_TRUE(contains(refused.err, "--env MODEL_SIZE=VALUE")) << refused.err;
  const Outcome r = ptdp({"import", "megatron", script, "--env", "MODEL_SIZE=1.7", "--out", file("s.yaml")});
  ASSERT_EQ(r.status, 0) << r.err;
  const json c = config(file("s.yaml"));
  EXPECT_EQ(c["model"]["num_layers"], 24);  // the 1.7B branch, not the last one written
  EXPECT_EQ(c["model"]["hidden_size"], 2304);
  EXPECT_EQ(ptdp({"import", "megatron", script, "--env", "=1"}).status, 2);
}

TEST_F(Interop, MegatronLaunchScriptWithSourceCaseFunctionsAndQuotedArrays) {
  // The shape of NVIDIA's Llama 3 examples: the model chosen by case from a sourced file, arguments
  // in arrays whose items are quoted pairs, sizes computed with $(( )).
  write("models.sh",
        "case ${MODEL_SIZE:-8B} in\n"
        "  8B)  LAYERS=32; HIDDEN=4096; FFN=14336; HEADS=32 ;;\n"
        "  70B) LAYERS=80; HIDDEN=8192; FFN=28672; HEADS=64 ;;\n"
        "  *)   echo unknown size; exit 1 ;;\n"
        "esac\n");
  const std::string script = write("llama3.sh",
                                   "#!/bin/bash\n"
                                   "set -euo pipefail\n"
                                   "source models.sh\n"
                                   "GPUS_PER_NODE=8\n"
                                   "NUM_NODES=${SLURM_NNODES:-2}\n"
                                   "WORLD=$(( GPUS_PER_NODE * NUM_NODES ))\n"
                                   "model_args() {\n"
                                   "  MODEL_ARGS=(\"--num-layers $LAYERS\" \"--hidden-size $HIDDEN\" \"--ffn-hidden-size $FFN\")\n"
                                   "  MODEL_ARGS+=(\"--num-attention-heads $HEADS\" --group-query-attention --num-query-groups 8)\n"
                                   "}\n"
                                   "model_args\n"
                                   "TRAIN_ARGS=(\"--micro-batch-size 1\" \"--global-batch-size $(( WORLD * 8 ))\" --seq-length 8192)\n"
                                   "if [[ $WORLD -ge 16 ]]; then PARALLEL=(--tensor-model-parallel-size 8); else PARALLEL=(); fi\n"
                                   "echo \"running on $WORLD GPUs\"\n"
                                   "torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES pretrain_gpt.py \\\n"
                                   "  ${MODEL_ARGS[@]} ${TRAIN_ARGS[@]} \"${PARALLEL[@]}\" --swiglu --normalization RMSNorm \\\n"
                                   "  --vocab-size 128256 --bf16 2>&1 | tee train.log\n");
  Outcome r = ptdp({"import", "megatron", script, "--out", file("s.yaml")});
  ASSERT_EQ(r.status, 0) << r.err;
  json c = config(file("s.yaml"));
  EXPECT_EQ(c["model"]["num_layers"], 32);
  EXPECT_EQ(c["model"]["hidden_size"], 4096);
  EXPECT_EQ(c["model"]["ffn_hidden_size"], 14336);
  EXPECT_EQ(c["model"]["vocab_size"], 128256);  // a quoted array item is one word before splitting
  EXPECT_EQ(c["cluster"]["gpus"], 16);
  EXPECT_EQ(c["parallel"]["tensor"], 8);
  EXPECT_EQ(c["training"]["global_batch"], 128);
  r = ptdp({"import", "megatron", script, "--env", "MODEL_SIZE=70B", "--env", "SLURM_NNODES=8", "--out", file("s.yaml")});
  ASSERT_EQ(r.status, 0) << r.err;
  c = config(file("s.yaml"));
  EXPECT_EQ(c["model"]["num_layers"], 80);
  EXPECT_EQ(c["cluster"]["gpus"], 64);
  EXPECT_EQ(c["training"]["global_batch"], 512);
  // A script over 1 MiB is refused before it is read.
  r = ptdp({"import", "megatron", write("huge.sh", "#!/bin/bash\n" + std::string(size_t{1} << 20, '#'))});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "above the limit of 1 MiB")) << r.err;
  // A sourced file that is missing is named at the line that sources it.
  const std::string missing = write("missing.sh", "A=1\nsource nowhere.sh\n");
  r = ptdp({"import", "megatron", missing});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "missing.sh:2")) << r.err;
  EXPECT_TRUE(contains(r.err, "nowhere.sh")) << r.err;
}

// `import megatron` of an 8-layer, 8k-token model on 16 GPUs with the sequence-splitting
// arguments `split`, written to `out`.
std::vector<std::string> long_context_import(std::vector<std::string> split, const std::string& out) {
  std::vector<std::string> args = {"import", "megatron", "--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16",
                                   "--seq-length", "8192", "--micro-batch-size", "1", "--global-batch-size", "16", "--bf16", "--gpus", "16",
                                   "--out", out};
  args.insert(args.end(), split.begin(), split.end());
  return args;
}

TEST_F(Interop, WhatAnImportCouldNotModelIsPrintedBySimulate) {
  // --cp-comm-type a2a+p2p (hierarchical) is not modelled: the imported scenario lists it and
  // simulate says so beside its prediction (not only in YAML comments).
  Outcome r = ptdp(long_context_import({"--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p"}, file("s.yaml")));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string yaml = slurp(file("s.yaml"));
  EXPECT_TRUE(contains(yaml, "not_modelled:\n  - \"--cp-comm-type a2a+p2p")) << yaml;
  Outcome s = ptdp({"simulate", file("s.yaml")});
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_TRUE(contains(s.out, "not modelled")) << s.out;
  EXPECT_TRUE(contains(s.out, "- --cp-comm-type a2a+p2p")) << s.out;
  EXPECT_TRUE(contains(slurp(file("s.yaml")), "not_modelled")) << yaml;
  // A plan without such items prints no such line; a malformed list is exit 2 at its line.
  s = ptdp({"simulate", std::string(PTDP_SOURCE_DIR) + "/scenarios/gpt3-175b.yaml"});
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_FALSE(contains(s.out, "not modelled")) << s.out;
  const std::string bad = write("bad.yaml", yaml.substr(0, yaml.find("not_modelled:")) + "not_modelled: {a: 1}\n");
  s = ptdp({"simulate", bad});
  EXPECT_EQ(s.status, 2);
  EXPECT_TRUE(contains(s.err, "not_modelled: expected a list of text")) << s.err;
}

TEST_F(Interop, MegatronsAllToAllContextExchangeIsUlysses) {
  // --cp-comm-type a2a is context_comm alltoall (priced, not listed as unmodelled), and the
  // export writes it back.
  Outcome r = ptdp(long_context_import({"--context-parallel-size", "2", "--cp-comm-type", "a2a"}, file("u.yaml")));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string yaml = slurp(file("u.yaml"));
  EXPECT_TRUE(contains(yaml, "context_comm: alltoall")) << yaml;
  EXPECT_FALSE(contains(yaml, "not_modelled")) << yaml;
  Outcome s = ptdp({"simulate", file("u.yaml")});
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_TRUE(contains(s.out, "cp 2 (alltoall)")) << s.out;
  Outcome e = ptdp({"export", "megatron", file("u.yaml")});
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_TRUE(contains(e.out, "--cp-comm-type a2a")) << e.out;
  // Megatron-DeepSpeed's --ds-sequence-parallel-size is the same Ulysses, both ways.
  r = ptdp(long_context_import({"--ds-sequence-parallel-size", "2"}, file("ds.yaml")));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(slurp(file("ds.yaml")), "context: 2, context_comm: alltoall")) << slurp(file("ds.yaml"));
  e = ptdp({"export", "deepspeed", file("ds.yaml")});
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_TRUE(contains(e.out, "--ds-sequence-parallel-size 2")) << e.out;
}

TEST_F(Interop, TorchtitanConfigInAndOut) {
  // export torchtitan of an FSDP plan, imported back by the CLI; a bad value is exit 2 at its line.
  // Without --torchtitan-version the export is the newest release's (0.3: a Python config
  // function); 0.2 and 0.1 are TOML.
  const std::string scenario = std::string(PTDP_SOURCE_DIR) + "/scenarios/llama3-8b.yaml";
  const Outcome py = ptdp({"export", "torchtitan", scenario, "--set", "parallel.zero_stage=3"});
  ASSERT_EQ(py.status, 0) << py.err;
  EXPECT_TRUE(contains(py.out, "def llama3_ptdp() -> Trainer.Config:")) << py.out;
  EXPECT_TRUE(contains(py.out, "data_parallel_shard_degree=")) << py.out;
  const Outcome pi = ptdp({"import", "torchtitan", write("ptdp_job.py", py.out), "--out", file("p.yaml")});
  ASSERT_EQ(pi.status, 0) << pi.err;
  EXPECT_EQ(config(file("p.yaml"))["parallel"]["zero_stage"], 3);
  const Outcome e = ptdp({"export", "torchtitan", scenario, "--set", "parallel.zero_stage=3", "--torchtitan-version", "0.2"});
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_TRUE(contains(e.out, "data_parallel_shard_degree = ")) << e.out;
  EXPECT_FALSE(contains(e.out, "def ")) << e.out;
  const std::string toml = write("train.toml", e.out);
  const Outcome i = ptdp({"import", "torchtitan", toml, "--out", file("t.yaml")});
  ASSERT_EQ(i.status, 0) << i.err;
  const json c = config(file("t.yaml"));
  EXPECT_EQ(c["parallel"]["zero_stage"], 3);
  EXPECT_EQ(c["model"]["num_layers"], 32);
  const std::string bad = write("bad.toml", "[model]\nflavor = \"8B\"\n\n[training]\nseq_len = 8192\nlocal_batch_size = -2\n");
  const Outcome b = ptdp({"import", "torchtitan", bad, "--gpus", "8"});
  EXPECT_EQ(b.status, 2);
  EXPECT_TRUE(contains(b.err, "bad.toml:6:20: training.local_batch_size: expected an integer in [1, 1000000000]")) << b.err;
}

TEST_F(Interop, MegatronExportSetsTheEnvironmentValidateArgsNeeds) {
  // Megatron-LM's validate_args refuses tensor or context parallelism without it.
  const Outcome e = ptdp({"export", "megatron", std::string(PTDP_SOURCE_DIR) + "/scenarios/gpt3-175b.yaml"});
  ASSERT_EQ(e.status, 0) << e.err;
  const size_t env = e.out.find("export CUDA_DEVICE_MAX_CONNECTIONS=1\n");
  ASSERT_NE(env, std::string::npos) << e.out;
  EXPECT_LT(env, e.out.find("torchrun")) << e.out;
}

TEST_F(Interop, LaunchScriptsRunAsBashRunsThem) {
  // NVIDIA's Llama 3 guard: run from the Megatron-LM folder or stop.
  const std::string body =
      "#!/bin/bash\n"
      "if [ ! -f pretrain_gpt.py ]; then\n"
      "  echo 'run me from Megatron-LM'\n"
      "  exit 1\n"
      "fi\n"
      "TOKENIZER=(--vocab-file $PWD/vocab.json --merge-file $PWD/merges.txt)\n"
      "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
      "--tokenizer-type GPT2BPETokenizer \"${TOKENIZER[@]}\"\n";
  const std::string script = write("guarded.sh", body);
  Outcome r = ptdp({"import", "megatron", script});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "the script stopped at " + script + ":4:3 (`exit 1`)")) << r.err;
  EXPECT_TRUE(contains(r.err, "[ -f pretrain_gpt.py ] is false, looking in")) << r.err;
  // With the file there (the script's folder is where it runs by default), or --assume-files.
  write("pretrain_gpt.py", "");
  r = ptdp({"import", "megatron", script, "--out", file("g.yaml")});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(config(file("g.yaml"))["model"]["vocab_size"], 50257);  // GPT-2's vocabulary: the array split into its words
  const std::string elsewhere = file("elsewhere");
  fs::create_directories(elsewhere);
  r = ptdp({"import", "megatron", script, "--cwd", elsewhere, "--assume-files", "--out", file("a.yaml")});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(slurp(file("a.yaml")), "taken as true (--assume-files)")) << slurp(file("a.yaml"));
  // BLOOM's shape: environment sourced from a variable's folder, the launch inside bash -c, the
  // embedding pipes counted by the partition method; #SBATCH says how many GPUs.
  const std::string bloom = write("bloom.sh",
      "#!/bin/bash\n#SBATCH --nodes=48\n#SBATCH --gres=gpu:8\n"
      "source $six_ALL_CCFRWORK/start-prod\n"
      "export LAUNCHER=\"python -u -m torch.distributed.run --nproc_per_node 8 --nnodes 48\"\n"
      "export CMD=\" pretrain_gpt.py --num-layers 70 --hidden-size 14336 --num-attention-heads 112 --seq-length 2048 "
      "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 12 --pp-partition-method 'type:transformer|embedding' "
      "--micro-batch-size 2 --global-batch-size 2048 --bf16 --checkpoint-activations --deepspeed --zero-stage 0\"\n"
      "srun --jobid $SLURM_JOBID bash -c \"$LAUNCHER --node_rank \\$SLURM_PROCID $CMD\" 2>&1 | tee log.txt\n");
  r = ptdp({"import", "megatron", bloom, "--out", file("bloom.yaml")});
  ASSERT_EQ(r.status, 0) << r.err;
  const json b = config(file("bloom.yaml"));
  EXPECT_EQ(b["cluster"]["gpus"], 384);
  EXPECT_EQ(b["parallel"]["first_stage_layers"], 5);  // 72 items over 12 stages: 6 each, an embedding in the first and last
  EXPECT_EQ(b["parallel"]["last_stage_layers"], 5);
  EXPECT_EQ(b["parallel"]["zero_stage"], 1);  // bf16 at stage 0 under DeepSpeed: its BF16 optimizer, as import deepspeed reads it
  const std::string yaml = slurp(file("bloom.yaml"));
  EXPECT_TRUE(contains(yaml, "skipped `source $six_ALL_CCFRWORK/start-prod`")) << yaml;
  EXPECT_TRUE(contains(yaml, "ran the string of `bash -c`")) << yaml;
  // The SC'21 scripts: `pwd`/CONFIG.sh sourced, sh -c "${CMD}", --activations-checkpoint-method uniform.
  write("CONFIG.sh", "NLAYERS=96\n");
  const std::string sc21 = write("sc21.sh",
      "#!/bin/bash\n#SBATCH --nodes=128\n#SBATCH --ntasks-per-node=8\n"
      "source `pwd`/CONFIG.sh\n"
      "CMD=\"python pretrain_gpt.py --num-layers ${NLAYERS} --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
      "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --micro-batch-size 1 --global-batch-size 1536 --fp16 "
      "--activations-checkpoint-method uniform\"\n"
      "srun -l sh -c \"${CMD}\"\n");
  // srun's world size is not in the words: cluster.gpus falls back to t·p, and the #SBATCH lines' count is suggested.
  r = ptdp({"import", "megatron", sc21, "--out", file("sc21.yaml")});
  EXPECT_TRUE(contains(r.err, "the script's #SBATCH lines ask for 1024 GPUs: give --gpus 1024")) << r.err;
  r = ptdp({"import", "megatron", sc21, "--gpus", "1024", "--out", file("sc21.yaml")});
  ASSERT_EQ(r.status, 0) << r.err;
  const json g = config(file("sc21.yaml"));
  EXPECT_EQ(g["model"]["num_layers"], 96);
  EXPECT_EQ(g["parallel"]["recompute"], "full");
  // Without #SBATCH lines, the launcher's own words say it: srun's nodes × tasks per node, mpirun's -np.
  const std::string line = " python pretrain_gpt.py --num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
                           "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --micro-batch-size 1 --global-batch-size 1536\n";
  r = ptdp({"import", "megatron", write("srun.sh", "#!/bin/bash\nsrun -N 128 --ntasks-per-node=8" + line), "--out", file("srun.yaml")});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "the script's launcher (srun -N 128 --ntasks-per-node=8) asks for 1024 GPUs: give --gpus 1024")) << r.err;
  r = ptdp({"import", "megatron", write("mpirun.sh", "#!/bin/bash\nmpirun -np 1024 -x NCCL_DEBUG=INFO" + line), "--out", file("mpirun.yaml")});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "the script's launcher (mpirun -np 1024) asks for 1024 GPUs: give --gpus 1024")) << r.err;
  // A launch the import cannot turn into a plan says it in its error too.
  r = ptdp({"import", "megatron", write("moe.sh", "#!/bin/bash\nsrun --nodes 128 --gpus-per-node 8" + line.substr(0, line.size() - 1) +
                                                   " --num-experts 16 --expert-model-parallel-size 8\n")});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "the script's launcher (srun --nodes 128 --gpus-per-node 8) asks for 1024 GPUs: give --gpus 1024")) << r.err;
}

// Positions as Megatron-LM spells them (--position-embedding-type, --rotary-base,
// --rotary-percent), and the older flags; without any, Megatron's default learned_absolute.
TEST_F(Interop, MegatronPositionEmbeddingFlagsAreImported) {
  const std::vector<std::string> llama = {"import", "megatron", "--gpus", "8", "--num-layers", "4", "--hidden-size", "512",
                                          "--num-attention-heads", "8", "--seq-length", "1024", "--micro-batch-size", "1",
                                          "--global-batch-size", "8", "--swiglu", "--normalization", "RMSNorm"};
  auto imported = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = llama;
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--out", file("pos.yaml")});
    const Outcome r = ptdp(args);
    EXPECT_EQ(r.status, 0) << r.err;
    return std::make_pair(config(file("pos.yaml"))["model"], slurp(file("pos.yaml")));
  };
  auto [rope, yaml] = imported({"--position-embedding-type", "rope", "--rotary-base", "500000", "--rotary-percent", "0.5"});
  EXPECT_EQ(rope["position_embedding"], "rope");
  EXPECT_TRUE(contains(yaml, "rotary_base: 500000, rotary_percent: 0.5")) << yaml;
  EXPECT_EQ(imported({"--position-embedding-type", "rotary"}).first["position_embedding"], "rope");  // Megatron-DeepSpeed
  EXPECT_EQ(imported({"--use-rotary-position-embeddings", "--no-position-embedding"}).first["position_embedding"], "rope");
  EXPECT_EQ(imported({"--position-embedding-type", "none"}).first["position_embedding"], "none");
  auto [learned, note] = imported({});
  EXPECT_EQ(learned["position_embedding"], "learned");
  EXPECT_TRUE(contains(note, "Megatron-LM's default learned_absolute")) << note;
  std::vector<std::string> bad = llama;
  bad.insert(bad.end(), {"--position-embedding-type", "alibi", "--out", file("bad.yaml")});
  const Outcome r = ptdp(bad);
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "--position-embedding-type: 'alibi' is not modelled")) << r.err;
  // Exported back: Megatron-LM's spelling, the base as an integer.
  imported({"--position-embedding-type", "rope", "--rotary-base", "500000", "--rotary-percent", "0.5"});
  const Outcome e = ptdp({"export", "megatron", file("pos.yaml")});
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_TRUE(contains(e.out, "--position-embedding-type rope")) << e.out;
  EXPECT_TRUE(contains(e.out, "--rotary-base 500000")) << e.out;
  EXPECT_TRUE(contains(e.out, "--rotary-percent 0.5")) << e.out;
}

TEST_F(Interop, ExportedMegatronLineImportsBackToTheSamePlan) {
  for (const std::string scenario : {"scenarios/gpt3-175b.yaml", "scenarios/llama2-70b.yaml", "scenarios/llama3-405b.yaml",
                                     "scenarios/llama3-8b.yaml", "scenarios/h100/gpt3-175b-fp8.yaml"}) {
    const std::string path = std::string(PTDP_SOURCE_DIR) + "/" + scenario;
    const std::string topology = config(path)["cluster"]["topology"].get<std::string>();
    const Outcome e = ptdp({"export", "megatron", path});
    ASSERT_EQ(e.status, 0) << e.err;
    EXPECT_TRUE(contains(e.out, "pretrain_gpt.py")) << e.out;
    const std::string line = write("launch.sh", e.out);
    const json before = config(path);
    const Outcome i = ptdp({"import", "megatron", line, "--topology", topology, "--out", file("back.yaml")});
    ASSERT_EQ(i.status, 0) << scenario << ": " << i.err << "\n" << e.out;
    const json after = config(file("back.yaml"));
    for (const char* k : {"num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
                          "vocab_size", "mlp", "normalization", "tie_embeddings", "attention", "dropout", "bias",
                          "position_embedding"})
      EXPECT_EQ(before["model"][k], after["model"][k]) << scenario << " model." << k;
    for (const char* k : {"tensor", "pipeline", "data", "virtual_stages", "schedule", "recompute", "layers_per_stage",
                          "sequence_parallel", "zero_stage", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap"})
      EXPECT_EQ(before["parallel"][k], after["parallel"][k]) << scenario << " parallel." << k;
    for (const char* k : {"global_batch", "micro_batch", "precision", "fp8_format", "fp8_param_gather"})
      EXPECT_EQ(before["training"][k], after["training"][k]) << scenario << " training." << k;
    EXPECT_EQ(before["cluster"]["gpus"], after["cluster"]["gpus"]) << scenario;
  }
}

TEST_F(Interop, DeepSpeedConfigSetsBatchesZeroAndPrecision) {
  const std::string cfg = write("ds.json", R"({
    "train_batch_size": 1536,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 96,
    "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}, "overlap_comm": true},
    "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "mystery": 1
  })");
  const Outcome r = ptdp({"import", "deepspeed", cfg, "--out", file("d.yaml")});
  ASSERT_EQ(r.status, 0) << r.err;
  const json c = config(file("d.yaml"));
  EXPECT_EQ(c["parallel"]["data"], 8);  // the base scenario's 1024 GPUs over t 8 · p 16
  EXPECT_EQ(c["training"]["global_batch"], 1536);
  EXPECT_EQ(c["training"]["micro_batch"], 2);
  EXPECT_EQ(c["training"]["precision"], "bf16");
  const std::string yaml = slurp(file("d.yaml"));
  EXPECT_TRUE(contains(yaml, "mystery")) << yaml;
  EXPECT_TRUE(contains(yaml, "optimizer")) << yaml;
  EXPECT_TRUE(contains(yaml, "zero_stage: 1") || contains(yaml, "zero_optimization.stage 1")) << yaml;
  EXPECT_TRUE(contains(yaml, "offload: optimizer") || contains(yaml, "offload_optimizer (cpu)")) << yaml;
  if (c["parallel"].contains("zero_stage")) {
    EXPECT_EQ(c["parallel"]["zero_stage"], 1);
    EXPECT_EQ(c["parallel"]["offload"], "optimizer");
  }
}

// Importing a DeepSpeed config onto a base keeps every layout key of the base it does not set.
TEST_F(Interop, DeepSpeedImportKeepsTheBaseLayoutKeys) {
  const std::string base = write("base.yaml",
                                 "model: {name: m, num_layers: 30, hidden_size: 1024, num_attention_heads: 16, seq_length: 1024, vocab_size: 32000}\n"
                                 "cluster: {topology: dgx-a100, gpus: 64}\n"
                                 "parallel: {tensor: 2, pipeline: 4, first_stage_layers: 6, last_stage_layers: 6, sequence_parallel: true,\n"
                                 "           scatter_gather: false, overlap_p2p: true, recompute: full}\n"
                                 "training: {global_batch: 256, micro_batch: 1, precision: bf16}\n");
  const std::string cfg = write("hf.json", R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 1}})");
  const Outcome r = ptdp({"import", "deepspeed", cfg, "--scenario", base, "--out", file("d.yaml")});
  ASSERT_EQ(r.status, 0) << r.err;
  const json c = config(file("d.yaml"));
  EXPECT_EQ(c["parallel"]["first_stage_layers"], 6);
  EXPECT_EQ(c["parallel"]["last_stage_layers"], 6);
  EXPECT_EQ(c["parallel"]["sequence_parallel"], true);
  EXPECT_EQ(c["parallel"]["scatter_gather"], false);
  EXPECT_EQ(c["parallel"]["overlap_p2p"], true);
  EXPECT_EQ(c["parallel"]["recompute"], "full");
  EXPECT_EQ(c["parallel"]["zero_stage"], 1);
  EXPECT_EQ(c["training"]["precision"], "bf16");  // both "auto": the base's
  EXPECT_EQ(c["training"]["global_batch"], 256);
}

TEST_F(Interop, DeepSpeedWrongTypeOrInconsistentBatchIsExit2NamingTheJsonPath) {
  Outcome r = ptdp({"import", "deepspeed", write("a.json", R"({"zero_optimization": {"stage": "two"}})")});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "a.json: zero_optimization.stage: expected an integer in [0, 3] (got \"two\")")) << r.err;
  r = ptdp({"import", "deepspeed", write("b.json", R"({"fp16": {"enabled": "yes"}})")});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "fp16.enabled: expected true or false")) << r.err;
  r = ptdp({"import", "deepspeed", write("c.json", R"({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4})")});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "train_batch_size: must equal")) << r.err;
  r = ptdp({"import", "deepspeed", write("d.json", R"({"zero_optimization": {"offload_param": {"device": 3}}})")});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "zero_optimization.offload_param.device")) << r.err;
  r = ptdp({"import", "deepspeed", write("e.json", "{\"train_batch_size\": 8,\n  oops}")});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "e.json:2:")) << r.err;
}

TEST_F(Interop, KeysListsEveryKeyWithTypeRangeAndDefault) {
  const Outcome r = ptdp({"keys"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "key")) << r.out;
  // Every listed key is one the loader accepts with --set (wrong values are refused by value,
  // never as an unknown key), and the ones users ask about carry range and default.
  std::istringstream lines(r.out);
  std::string line;
  std::getline(lines, line);  // header
  int n = 0;
  while (std::getline(lines, line)) {
    const std::string key = line.substr(0, line.find(' '));
    if (key.rfind("cluster.topology", 0) == 0 || key == "description" || key == "model.name") continue;
    const Outcome s = ptdp({"simulate", "--set", key + "=[[[not a value", "--fidelity", "analytic"});
    EXPECT_EQ(s.status, 2) << key;
    EXPECT_FALSE(contains(s.err, "unknown key")) << key << ": " << s.err;
    ++n;
  }
  EXPECT_GT(n, 25);
  const Outcome p = ptdp({"keys", "parallel.tensor"});
  ASSERT_EQ(p.status, 0);
  EXPECT_TRUE(contains(p.out, "integer") && contains(p.out, "1 … cluster.gpus")) << p.out;
  const Outcome g = ptdp({"keys", "cluster.topology.gpu.memory"});
  EXPECT_TRUE(contains(g.out, "bytes") && contains(g.out, "80GB")) << g.out;
  EXPECT_EQ(ptdp({"keys", "paralel"}).status, 2);
}

// A save written as a Hugging Face model (checkpoint --hf) and read back by --init in Hugging
// Face's names gives the first step's loss of --init from the save itself: GPT-2 for a GPT run,
// LlamaForCausalLM for a Llama-style one (GQA, SwiGLU, RMSNorm, rope, untied). A file of the
// other architecture names its first tensor and the layout expected.
TEST_F(Cli, TrainStartsFromAHuggingFaceGpt2OrLlamaModel) {
  const std::string scenario = std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml";
  const std::vector<std::string> one = {"--set", "parallel.tensor=1", "--set", "parallel.pipeline=1", "--set", "cluster.gpus=1"};
  const std::vector<std::string> llama = {"--set", "model.mlp=swiglu", "--set", "model.normalization=rmsnorm",
                                          "--set", "model.num_query_groups=2", "--set", "model.tie_embeddings=false",
                                          "--set", "model.rotary_base=500000", "--set", "model.num_layers=2"};
  for (const bool is_llama : {false, true}) {
    SCOPED_TRACE(is_llama ? "llama" : "gpt2");
    const std::string tag = is_llama ? "llama-" : "gpt2-";
    auto train = [&](std::vector<std::string> args) {
      args.insert(args.begin(), {"train", scenario, "--steps", "1"});
      args.insert(args.end(), one.begin(), one.end());
      if (is_llama) args.insert(args.end(), llama.begin(), llama.end());
      return ptdp(args);
    };
    ASSERT_EQ(train({"--checkpoint", file(tag + "ck")}).status, 0);
    const Outcome hf = ptdp({"checkpoint", file(tag + "ck"), "--hf", file(tag + "hf")});
    ASSERT_EQ(hf.status, 0) << hf.err;
    const json cfg = json::parse(slurp(file(tag + "hf/config.json")));
    EXPECT_LT(cfg["eos_token_id"].get<int64_t>(), cfg["vocab_size"].get<int64_t>());
    EXPECT_EQ(cfg["architectures"][0], is_llama ? "LlamaForCausalLM" : "GPT2LMHeadModel");
    EXPECT_TRUE(contains(hf.out, is_llama ? "LlamaForCausalLM.from_pretrained" : "GPT2LMHeadModel.from_pretrained")) << hf.out;
    if (is_llama) {
      EXPECT_EQ(cfg["num_key_value_heads"], 2);
      EXPECT_EQ(cfg["rope_theta"], 500000.0);
      EXPECT_EQ(cfg["tie_word_embeddings"], false);
    }
    std::string saved;
    for (const auto& e : fs::directory_iterator(file(tag + "ck")))
      if (e.path().filename().string().rfind("step-", 0) == 0) saved = (e.path() / "model.safetensors").string();
    ASSERT_FALSE(saved.empty());
    ASSERT_EQ(train({"--init", saved, "--json", file(tag + "a.json")}).status, 0);
    const Outcome b = train({"--init", file(tag + "hf/model.safetensors"), "--json", file(tag + "b.json")});
    ASSERT_EQ(b.status, 0) << b.err;
    EXPECT_EQ(json::parse(slurp(file(tag + "a.json")))["losses"], json::parse(slurp(file(tag + "b.json")))["losses"]);
    // The other architecture's file: the GPT-2 export into the Llama model; a Llama-style file
    // (its first tensor alone) into the GPT model.
    if (is_llama) {
      const Outcome other = train({"--init", file("gpt2-hf/model.safetensors")});
      EXPECT_EQ(other.status, 2);
      EXPECT_TRUE(contains(other.err, "tensor 'transformer.wte.weight' is GPT-2's")) << other.err;
      EXPECT_TRUE(contains(other.err, "model.layers.N.{input_layernorm")) << other.err;
    } else {
      const Outcome other = train({"--init", write("llama.safetensors", [] {
        const std::string header = R"({"model.embed_tokens.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
        std::string bytes(8, '\0');
        for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
        return bytes + header + std::string(4, '\0');
      }())});
      EXPECT_EQ(other.status, 2);
      EXPECT_TRUE(contains(other.err, "'model.embed_tokens.weight' is Llama-style")) << other.err;
    }
  }
}

TEST_F(Interop, TextReportShowsMemoryPerPipelineRank) {
  const Outcome r = ptdp({"simulate", std::string(PTDP_SOURCE_DIR) + "/scenarios/llama2-70b.yaml"});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* col : {"weights", "gradients", "optimizer", "activations", "buffers"})
    EXPECT_TRUE(contains(r.out, col)) << col << "\n" << r.out;
  // One memory row per pipeline rank (p 8).
  const auto at = r.out.find(" activations ");
  std::istringstream rows(r.out.substr(r.out.find('\n', at) + 1));
  std::string row;
  int ranks = 0;
  while (std::getline(rows, row) && !row.empty()) ++ranks;
  EXPECT_EQ(ranks, 8) << r.out;
  EXPECT_FALSE(contains(r.out, "0.00 ns")) << r.out;
}

}  // namespace

namespace {
using namespace ptdp_cli_test;

// A Megatron indexed dataset written by an independent writer (Python's struct, following the
// layout of Megatron-LM's indexed_dataset.py: uint16 tokens, one sequence per document, EOD 0),
// then trained on with `--data PREFIX`.
TEST_F(Cli, TrainReadsAMegatronIndexedDataset) {
  const std::string prefix = file("corpus_text_document");
  const std::string script = write("mk.py",
                                   "import struct, sys\n"
                                   "prefix = sys.argv[1]\n"
                                   "docs = [[(7 * d + 3 * i) % 200 + 1 for i in range(150 + 10 * d)] + [0] for d in range(12)]\n"
                                   "with open(prefix + '.bin', 'wb') as b:\n"
                                   "    offsets = []\n"
                                   "    for d in docs:\n"
                                   "        offsets.append(b.tell())\n"
                                   "        b.write(struct.pack('<%dH' % len(d), *d))\n"
                                   "with open(prefix + '.idx', 'wb') as f:\n"
                                   "    f.write(b'MMIDIDX\\x00\\x00')\n"
                                   "    f.write(struct.pack('<Q', 1))\n"
                                   "    f.write(struct.pack('<B', 8))\n"
                                   "    f.write(struct.pack('<Q', len(docs)))\n"
                                   "    f.write(struct.pack('<Q', len(docs) + 1))\n"
                                   "    f.write(struct.pack('<%di' % len(docs), *[len(d) for d in docs]))\n"
                                   "    f.write(struct.pack('<%dq' % len(docs), *offsets))\n"
                                   "    f.write(struct.pack('<%dq' % (len(docs) + 1), *range(len(docs) + 1)))\n");
  ASSERT_EQ(std::system(("/usr/bin/python3 " + quoted(script) + " " + quoted(prefix)).c_str()), 0);
  const Outcome r = ptdp({"train", std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml", "--set", "parallel.tensor=1", "--set",
                          "parallel.pipeline=1", "--set", "cluster.gpus=1", "--steps", "2", "--data", prefix, "--json", file("t.json")});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out + r.err, "Megatron indexed dataset")) << r.out << r.err;
  EXPECT_TRUE(contains(r.out + r.err, "12 documents")) << r.out << r.err;
  // The same corpus through the .idx name gives the same losses.
  const auto losses = nlohmann::json::parse(slurp(file("t.json"))).at("losses");
  const Outcome again = ptdp({"train", std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml", "--set", "parallel.tensor=1", "--set",
                              "parallel.pipeline=1", "--set", "cluster.gpus=1", "--steps", "2", "--data", prefix + ".idx", "--json",
                              file("u.json")});
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(losses, nlohmann::json::parse(slurp(file("u.json"))).at("losses"));
}

}  // namespace

namespace {
using namespace ptdp_cli_test;

// Checkpoint shards are safetensors files: read back here by a reader written from the format's
// specification alone (Python's struct and json; 8-byte little-endian header size, JSON header,
// contiguous F32 data), and by the `safetensors` package itself when it is installed.
TEST_F(Cli, CheckpointShardsAreSafetensorsFiles) {
  const Outcome r = ptdp({"train", std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml", "--set", "parallel.tensor=1", "--set",
                          "parallel.pipeline=1", "--set", "cluster.gpus=1", "--steps", "2", "--checkpoint", file("ck"), "--save-every", "2"});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string latest = slurp(file("ck/latest"));
  const std::string shard = file("ck/" + latest.substr(0, latest.find_first_of("\n ")) + "/rank-00000.safetensors");
  ASSERT_TRUE(fs::exists(shard)) << shard;
  const std::string script = write("read.py",
                                   "import json, struct, sys\n"
                                   "data = open(sys.argv[1], 'rb').read()\n"
                                   "n, = struct.unpack('<Q', data[:8])\n"
                                   "header = json.loads(data[8:8 + n])\n"
                                   "meta = header.pop('__metadata__')\n"
                                   "assert json.loads(meta['ptdp_shard'])['global_rank'] == 0, meta\n"
                                   "body = data[8 + n:]\n"
                                   "spans = sorted((t['data_offsets'][0], t['data_offsets'][1], k) for k, t in header.items())\n"
                                   "at = 0\n"
                                   "for b, e, k in spans:\n"
                                   "    t = header[k]\n"
                                   "    assert t['dtype'] == 'F32' and b == at and e - b == 4 * t['shape'][0], (k, t)\n"
                                   "    at = e\n"
                                   "assert at == len(body), (at, len(body))\n"
                                   "w = header['embedding.word_embeddings.weight']\n"
                                   "vals = struct.unpack('<%df' % w['shape'][0], body[w['data_offsets'][0]:w['data_offsets'][1]])\n"
                                   "assert w['shape'][0] == 256 * 128 and all(abs(v) < 1 for v in vals)\n"
                                   "names = set(header)\n"
                                   "assert all(k + '#adam_m' in names and k + '#adam_v' in names for k in names if '#' not in k)\n"
                                   "try:\n"
                                   "    from safetensors import safe_open\n"
                                   "except ImportError:\n"
                                   "    print('ok (stdlib reader)'); sys.exit(0)\n"
                                   "with safe_open(sys.argv[1], 'np') as f:\n"
                                   "    assert set(f.keys()) == names and f.metadata()['ptdp_checksum'] == meta['ptdp_checksum']\n"
                                   "print('ok (stdlib reader and safetensors)')\n");
  const std::string out = file("read.out");
  ASSERT_EQ(std::system(("/usr/bin/python3 " + quoted(script) + " " + quoted(shard) + " >" + quoted(out) + " 2>&1").c_str()), 0)
      << slurp(out);
  EXPECT_TRUE(contains(slurp(out), "ok")) << slurp(out);
}

}  // namespace

namespace {
using namespace ptdp_cli_test;

TEST_F(Cli, HelpNamesWhatEachValueIs) {
  for (const std::vector<std::string>& cmd :
       {std::vector<std::string>{"simulate"}, {"train"}, {"validate"}, {"calibrate"}, {"sweep"}, {"compare"}, {"plot", "timeline"},
        {"plot", "sweep"}, {"import", "megatron"}, {"import", "deepspeed"}, {"import", "hf"}, {"import", "torchtitan"},
        {"export", "megatron"}, {"export", "deepspeed"}, {"export", "torchtitan"}, {"keys"}, {"bench"}, {"cost"}}) {
    std::vector<std::string> args = cmd;
    args.push_back("--help");
    const Outcome r = ptdp(args);
    EXPECT_EQ(r.status, 0) << cmd[0];
    EXPECT_FALSE(contains(r.out, " TEXT")) << cmd[0] << ":\n" << r.out;
    EXPECT_FALSE(contains(r.out, ":FILE")) << cmd[0] << ":\n" << r.out;
  }
}

TEST_F(Cli, SweepTableChartAndCsvShareTheRankedFigure) {
  const std::string scenario = std::string(PTDP_SOURCE_DIR) + "/scenarios/paper/gpt-18.4b.yaml";
  const Outcome both = ptdp({"sweep", scenario, "--auto", "--vary", "parallel.pipeline=1,2"});
  EXPECT_EQ(both.status, 2);
  EXPECT_TRUE(contains(both.err, "--vary: --auto chooses parallel.pipeline itself")) << both.err;

  const Outcome r = ptdp({"sweep", scenario, "--vary", "parallel.pipeline=1,2,4", "--vary", "parallel.recompute=full,selective", "--top", "1",
                          "--fidelity", "analytic", "--csv", file("s.csv"), "--plot", file("s.png"), "--megatron"});
  ASSERT_EQ(r.status, 0) << r.err;
  // The varied keys are columns, the ranked figure (tokens/s) is named and shown.
  for (const char* heading : {"pipeline", "recompute", "tokens/s", "(ranked)", "ranked by tokens/s"})
    EXPECT_TRUE(contains(r.out, heading)) << heading << "\n" << r.out;
  EXPECT_TRUE(contains(r.out, "Megatron-LM launch line of") && contains(r.out, "rank 1")) << r.out;
  EXPECT_TRUE(contains(r.out, "--pipeline-model-parallel-size")) << r.out;
  EXPECT_TRUE(fs::exists(file("s.png")));
  // The CSV carries the same figure; ranks follow it (higher tokens/s first).
  std::istringstream csv(slurp(file("s.csv")));
  std::string line;
  std::getline(csv, line);
  std::vector<std::string> header;
  {
    std::istringstream h(line);
    for (std::string c; std::getline(h, c, ',');) header.push_back(c);
  }
  const auto col = [&](const std::string& name) { return std::find(header.begin(), header.end(), name) - header.begin(); };
  ASSERT_LT(col("ranked_value"), static_cast<long>(header.size()));
  double previous = 1e300;
  int rows = 0;
  while (std::getline(csv, line)) {
    std::vector<std::string> cells;
    std::istringstream l(line);
    for (std::string c; std::getline(l, c, ',');) cells.push_back(c);
    if (cells.size() < header.size() || cells[col("rank")].empty()) continue;
    EXPECT_EQ(cells[col("ranked_by")], "tokens_per_s");
    const double v = std::stod(cells[col("ranked_value")]);
    EXPECT_DOUBLE_EQ(v, std::stod(cells[col("tokens_per_s")]));
    EXPECT_LE(v, previous * (1 + 1e-12)) << line;
    previous = v;
    ++rows;
  }
  const auto at = r.out.find(" ranked, ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const auto open = r.out.rfind('(', at);
  EXPECT_EQ(rows, std::stoi(r.out.substr(open + 1, at - open - 1))) << r.out;  // every ranked configuration
  EXPECT_GE(rows, 4);
}

TEST_F(Cli, CompareAndTimelineReadAPyTorchProfilerTrace) {
  // Rank 1 of 4 (tiny-gpt-cpu: t 2, p 2): a forward GEMM, a backward one launched inside
  // MmBackward0, a tensor-parallel all-reduce whose group is named, a pipeline SendRecv.
  const std::string kineto = write("rank1.json", R"({"schemaVersion": 1,
    "distributedInfo": {"backend": "nccl", "rank": 1, "world_size": 4},
    "traceEvents": [
      {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 5000},
      {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 5, "args": {"correlation": 1}},
      {"ph": "X", "cat": "kernel", "name": "sm80_xmma_gemm_bf16", "pid": 0, "tid": 7, "ts": 100, "dur": 1000, "args": {"correlation": 1}},
      {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0", "pid": 1, "tid": 2, "ts": 1100, "dur": 50},
      {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 1110, "dur": 5, "args": {"correlation": 2}},
      {"ph": "X", "cat": "kernel", "name": "sm80_xmma_gemm_bf16_nt", "pid": 0, "tid": 7, "ts": 1200, "dur": 2000, "args": {"correlation": 2}},
      {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 3200, "dur": 5, "args": {"External id": 4, "Process Group Description": "TENSOR_MODEL_PARALLEL_GROUP"}},
      {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "pid": 0, "tid": 9, "ts": 3300, "dur": 300, "args": {"External id": 4}},
      {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv", "pid": 0, "tid": 10, "ts": 3700, "dur": 200}
    ]})");
  const std::string scenario = std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml";
  ASSERT_EQ(ptdp({"simulate", scenario, "--json", file("p.json"), "--trace", file("t.json")}).status, 0);
  const Outcome c = ptdp({"compare", file("p.json"), kineto});
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_TRUE(contains(c.out, "PyTorch profiler trace of rank 1 of 4: 4 kernels, 2 NCCL")) << c.out;
  EXPECT_TRUE(contains(c.out, "iteration (ProfilerStep mean)")) << c.out;
  EXPECT_TRUE(contains(c.out, "5.00 ms")) << c.out;
  EXPECT_TRUE(contains(c.out, "compute busy of pipeline rank 0")) << c.out;  // global rank 1: tp 1 of pipeline rank 0
  EXPECT_TRUE(contains(c.out, "2.00 ms")) << c.out;                          // the backward kernel
  EXPECT_TRUE(contains(c.out, "300 us")) << c.out;                           // tp
  EXPECT_FALSE(contains(c.err, "world size")) << c.err;  // 4 ranks, as the plan (t 2, p 2)
  const Outcome t = ptdp({"plot", "timeline", file("tl.png"), file("t.json"), kineto});
  EXPECT_EQ(t.status, 0) << t.err;
  EXPECT_TRUE(fs::exists(file("tl.png")));
  // A trace of another run's size: compared, with a warning naming both sizes.
  std::string other = slurp(kineto);
  const std::string four = "\"world_size\": 4";
  other.replace(other.find(four), four.size(), "\"world_size\": 8");
  const Outcome w = ptdp({"compare", file("p.json"), write("rank1-of-8.json", other)});
  ASSERT_EQ(w.status, 0) << w.err;
  EXPECT_TRUE(contains(w.err, "warning: the trace is of a run of 8 ranks (its world size), the prediction of a plan on 4 GPUs")) << w.err;
  // ptdp's own trace is not a measured report or a profiler trace: exit 2 saying what was expected.
  const Outcome bad = ptdp({"compare", file("p.json"), file("t.json")});
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(contains(bad.err, "expected a PyTorch profiler (Kineto) trace")) << bad.err;
  EXPECT_TRUE(contains(bad.err, "or give a report of ptdp train --json")) << bad.err;
}

TEST_F(Cli, CompareAndTimelineReadAnNsightSystemsExport) {
  // The nsight fuzz target's seed export (tests/fuzz/nsight_seed.sql): two GPUs, the busier one's
  // five kernels (a forward and two backward GEMMs, an all-reduce, a SendRecv), one ProfilerStep.
  const std::string export_path = std::string(PTDP_SOURCE_DIR) + "/tests/fuzz/corpus/nsight/step.sqlite";
  const std::string scenario = std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml";
  ASSERT_EQ(ptdp({"simulate", scenario, "--json", file("p.json"), "--trace", file("t.json")}).status, 0);
  const Outcome c = ptdp({"compare", file("p.json"), export_path});
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_TRUE(contains(c.out, "Nsight Systems export, the GPU of rank 0 of 2: 5 kernels, 2 NCCL")) << c.out;
  const Outcome t = ptdp({"plot", "timeline", file("tl.png"), file("t.json"), export_path});
  EXPECT_EQ(t.status, 0) << t.err;
  EXPECT_TRUE(fs::exists(file("tl.png")));
  // A SQLite file that is not an export: exit 2 saying what was expected.
  const std::string other = write("other.sqlite", std::string("SQLite format 3\0", 16) + std::string(200, 'x'));
  const Outcome bad = ptdp({"compare", file("p.json"), other});
  EXPECT_EQ(bad.status, 2);
  EXPECT_TRUE(contains(bad.err, "expected an Nsight Systems SQLite export")) << bad.err;
}

TEST_F(Cli, TimelineTakesAWindowAndSharesTheTimeAxis) {
  const std::string scenario = std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml";
  const Outcome s = ptdp({"simulate", scenario, "--trace", file("p.json")});
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_EQ(s.err, "") << "a sub-second run with its trace prints no progress";
  for (const std::vector<std::string>& window : {std::vector<std::string>{"--from", "1", "--to", "2"}, {"--from", "10ms", "--to", "40ms"}, {}}) {
    std::vector<std::string> args = {"plot", "timeline", file("t.png"), file("p.json"), file("p.json")};
    args.insert(args.end(), window.begin(), window.end());
    fs::remove(file("t.png"));
    const Outcome r = ptdp(args);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(fs::exists(file("t.png")));
  }
  Outcome r = ptdp({"plot", "timeline", file("t.png"), file("p.json"), "--from", "soon"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "--from: expected a microbatch number")) << r.err;
  r = ptdp({"plot", "timeline", file("t.png"), file("p.json"), "--from", "99"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "has microbatches 0 … 3")) << r.err;
  r = ptdp({"plot", "timeline", file("t.png"), file("p.json"), "--from", "30ms", "--to", "10ms"});
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.err, "the window is empty")) << r.err;
}

// Issue 36's smaller defects, as a user meets them.
TEST_F(Cli, ImportOutNeverReplacesTheScriptItReads) {
  const std::string script = "torchrun pretrain_gpt.py --num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024\n";
  write("run.sh", script);
  fs::create_directories(file("sub"));
  const Outcome r = ptdp({"import", "megatron", file("run.sh"), "--out", file("sub/../run.sh")});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(slurp(file("run.sh")), script);
  const Outcome ok = ptdp({"import", "megatron", file("run.sh"), "--out", file("run.yaml")});
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_EQ(slurp(file("run.sh")), script);
}

TEST_F(Cli, ShardingOverOneDataParallelRankIsNoSharding) {
  // Megatron-LM runs the distributed optimizer at t 8 on 8 GPUs (d = 1): imported as zero_stage 0.
  const Outcome m = ptdp({"import", "megatron", "--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length",
                          "1024", "--tensor-model-parallel-size", "8", "--use-distributed-optimizer", "--gpus", "8", "--out", file("m.yaml")});
  ASSERT_EQ(m.status, 0) << m.err;
  EXPECT_TRUE(contains(slurp(file("m.yaml")), "one data-parallel rank: nothing to shard")) << slurp(file("m.yaml"));
  EXPECT_EQ(ptdp({"simulate", file("m.yaml")}).status, 0);
  // DeepSpeed bf16 at stage 0 on t 2 · p 2 = 4 GPUs (d = 1).
  write("ds.json", R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}})");
  const Outcome d = ptdp({"import", "deepspeed", file("ds.json"), "--scenario", std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml",
                          "--gpus", "4", "--out", file("d.yaml")});
  ASSERT_EQ(d.status, 0) << d.err;
  EXPECT_TRUE(contains(slurp(file("d.yaml")), "nothing to shard (zero_stage 0)")) << slurp(file("d.yaml"));
}

TEST_F(Cli, CompareOfReportsOfDifferentPlansSaysSo) {
  const std::string scenario = std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml";
  ASSERT_EQ(ptdp({"simulate", scenario, "--json", file("p2.json")}).status, 0);
  ASSERT_EQ(ptdp({"simulate", scenario, "--set", "parallel.pipeline=1", "--set", "parallel.data=2", "--json", file("p1.json")}).status, 0);
  const Outcome c = ptdp({"compare", file("p2.json"), file("p1.json")});
  EXPECT_EQ(c.status, 0) << c.err;
  EXPECT_TRUE(contains(c.err, "the reports are of different plans (parallel.data 1 vs 2)")) << c.err;
  const Outcome same = ptdp({"compare", file("p2.json"), file("p2.json")});
  EXPECT_FALSE(contains(same.err, "different plans")) << same.err;
}

TEST_F(Cli, AnInvalidUtf8KernelNamePlotsAndLeavesNoTemporary) {
  const std::string scenario = std::string(PTDP_SOURCE_DIR) + "/scenarios/tiny-gpt-cpu.yaml";
  ASSERT_EQ(ptdp({"simulate", scenario, "--trace", file("t.json")}).status, 0);
  auto temporaries = [] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
      if (e.path().filename().string().rfind("ptdp-kernels-", 0) == 0) ++n;
    return n;
  };
  const int before = temporaries();
  // An Nsight export whose kernel name is not UTF-8 (SQLite stores the bytes as given): the
  // converted trace carries U+FFFD (it failed with the JSON library's text and left its file).
  const std::string nsys = file("k.sqlite");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(nsys.c_str(), &db), SQLITE_OK);
  const std::string sql = std::string("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);"
                                      "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, \"end\" INTEGER, deviceId INTEGER, demangledName INTEGER);"
                                      "INSERT INTO StringIds VALUES (1, 'gemm_") + "\xff\xfe" + "');"
                                      "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (1000, 900000, 0, 1);";
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  const Outcome t = ptdp({"plot", "timeline", file("tl.png"), file("t.json"), nsys});
  EXPECT_EQ(t.status, 0) << t.err;
  EXPECT_TRUE(fs::exists(file("tl.png")));
  EXPECT_EQ(temporaries(), before) << "a converted trace was left in " << fs::temp_directory_path();
  // A PyTorch profiler trace with such a name is no JSON: exit 2 naming the file, nothing left.
  const std::string kineto = write("rank0.json", std::string(R"({"schemaVersion": 1, "traceEvents": [
      {"ph": "X", "cat": "kernel", "name": "gemm_)") + "\xff\xfe" + R"(", "pid": 0, "tid": 7, "ts": 100, "dur": 1000}]})");
  const Outcome k = ptdp({"plot", "timeline", file("tl2.png"), file("t.json"), kineto});
  EXPECT_EQ(k.status, 2) << k.err;
  EXPECT_TRUE(contains(k.err, kineto)) << k.err;
  EXPECT_EQ(temporaries(), before);
}

}  // namespace
