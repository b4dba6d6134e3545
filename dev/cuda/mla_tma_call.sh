#!/bin/bash
# dev/cuda/mla_tma_call.sh — one device call that measures the MLA wgmma kernel's TMA variants
# (dev/mla-wgmma-tma.diff: TMA tile copies; dev/mla-wgmma-tma-mc.diff: the same plus 2-CTA
# clusters multicasting each key tile to both row tiles of a sequence) against this tree.
#   bash dev/cuda/mla_tma_call.sh prepare     here: .xp/tma and .xp/mc = this tree + each diff
#   then the device tool: command "bash dev/cuda/mla_tma_call.sh device",
#   carry [".xp/tma", ".xp/mc", ".whl"] (~55 MB of the 64 MB a call carries)
# `device` is scripts/device_run.sh mlaxp over both variants (90a-real builds): each variant's
# test_gpu_mla, the MLA rows of the three builds alternating, memcheck of the TMA cases (pages
# of 64 and 256 keys), bench_gpu.py --mla-only with FlashInfer's MLA beside the mc variant,
# Nsight Compute of B=64 128 heads 8k on every build; steps skipped past FD_DEADLINE_S (540).
set -u
cd "$(dirname "$0")/../.."
case "${1:-}" in
  prepare)
    for v in tma mc; do
      d=dev/mla-wgmma-tma.diff; [ $v = mc ] && d=dev/mla-wgmma-tma-mc.diff
      rm -rf ".xp/$v" && mkdir -p ".xp/$v" && git archive HEAD | tar -x -C ".xp/$v" &&
        (cd ".xp/$v" && git apply "../../$d") && echo "prepared .xp/$v ($d)"
    done
    du -sh .xp ;;
  device)
    FD_XP="tma mc" FD_ARCHS=90a-real FD_DEADLINE_S=${FD_DEADLINE_S:-540} FD_MLAXP_BENCH=mc \
      FD_MLAXP_NCU=1 FD_SAN_FILTER="_H128_T1_B3_kv1000,0,257,-1_pg64 _H128_T1_B3_kv1000,0,1500,-1_pg256" \
      exec scripts/device_run.sh mlaxp ;;
  *) echo "usage: $0 prepare|device" >&2; exit 2 ;;
esac
