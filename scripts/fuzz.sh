#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang in build-fuzz and runs each for SECONDS
# (default 30): scripts/fuzz.sh [SECONDS] [TARGET...]
# The whole library is compiled with coverage for the fuzzer plus ASan and UBSan, so a bug deep in
# the metadata validation or the planner is found, not only in the decoder. New inputs collect in
# build-fuzz/fuzz/work-<target>; a crash leaves build-fuzz/fuzz/crash-<target>-* and fails the run
# (reproduce: build-fuzz/fuzz/fuzz_<target> FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-30}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(metadata meta_v2 loader_state wire index_records)
BUILD=${H5CKPT_FUZZ_BUILD_DIR:-build-fuzz}
CC=${CC:-clang-14}
CXX=${CXX:-clang++-14}
command -v "$CXX" >/dev/null || { echo "fuzz.sh: $CXX not found (apt-get install clang-14)" >&2; exit 2; }

# UBSan reports stay recoverable so that scripts/sanitizers/ubsan.supp can name known findings;
# halt_on_error makes every other one fatal.
FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer"
CC=$CC CXX=$CXX cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DH5CKPT_BUILD_FUZZERS=ON \
  -DH5CKPT_BUILD_TESTS=OFF -DH5CKPT_BUILD_PERF=OFF -DH5CKPT_WITH_CUDA=OFF \
  -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  >/dev/null
nice cmake --build "$BUILD" -j "${H5CKPT_FUZZ_JOBS:-2}" --target fuzz_make_seeds $(printf 'fuzz_%s ' "${TARGETS[@]}")

OUT=$BUILD/fuzz
"$OUT/fuzz_make_seeds" "$OUT/seeds" >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$PWD/scripts/sanitizers/ubsan.supp}
status=0
for t in "${TARGETS[@]}"; do
  seeds=$OUT/seeds/$t
  [ "$t" = metadata ] && seeds=fuzz/seeds/metadata
  mkdir -p "$OUT/work-$t" "$seeds"  # index_records needs no seeds: it builds its checkpoint itself
  echo "== fuzz_$t for ${SECONDS_EACH}s (corpus $OUT/work-$t, seeds $seeds)"
  if ! "$OUT/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$OUT/crash-$t-" "$OUT/work-$t" "$seeds" 2>"$OUT/fuzz_$t.log"; then
    echo "fuzz_$t FAILED: see $OUT/fuzz_$t.log and $OUT/crash-$t-*" >&2
    tail -40 "$OUT/fuzz_$t.log" >&2
    status=1
  else
    grep -E "^stat::(number_of_executed_units|new_units_added|peak_rss_mb)" "$OUT/fuzz_$t.log" | tr '\n' ' '
    echo
  fi
done
exit $status
