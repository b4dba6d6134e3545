#!/usr/bin/env python3
"""fi_prebuild.py SPECS.json [THREADS] — compile FlashInfer JIT modules into its cache.

Started by the benchmark in a background process (no GPU: CUDA_VISIBLE_DEVICES='') so that
FlashInfer's kernels compile while our own rows are measured; the benchmark's process then
finds them built (FlashInfer's file lock makes it wait for one still compiling, and ninja
rebuilds nothing). Each spec is one JSON list (flashinfer_peers.fi_spec_list):
  ["decode", dtype, head_dim, use_sliding_window, use_logits_soft_cap]
  ["prefill", backend, dtype, head_dim, use_sliding_window, use_logits_soft_cap]
  ["xqa", dtype, page_size, head_dim, head_group_ratio, use_sliding_window]
  ["cascade"]
  ["mla", backend, dtype, head_dim_ckv, head_dim_kpe]  (BatchMLAPagedAttentionWrapper, fa2/fa3)
An fp8 cache appends its kv dtype ("e4m3" / "e5m2") to a decode, prefill or xqa spec; q and
out keep the spec's dtype.
Needs FLASHINFER_CUDA_ARCH_LIST (the GPU is not visible) and the same FlashInfer
environment as the benchmark (scripts/prebuild_flashinfer_mla.sh runs it without a GPU machine
for the MLA modules). Prints one line per module and a DONE line.
"""
import importlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def make_spec(sp):
    import torch

    if sp[0] == "cascade":  # merge_state(s) kernels (the cascade wrapper's merge)
        from flashinfer.jit.cascade import gen_cascade_module
        return gen_cascade_module()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[sp[2] if sp[0] in ("prefill", "mla")
                                                         else sp[1]]
    nargs = {"decode": 5, "prefill": 6, "xqa": 6, "mla": 5}.get(sp[0])
    if nargs is None or len(sp) not in (nargs, nargs + 1):
        raise ValueError(f"unknown spec {sp}")
    kv = dt  # the cache's dtype: the spec's, or the fp8 type appended
    if len(sp) == nargs + 1:
        kv = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[sp[-1]]
        sp = sp[:-1]
    if sp[0] == "decode":
        from flashinfer.jit.attention.modules import gen_batch_decode_module
        _, _, hd, swa, cap = sp
        return gen_batch_decode_module(dt, kv, dt, torch.int32, hd, hd, 0, bool(swa), bool(cap))
    if sp[0] == "prefill":
        from flashinfer.jit.attention.modules import gen_batch_prefill_module
        _, backend, _, hd, swa, cap = sp
        return gen_batch_prefill_module(backend, dt, kv, dt, torch.int32, hd, hd, 0, bool(swa),
                                        bool(cap), False)
    if sp[0] == "mla":  # the wrapper's get_batch_mla_module(backend, q, kv, o, idx, ckv, kpe, prof)
        from flashinfer.jit.attention.modules import gen_batch_mla_module
        _, backend, _, ckv, kpe = sp
        return gen_batch_mla_module(backend, dt, kv, dt, torch.int32, ckv, kpe, False)
    if sp[0] == "xqa":
        from flashinfer.jit.xqa import gen_xqa_module
        _, _, page, hd, group, swa = sp
        return gen_xqa_module(dt, kv, page, hd, group, bool(swa), dt, 1, False)
    raise ValueError(f"unknown spec {sp}")


def build_one(sp):
    t = time.monotonic()
    try:
        spec = make_spec(sp)
        name = spec.name
        if getattr(spec, "is_compiled", False):
            return f"CACHED {name} {time.monotonic() - t:.1f}s"
        spec.build(need_lock=True)
        return f"BUILT {name} {time.monotonic() - t:.1f}s"
    except Exception as exc:  # the benchmark's own call reports the failure on its row
        msg = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        return f"FAILED {sp} {time.monotonic() - t:.1f}s {msg}"


def main(argv):
    specs = json.load(open(argv[1]))
    threads = int(argv[2]) if len(argv) > 2 else 4
    t0 = time.monotonic()
    print(f"prebuilding {len(specs)} FlashInfer modules with {threads} threads", flush=True)
    try:
        importlib.import_module("flashinfer")  # fails early, with a clear message
    except Exception as exc:
        print(f"FAILED import flashinfer: {type(exc).__name__}: {exc}", flush=True)
        return 1
    built = failed = 0
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for line in pool.map(build_one, specs):
            print(line, flush=True)
            built += line.startswith(("BUILT", "CACHED"))
            failed += line.startswith("FAILED")
    print(f"DONE {built} built/cached, {failed} failed in {time.monotonic() - t0:.0f}s", flush=True)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
