#!/usr/bin/env bash
# dev/cuda/sass_kernel.sh — the SASS of one kernel instance, on a machine without a GPU (and
# without cuobjdump in its toolkit): compiles FILE.cu to PTX for sm_90a, keeps the one entry
# whose mangled name contains PATTERN, assembles it with ptxas and disassembles it with the
# cuobjdump and nvdisasm of NVIDIA's `nvidia-cuda-cuobjdump` / `nvidia-cuda-nvdisasm` wheels
# (downloaded once into .deps/cuobjdump, git-ignored). Then prints the instruction count and, for each loop (a backward branch over
# more than 1 KB), its length and its HMMA / MUFU / LDGSTS / HGMMA counts.
#
# Usage: dev/cuda/sass_kernel.sh TREE FILE.cu PATTERN [OUT.sass]
#   TREE     a source tree (this one: ., a commit's: `git archive REV | tar -x -C /tmp/t`)
#   FILE.cu  relative to TREE, e.g. src/cuda/split_mma_kernel.cu
#   PATTERN  a substring of the mangled entry name, e.g.
#            fd_split_mma_kernelI13__nv_bfloat16Li128ELi4ELi128ELi0ELi0ELi0E
# Two trees' OUT files diff well after `sed -E 's/R[0-9]+/R/g'`.
set -euo pipefail
TREE=$1 FILE=$2 PAT=$3 OUT=${4:-/tmp/sass-$$.txt}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TOOLS=$ROOT/.deps/cuobjdump
CUOBJDUMP=$(find "$TOOLS" -type f -name cuobjdump -print -quit 2>/dev/null || true)
if [ -z "$CUOBJDUMP" ]; then
  mkdir -p "$TOOLS"
  python3 -m pip download --disable-pip-version-check --no-deps -d "$TOOLS" \
    nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >/dev/null
  for w in "$TOOLS"/*.whl; do (cd "$TOOLS" && python3 -m zipfile -e "$w" x); done
  chmod +x "$(find "$TOOLS" -type f -name nvdisasm -print -quit)"
  CUOBJDUMP=$(find "$TOOLS" -type f -name cuobjdump -print -quit)
  chmod +x "$CUOBJDUMP"
fi
W=$(mktemp -d)
nvcc -std=c++17 -arch=sm_90a -O3 --expt-relaxed-constexpr -I"$TREE/include" -I"$TREE/src" \
  -I"$TREE/src/cuda" -ptx "$TREE/$FILE" -o "$W/all.ptx"
first=$(awk '/^\.(visible \.entry|entry|func|weak)/ {print NR; exit}' "$W/all.ptx")
head -n $((first - 1)) "$W/all.ptx" >"$W/one.ptx"
awk -v pat="$PAT" '/^(\.visible |\.weak )?\.(entry|func)/ {if (p) exit; p = index($0, pat) > 0} p {print}' \
  "$W/all.ptx" >>"$W/one.ptx"
ptxas -arch=sm_90a -O3 "$W/one.ptx" -o "$W/one.cubin"
PATH="$(dirname "$CUOBJDUMP"):$PATH" "$CUOBJDUMP" -sass "$W/one.cubin" >"$OUT"
python3 - "$OUT" <<'EOF'
import re, sys
ins = []
for line in open(sys.argv[1]):
    m = re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?);', line)
    if m:
        ins.append((int(m.group(1), 16), m.group(2).strip()))
print(f"{sys.argv[1]}: {len(ins)} instructions")
at = {a: i for i, (a, _) in enumerate(ins)}
for i, (a, t) in enumerate(ins):
    m = re.search(r'BRA .*?0x([0-9a-f]+)', t)
    if not m:
        continue
    tgt = int(m.group(1), 16)
    if tgt < a and a - tgt > 0x400 and tgt in at:
        body = [x for _, x in ins[at[tgt]:i + 1]]
        count = lambda op: sum(1 for x in body if re.search(r'(^|\s)' + op + r'(\.|\s|$)', x))
        print(f"  loop {tgt:#x}..{a:#x}: {len(body)} instructions, HMMA {count('HMMA')}, "
              f"HGMMA {count('HGMMA')}, MUFU {count('MUFU')}, LDGSTS {count('LDGSTS')}")
EOF
rm -rf "$W"
