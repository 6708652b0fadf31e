#!/usr/bin/env bash
# Builds the tests under a sanitizer and runs them: scripts/sanitize.sh asan|tsan [CTEST ARGS...]
#   asan  build-asan, -fsanitize=address,undefined: every unit test, every MPI test binary at 1 and
#         2 ranks (the node-local level's at 1 and 2 ranks, the level battery at 2), and the corpus
#         loader. Left out: the deadline tests that stop or abort ranks on purpose (their timings
#         assume uninstrumented code) and the multi-process scripts (trainer, cluster, crash).
#   tsan  build-tsan, -fsanitize=thread: the tests whose ranks run threads of ours: asynchronous
#         saves, load readers and block checkers, helper threads, transfers, the node-local level,
#         and the work pool and stream copy unit tests.
# Open MPI, PMIx, hwloc and HDF5 are not instrumented and have known leaks and unsynchronised
# internals: scripts/sanitizers/{lsan,tsan,ubsan}.supp name what is suppressed and why. Reports go
# to the test output (ctest --output-on-failure) and to BUILD/sanitizer-logs/<tool>.<pid>.
# H5CKPT_SANITIZE_NO_BUILD=1 reruns the tests without building.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-}
shift || true
case "$MODE" in
  asan) FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" ;;
  tsan) FLAGS="-fsanitize=thread -fno-omit-frame-pointer" ;;
  *) echo "usage: scripts/sanitize.sh asan|tsan [ctest arguments]" >&2; exit 2 ;;
esac
BUILD=build-$MODE
SUPP=$PWD/scripts/sanitizers
CC=${CC:-gcc} CXX=${CXX:-g++} cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DH5CKPT_BUILD_PERF=OFF -DH5CKPT_WITH_CUDA=OFF -DH5CKPT_MPI_TEST_RANKS="1;2" -DH5CKPT_TEST_TIMEOUT_SCALE=5 \
  -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="$FLAGS" -DCMAKE_SHARED_LINKER_FLAGS="$FLAGS" >/dev/null

# Test binaries as the CMake lists declare them: h5ckpt_mpi_test_binary (mpi_tests/*.cmake) and
# h5ckpt_unit_test_binary (tests/*.cmake); the GPU ones need CUDA, which this build leaves out.
binaries() { sed -n "s/^ *$1(\([A-Za-z0-9_]*\).*/\1/p" $2 | grep -v '_gpu$' | sort -u; }
MPI_BINS=$(binaries h5ckpt_mpi_test_binary 'mpi_tests/*.cmake')
UNIT_BINS=$(binaries h5ckpt_unit_test_binary 'tests/*.cmake')
alt() { echo $* | tr ' ' '|'; }
EXCLUDE='_gpu_|timeouts_abort|sigstop'
if [ "$MODE" = asan ]; then
  TARGETS="$MPI_BINS $UNIT_BINS test_v1_fixture corpus_load cli_make_fixture h5ckpt-cli"
  MPI_TESTS="^(($(alt $MPI_BINS))_np[12](_rpn[01])?|(test_v1_fixture|corpus_load|corpus_hints)_np[12])\$"
  UNIT_TESTS="^($(alt $UNIT_BINS))\$"
else
  THREADED="test_async test_helper_threads test_transfer test_reshard test_zero_redundancy"
  TARGETS="$THREADED test_local_level test_work_pool test_stream_copy"
  MPI_TESTS="^(($(alt $THREADED))_np[12]|test_local_level_np[12]_rpn[01])\$"
  UNIT_TESTS="^(test_work_pool|test_stream_copy)\$"
fi
[ -n "${H5CKPT_SANITIZE_NO_BUILD:-}" ] || nice cmake --build "$BUILD" -j "${H5CKPT_SANITIZE_JOBS:-2}" --target $TARGETS

rm -rf "$BUILD/sanitizer-logs"
mkdir -p "$BUILD/sanitizer-logs"
LOGS=$PWD/$BUILD/sanitizer-logs
# Open MPI is built without frame pointers: the slow unwinder gives leak stacks lsan.supp can match.
export ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:malloc_context_size=30:halt_on_error=1:log_path=$LOGS/asan:log_exe_name=1"
export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$SUPP/ubsan.supp:log_path=$LOGS/ubsan"
export TSAN_OPTIONS="suppressions=$SUPP/tsan.supp:halt_on_error=0:second_deadlock_stack=1:log_path=$LOGS/tsan:exitcode=66"
# Open MPI's memory hooks (patcher) fight the sanitizers' own malloc and mmap interceptors.
export OMPI_MCA_memory=^patcher
# Keep MCA components loaded at MPI_Finalize: their leaks then have symbols that lsan.supp can name.
export OMPI_MCA_mca_base_component_disable_dlclose=1
rc=0
# The unit tests call no MPI, whose leaks need the slow unwinder to match lsan.supp; with it, an
# allocation-heavy planner test ran 200 times slower than uninstrumented (20 with the fast one).
# The label keeps each pass to its kind when the caller narrows the tests with another -R.
ASAN_OPTIONS=${ASAN_OPTIONS/fast_unwind_on_malloc=0/fast_unwind_on_malloc=1} \
  ctest --test-dir "$BUILD" -R "$UNIT_TESTS" -L '^unit$' -E "$EXCLUDE" --output-on-failure -j 2 "$@" || rc=$?
ctest --test-dir "$BUILD" -R "$MPI_TESTS" -LE '^unit$' -E "$EXCLUDE" --output-on-failure -j 2 "$@" || rc=$?
reports=$(find "$LOGS" -type f -size +0 2>/dev/null | wc -l)
echo "sanitize.sh $MODE: ctest status $rc, $reports sanitizer report file(s) in $LOGS"
[ "$reports" -eq 0 ] || { head -60 $(find "$LOGS" -type f -size +0 | head -3); rc=1; }
exit $rc
