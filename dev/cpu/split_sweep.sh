#!/bin/bash
# split_sweep.sh — the CPU backend's time against forced split counts and
# thread counts on this machine (flashdecode bench --backend cpu; no Python,
# no torch in the process), for the CPU benchmark shapes whose automatic split
# count is in question. From the repository root after the build:
#   bash dev/cpu/split_sweep.sh [BUILD_DIR]
set -u
FD=${1:-build}/flashdecode
run() { # run LABEL ARGS...
  local label=$1; shift
  local line
  line=$("$FD" bench --backend cpu --iters 10 "$@" 2>/dev/null | tail -1)
  echo "$label $(echo "$line" | grep -oE '(us|num_splits|threads|gbps|pct_read)=[^ ]+' | tr '\n' ' ')"
}
for shape in "--dtype f32 --kv-len 4096" "--dtype bf16 --kv-len 4096" \
             "--dtype bf16 --kv-len 4096 --batch 8" "--dtype f32 --kv-len 65536" \
             "--dtype bf16 --kv-len 16384" "--dtype f32 --kv-len 4096 --num-heads-q 8 --num-heads-kv 4 --head-dim 8"; do
  for s in 0 1 2 4 8 16; do run "[$shape] splits=$s" $shape --num-splits $s; done
  run "[$shape] splits=1 threads=8" $shape --num-splits 1 --threads 8
  run "[$shape] splits=16 threads=8" $shape --num-splits 16 --threads 8
done
