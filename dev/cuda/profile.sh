#!/bin/bash
# profile.sh — Nsight Compute on the split kernel for a few shapes, from the
# repository root after the CMake build (build/flashdecode): warp-state
# (stall reasons), scheduler, throughput and memory sections of one launch of
# the tensor-core split kernel per shape, contiguous against paged. Writes
# OUTDIR/ncu-<tag>.txt and prints the lines that compare them.
#   bash dev/cuda/profile.sh OUTDIR          the shapes below
#   bash dev/cuda/profile.sh OUTDIR paged    B=1 16k, one split (8 blocks of the
#        8-warp kernel): contiguous against page_size 16 and 64, where the
#        page walk costs a lone block 38-64 % (dev/NOTES.md); and the fp32
#        CUDA-core kernel at B=64 8k (66 % of the ceiling, latency-bound?)
#   bash dev/cuda/profile.sh OUTDIR fp8      B=64 8k 32/8 d128: bf16 cache against
#        an e4m3 cache (per-tensor and per-token scales)
#   bash dev/cuda/profile.sh OUTDIR rows     the rows kernel (rows_mma_kernel.cu) on
#        a shared prefix's call: 64 sequences' rows over 16k keys, 32/8 d128 (the CLI's
#        time, then Nsight Compute; paged 16 and contiguous)
#   bash dev/cuda/profile.sh OUTDIR d64      B=1 head_dim 64 (gpt-oss 64/8 16k, MHA 32/32
#        4k; 32/8 d128 16k beside them): the CLI's time at forced split counts, then
#        Nsight Compute on the automatic plan's split kernel
#   bash dev/cuda/profile.sh OUTDIR cudnn    SDPA-cuDNN's kernels (dev/cuda/
#        sdpa_cudnn_calls.py) beside ours (--no-pdl, as in the model) where cuDNN leads
#        end to end: B=16 8193 keys and B=1 32769, 32/8 d128: grids, registers, shared
#        memory, durations and DRAM throughput of every kernel of a call
#   bash dev/cuda/profile.sh OUTDIR mla      the MLA kernels at 128 and 16 query heads (b64 8k
#        and b1 32k, 64-key pages): the CLI's time, then Nsight Compute with the tensor pipes'
#        utilisation (ComputeWorkloadAnalysis) and the L2/shared-memory traffic
#   FD_BIN=path: the flashdecode CLI to run (default ./build/flashdecode)
set -u
OUT=${1:-/tmp/fd_prof}
mkdir -p "$OUT"
prof() { # prof TAG ARGS...
  local tag=$1; shift
  timeout 120 ncu -k regex:${KREGEX:-fd_split_mma_kernel} --launch-skip 5 --launch-count ${LCOUNT:-1} \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    --section SourceCounters ${SECTIONS:-} --print-details all \
    "${FD_BIN:-./build/flashdecode}" bench --backend cuda --iters 2 "$@" >"$OUT/ncu-$tag.txt" 2>&1
  echo "== $tag ($*)"
  grep -E "Grid Size|Duration|Memory Throughput|DRAM Throughput|Executed Ipc Active|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Stall [A-Z]|Registers Per|Achieved Occupancy|Executed Instructions  " \
    "$OUT/ncu-$tag.txt" | head -40
}
if [ "${2:-}" = cudnn ]; then
  for shape in "16 8193" "1 32769"; do
    read -r bb kv <<<"$shape"
    # cuDNN: every kernel of the 6th call on (main kernel and any reduction), no filter
    timeout 180 ncu --launch-skip 10 --launch-count 4 --section SpeedOfLight --section LaunchStats \
      --section Occupancy --print-details all python3 dev/cuda/sdpa_cudnn_calls.py \
      --batch "$bb" --kv-len "$kv" >"$OUT/ncu-cudnn-b$bb-$kv.txt" 2>&1
    echo "== cudnn B=$bb kv $kv"
    grep -E "^  [a-zA-Z_].*\(|Grid Size|Block Size|Duration|DRAM Throughput|Registers Per|Shared Memory Config|Dynamic Shared|Achieved Occupancy|Waves Per SM" \
      "$OUT/ncu-cudnn-b$bb-$kv.txt" | head -60
    KREGEX="fd_" LCOUNT=2 prof ours-b$bb-$kv --batch "$bb" --kv-len "$kv" --no-pdl
  done
  exit 0
fi
if [ "${2:-}" = fp8 ]; then
  prof b64-bf16 --batch 64 --kv-len 8192 --dtype bf16
  prof b64-e4m3 --batch 64 --kv-len 8192 --dtype bf16 --kv-dtype e4m3
  prof b64-e4m3-token --batch 64 --kv-len 8192 --dtype bf16 --kv-dtype e4m3 --kv-scale token
  exit 0
fi
if [ "${2:-}" = d64 ]; then
  for shape in "64 8 64 16384" "32 32 64 4096" "32 8 128 16384"; do
    read -r hq hkv d kv <<<"$shape"
    for sp in 0 8 12 16 17 24 32 33 48 64; do
      printf 'hq %s hkv %s d %s kv %s splits %2s: ' "$hq" "$hkv" "$d" "$kv" "$sp"
      "${FD_BIN:-./build/flashdecode}" bench --backend cuda --batch 1 --num-heads-q "$hq" \
        --num-heads-kv "$hkv" --head-dim "$d" --kv-len "$kv" --num-splits "$sp" 2>&1 | tail -1
    done
  done | tee "$OUT/ncu-0sweep.txt"
  prof gptoss-d64-16k --batch 1 --num-heads-q 64 --num-heads-kv 8 --head-dim 64 --kv-len 16384
  prof mha-d64-4k --batch 1 --num-heads-q 32 --num-heads-kv 32 --head-dim 64 --kv-len 4096
  prof b1-d128-16k --batch 1 --kv-len 16384
  exit 0
fi
if [ "${2:-}" = rows ]; then # the rows kernel on the shared-prefix row's prefix call
  for ps in 16 0; do # the CLI's time of that call, paged and contiguous
    "${FD_BIN:-./build/flashdecode}" bench --backend cuda --batch 1 --q-len 64 --non-causal \
      --kv-len 16384 --page-size $ps 2>&1 | tail -1
  done | tee "$OUT/ncu-0cli.txt"
  KREGEX=fd_rows_mma_kernel prof prefix-paged16 --batch 1 --q-len 64 --non-causal --kv-len 16384 --page-size 16
  KREGEX=fd_rows_mma_kernel prof prefix-contig --batch 1 --q-len 64 --non-causal --kv-len 16384
  exit 0
fi
if [ "${2:-}" = mla ]; then
  m=(--num-heads-kv 1 --head-dim 512 --rope-dim 64 --page-size 64)
  for shape in "64 128 8192" "1 128 32768" "64 16 8192"; do
    read -r bb hq kv <<<"$shape"
    "${FD_BIN:-./build/flashdecode}" bench --backend cuda --batch "$bb" --num-heads-q "$hq" \
      --kv-len "$kv" "${m[@]}" 2>&1 | tail -1
  done | tee "$OUT/ncu-0cli.txt"
  export SECTIONS="--section ComputeWorkloadAnalysis --section InstructionStats"
  KREGEX=fd_mla_wgmma_kernel prof mla-b64-h128 --batch 64 --num-heads-q 128 --kv-len 8192 "${m[@]}"
  KREGEX=fd_mla_wgmma_kernel prof mla-b1-h128 --batch 1 --num-heads-q 128 --kv-len 32768 "${m[@]}"
  KREGEX=fd_mla_kernel prof mla-b64-h16 --batch 64 --num-heads-q 16 --kv-len 8192 "${m[@]}"
  exit 0
fi
if [ "${2:-}" = paged ]; then
  prof b1-1split-contig --batch 1 --kv-len 16384 --num-splits 1
  prof b1-1split-paged16 --batch 1 --kv-len 16384 --page-size 16 --num-splits 1
  prof b1-1split-paged64 --batch 1 --kv-len 16384 --page-size 64 --num-splits 1
  KREGEX=fd_split_kernel prof b64-fp32 --batch 64 --kv-len 8192 --dtype f32
  exit 0
fi
prof b32-contig --batch 32 --kv-len 4096
prof b32-paged16 --batch 32 --kv-len 4096 --page-size 16
prof b1-16k-contig --batch 1 --kv-len 16384 --num-splits 32
prof b1-16k-paged16 --batch 1 --kv-len 16384 --page-size 16 --num-splits 32
prof b1-1k-contig --batch 1 --kv-len 1024 --num-splits 16
