#!/usr/bin/env bash
# fetch_device_deps.sh — stage what the GPU machine lacks (it reaches no
# network), to be carried with the device call (both folders git-ignored):
#   .whl/          FlashInfer and the three packages it needs that the machine's
#                  image lacks (Python 3.12, manylinux x86_64, pinned below;
#                  ~27 MB), installed by scripts/device_run.sh bench into /tmp/site
#   .deps/         only with FD_FETCH_CMOCKA=1: cmocka from Debian's binary
#                  packages. Not needed: without a system cmocka the tests build
#                  the vendored copy in third_party/cmocka.
# FD_FETCH_WHEELS=0 skips the wheels. (The serving traces are in the repository:
# bench/data.)
set -eu
cd "$(dirname "$0")/.."
if [ "${FD_FETCH_CMOCKA:-0}" = 1 ]; then
  mkdir -p .deps && (cd .deps && apt-get download libcmocka0 libcmocka-dev &&
    for f in *.deb; do dpkg -x "$f" root; done)
fi
# FlashInfer 0.6.18.post1 (the last release under 20 MB: 0.7.x is 33-115 MB, over
# what a device call carries beside the tree). Its Requires-Dist beyond these four
# (torch, numpy, ninja, einops, click, tabulate, requests, packaging, tqdm,
# nvidia-ml-py, cuda-python -> cuda-bindings) is on the machine's image, except
# nccl4py (communication ops) and nvidia-cutlass-dsl (CuTe DSL kernels for
# Blackwell), which the decode paths never import. apache-tvm-ffi, cuda-tile and
# cudnn-frontend are the versions current when 0.6.18.post1 was released.
WHEELS="flashinfer-python==0.6.18.post1 apache-tvm-ffi==0.1.13.post3
        nvidia-cudnn-frontend==1.28.0 cuda-tile==1.5.0"
if [ "${FD_FETCH_WHEELS:-1}" = 1 ]; then
  mkdir -p .whl
  # one version of each: a second one stops the install on the device
  for w in $WHEELS; do
    n=$(echo "${w%%==*}" | tr - _); v=${w##*==}
    for f in .whl/"$n"-*.whl; do
      [ -e "$f" ] && case "$f" in .whl/"$n"-"$v"-*) ;; *) rm -f "$f" ;; esac
    done
  done
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $WHEELS
  ls -l .whl
fi
