# find_cuobjdump.sh — sourced by check_fatbin.sh and check_code_size.sh: sets
# `tool` to cuobjdump: $CUOBJDUMP, else on PATH, else next to nvcc, else the
# PyPI wheel nvidia-cuda-cuobjdump that `make cuda-check` installs into
# $FD_TOOLS_DIR/cuobjdump (the build folder's tools/). Without it: exit 77
# (ctest: skipped).
# shellcheck shell=bash
tool=${CUOBJDUMP:-}
if [ -z "$tool" ]; then tool=$(command -v cuobjdump 2>/dev/null); fi
if [ -z "$tool" ] && command -v nvcc >/dev/null 2>&1; then
  cand="$(dirname "$(command -v nvcc)")/cuobjdump"
  [ -x "$cand" ] && tool=$cand
fi
if [ -z "$tool" ] && [ -n "${FD_TOOLS_DIR:-}" ]; then
  for cand in "$FD_TOOLS_DIR"/cuobjdump/nvidia/*/bin/cuobjdump; do
    [ -x "$cand" ] && tool=$cand && break
  done
fi
if [ -z "$tool" ]; then
  echo "SKIP: no cuobjdump (not on PATH, not next to nvcc, not in ${FD_TOOLS_DIR:-<no tools dir>};" \
       "\`make cuda-check\` installs it from PyPI: nvidia-cuda-cuobjdump)"
  exit 77
fi
echo "cuobjdump: $tool ($("$tool" --version 2>/dev/null | tail -1))"
