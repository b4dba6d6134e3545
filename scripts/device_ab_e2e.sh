#!/usr/bin/env bash
# device_ab_e2e.sh — one device call that A/Bs builds of the library end to end:
# each FD_AB entry "name|cmake flags" is built (sm_90a, library + CLI) in
# build-ab-<name>; then, per build, `flashdecode bench` at the FD_AB_LENS
# lengths (B=1 32/8 d128 bf16; graph replay, cold L2) and bench_e2e.py's
# flashdecode rows (FD_AB_E2E flags), and once SDPA-cuDNN and no-attention.
# FD_AB_TESTS=name: that build also gets tests (quick GPU grid, fp8 grid,
# variants, Python CUDA tests, memcheck of the bf16 d128 cases).
# FD_AB_STEPS="tests interleave bench" (default "tests bench"): what runs after the
# builds (a warm machine keeps the build trees: a second call rebuilds nothing).
# Output: $OUT/ab-e2e.txt and $OUT/e2e-csv.tgz. E.g. a build with a compile-time switch
# against main's: FD_AB='main|;sw|"-DCMAKE_C_FLAGS=-I$DEPS/include -DFD_SWITCH=0"
# -DCMAKE_CUDA_FLAGS=-DFD_SWITCH=0' FD_AB_STEPS=bench FD_AB_IMPLS=fdecode,fdecode-pdl
# FD_AB_E2E="--batches 1 --contexts 8192,32768 --graph-profile". Needs .deps carried.
OUT=${OUT:-/tmp/fd-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/ab-e2e.txt") 2>&1
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/device_env.sh
. scripts/device_env.sh # DEPS, LD_LIBRARY_PATH, qbuild
export PYTHONPATH="$PWD/python"
t0=$(date +%s)
el() { echo "t=$(( $(date +%s) - t0 ))s"; }
IFS=';' read -r -a entries <<<"${FD_AB:?FD_AB=\"name|flags;name|flags\"}"
pids=()
for ent in "${entries[@]}"; do
  name=${ent%%|*}; flags=${ent#*|}
  tests=OFF; [ "${FD_AB_TESTS:-}" = "$name" ] && tests=ON
  fl=()
  eval "fl=($flags)"
  { qbuild "build-ab-$name" "/tmp/ab-$name.log" -DFD_BUILD_TESTS=$tests -DFD_BUILD_READ_PROBE=OFF \
      "${fl[@]}" || { echo "BUILD $name FAILED"; tail -20 "/tmp/ab-$name.log"; }; } &
  pids+=($!)
done
wait "${pids[@]}"; echo "== built $(el)"
STEPS=${FD_AB_STEPS:-tests bench}
if [ -n "${FD_AB_TESTS:-}" ] && [[ " $STEPS " == *" tests "* ]]; then
  b=build-ab-$FD_AB_TESTS
  run() { local t=$1; shift; echo "== $* ($(el))"; timeout "$t" "$@" 2>&1 | grep -v "^\[ *OK\|^\[ RUN" | tail -6; echo "   exit ${PIPESTATUS[0]}"; }
  FD_TEST_QUICK=1 run 180 "$b"/tests/test_gpu_grid
  run 40 "$b"/tests/test_gpu_fp8_grid
  run 30 "$b"/tests/test_gpu_append
  run 20 "$b"/tests/test_variants cuda
  run 90 "$b"/tests/reliability/test_reliability_gpu capacity
  FLASHDECODE_LIBRARY=$PWD/$b/libflashdecode.so run 150 python3 -m pytest -x -q -p no:cacheprovider tests/python/test_cuda.py tests/python/test_cuda_fp8.py tests/python/test_cuda_variants.py tests/python/test_cuda_deterministic.py tests/python/test_pdl.py
  FD_TEST_QUICK=1 FD_TEST_FILTER='cuda/bf16/d128*' run 90 compute-sanitizer --tool memcheck --error-exitcode 99 "$b"/tests/test_gpu_grid
fi
# FD_AB_STEPS with "interleave": bench_interleave.py --profile per build, once a
# --between mode of FD_AB_BETWEEN (default "gemm gemm+small") and context of FD_AB_CONTEXTS
# (default 8192)
if [[ " $STEPS " == *" interleave "* ]]; then
  for ent in "${entries[@]}"; do
    name=${ent%%|*}
    for ctx in ${FD_AB_CONTEXTS:-8192}; do
      for w in ${FD_AB_BETWEEN:-gemm gemm+small}; do
        echo "== bench_interleave.py --context $ctx --between $w --profile, build $name ($(el))"
        FLASHDECODE_LIBRARY="$PWD/build-ab-$name/libflashdecode.so" timeout 90 python3 \
          bench/bench_interleave.py --context "$ctx" --between "$w" --profile 2>&1 | tail -30
      done
    done
  done
fi
[[ " $STEPS " == *" bench "* ]] || { echo "== done ($(el))"; exit 0; }
for ent in "${entries[@]}"; do
  name=${ent%%|*}
  echo "== flashdecode bench, build $name ($(el))"
  for n in ${FD_AB_LENS:-1024 8192 8193 16384 32768 32769}; do
    printf '%-8s n=%-6s ' "$name" "$n"
    timeout 30 "build-ab-$name/flashdecode" bench --kv-len "$n" --iters 200 2>&1 | tail -1
  done
  # FD_AB_CLI="flags;flags": more `flashdecode bench` rows, one a flag set (e.g. "--batch 16
  # --kv-len 8193")
  IFS=';' read -r -a clis <<<"${FD_AB_CLI:-}"
  for fl in "${clis[@]}"; do
    printf '%-8s %-24s ' "$name" "$fl"
    # shellcheck disable=SC2086  # a list of flags
    timeout 30 "build-ab-$name/flashdecode" bench $fl --iters 200 2>&1 | tail -1
  done
done
# FD_AB_ROUNDS=N: the end-to-end runs N times over the builds in turn (each round's first
# build also times SDPA-cuDNN and no-attention), one process a run; FD_AB_IMPLS: our
# bench_e2e.py impls (default fdecode; e.g. fdecode,fdecode-pdl)
first=${entries[0]%%|*}
for round in $(seq "${FD_AB_ROUNDS:-1}"); do
  for ent in "${entries[@]}"; do
    name=${ent%%|*}
    impls=${FD_AB_IMPLS:-fdecode}; [ "$name" = "$first" ] && impls=$impls,sdpa-cudnn,no-attention
    echo "== bench_e2e.py, build $name, round $round ($(el))"
    # shellcheck disable=SC2086  # FD_AB_E2E is a list of flags
    FLASHDECODE_LIBRARY="$PWD/build-ab-$name/libflashdecode.so" timeout 200 python3 bench/bench_e2e.py \
      --impls $impls --steps 10 --budget-s 150 --out-dir "/tmp/e2e-$name-$round" \
      --commit "${FD_COMMIT:-?}-$name-r$round" \
      ${FD_AB_E2E:---batches 1,16 --contexts 8192,32768} 2>&1 | grep -v '^#' | sed -n '/^impl /,/^wrote/p'
  done
done
# every run's CSVs (with --graph-profile, its graph-*.csv too), named by build and round
mkdir -p /tmp/e2e-all
for d in /tmp/e2e-*-[0-9]*; do
  for f in "$d"/*.csv; do [ -e "$f" ] && cp "$f" "/tmp/e2e-all/${d#/tmp/e2e-}-$(basename "$f")"; done
done
tar czf "$OUT/e2e-csv.tgz" -C /tmp e2e-all
echo "== done ($(el))"
