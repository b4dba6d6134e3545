#!/usr/bin/env bash
# device_quick.sh — a short check on the GPU machine after a fix: build-90a
# (sm_90a SASS only), then the tests named below, each bounded; output in
# $OUT/quick.txt. Usage: scripts/device_quick.sh (needs .deps/ carried).
OUT=${OUT:-/tmp/fd-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/quick.txt") 2>&1
cd "$(dirname "$0")/.."
DEPS="$PWD/.deps/root/usr"
export LD_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
cmake -S . -B build-90a -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON -DFD_CUDA_ARCHS=90a-real \
  -DCMAKE_PREFIX_PATH="$DEPS" -DCMAKE_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu" \
  -DCMAKE_INCLUDE_PATH="$DEPS/include" -DCMAKE_C_FLAGS="-I$DEPS/include" >/tmp/qb.txt 2>&1 &&
  cmake --build build-90a -j "$(nproc)" >>/tmp/qb.txt 2>&1 || { echo BUILD FAILED; tail -30 /tmp/qb.txt; exit 1; }
echo "== built in $(( $(date +%s) - t0 ))s"
export FLASHDECODE_LIBRARY="$PWD/build-90a/libflashdecode.so" PYTHONPATH="$PWD/python"
run() { local t=$1; shift; echo "== $* (t=$(( $(date +%s) - t0 ))s)"; timeout "$t" "$@" 2>&1 | grep -v "^\[ *OK\|^\[ RUN" | tail -25; echo "   exit ${PIPESTATUS[0]}"; }
run 20 build-90a/tests/test_variants cuda
run 30 build-90a/tests/test_gpu_append
FD_TEST_FILTER='cuda/*softcap*' run 20 build-90a/tests/test_gpu_grid
run 40 build-90a/tests/reliability/test_reliability_gpu trust
run 30 python3 -m pytest -x -q --tb=short -p no:cacheprovider tests/python/test_cuda_fp8.py
run 20 build-90a/tests/reliability/test_reliability_gpu variants
run 20 build-90a/tests/reliability/test_reliability_gpu graphs
echo "== done t=$(( $(date +%s) - t0 ))s"
