#!/bin/bash
# dev/cpu/cpu16_call.sh — the CPU measurements of one device call (its 16-core Xeon):
# fp8 e4m3 against bf16 on this tree and on .xp/cpubase (a `git archive` of the base commit,
# carried), alternating, then the thread scaling of this tree. Writes $OUT/cpu16.txt.
#   device tool: command "bash dev/cpu/cpu16_call.sh", carry [".xp/cpubase"]
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fd-out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/cpu16.txt") 2>&1
echo "== cpu16 $(date -u +%FT%TZ)"; lscpu | grep -E "Model name|^CPU\(s\)|NUMA node" | tr -s ' '
for t in . .xp/cpubase; do
  [ -f "$t/CMakeLists.txt" ] || continue
  cmake -S "$t" -B "$t/build-cpu16" -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=OFF -DFD_BUILD_TESTS=OFF >/tmp/c16.txt 2>&1 &&
    cmake --build "$t/build-cpu16" -j "$(nproc)" >>/tmp/c16.txt 2>&1 || { echo "build of $t failed"; tail -20 /tmp/c16.txt; }
done
short() { grep -o 'kv_dtype=[a-z0-9]*\|us=[0-9.]*\|gbps=[0-9.]*\|read_gbps=[0-9.]*\|pct_read=[0-9.]*\|threads=[0-9]*' | tr '\n' ' '; }
for round in 1 2; do
  for shape in "--batch 1 --kv-len 65536" "--batch 8 --kv-len 4096" "--batch 4 --kv-len 16384"; do
    for kv in bf16 e4m3; do
      for t in . .xp/cpubase; do
        [ -x "$t/build-cpu16/flashdecode" ] || continue
        extra=""; [ $kv = e4m3 ] && extra="--kv-dtype e4m3"
        echo "$round $t $shape: $(timeout 60 "$t/build-cpu16/flashdecode" bench --backend cpu $shape $extra 2>&1 | tail -1 | short)"
      done
    done
  done
done
echo "== threads (this tree, B=8 32/8 d128 4k)"
for T in 1 2 4 8 12 16; do
  for kv in bf16 e4m3; do
    extra=""; [ $kv = e4m3 ] && extra="--kv-dtype e4m3"
    echo "T=$T $kv: $(timeout 60 ./build-cpu16/flashdecode bench --backend cpu --threads $T --batch 8 --kv-len 4096 $extra 2>&1 | tail -1 | short)"
  done
done
