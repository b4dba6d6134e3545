#!/usr/bin/env bash
# check_code_size.sh — the size of the tensor-core kernels' sm_90a code, which
# their speed depends on: a kernel whose code is larger than the SMs'
# instruction caches stalls on instruction fetch, most in a model's stream,
# where other kernels have evicted it from L2 (dev/NOTES.md, 2026-12-02: a
# 123 KB split kernel spent ~5 cycles an instruction in "no instruction"
# stalls; with one loader an instance, 56 KB, 0.5, and 5-6 us a call less
# between a model's GEMMs). The loader is the last template constant, PG
# (mma_loaders.cuh, fd_mma_loader_pg): 0 contiguous, 1 paged with page_size a
# power of two >= a thread's keys a tile (one page id a tile: the usual
# paged caches), 2 any other page_size (one page id a key). Bounds, in KB of
# SASS (16 bytes an instruction), 10-15 % over the largest instance measured
# with nvcc 13 (2026-12-02, in parentheses):
#   fd_split_mma_kernel, PG 0 (65: fp8 head_dim 256)            <= 72
#   fd_rows_mma_kernel, PG 0 (86: head_dim 128)                 <= 96
#   fd_split_mma_kernel, PG 1 (73: fp8 head_dim 256)            <= 84
#   fd_rows_mma_kernel, PG 1 (80: head_dim 128)                 <= 92
#   every PG 2 instance of either (130: fp8 head_dim 256)       <= 150
#   fd_mla_kernel, any instance (82: bf16 head_dim 512, 4 row
#   groups, fp8; 2026-12-06; one loader for every layout)        <= 96
# Usage: check_code_size.sh LIBRARY. Exit 77 (ctest: skipped) without
# cuobjdump (find_cuobjdump.sh) or without sm_90a code in the library.
set -u
lib=$1
# shellcheck source=tests/find_cuobjdump.sh
. "$(dirname "$0")/find_cuobjdump.sh" # sets tool, or exits 77
# cuobjdump prints SASS through nvdisasm: on PATH, next to cuobjdump or nvcc,
# or the PyPI wheel `make cuda-check` installs into $FD_TOOLS_DIR/nvdisasm
dis=$(command -v nvdisasm 2>/dev/null)
for cand in "$(dirname "$tool")/nvdisasm" \
            "$(dirname "$(command -v nvcc 2>/dev/null || echo /none/nvcc)")/nvdisasm" \
            "${FD_TOOLS_DIR:-/none}"/nvdisasm/nvidia/*/bin/nvdisasm; do
  [ -z "$dis" ] && [ -x "$cand" ] && dis=$cand
done
if [ -z "$dis" ]; then
  echo "SKIP: no nvdisasm, which cuobjdump needs to print SASS (\`make cuda-check\` installs it from" \
       "PyPI: nvidia-cuda-nvdisasm)"
  exit 77
fi
export PATH="$(dirname "$dis"):$PATH"
if ! "$tool" --list-elf "$lib" 2>/dev/null | grep -q 'sm_90a\.cubin'; then
  echo "SKIP: $lib holds no sm_90a code (FD_CUDA_ARCHS without 90a)"
  exit 77
fi
# one line a kernel: instructions, name (cuobjdump prints each instruction
# as /*offset*/ OPCODE ...)
errs=$(mktemp)
trap 'rm -f "$errs"' EXIT
sizes=$("$tool" -sass -arch sm_90a "$lib" 2>"$errs" | awk '
  /Function : / { if (f != "") print n, f; f = $3; n = 0; next }
  /^[ \t]+\/\*[0-9a-f]+\*\/[ \t]/ { n++ }
  END { if (f != "") print n, f }')
status=0
checked=0
while read -r n name; do
  case "$name" in
    *fd_split_mma_kernel*|*fd_rows_mma_kernel*|*fd_mla_kernel*) ;;
    *) continue ;;
  esac
  kb=$(( n * 16 / 1024 ))
  pg=$(sed -n 's/.*Li\([0-9]*\)EEv16fd_kernel_params$/\1/p' <<<"$name")
  case "$pg:$name" in
    *fd_mla_kernel*) limit=96 ;;
    0:*fd_split_mma_kernel*) limit=72 ;;
    0:*) limit=96 ;;
    1:*fd_split_mma_kernel*) limit=84 ;;
    1:*) limit=92 ;;
    *) limit=150 ;;
  esac
  checked=$((checked + 1))
  if [ "$kb" -gt "$limit" ]; then
    echo "FAIL: $name: $kb KB of sm_90a SASS, bound $limit KB"
    status=1
  fi
done < <(sort -k2 -u <<<"$sizes")
if [ "$checked" -eq 0 ]; then
  echo "FAIL: no fd_split_mma_kernel / fd_rows_mma_kernel code found in $lib"
  cat "$errs"
  exit 1
fi
echo "$checked kernels checked; the largest:"
sort -rn <<<"$sizes" | grep -E 'fd_(split|rows)_mma_kernel' | head -4 |
  awk '{printf "  %4d KB %s\n", $1 * 16 / 1024, $2}'
[ $status -eq 0 ] && echo "PASS"
exit $status
