#!/usr/bin/env bash
# dev/cuda/mla_source_profile.sh — where the Hopper MLA kernels' warps wait: Nsight Compute's
# per-instruction stall sampling (SourceCounters) of one launch of the seesaw kernel (and of
# mla_wgmma_kernel for comparison) at B=64, 128 heads, 8k keys, 64-key pages, on a build in
# ./build (device_run.sh made it). Writes $OUT/mla-src-<kernel>.csv (the SASS with its samples),
# $OUT/mla-src-<kernel>-details.txt and a summary of the samples by instruction kind
# (dev/cuda/ncu_source_summary.py) to stdout.
#   device tool: command "bash dev/cuda/mla_source_profile.sh" after a build
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fd-out}; mkdir -p "$OUT"
for k in ${FD_PROFILE_KERNELS:-fd_mla_seesaw_kernel fd_mla_wgmma_kernel}; do
  extra=""
  [ "$k" = fd_mla_wgmma_kernel ] && extra="--num-splits 64"  # 128-key splits: not the seesaw's
  timeout 150 ncu -k "regex:$k" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters \
    --section SchedulerStats -o "/tmp/mla-src-$k" -f \
    ./build/flashdecode bench --backend cuda --iters 2 --batch 64 --num-heads-q 128 \
    --kv-len 8192 --num-heads-kv 1 --head-dim 512 --rope-dim 64 --page-size 64 $extra \
    >"/tmp/mla-src-$k.log" 2>&1 || { echo "ncu $k failed"; tail -20 "/tmp/mla-src-$k.log"; continue; }
  ncu -i "/tmp/mla-src-$k.ncu-rep" --page details --print-details all >"$OUT/mla-src-$k-details.txt" 2>&1
  ncu -i "/tmp/mla-src-$k.ncu-rep" --page source --csv --print-source sass >"$OUT/mla-src-$k.csv" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|No Eligible|Stall [A-Z]" "$OUT/mla-src-$k-details.txt" | head -20
  python3 dev/cuda/ncu_source_summary.py "$OUT/mla-src-$k.csv" | head -60
  gzip -f "$OUT/mla-src-$k.csv"
done
[ "${FD_PROFILE_SWEEPS:-1}" = 1 ] || exit 0
# B=1, 128 heads, 32k keys (fa3 41 us, ours ~80): each kernel's duration (split and combine) at
# the plan's split count, then the CLI's time over forced split counts
echo "== B=1 128 heads 32k: kernel durations"
timeout 120 ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  --launch-skip 4 --launch-count 6 ./build/flashdecode bench --backend cuda --iters 2 --batch 1 \
  --num-heads-q 128 --kv-len 32768 --num-heads-kv 1 --head-dim 512 --rope-dim 64 --page-size 64 \
  >"$OUT/mla-b1-kernels.txt" 2>&1
grep -E "fd_[a-z_]+kernel|gpu__time_duration|dram__bytes" "$OUT/mla-b1-kernels.txt" | head -40
for s in 0 16 32 48 64 96 128; do
  echo "num_splits=$s: $(./build/flashdecode bench --backend cuda --batch 1 --num-heads-q 128 \
    --kv-len 32768 --num-heads-kv 1 --head-dim 512 --rope-dim 64 --page-size 64 \
    --num-splits $s 2>&1 | tail -1)"
done
# 16 heads (memory-bound; fa3 at 91 % of the read ceiling at B=64 8k): the CLI's time over forced
# split counts at B=64 8k and B=16 8k (64-key pages)
for bk in "64 8192" "16 8192"; do
  set -- $bk
  for s in 0 1 2 3 4 6 8 12; do
    echo "B=$1 h16 n$2 num_splits=$s: $(./build/flashdecode bench --backend cuda --batch $1 \
      --num-heads-q 16 --kv-len $2 --num-heads-kv 1 --head-dim 512 --rope-dim 64 --page-size 64 \
      --num-splits $s 2>&1 | tail -1)"
  done
done
