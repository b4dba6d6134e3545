# device_env.sh — sourced from the repository root by device_quick.sh and
# device_ab_e2e.sh: DEPS (the carried .deps/ tree), its libraries on
# LD_LIBRARY_PATH, and qbuild.
# shellcheck shell=bash
DEPS="$PWD/.deps/root/usr"
export LD_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"

# qbuild DIR LOG [CMAKE FLAGS...]: configure and build an sm_90a-only tree
# (a flag setting CMAKE_C_FLAGS replaces the -I of .deps: repeat it there)
qbuild() {
  local dir=$1 log=$2; shift 2
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON -DFD_CUDA_ARCHS=90a-real \
    -DCMAKE_PREFIX_PATH="$DEPS" -DCMAKE_LIBRARY_PATH="$DEPS/lib/x86_64-linux-gnu" \
    -DCMAKE_INCLUDE_PATH="$DEPS/include" -DCMAKE_C_FLAGS="-I$DEPS/include" "$@" >"$log" 2>&1 &&
    cmake --build "$dir" -j "$(nproc)" >>"$log" 2>&1
}
