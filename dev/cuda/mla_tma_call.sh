#!/bin/bash
# dev/cuda/mla_tma_call.sh — one device call that measures the MLA wgmma kernel's TMA variants
# (dev/mla-wgmma-tma.diff: TMA tile copies; dev/mla-wgmma-tma-mc.diff: the same plus 2-CTA
# clusters multicasting each key tile to both row tiles of a sequence) against this tree.
#   bash dev/cuda/mla_tma_call.sh prepare     here: .xp/tma and .xp/mc = this tree + each diff
#   then the device tool: command "bash dev/cuda/mla_tma_call.sh device",
#   carry [".xp/tma", ".xp/mc", ".xp/commit", ".whl"] (~55 MB of the 64 MB a call carries)
# Device steps, each skipped when FD_DEADLINE_S (default 540) would be overrun, most important
# first: build this tree and both variants (90a-real); each variant's test_gpu_mla (quick; a
# hang is cut by its timeout); the CLI's MLA rows on the three builds alternating (two rounds);
# compute-sanitizer memcheck of the variants' TMA cases; bench_gpu.py --mla-only (FlashInfer's
# MLA beside ours) on the mc variant (FD_BENCH_BUILD: another); Nsight Compute of B=64 128 heads 8k on every build.
# Env: FD_MIN=1 builds only what the steps need; FD_ROWS "b h n page;..." the rows.
set -u
cd "$(dirname "$0")/../.."
if [ "${1:-}" = prepare ]; then
  for v in tma mc; do
    d=dev/mla-wgmma-tma.diff; [ $v = mc ] && d=dev/mla-wgmma-tma-mc.diff
    rm -rf ".xp/$v" && mkdir -p ".xp/$v" && git archive HEAD | tar -x -C ".xp/$v" &&
      (cd ".xp/$v" && git apply "../../$d") && echo "prepared .xp/$v ($d)"
  done
  git rev-parse --short HEAD >.xp/commit
  du -sh .xp
  exit 0
fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/call.txt") 2>&1
START=$(date +%s); DL=${FD_DEADLINE_S:-540}
t() { echo; echo "== $1 (t=$(( $(date +%s) - START ))s)"; }
left() { echo $(( DL - ($(date +%s) - START) )); }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
TG=${FD_MIN:+--target flashdecode_cli test_gpu_mla flashdecode fd_read_probe}
t build
for v in tma mc; do
  (cmake -S .xp/$v -B .xp/$v/build -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON -DFD_CUDA_ARCHS=90a-real \
     -DFD_PTXAS_VERBOSE=ON >/tmp/b-$v.txt 2>&1 &&
   cmake --build .xp/$v/build -j 5 --target flashdecode_cli test_gpu_mla flashdecode >>/tmp/b-$v.txt 2>&1) &
done
# shellcheck disable=SC2086
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON -DFD_CUDA_ARCHS=90a-real >/tmp/b.txt 2>&1 &&
  cmake --build build -j 6 $TG >>/tmp/b.txt 2>&1 || { echo "BUILD FAILED (this tree)"; tail -30 /tmp/b.txt; }
wait
BUILDS=(build)
for v in tma mc; do
  if [ -x .xp/$v/build/flashdecode ]; then BUILDS+=(.xp/$v/build)
  else echo "BUILD FAILED ($v)"; grep -B2 -A6 error /tmp/b-$v.txt | head -30; fi
  grep -A2 'mla_wgmma' /tmp/b-$v.txt | grep -E 'Used|spill' | sort | uniq -c
done
for d in "${BUILDS[@]:1}"; do
  t "test_gpu_mla (quick): $d"
  (cd "$d" && FD_TEST_QUICK=1 timeout 100 ./tests/test_gpu_mla) >/tmp/gm.txt 2>&1
  echo "rc $?: $(grep -c '^PASS' /tmp/gm.txt) PASS, $(grep -c '^FAIL' /tmp/gm.txt) FAIL"
  grep -m 10 -E '^FAIL|hopper:' /tmp/gm.txt
  cp /tmp/gm.txt "$OUT/gpu_mla-$(basename "$(dirname "$d")").txt"
done
t "the CLI's MLA rows: this tree, tma, mc (alternating, two rounds)"
rows=${FD_ROWS:-"64 128 8192 64;1 128 32768 64;16 128 8192 64;128 128 4096 64;64 128 8192 0;64 128 8192 16;64 16 8192 64"}
for round in 1 2; do
  [ "$(left)" -lt 60 ] && break
  IFS=';' read -r -a list <<<"$rows"
  for r in "${list[@]}"; do
    read -r b h n pg <<<"$r"
    for d in "${BUILDS[@]}"; do
      echo "   $round $d b$b h$h n$n pg$pg: $(timeout 40 "./$d/flashdecode" bench --backend cuda \
        --num-heads-kv 1 --head-dim 512 --rope-dim 64 --iters 50 --batch "$b" --num-heads-q "$h" \
        --kv-len "$n" --page-size "$pg" 2>&1 | tail -1 | grep -oE "us=[0-9.]+|num_splits=[0-9]+" | tr '\n' ' ')"
    done
  done
done | tee "$OUT/mla_rows.txt"
for d in "${BUILDS[@]:1}"; do
  [ "$(left)" -lt 60 ] && break
  t "memcheck of the TMA cases: $d"
  for flt in _H128_T1_B3_kv1000,0,257,-1_pg64 _H128_T1_B3_kv1000,0,1500,-1_pg256; do
    (cd "$d" && FD_TEST_QUICK=1 FD_TEST_FILTER=$flt timeout 80 compute-sanitizer --tool memcheck \
       ./tests/test_gpu_mla) >/tmp/mc.txt 2>&1
    echo "   $flt rc $?: $(grep -E 'ERROR SUMMARY' /tmp/mc.txt | tail -1); $(grep -c '^PASS' /tmp/mc.txt) PASS $(grep -c '^FAIL' /tmp/mc.txt) FAIL"
    cat /tmp/mc.txt >>"$OUT/memcheck-mla.txt"
  done
done
BEST=${FD_BENCH_BUILD:-.xp/mc/build}
if [ "$(left)" -gt 200 ] && [ -x "$BEST/libflashdecode.so" ]; then
  t "bench_gpu.py --mla-only on $BEST, FlashInfer's MLA beside it"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/tmp/pip.txt 2>&1 || tail -5 /tmp/pip.txt
  export PYTHONPATH="$PWD/python:/tmp/site" FLASHDECODE_LIBRARY="$PWD/$BEST/libflashdecode.so"
  export FD_READ_PROBE_LIBRARY="$PWD/build/libfd_read_probe.so"
  CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); export CUDA_HOME
  export FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=/tmp/fd-flashinfer-jit MAX_JOBS=16
  bud=$(( $(left) - 100 )); [ $bud -gt 240 ] && bud=240
  timeout $(( bud + 40 )) python3 bench/bench_gpu.py --mla-only --out-dir "$OUT" \
    --commit "$(cat .xp/commit 2>/dev/null || echo unknown)-mc" --budget-s $bud \
    --log-dir /tmp/fd-bench-logs >/tmp/fd-bench.txt 2>&1
  echo "rc $?"; sed -n '/^=====/,$p' /tmp/fd-bench.txt | head -60
  cp /tmp/fd-bench.txt "$OUT/mla-bench-log.txt"
fi
for d in "${BUILDS[@]}"; do
  [ "$(left)" -lt 50 ] && break
  t "ncu: B=64 128 heads 8k page 64, $d"
  timeout $(( $(left) - 10 )) ncu -k regex:fd_mla_wgmma_kernel --launch-skip 5 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --print-details all \
    "./$d/flashdecode" bench --backend cuda --iters 2 --batch 64 --num-heads-q 128 --kv-len 8192 \
    --num-heads-kv 1 --head-dim 512 --rope-dim 64 --page-size 64 >/tmp/ncu.txt 2>&1
  grep -E "Duration|L2 Cache Throughput|DRAM Throughput|Issue Slots|No Eligible|Warp Cycles Per Issued|Stall [A-Z]|Tensor|Shared" /tmp/ncu.txt | head -24
  cat /tmp/ncu.txt >>"$OUT/ncu-mla.txt"
done
t done
