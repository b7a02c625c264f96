#!/usr/bin/env bash
# The other tools' own checks on what ptdp writes, where those tools are installed (pip install
# torch transformers megatron-core deepspeed torchtitan; Megatron-LM's parser needs its source:
# MEGATRON_LM=/path/to/Megatron-LM). A tool that is not installed is skipped, not failed: CI runs
# ptdp's own tests of the same files (tests/schedules/csv_test.cpp's reader of PyTorch's format,
# tests/exec/megatron_state_test.cpp, tests/cli/interop_test.cpp) without these installs.
#   scripts/interop_check.sh [BUILD_DIR]      (default: build)
# Prints one row per check: the tool, what was checked, pass / FAIL / skipped (why).
# Exit status: 1 when a check failed, else 0.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
ptdp="$build/ptdp"
python=${PYTHON:-python3}
[ -x "$ptdp" ] || { echo "interop_check: $ptdp not built (scripts/setup.sh)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/ptdp-interop.XXXXXX")
trap 'rm -rf "$work"' EXIT

rows=()
failed=0
row() {  # tool, check, result
  rows+=("$(printf '%-14s %-58s %s' "$1" "$2" "$3")")
  case "$3" in FAIL*) failed=1 ;; esac
}
has() { "$python" -c "import $1" >/dev/null 2>&1; }
# Runs python code ($3) with arguments; the row passes when it exits 0, else shows its last line.
check() {
  local tool=$1 what=$2 code=$3
  shift 3
  local out
  if out=$("$python" -c "$code" "$@" 2>&1); then row "$tool" "$what" "pass"
  else row "$tool" "$what" "FAIL: $(printf '%s' "$out" | tail -n 1 | cut -c1-100)"; fi
}

# ---- what ptdp writes
tiny=scenarios/tiny-gpt-cpu.yaml
for s in 1f1b interleaved zb-v dualpipev; do
  extra=()
  [ "$s" != 1f1b ] && extra=(--set parallel.virtual_stages=2)
  [ "$s" = interleaved ] && extra+=(--set parallel.overlap_p2p=true)  # interleaving at pipeline 2
  "$ptdp" schedule export "$tiny" --csv "$work/$s.csv" --set parallel.schedule=$s "${extra[@]}" 2>/dev/null ||
    row ptdp "schedule export $s" "FAIL: ptdp refused it"
done
"$ptdp" export megatron scenarios/gpt3-175b.yaml >"$work/megatron.sh" 2>/dev/null ||
  row ptdp "export megatron gpt3-175b" "FAIL: ptdp refused it"
# ZeRO-3 sharded within a node (t 4: two data-parallel ranks per node): zero_hpz_partition_size
"$ptdp" export deepspeed scenarios/llama3-8b.yaml --set parallel.zero_stage=3 --set parallel.sharding_group=node \
  --config "$work/ds_config.json" >/dev/null 2>&1 || row ptdp "export deepspeed llama3-8b (node sharding)" "FAIL: ptdp refused it"
# torchtitan: the installed release's form (0.3, the default: a Python config function; 0.1/0.2: TOML)
titan_version=$("$python" -c 'import importlib.metadata as m; print(".".join(m.version("torchtitan").split(".")[:2]))' 2>/dev/null)
case "$titan_version" in 0.1|0.2) ;; *) titan_version=0.2 ;; esac
"$ptdp" export torchtitan scenarios/llama3-8b.yaml --torchtitan-version "$titan_version" >"$work/train.toml" 2>/dev/null ||
  row ptdp "export torchtitan --torchtitan-version $titan_version" "FAIL: ptdp refused it"
"$ptdp" export torchtitan scenarios/llama3-8b.yaml >"$work/ptdp_job.py" 2>/dev/null ||
  row ptdp "export torchtitan (0.3)" "FAIL: ptdp refused it"
hf_ready=0
if "$ptdp" train "$tiny" --steps 1 --checkpoint "$work/ckpt" >/dev/null 2>&1 &&
   "$ptdp" checkpoint "$work/ckpt" --hf "$work/hf" >/dev/null 2>&1; then hf_ready=1; fi
llama_ready=0  # a Llama-style run (GQA, SwiGLU, RMSNorm, rope, untied) as LlamaForCausalLM
if "$ptdp" train "$tiny" --steps 1 --checkpoint "$work/llama-ckpt" --set model.mlp=swiglu --set model.normalization=rmsnorm \
     --set model.num_query_groups=2 --set model.tie_embeddings=false >/dev/null 2>&1 &&
   "$ptdp" checkpoint "$work/llama-ckpt" --hf "$work/llama-hf" >/dev/null 2>&1; then llama_ready=1; fi

# ---- torch: its own action parser and comms simulator on the lowered CSVs
if has torch; then
  for s in 1f1b interleaved zb-v dualpipev; do
    check torch "pipelining parses and simulates $s.csv" '
import csv, sys
from torch.distributed.pipelining import schedules as S
rows = [[c.strip() for c in r if c.strip()] for r in csv.reader(open(sys.argv[1]))]
order = {rank: [S._Action.from_str(c) for c in r] for rank, r in enumerate(rows)}
stages = 1 + max(a.stage_index for r in order.values() for a in r if a is not None)
if hasattr(S, "_simulate_comms_compute"):
    stage_to_rank = {}
    for rank, r in order.items():
        for a in r:
            if a is not None and a.computation_type in (S.F, S.B, S.I, S.W):
                stage_to_rank[a.stage_index] = rank
    S._simulate_comms_compute(order, lambda st: stage_to_rank[st], stages)
' "$work/$s.csv"
  done
else
  row torch "pipelining CSV loader" "skipped (pip install torch)"
fi

# ---- transformers: from_pretrained on ptdp checkpoint --hf
if has transformers && has torch; then
  if [ $hf_ready = 1 ]; then
    check transformers "GPT2LMHeadModel.from_pretrained(checkpoint --hf)" '
import sys, torch
from transformers import GPT2LMHeadModel
m = GPT2LMHeadModel.from_pretrained(sys.argv[1])
ids = torch.tensor([[1, 2, 3, 4]])
loss = m(ids, labels=ids).loss
assert torch.isfinite(loss), loss
assert 0 <= m.config.eos_token_id < m.config.vocab_size
' "$work/hf"
  else
    row transformers "from_pretrained(checkpoint --hf)" "FAIL: ptdp train/checkpoint --hf did not run"
  fi
  if [ $llama_ready = 1 ]; then
    check transformers "LlamaForCausalLM.from_pretrained(checkpoint --hf)" '
import sys, torch
from transformers import LlamaForCausalLM
m, info = LlamaForCausalLM.from_pretrained(sys.argv[1], output_loading_info=True)
assert not info["missing_keys"] and not info["unexpected_keys"], info
ids = torch.tensor([[1, 2, 3, 4]])
loss = m(ids, labels=ids).loss
assert torch.isfinite(loss), loss
assert 0 <= m.config.eos_token_id < m.config.vocab_size
' "$work/llama-hf"
  else
    row transformers "LlamaForCausalLM.from_pretrained" "FAIL: ptdp train/checkpoint --hf of a Llama-style run did not run"
  fi
else
  row transformers "GPT2LMHeadModel/LlamaForCausalLM.from_pretrained" "skipped (pip install torch transformers)"
fi

# ---- Megatron-LM: its argument parser and validate_args on the exported line
if [ -n "${MEGATRON_LM:-}" ] && [ -f "$MEGATRON_LM/megatron/training/arguments.py" ]; then
  check megatron-lm "parse_args + validate_args on export megatron" '
import os, re, shlex, sys
sys.path.insert(0, sys.argv[2])
text = open(sys.argv[1]).read()
for name, value in re.findall(r"^export (\w+)=(\S+)$", text, re.M):
    os.environ[name] = value
line = text[text.index("pretrain_gpt.py") + len("pretrain_gpt.py"):]
words = [w for w in shlex.split(line.replace("\\\n", " ")) if not w.startswith("${")]
from megatron.training.arguments import parse_args, validate_args
sys.argv = ["pretrain_gpt.py"] + words + ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "51200"]
args = parse_args()
args.world_size = args.tensor_model_parallel_size * args.pipeline_model_parallel_size * 8
args.rank = 0
validate_args(args)
' "$work/megatron.sh" "$MEGATRON_LM"
else
  row megatron-lm "parse_args + validate_args" "skipped (MEGATRON_LM=/path/to/Megatron-LM)"
fi

# ---- DeepSpeed: its config class on the exported JSON
if has deepspeed; then
  check deepspeed "DeepSpeedConfig(ds_config.json)" '
import sys
from deepspeed.runtime.config import DeepSpeedConfig
DeepSpeedConfig(sys.argv[1])
' "$work/ds_config.json"
else
  row deepspeed "DeepSpeedConfig" "skipped (pip install deepspeed)"
fi

# ---- torchtitan: its config manager on the export of its release (0.3: the Python function)
if has torchtitan && "$python" -c 'import importlib.metadata as m, sys; sys.exit(0 if m.version("torchtitan") >= "0.3" else 1)' 2>/dev/null; then
  check torchtitan "ConfigManager --module ptdp_job (export --torchtitan-version 0.3)" '
import sys
sys.path.insert(0, sys.argv[1])
from torchtitan.config import ConfigManager
ConfigManager().parse_args(["--module", "ptdp_job", "--config", "llama3_ptdp"])
' "$work"
elif has torchtitan; then
  check torchtitan "config manager parses export torchtitan --torchtitan-version $titan_version" '
import sys
try:
    from torchtitan.config import ConfigManager
    ConfigManager().parse_args(["--job.config_file", sys.argv[1]])
except ImportError:  # 0.1: torchtitan/config_manager.py
    from torchtitan.config_manager import ConfigManager
    ConfigManager().parse_args(["--job.config_file", sys.argv[1]])
' "$work/train.toml"
else
  row torchtitan "config manager" "skipped (pip install torchtitan)"
fi

printf '%-14s %-58s %s\n' tool check result
printf '%s\n' "${rows[@]}"
exit $failed
