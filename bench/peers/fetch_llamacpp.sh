#!/usr/bin/env bash
# bench/peers/fetch_llamacpp.sh — llama.cpp's CPU flash attention as a peer for bench_cpu.py.
#
# Downloads the llama-cpp-python sdist (pinned below) from PyPI into .deps/llamacpp/ (git-ignored),
# unpacks its vendored llama.cpp (vendor/llama.cpp), builds ggml's CPU backend only (Release,
# GGML_NATIVE=ON, no CUDA / server / examples / tests) into build-llamacpp/llama.cpp (git-ignored), and
# compiles bench/peers/ggml_fa_bench.c against it into build-llamacpp/ggml_fa_bench.
# Nothing is vendored into this repository; the code is llama.cpp's (MIT licence, in the sdist).
#
# Usage (from anywhere):  bash bench/peers/fetch_llamacpp.sh
# Environment: PYTHON (default python3, must have pip), JOBS (default nproc), CC (default cc).
set -euo pipefail

# llama-cpp-python 0.3.36's sdist vendors llama.cpp at the commit printed below (read from the
# sdist's vendor/llama.cpp; recorded in build-llamacpp/VERSION).
LLAMA_CPP_PYTHON_VERSION=0.3.36

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=$ROOT/.deps/llamacpp
OUT=$ROOT/build-llamacpp
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
CC=${CC:-cc}
SDIST=$CACHE/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz
SRC=$CACHE/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION

mkdir -p "$CACHE" "$OUT"

# 1. the sdist (once)
if [ ! -f "$SDIST" ]; then
  "$PYTHON" -m pip download --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$CACHE" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
fi

# 2. unpacked (once)
if [ ! -d "$SRC/vendor/llama.cpp/ggml" ]; then
  tar -xzf "$SDIST" -C "$CACHE"
fi
LLAMA=$SRC/vendor/llama.cpp

# 3. ggml's CPU backend only, static, native ISA. Configured through llama.cpp's top level (the
#    sdist lacks ggml/ggml.pc.in, which a standalone ggml configure needs) with every llama.cpp
#    part off; only the three ggml libraries are built.
cmake -S "$LLAMA" -B "$OUT/llama.cpp" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF \
  -DGGML_OPENMP=ON -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_OPENSSL=OFF >/dev/null
cmake --build "$OUT/llama.cpp" -j "$JOBS" --target ggml ggml-base ggml-cpu

# 4. the harness, linked statically against the three libraries
libs=$(find "$OUT/llama.cpp" -name 'libggml.a' -o -name 'libggml-cpu.a' -o -name 'libggml-base.a' | sort)
# order: ggml (registry) -> ggml-cpu -> ggml-base
lib_ggml=$(echo "$libs" | grep '/libggml\.a$')
lib_cpu=$(echo "$libs" | grep '/libggml-cpu\.a$')
lib_base=$(echo "$libs" | grep '/libggml-base\.a$')
"$CC" -std=c11 -O2 -march=native -fopenmp -I"$LLAMA/ggml/include" \
  "$ROOT/bench/peers/ggml_fa_bench.c" "$lib_ggml" "$lib_cpu" "$lib_base" \
  -lstdc++ -lm -lpthread -o "$OUT/ggml_fa_bench"

# 5. what was built from what
{
  echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (PyPI sdist)"
  # the sdist has no .git: its CHANGELOG names the llama.cpp commit it vendors
  grep -m1 -o 'ggml-org/llama.cpp@[0-9a-f]*' "$SRC/CHANGELOG.md" || true
  grep -m3 -oE 'GGML_VERSION_(MAJOR|MINOR|PATCH) [0-9]+' "$LLAMA/ggml/CMakeLists.txt" | tr '\n' ' '; echo
} > "$OUT/VERSION"
cat "$OUT/VERSION"
echo "built $OUT/ggml_fa_bench"
