#!/usr/bin/env bash
# prebuild_flashinfer_mla.sh — compiles FlashInfer's MLA JIT modules (BatchMLAPagedAttentionWrapper,
# backends fa2 and fa3; bf16 q/out; bf16 and fp8 e4m3 caches; head_dim_ckv 512, head_dim_kpe 64;
# sm_90a) on a machine WITHOUT a GPU, and lays the libraries out as FlashInfer's AOT directory
# (<name>/<name>.so), so that a device run copies them into
# /tmp/site/flashinfer/data/aot/ (scripts/device_run.sh mla does) and FlashInfer loads them
# without compiling: JitSpecNvcc.try_load() takes an AOT library before ninja is ever asked, so
# neither the Python version nor file times on the device matter.
#
# Usage: scripts/prebuild_flashinfer_mla.sh [OUTDIR]      (default .fi-mla-aot, git-ignored)
#   FD_FI_PYTHON  a Python with torch (2.11, cu130 here) whose site has pynvml / einops
#                 (default /work/fi-venv/bin/python, else python3)
#   FD_FI_SITE    where the .whl/ wheels are installed (default /tmp/site, as on the device);
#                 the tvm-ffi / cudnn-frontend / cuda-tile wheels must match FD_FI_PYTHON's
#                 version (cp311 here: `pip download --no-deps apache-tvm-ffi==0.1.13.post3 ...`)
#   FD_FI_JOBS    compilers at once (default 2); runs under nice -n 15
# The device must use the same FlashInfer (0.6.18.post1) and tvm-ffi (0.1.13.post3) and CUDA 13
# (libcudart.so.13); the modules hold sm_90a code only. They need no Python symbols (tvm-ffi's
# C ABI and libcudart only), so a cp311 build loads under the device's Python 3.12.
# A Python for it, once (here: python 3.11, torch 2.11+cu130 from /work/venv211):
#   python3 -m venv /work/fi-venv
#   echo /work/venv211/lib/python3.11/site-packages > /work/fi-venv/lib/python3.11/site-packages/t.pth
#   /work/fi-venv/bin/pip install nvidia-ml-py einops
#   /work/fi-venv/bin/pip download --no-deps -d /tmp/w apache-tvm-ffi==0.1.13.post3 \
#       nvidia-cudnn-frontend==1.28.0 cuda-tile==1.5.0
#   /work/fi-venv/bin/pip install --no-deps --target /tmp/site \
#       .whl/flashinfer_python-0.6.18.post1-py3-none-any.whl /tmp/w/*.whl
# Measured here (2 shared cores, 2 compilers): 115 CPU-seconds, 88 s, 1.2 MiB for the four.
set -eu
cd "$(dirname "$0")/.."
OUTDIR=${1:-.fi-mla-aot}
PY=${FD_FI_PYTHON:-/work/fi-venv/bin/python}
[ -x "$PY" ] || PY=python3
SITE=${FD_FI_SITE:-/tmp/site}
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} FLASHINFER_CUDA_ARCH_LIST=9.0a
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fd-flashinfer-jit}
export MAX_JOBS=${FD_FI_JOBS:-2} CUDA_VISIBLE_DEVICES=""
SPECS=$(mktemp /tmp/fd-mla-specs.XXXXXX.json)
cat >"$SPECS" <<'EOF'
[["mla", "fa2", "bf16", 512, 64], ["mla", "fa3", "bf16", 512, 64],
 ["mla", "fa2", "bf16", 512, 64, "e4m3"], ["mla", "fa3", "bf16", 512, 64, "e4m3"]]
EOF
t0=$(date +%s)
# one module at a time, ninja running MAX_JOBS compilers within it
nice -n 15 "$PY" bench/gpubench/fi_prebuild.py "$SPECS" 1
rm -f "$SPECS"
mkdir -p "$OUTDIR"
"$PY" - "$OUTDIR" <<'EOF'
import os, shutil, sys, torch
from flashinfer.jit.attention.modules import gen_batch_mla_module
out = sys.argv[1]
for backend in ("fa2", "fa3"):
    for kv in (torch.bfloat16, torch.float8_e4m3fn):
        spec = gen_batch_mla_module(backend, torch.bfloat16, kv, torch.bfloat16, torch.int32,
                                    512, 64, False)
        src = spec.get_library_path()  # the JIT build (or an AOT copy already in the site)
        if not src.exists():
            sys.exit(f"missing {src}")
        os.makedirs(os.path.join(out, spec.name), exist_ok=True)
        shutil.copy2(src, os.path.join(out, spec.name, spec.name + ".so"))
        print(f"{spec.name}.so {src.stat().st_size / 2**20:.1f} MiB")
EOF
echo "prebuilt in $(( $(date +%s) - t0 ))s: $OUTDIR ($(du -sh "$OUTDIR" | cut -f1))"
