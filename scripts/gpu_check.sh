#!/usr/bin/env bash
# shellcheck disable=SC2317  # the stage functions run in `bash -c` (exported), not inline
# ptdp on a GPU it has never seen: everything worth learning in at most 8 minutes of one H100/H200
# (docs/GPU.md). From a clean clone:
#
#   scripts/gpu_check.sh OUT_DIR
#
# Stages, each under its own time limit, each writing OUT_DIR/NN-name.{log,status} before the
# next starts (so a stage that hangs, crashes or is cut off by the machine's owner leaves every
# earlier result on disk):
#   1 build      configure and build with CUDA (build-gpu/)
#   2 device     `ptdp backends`: the device, its memory, the driver
#   3 gpu-tests  ctest -L gpu: kernels against the cpu device, cuda training against cpu training
#   4 cuda-cpu   the CUDA executor against the CPU executor on small plans (losses side by side)
#   5 calibrate  `ptdp calibrate --backend cuda` on this node → OUT_DIR/profile.yaml
#   6 validate   `ptdp validate` of three plans with that profile: predicted vs measured
# A stage's status is PASS, FAIL (exit code), TIMEOUT, NO-DEVICE (no GPU: every stage after
# the build says so and moves on) or SKIPPED (what it needs failed). The script fails soft: it
# runs every stage whatever the others did, and exits 0 once OUT_DIR/summary.md is written
# (1 when OUT_DIR cannot be written).
#   PTDP_GPU_CHECK_BUILD   build folder (default build-gpu)
#   PTDP_GPU_CHECK_BUDGET  seconds for the whole check (default 480)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

out=${1:-}
if [ -z "$out" ]; then
  echo "usage: scripts/gpu_check.sh OUT_DIR" >&2
  exit 1
fi
mkdir -p "$out" || { echo "gpu_check: cannot create $out" >&2; exit 1; }
out=$(cd "$out" && pwd)
build=${PTDP_GPU_CHECK_BUILD:-build-gpu}
budget=${PTDP_GPU_CHECK_BUDGET:-480}
start=$(date +%s)
ptdp="$PWD/$build/ptdp"
summary="$out/summary.md"
: > "$out/stages.tsv"
device=unknown

# Seconds left of the budget, at most $1.
left() {
  local remaining=$((budget - ($(date +%s) - start)))
  [ "$remaining" -lt "$1" ] && echo "$remaining" || echo "$1"
}

# stage NN NAME LIMIT_S COMMAND...: runs COMMAND (a shell function or program) with output in
# NN-NAME.log under `timeout`, then writes NN-NAME.status and a row of stages.tsv.
stage() {
  local nn=$1 name=$2 limit=$3
  shift 3
  local log="$out/$nn-$name.log" status t0 rc detail=""
  t0=$(date +%s)
  local allowed
  allowed=$(left "$limit")
  if [ "$allowed" -le 5 ]; then
    status=SKIPPED
    detail="the ${budget} s budget is spent"
    echo "$detail" > "$log"
  else
    echo "== $nn $name (limit ${allowed} s): $*" > "$log"
    # A new bash runs the stage's function (exported below): timeout kills it and its children.
    timeout --kill-after=10 "$allowed" bash -c "$*" >> "$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then status=PASS
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=TIMEOUT; detail="stopped after ${allowed} s"
    elif [ $rc -eq 3 ]; then status=NO-DEVICE; detail=$(grep -m1 -i "no device\|no CUDA device\|no usable GPU\|not compiled" "$log" | cut -c1-160)
    elif [ $rc -eq 4 ]; then status=SKIPPED; detail=$(tail -n1 "$log" | cut -c1-160)
    else status=FAIL; detail="exit $rc: $(grep -m1 -i "error\|fail" "$log" | cut -c1-140)"
    fi
  fi
  local took=$(($(date +%s) - t0))
  printf '%s\t%s\t%s\t%s\t%s\n' "$nn" "$name" "$status" "$took" "$detail" >> "$out/stages.tsv"
  printf '%s %s %s s %s\n' "$status" "$nn-$name" "$took" "$detail" > "$out/$nn-$name.status"
  echo "gpu_check: $nn $name: $status (${took} s) $detail" >&2
  sync "$out" 2>/dev/null || true
}

# Exit 3 (NO-DEVICE) unless a CUDA device is usable; `ptdp backends` says why not.
need_device() {
  [ -x "$ptdp" ] || { echo "no ptdp binary (the build failed)"; return 4; }
  local line
  line=$("$ptdp" backends 2>&1 | grep -m1 "^cuda:")
  echo "$line"
  case "$line" in
    *"no device"*|*"not compiled"*|"") return 3 ;;
  esac
  return 0
}

do_build() {
  local args=(-S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTDP_ENABLE_CUDA=ON)
  # The GPU this runs on, not every architecture (compile time): sm_90 for H100/H200.
  local cc
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')
  [ -n "$cc" ] && args+=("-DCMAKE_CUDA_ARCHITECTURES=$cc")
  [ -f "$build/build.ninja" ] || cmake "${args[@]}" || return 1
  # ptdp and the gpu-labelled tests only (the rest of the suite is not needed here).
  cmake --build "$build" -j "$(nproc)" --target ptdp cuda_kernels_test cuda_backend_test cuda_train_test exec_train_driver
}

do_device() {
  need_device
  local rc=$?
  nvidia-smi 2>&1 | head -n 20 || true
  return "$rc"
}

do_gpu_tests() {
  need_device || return $?
  ctest --test-dir "$build" -L gpu --output-on-failure --timeout 240
}

# The same small plans on both back ends: losses side by side (bf16 GEMM operands on both).
do_cuda_cpu() {
  need_device || return $?
  local rc=0
  for plan in "tiny-gpt t1:--set parallel.tensor=1 --set parallel.pipeline=1 --set cluster.gpus=1" \
              "llama-rope:--set parallel.tensor=1 --set parallel.pipeline=1 --set cluster.gpus=1 --set model.mlp=swiglu --set model.normalization=rmsnorm --set model.attention=flash --set model.num_query_groups=2"; do
    local name=${plan%%:*} sets=${plan#*:}
    for backend in cpu cuda; do
      # shellcheck disable=SC2086
      mpirun --allow-run-as-root --oversubscribe -np 1 "$ptdp" train scenarios/tiny-gpt-cpu.yaml --steps 5 --backend "$backend" \
        --set training.precision=bf16 $sets --json "$out/cuda-cpu-$name-$backend.json" || rc=1
    done
    python3 - "$out/cuda-cpu-$name-cpu.json" "$out/cuda-cpu-$name-cuda.json" "$name" <<'EOF' || rc=1
import json, sys
a, b = (json.load(open(p))["losses"] for p in sys.argv[1:3])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"{sys.argv[3]}: cpu {a}\n{sys.argv[3]}: cuda {b}\n{sys.argv[3]}: worst relative difference {worst:.2e} (bf16 GEMM operands on both)")
sys.exit(0 if worst < 2e-2 else 1)
EOF
  done
  return "$rc"
}

do_calibrate() {
  need_device || return $?
  # Every GPU of this node, one rank each; the base topology after the GPU's name (H200, else H100).
  local gpus base=dgx-h100
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
  [ "$gpus" -ge 1 ] || gpus=1
  nvidia-smi -L 2>/dev/null | grep -q "H200" && base=dgx-h200
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$gpus" "$ptdp" calibrate --backend cuda --base "$base" \
    --out "$out/profile.yaml"
}

do_validate() {
  need_device || return $?
  [ -f "$out/profile.yaml" ] || { echo "no profile.yaml: the calibrate stage did not write one"; return 4; }
  local rc=0
  for sets in "--set parallel.tensor=1 --set parallel.pipeline=1 --set cluster.gpus=1" \
              "--set parallel.tensor=1 --set parallel.pipeline=1 --set cluster.gpus=1 --set model.mlp=swiglu --set model.normalization=rmsnorm --set model.attention=flash" \
              "--set parallel.tensor=1 --set parallel.pipeline=1 --set cluster.gpus=1 --set training.precision=bf16 --set training.micro_batch=8"; do
    # shellcheck disable=SC2086
    "$ptdp" validate scenarios/tiny-gpt-cpu.yaml --backend cuda --profile "$out/profile.yaml" --steps 4 --timeout 90 $sets || rc=1
  done
  return "$rc"
}

export out build ptdp
export -f need_device do_build do_device do_gpu_tests do_cuda_cpu do_calibrate do_validate

{
  echo "# ptdp gpu_check, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), host $(hostname)"
} > "$summary"

stage 01 build 300 do_build
stage 02 device 20 do_device
stage 03 gpu-tests 150 do_gpu_tests
stage 04 cuda-cpu 90 do_cuda_cpu
stage 05 calibrate 90 do_calibrate
stage 06 validate 120 do_validate

device=$(grep -h -m1 "^cuda:" "$out/02-device.log" 2>/dev/null || echo "cuda: unknown")
{
  echo
  echo "$device"
  echo
  echo "| stage | status | seconds | detail |"
  echo "|---|---|---|---|"
  while IFS=$'\t' read -r nn name status took detail; do
    echo "| $nn $name | $status | $took | ${detail//|/\\|} |"
  done < "$out/stages.tsv"
  echo
  echo "Logs: $out/NN-stage.log; total $(($(date +%s) - start)) s of the ${budget} s budget."
} >> "$summary"
cat "$summary"
exit 0
