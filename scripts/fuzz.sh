#!/usr/bin/env bash
# Fuzzing: builds the libFuzzer targets of tests/fuzz with clang (AddressSanitizer + UBSan, the
# whole build instrumented) in build-fuzz/ and runs each for SECONDS (default 60).
#   ./scripts/fuzz.sh            60 s per target (what CI runs)
#   ./scripts/fuzz.sh 600        10 minutes per target (the documented longer run)
#   PTDP_FUZZ_TARGETS="scenario" ./scripts/fuzz.sh 60
# Starts from the seed corpus in tests/fuzz/corpus/<target> (never modified; new inputs go to a
# scratch folder). A finding (crash, leak, sanitizer report, timeout, out-of-memory) stops the
# run with exit 1 and leaves the input as build-fuzz/findings/<target>/crash-…: copy it into
# tests/fuzz/corpus/<target> once fixed, so that every build replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
targets=${PTDP_FUZZ_TARGETS:-"scenario schedule_csv megatron deepspeed kineto hf torchtitan nsight nsight_json safetensors pipeline_layout"}
build=${PTDP_FUZZ_BUILD_DIR:-build-fuzz}

for tool in clang clang++; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool not found (./scripts/setup.sh installs clang)" >&2; exit 2; }
done
if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPTDP_FUZZ=ON \
    -DPTDP_ENABLE_CUDA=OFF >&2
fi
for t in $targets; do cmake --build "$build" -j "$(nproc)" --target "fuzz_$t" >&2; done

status=0
for t in $targets; do
  scratch=$(mktemp -d)
  mkdir -p "$build/findings/$t"
  echo "fuzz.sh: fuzz_$t for ${seconds}s" >&2
  # -timeout: one input may take at most 10 s (a hang is a finding); -rss_limit_mb: memory
  # exhaustion is a finding; -max_len: inputs up to 64 KiB.
  if ! (cd "$build/findings/$t" && \
        ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
        "../../tests/fuzz/fuzz_$t" "$scratch" "$PWD/../../../tests/fuzz/corpus/$t" \
          -dict="$PWD/../../../tests/fuzz/$t.dict" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
          -max_len=65536 -print_final_stats=1 2>"$PWD/../$t.log"); then
    echo "fuzz.sh: fuzz_$t found a problem; input and log in $build/findings/$t, $build/findings/$t.log" >&2
    tail -40 "$build/findings/$t.log" >&2
    status=1
  else
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$build/findings/$t.log" | sed "s/^/fuzz_$t: /" >&2
    echo "fuzz_$t: corpus $(find "$scratch" -type f | wc -l) new inputs, 0 findings" >&2
  fi
  rm -rf "$scratch"
done
exit $status
