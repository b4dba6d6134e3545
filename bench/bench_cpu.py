#!/usr/bin/env python3
"""
bench_cpu.py — flashdecode's CPU backend against PyTorch's CPU attention, one run on one machine.

In one process it
  1. measures the machine's memory read bandwidth with the CLI
     (`flashdecode bench --backend cpu` runs a plain OpenMP read loop over a
     buffer of max(1 GiB, 8 x LLC); its `read_gbps=`), before and after the
     shapes; the higher of the two is the ceiling of the % columns;
  2. for every shape of the CPU grid (B=1 32/8 d128 at 4k, 16k, 64k keys; B=8 at
     4k; small models: B=1 8/4 d8 at 512 and 4k keys, B=1 12/12 d64 at 4k;
     fp32 and bf16) times, on the same inputs:
       flashdecode          our CPU backend, automatic split count: a DecodePlan
                            planned with kv_len_hint = the real lengths, its
                            fd_tensors built once per input set, so a call is
                            one ctypes call of fd_run (what an integration that
                            reuses its buffers pays)
       flashdecode-nosplit  the same with num_splits = 1
       flashdecode-run      DecodePlan.run (automatic splits), which describes and
                            checks every argument on every call: the Python
                            package's per-call overhead shows on small shapes
       torch-sdpa           torch.nn.functional.scaled_dot_product_attention on
                            CPU tensors, q [B, Hq, 1, D], K/V [B, Hkv, N, D]
                            contiguous (its own layout), enable_gqa=True
       reference-f64        the library's float64 reference backend (one
                            thread, plain loops): only shapes with K+V <=
                            16 MiB, it is slow
       flashdecode-c, flashdecode-c-nosplit
                            the CLI's own timing of the same shape (C loop, no
                            Python in the timed region; `--no-cli` skips them)
       llamacpp-f16, llamacpp-q8_0
                            the optional llama.cpp peer: ggml_flash_attn_ext on
                            ggml's CPU backend (bench/peers/ggml_fa_bench, built by
                            bench/peers/fetch_llamacpp.sh from the llama-cpp-python
                            sdist), same shape, threads and input-set count, on
                            its own random inputs (q f32, K/V in llama.cpp's cache
                            layout); when it is there (or --llamacpp PATH), the
                            d128 shapes also run as f16 rows (next to llamacpp-f16)
                            and e4m3 rows (bf16 q, fp8 e4m3 cache with a tensor
                            scale; next to llamacpp-q8_0; no torch row: torch has
                            no fp8 SDPA on the CPU, checked against a float32 SDPA
                            over the dequantized cache). Its GB/s count the bytes
                            ggml reads (f16 2 bytes an element, q8_0 34 per 32).
                            Absent: the bench says so and runs without it.
  3. runs `flashdecode generate` (stories260K, greedy, 256 steps) with the
     automatic split count and with --num-splits 1 and reports tokens/s;
  4. writes <date>-<commit>-cpu-<cores>c.csv (columns shape, impl, us, gbps,
     pct_read_bw, num_splits, ratio_vs_torch, ratio_vs_llamacpp; '#' header lines
     describe the machine; FD_CPU_ISA, when set, is in the name; "-llamacpp" when the
     peer ran) and prints a table with the verdict of every CPU target (with the
     peer: ours >= 1.5x llama.cpp on every f16 / e4m3 row, ours >= 2.5x torch SDPA
     on every bf16 row).

Timing: time.perf_counter around each call; calls rotate over input sets
whose K+V together exceed 4 x the last-level cache (at most 64 sets), so K and
V come from memory for every implementation alike (the smallest shapes stay in
cache: there the per-call overhead is what is measured); warm-up: one call
per set (at least 3); median of the timed calls. torch.set_num_threads(all
cores of this process's affinity); our library uses the same cores.
ratio_vs_torch = torch µs / this row's µs (> 1: faster than torch); ratio_vs_llamacpp =
llama.cpp's µs / this row's µs on the same shape (f16 rows vs ggml f16, e4m3 rows vs ggml q8_0).
GB/s = K+V bytes (2 * B * N * Hkv * D * sizeof) / µs.

Run from the repository root after building (no network needed):
  PYTHONPATH=python FLASHDECODE_LIBRARY=build/libflashdecode.so \\
      python3 bench/bench_cpu.py --out-dir bench/results --commit <short-sha>
(PYTHONPATH and FLASHDECODE_LIBRARY default to python/ and <build-dir>/libflashdecode.so.)
"""
import argparse
import datetime
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time

from benchutil import REPO, git_commit  # noqa: E402  (bench/ is on sys.path)
MIB = 1 << 20
GIB = 1 << 30
REF_MAX_BYTES = 16 * MIB   # float64 reference only up to this much K+V
MAX_SETS = 64
BW_TARGET_BYTES = 64 * MIB  # the bandwidth target applies from this K+V size on
BW_TARGET_PCT = 80.0
GEOMEAN_TARGET = 1.5

# (batch, num_heads_q, num_heads_kv, head_dim, kv_len): the CPU grid
GRID = [
    (1, 32, 8, 128, 4096),
    (1, 32, 8, 128, 16384),
    (1, 32, 8, 128, 65536),
    (8, 32, 8, 128, 4096),
    (1, 8, 4, 8, 512),
    (1, 8, 4, 8, 4096),
    (1, 12, 12, 64, 4096),
]
DTYPES = ["f32", "bf16"]
QUICK = [(1, 32, 8, 128, 4096), (1, 8, 4, 8, 512)]
# With the llama.cpp peer: our f16 rows next to ggml f16, our e4m3 rows next to ggml q8_0, on
# the grid's head_dim 128 shapes
PEER_TYPE = {"f16": "f16", "e4m3": "q8_0"}
LLAMACPP_DEFAULT = os.path.join(REPO, "build-llamacpp", "ggml_fa_bench")
PEER_TARGET = 1.5       # ours >= 1.5x llama.cpp's CPU flash attention
SDPA_BF16_TARGET = 2.5  # ours >= 2.5x torch SDPA on bf16


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=os.path.join(REPO, "bench", "results"),
                    help="where the CSV goes (default bench/results)")
    ap.add_argument("--commit", default=None, help="commit id for the file name (default: git)")
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"),
                    help="where libflashdecode.so and the flashdecode CLI are (default build/)")
    ap.add_argument("--threads", type=int, default=0, help="threads (default: all cores)")
    ap.add_argument("--shapes", default=None,
                    help="only shapes whose name contains one of these comma-separated strings")
    ap.add_argument("--quick", action="store_true", help="two shapes, fewer calls (smoke test)")
    ap.add_argument("--budget-s", type=float, default=4.0,
                    help="time budget per (shape, implementation) for the timed calls")
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI's per-shape timings")
    ap.add_argument("--no-generate", action="store_true", help="skip the generate tokens/s")
    ap.add_argument("--no-reference", action="store_true", help="skip the float64 reference")
    ap.add_argument("--llamacpp", default=None, metavar="PATH",
                    help="the llama.cpp peer's harness (default build-llamacpp/ggml_fa_bench when "
                         "it exists; build it with bash bench/peers/fetch_llamacpp.sh)")
    ap.add_argument("--no-llamacpp", action="store_true", help="skip the llama.cpp peer")
    return ap.parse_args(argv)


ARGS = parse_args(sys.argv[1:])
sys.path.insert(0, os.path.join(REPO, "python"))
os.environ.setdefault("FLASHDECODE_LIBRARY", os.path.join(ARGS.build_dir, "libflashdecode.so"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flashdecode  # noqa: E402
from flashdecode import _core, _lib  # noqa: E402
from flashdecode._tensors import describe, fill_tensors  # noqa: E402

TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
               "e4m3": torch.bfloat16}  # q's dtype (and the cache's, but for e4m3)
ELEM = {"f32": 4, "bf16": 2, "f16": 2, "e4m3": 1}  # bytes of a cache element
FP8_MAX = 448.0  # largest finite e4m3


# ---------------------------------------------------------------------------
# machine
# ---------------------------------------------------------------------------

def cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpuinfo():
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model in ("unknown", "", "x86_64"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
              "avx512_fp16", "amx_tile", "amx_bf16", "avx_vnni"]
    return model, [f for f in wanted if f in flags]


def llc_bytes():
    try:
        v = os.sysconf("SC_LEVEL3_CACHE_SIZE")
        if v > 0:
            return v
    except (ValueError, OSError):
        pass
    best = 0
    for i in range(8):
        try:
            with open("/sys/devices/system/cpu/cpu0/cache/index%d/size" % i) as f:
                text = f.read().strip()
        except OSError:
            continue
        m = re.match(r"(\d+)([KM]?)", text)
        if m:
            n = int(m.group(1)) << {"": 0, "K": 10, "M": 20}[m.group(2)]
            best = max(best, n)
    return best


def ram_bytes():
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 16 * GIB


def loadavg():
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "n/a"


# ---------------------------------------------------------------------------
# the CLI: read bandwidth, per-shape C timings, generate
# ---------------------------------------------------------------------------

def cli_path():
    return os.path.join(ARGS.build_dir, "flashdecode")


def cli_bench(shape_args, iters):
    """`flashdecode bench --backend cpu ...`: dict of its key=value fields, or None."""
    cmd = [cli_path(), "bench", "--backend", "cpu", "--iters", str(iters)] + shape_args
    if ARGS.threads:
        cmd += ["--threads", str(ARGS.threads)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        print("  cli bench failed: %s" % e)
        return None
    if res.returncode != 0:
        print("  cli bench failed: %s" % (res.stderr.strip() or res.stdout.strip()))
        return None
    return dict(re.findall(r"(\w+)=(\S+)", res.stdout))


def read_bandwidth():
    """The CLI's read loop (the bench of a tiny problem around it)."""
    fields = cli_bench(["--batch", "1", "--num-heads-q", "1", "--num-heads-kv", "1", "--head-dim",
                        "8", "--kv-len", "64", "--dtype", "f32"], 1)
    if not fields or "read_gbps" not in fields:
        return float("nan")
    return float(fields["read_gbps"])


def generate_tok_s(num_splits, reps):
    rates = []
    for _ in range(reps):
        cmd = [cli_path(), "generate", "--backend", "cpu", "--temperature", "0", "--steps", "256"]
        if num_splits is not None:
            cmd += ["--num-splits", str(num_splits)]
        if ARGS.threads:
            cmd += ["--threads", str(ARGS.threads)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            print("  generate failed: %s" % e)
            return float("nan")
        m = re.search(r"achieved tok/s:\s*([0-9.]+)", res.stderr + res.stdout)
        if res.returncode != 0 or not m:
            print("  generate failed: %s" % res.stderr.strip()[-300:])
            return float("nan")
        rates.append(float(m.group(1)))
    return statistics.median(rates)


# ---------------------------------------------------------------------------
# the llama.cpp peer (bench/peers/ggml_fa_bench)
# ---------------------------------------------------------------------------

def llamacpp_path():
    """The peer's harness, or None (not asked for and not built, or --no-llamacpp)."""
    if ARGS.no_llamacpp:
        return None
    path = ARGS.llamacpp or LLAMACPP_DEFAULT
    if os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    if ARGS.llamacpp:
        sys.exit("bench_cpu.py: --llamacpp %s: not an executable file" % path)
    return None


def llamacpp_run(args, timeout=900):
    """Runs the harness with args: (dict of its last line's key=value fields, stdout), or
    (None, reason)."""
    cmd = [llamacpp_path()] + args
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    lines = res.stdout.strip().splitlines()
    if not lines:
        return None, (res.stderr.strip() or "no output")[-300:]
    fields = dict(re.findall(r"(\w+)=(\S+)", lines[-1]))
    fields["rc"] = res.returncode
    return fields, res.stdout


def llamacpp_check(threads):
    """The harness's own check against float64 (small shapes): (ok, summary)."""
    fields, out = llamacpp_run(["--check", "--threads", str(threads)], timeout=300)
    if fields is None:
        return False, "check did not run: %s" % out
    errs = re.findall(r"check type=(\S+) batch=(\d+).*?mask=(\d+).*?rel_err=(\S+)", out)
    summary = ", ".join("%s B=%s%s %s" % (t, b, " mask" if m == "1" else "", e)
                        for t, b, m, e in errs)
    return fields["rc"] == 0, summary


def llamacpp_bench(shape, n_sets, threads, budget):
    """µs and bytes of ggml_flash_attn_ext on this shape (ggml type PEER_TYPE[dtype]), or
    None (printed why)."""
    args = ["--type", PEER_TYPE[shape.dtype], "--batch", str(shape.batch), "--hq", str(shape.hq),
            "--hkv", str(shape.hkv), "--d", str(shape.d), "--n", str(shape.n), "--threads",
            str(threads), "--sets", str(n_sets), "--budget-s", "%g" % budget]
    fields, out = llamacpp_run(args)
    if fields is None or fields["rc"] != 0 or "us" not in fields:
        print("  llama.cpp peer failed: %s" % (out if fields is None else out[-300:]))
        return None
    return float(fields["us"]), float(fields["bytes"])


# ---------------------------------------------------------------------------
# shapes and implementations
# ---------------------------------------------------------------------------

class Shape:
    def __init__(self, batch, hq, hkv, d, n, dtype):
        self.batch, self.hq, self.hkv, self.d, self.n, self.dtype = batch, hq, hkv, d, n, dtype

    @property
    def name(self):
        return "b%d-h%d/%d-d%d-%s-n%d" % (self.batch, self.hq, self.hkv, self.d, self.dtype, self.n)

    @property
    def kv_bytes(self):
        return 2 * self.batch * self.n * self.hkv * self.d * ELEM[self.dtype]

    @property
    def fp8(self):
        return self.dtype == "e4m3"

    def cli_args(self):
        dtype = ["--dtype", "bf16", "--kv-dtype", "e4m3"] if self.fp8 else ["--dtype", self.dtype]
        return ["--batch", str(self.batch), "--num-heads-q", str(self.hq), "--num-heads-kv",
                str(self.hkv), "--head-dim", str(self.d), "--kv-len", str(self.n)] + dtype


def set_count(shape, llc):
    """Input sets per implementation: K+V over the sets >= 4 x LLC (as the CLI), at most
    MAX_SETS, and the two layouts (ours, torch's) within a quarter of RAM."""
    want = max(4 * llc, 32 * MIB)
    n = max(1, min(MAX_SETS, math.ceil(want / shape.kv_bytes)))
    while n > 1 and 2 * n * shape.kv_bytes > ram_bytes() / 4:
        n -= 1
    return n


def make_inputs(shape, n_sets, seed=1234):
    """Per set: q [B,1,Hq,D], ours K/V [B,N,Hkv,D], torch's K/V [B,Hkv,N,D] (same values);
    and the fp8 scales (k_scale, v_scale: float32 (1,) tensors, None but for e4m3). e4m3: the
    normal values quantized with a tensor scale amax / 448; no torch layout (theirs empty)."""
    g = torch.Generator().manual_seed(seed)
    dt = TORCH_DTYPE[shape.dtype]
    B, N, Hq, Hkv, D = shape.batch, shape.n, shape.hq, shape.hkv, shape.d
    q = torch.randn(B, 1, Hq, D, generator=g).to(dt)
    k = torch.randn(B, N, Hkv, D, generator=g)
    v = torch.randn(B, N, Hkv, D, generator=g)
    if shape.fp8:
        ks = (k.abs().max() / FP8_MAX).reshape(1)
        vs = (v.abs().max() / FP8_MAX).reshape(1)
        k, v = (k / ks).to(torch.float8_e4m3fn), (v / vs).to(torch.float8_e4m3fn)
        ours = [(k, v)] + [(k.clone(), v.clone()) for _ in range(n_sets - 1)]
        return q, ours, [], (ks, vs)
    k, v = k.to(dt), v.to(dt)
    kt, vt = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    ours = [(k, v)] + [(k.clone(), v.clone()) for _ in range(n_sets - 1)]
    theirs = [(kt, vt)] + [(kt.clone(), vt.clone()) for _ in range(n_sets - 1)]
    return q, ours, theirs, (None, None)


def time_rotation(calls, budget_s):
    """Median µs of one call; call i runs calls[i % len(calls)]."""
    n = len(calls)
    for i in range(max(3, n)):
        calls[i % n]()
    t0 = time.perf_counter()
    calls[0]()
    first = time.perf_counter() - t0
    iters = int(budget_s / max(first, 1e-6))
    iters = max(7, min(iters, 200, max(20, 2 * n)))
    times = []
    for i in range(iters):
        f = calls[(i + 1) % n]
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def reference_f64(shape, q, k, v, kv_len):
    """The library's float64 reference backend: (out, plan) on our layout."""
    plan = _core.make_plan(backend=_lib.FD_BACKEND_REFERENCE, device=0,
                           dtype={"f32": _lib.FD_DTYPE_F32, "f16": _lib.FD_DTYPE_F16,
                                  "bf16": _lib.FD_DTYPE_BF16}[shape.dtype],
                           batch=shape.batch, q_len=1, num_heads_q=shape.hq,
                           num_heads_kv=shape.hkv, head_dim=shape.d, kv_capacity=shape.n,
                           page_size=0, max_pages_per_seq=0, num_pages=0, num_splits=1,
                           softmax_scale=0.0)
    out = torch.empty_like(q)
    tensors = fill_tensors(describe(q, "q"), describe(k, "k_cache"), describe(v, "v_cache"),
                           describe(kv_len, "kv_len"), None, describe(out, "out"), None)
    return out, (lambda: _core.fd_run(plan, tensors, None, 0, None))


def bound_call(plan, q, k, v, kv_len, out, scales=(None, None)):
    """A call of plan on these tensors with the fd_tensors struct built once: what remains
    per call is one ctypes call of fd_run (the tensors are kept alive by the closure)."""
    ks, vs = scales
    tensors = fill_tensors(describe(q, "q"), describe(k, "k_cache"), describe(v, "v_cache"),
                           describe(kv_len, "kv_len"), None, describe(out, "out"), None, None,
                           None if ks is None else describe(ks, "k_scale"),
                           None if vs is None else describe(vs, "v_scale"))
    fd_plan, ws_addr, ws_size = plan._plan, plan._ws_addr, plan.workspace_size
    keep = (q, k, v, kv_len, out, plan, scales)

    def call():
        _core.fd_run(fd_plan, tensors, ws_addr, ws_size, None)
        return keep

    return call


def rel_err(x, ref):
    x, ref = x.float(), ref.float()
    return float((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def bench_shape(shape, llc, rows, checks):
    n_sets = set_count(shape, llc)
    q, ours, theirs, scales = make_inputs(shape, n_sets)
    B = shape.batch
    kv_len = torch.full((B,), shape.n, dtype=torch.int32)
    budget = ARGS.budget_s * (0.25 if ARGS.quick else 1.0)
    results = {}
    fp8_args = dict(kv_dtype="e4m3", kv_scale="tensor") if shape.fp8 else {}
    run_scales = dict(k_scale=scales[0], v_scale=scales[1]) if shape.fp8 else {}

    # ours: automatic splits and num_splits = 1, the arguments described once per input set
    # (one ctypes call per run); and DecodePlan.run, which checks them on every call
    outs = {}
    for impl, splits in (("flashdecode", 0), ("flashdecode-nosplit", 1), ("flashdecode-run", 0)):
        plan = flashdecode.DecodePlan(batch=B, num_heads_q=shape.hq, num_heads_kv=shape.hkv,
                                      head_dim=shape.d, dtype=TORCH_DTYPE[shape.dtype],
                                      kv_capacity=shape.n, device="cpu", num_splits=splits,
                                      kv_len_hint=[shape.n] * B, num_threads=ARGS.threads,
                                      **fp8_args)
        out = torch.empty_like(q)
        if impl == "flashdecode-run":
            calls = [(lambda kk=kk, vv=vv, plan=plan, out=out:
                      plan.run(q, kk, vv, kv_len, out=out, **run_scales)) for kk, vv in ours]
        else:
            calls = [bound_call(plan, q, kk, vv, kv_len, out, scales) for kk, vv in ours]
        us = time_rotation(calls, budget)
        calls[0]()
        outs[impl] = out.clone()
        results[impl] = (us, plan.num_splits)

    # torch SDPA, its own layout (not for fp8 caches: no fp8 SDPA on the CPU; the check's
    # base is then a float32 SDPA over the dequantized cache, untimed)
    qt = q.transpose(1, 2).contiguous()  # [B, Hq, 1, D]
    if theirs:
        calls = [(lambda kk=kk, vv=vv: F.scaled_dot_product_attention(qt, kk, vv, enable_gqa=True))
                 for kk, vv in theirs]
        results["torch-sdpa"] = (time_rotation(calls, budget), None)
        outs["torch-sdpa"] = F.scaled_dot_product_attention(qt, theirs[0][0], theirs[0][1],
                                                            enable_gqa=True).transpose(1, 2)
    else:
        kd = (ours[0][0].float() * scales[0]).transpose(1, 2)
        vd = (ours[0][1].float() * scales[1]).transpose(1, 2)
        outs["sdpa-f32-dequant"] = F.scaled_dot_product_attention(
            qt.float(), kd, vd, enable_gqa=True).transpose(1, 2)

    # float64 reference (small shapes only)
    ref = None
    if not ARGS.no_reference and not shape.fp8 and shape.kv_bytes <= REF_MAX_BYTES:
        ref, run_ref = reference_f64(shape, q, ours[0][0], ours[0][1], kv_len)
        t = []
        for _ in range(3):
            t0 = time.perf_counter()
            run_ref()
            t.append(time.perf_counter() - t0)
        results["reference-f64"] = (statistics.median(t) * 1e6, 1)

    # the CLI's timing of the same shape
    if not ARGS.no_cli:
        fields = cli_bench(shape.cli_args(), 20 if not ARGS.quick else 5)
        if fields and "us" in fields:
            results["flashdecode-c"] = (float(fields["us"]), int(fields["num_splits"]))
            results["flashdecode-c-nosplit"] = (float(fields["us_split1"]), 1)

    # the llama.cpp peer: same shape, threads and set count, its own inputs
    peer = None
    if shape.dtype in PEER_TYPE and llamacpp_path():
        got = llamacpp_bench(shape, n_sets, ARGS.threads or cores(), budget)
        if got:
            peer = ("llamacpp-" + PEER_TYPE[shape.dtype],) + got
            results[peer[0]] = (got[0], None)

    # correctness: against float64 where it ran, else against torch (fp8: the dequantized SDPA)
    base_name = ("reference-f64" if ref is not None else
                 "torch-sdpa" if "torch-sdpa" in outs else "sdpa-f32-dequant")
    base = ref if ref is not None else outs[base_name]
    tol = 5e-4 if shape.dtype == "f32" else 5e-3 if shape.dtype == "f16" else 2e-2
    for impl in ("flashdecode", "flashdecode-nosplit", "flashdecode-run", "torch-sdpa"):
        if impl == base_name or impl not in outs:
            continue
        e = rel_err(outs[impl], base)
        checks.append((shape.name, impl, base_name, e, e <= tol))

    torch_us = results["torch-sdpa"][0] if "torch-sdpa" in results else None
    peer_us = peer[1] if peer else None
    for impl, (us, splits) in results.items():
        nbytes = peer[2] if peer and impl == peer[0] else shape.kv_bytes
        gbps = nbytes / (us * 1e-6) / 1e9
        rows.append({"shape": shape.name, "impl": impl, "us": us, "gbps": gbps,
                     "num_splits": splits,
                     "ratio_vs_torch": torch_us / us if torch_us else None,
                     "ratio_vs_llamacpp": peer_us / us if peer_us else None,
                     "kv_bytes": nbytes, "sets": n_sets})
    line = "  ".join("%s %.1f" % (impl, us) for impl, (us, _) in results.items())
    print("%-32s sets=%-3d µs: %s" % (shape.name, n_sets, line), flush=True)


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------

def main():
    threads = ARGS.threads or cores()
    torch.set_num_threads(threads)
    model, isa = cpuinfo()
    llc = llc_bytes()
    commit = ARGS.commit or git_commit()
    date = datetime.date.today().isoformat()
    load_start = loadavg()
    print("bench_cpu.py: %s, %d threads, LLC %.0f MiB, torch %s (%s), library %s" % (
        model, threads, llc / MIB, torch.__version__, torch.backends.cpu.get_cpu_capability(),
        flashdecode.library_path))

    peer_path = llamacpp_path()
    peer_note = None
    if peer_path:
        version = os.path.join(os.path.dirname(peer_path), "VERSION")
        try:
            with open(version) as f:
                peer_version = " ".join(f.read().split())
        except OSError:
            peer_version = "version unknown"
        ok, summary = llamacpp_check(threads)
        peer_note = "%s (%s); its check against float64 (rel err): %s%s" % (
            peer_path, peer_version, summary, "" if ok else " -- CHECK FAILED")
        print("llama.cpp peer: %s" % peer_note, flush=True)
    elif ARGS.no_llamacpp:
        print("llama.cpp peer: skipped (--no-llamacpp)")
    else:
        print("llama.cpp peer: unavailable (no %s); build it with "
              "`bash bench/peers/fetch_llamacpp.sh` (needs network: PyPI)" % LLAMACPP_DEFAULT)

    bw_before = read_bandwidth()
    print("read bandwidth (before): %.1f GB/s" % bw_before, flush=True)

    grid = QUICK if ARGS.quick else GRID
    shapes = [Shape(*g, dt) for dt in DTYPES for g in grid]
    if peer_path:  # f16 and e4m3 rows next to the peer's f16 and q8_0, head_dim 128 shapes
        shapes += [Shape(*g, dt) for dt in PEER_TYPE for g in grid if g[3] == 128]
    if ARGS.shapes:
        keys = ARGS.shapes.split(",")
        shapes = [s for s in shapes if any(k in s.name for k in keys)]
    rows, checks = [], []
    for shape in shapes:
        bench_shape(shape, llc, rows, checks)

    gen = {}
    if not ARGS.no_generate:
        reps = 1 if ARGS.quick else 3
        gen["flashdecode"] = generate_tok_s(None, reps)
        gen["flashdecode-nosplit"] = generate_tok_s(1, reps)
        print("generate (stories260K, 256 steps, greedy): %.0f tok/s auto splits, %.0f tok/s "
              "num_splits=1" % (gen["flashdecode"], gen["flashdecode-nosplit"]), flush=True)

    bw_after = read_bandwidth()
    print("read bandwidth (after): %.1f GB/s" % bw_after, flush=True)
    bws = [b for b in (bw_before, bw_after) if b == b]
    read_bw = max(bws) if bws else float("nan")
    load_end = loadavg()

    # ---- CSV ----
    os.makedirs(ARGS.out_dir, exist_ok=True)
    # FD_CPU_ISA (the kernels' instruction set, read by fd_plan_init) in the
    # name, so runs under several sets on one machine keep their own files
    isa_env = os.environ.get("FD_CPU_ISA", "")
    path = os.path.join(ARGS.out_dir, "%s-%s-cpu-%dc%s%s.csv" % (
        date, commit, threads, "-" + isa_env if isa_env and isa_env != "auto" else "",
        "-llamacpp" if peer_path else ""))
    with open(path, "w") as f:
        f.write("# bench/bench_cpu.py %s commit %s host %s\n" % (date, commit, platform.node()))
        f.write("# cpu: %s; %d threads (cores of this process's affinity: %d); ISA: %s; "
                "FD_CPU_ISA=%s\n" % (model, threads, cores(), " ".join(isa), isa_env or "auto"))
        f.write("# LLC %.0f MiB, RAM %.1f GiB; load average at start %s, at end %s\n" % (
            llc / MIB, ram_bytes() / GIB, load_start, load_end))
        f.write("# read bandwidth (flashdecode bench --backend cpu, read_gbps=): %.1f GB/s before, "
                "%.1f GB/s after; pct_read_bw uses %.1f GB/s\n" % (bw_before, bw_after, read_bw))
        f.write("# torch %s (cpu capability %s), %d threads; timing: perf_counter per call, "
                "rotating over input sets > 4 x LLC (max %d), median\n" % (
                    torch.__version__, torch.backends.cpu.get_cpu_capability(),
                    torch.get_num_threads(), MAX_SETS))
        f.write("# reference-f64: the library's float64 backend (one thread), K+V <= %d MiB only; "
                "generate rows: us = microseconds per token (1e6 / tok/s)\n" % (REF_MAX_BYTES // MIB))
        if peer_note:
            f.write("# llama.cpp peer: %s; ggml_flash_attn_ext on its CPU backend, q f32, K/V in "
                    "llama.cpp's cache layout, no mask, same threads and set count, median of "
                    "its C-timed calls; gbps counts ggml's bytes (f16 2 B, q8_0 34 B per 32); "
                    "e4m3 rows: bf16 q, tensor scale, vs ggml q8_0\n" % peer_note)
        bad = [c for c in checks if not c[4]]
        f.write("# correctness: %d checks, %d over tolerance (bf16/e4m3 2e-2, f16 5e-3, f32 5e-4 "
                "of max|ref|)%s\n" % (len(checks), len(bad), "".join(
                    "; %s %s vs %s %.2e" % (c[0], c[1], c[2], c[3]) for c in bad)))
        f.write("shape,impl,us,gbps,pct_read_bw,num_splits,ratio_vs_torch,ratio_vs_llamacpp\n")
        for r in rows:
            pct = 100.0 * r["gbps"] / read_bw if read_bw == read_bw else float("nan")
            f.write("%s,%s,%.2f,%.2f,%.1f,%s,%s,%s\n" % (
                r["shape"], r["impl"], r["us"], r["gbps"], pct,
                "" if r["num_splits"] is None else r["num_splits"],
                "" if r["ratio_vs_torch"] is None else "%.3f" % r["ratio_vs_torch"],
                "" if r["ratio_vs_llamacpp"] is None else "%.3f" % r["ratio_vs_llamacpp"]))
        for impl, tok_s in gen.items():
            f.write("generate-stories260K,%s,%.2f,,,%s,\n" % (
                impl, 1e6 / tok_s if tok_s == tok_s and tok_s > 0 else float("nan"),
                "1" if impl.endswith("nosplit") else "auto"))
    print("wrote %s" % path)

    # ---- checks ----
    for c in checks:
        if not c[4]:
            print("CHECK FAILED: %s %s vs %s: rel err %.3e" % (c[0], c[1], c[2], c[3]))
    print("correctness: %d of %d checks within tolerance" % (sum(c[4] for c in checks), len(checks)))

    # ---- verdicts ----
    by = {(r["shape"], r["impl"]): r for r in rows}
    print()
    print("%-30s %10s %10s %10s %7s %7s %6s" % ("shape", "ours µs", "nosplit µs", "torch µs",
                                               "ratio", "% read", "splits"))
    ratios, bw_ok, bw_rows, slower = [], True, 0, []
    for shape in shapes:
        if shape.dtype not in DTYPES:  # these targets are over the f32 / bf16 grid
            continue
        ours, nos, th = (by.get((shape.name, i)) for i in ("flashdecode", "flashdecode-nosplit",
                                                           "torch-sdpa"))
        if not ours or not th:
            continue
        pct = 100.0 * ours["gbps"] / read_bw
        ratios.append(ours["ratio_vs_torch"])
        mark = ""
        if shape.kv_bytes >= BW_TARGET_BYTES:
            ok = pct >= BW_TARGET_PCT  # False when the read bandwidth is unknown (nan)
            bw_ok &= ok
            bw_rows += 1
            mark = " bw %s" % ("ok" if ok else "MISS")
        if ours["ratio_vs_torch"] < 1.0:
            slower.append(shape.name)
        print("%-30s %10.1f %10.1f %10.1f %7.2f %7.1f %6s%s" % (
            shape.name, ours["us"], nos["us"], th["us"], ours["ratio_vs_torch"], pct,
            ours["num_splits"], mark))
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else float("nan")
    run_ratios = [by[(s.name, "flashdecode-run")]["ratio_vs_torch"] for s in shapes
                  if (s.name, "flashdecode-run") in by and s.dtype in DTYPES]
    run_geo = (math.exp(sum(math.log(x) for x in run_ratios) / len(run_ratios))
               if run_ratios else float("nan"))
    print()
    print("target: >= %.0f %% of read bandwidth (%.1f GB/s) when K+V >= %d MiB: %s" % (
        BW_TARGET_PCT, read_bw, BW_TARGET_BYTES // MIB,
        "n/a (no such shape run)" if not bw_rows else "MET" if bw_ok else "MISSED"))
    print("target: geometric mean >= %.1fx torch: %.2fx  %s" % (
        GEOMEAN_TARGET, geo, "MET" if geo >= GEOMEAN_TARGET else "MISSED"))
    print("target: no slower than torch on any shape: %s" % (
        "MET" if not slower else "MISSED (" + ", ".join(slower) + ")"))
    run_slower = [s.name for s in shapes if (s.name, "flashdecode-run") in by
                  and s.dtype in DTYPES and by[(s.name, "flashdecode-run")]["ratio_vs_torch"] < 1.0]
    print("(through DecodePlan.run, argument checks on every call: geometric mean %.2fx, slower "
          "than torch on %s)" % (run_geo, ", ".join(run_slower) if run_slower else "no shape"))
    if gen:
        print("generate tok/s: auto %.0f, num_splits=1 %.0f" % (gen["flashdecode"],
                                                               gen["flashdecode-nosplit"]))
    peer_verdicts(shapes, by, read_bw, peer_path)
    print("load average: start %s, end %s" % (load_start, load_end))


def peer_verdicts(shapes, by, read_bw, peer_path):
    """The peer table (ours vs llama.cpp, GB/s and % of the read probe) and the two peer
    targets: ours >= PEER_TARGET x llama.cpp on every f16 / e4m3 row, ours >= SDPA_BF16_TARGET x
    torch SDPA on every bf16 row."""
    print()
    bf16 = [(s.name, by[(s.name, "flashdecode")]["ratio_vs_torch"]) for s in shapes
            if s.dtype == "bf16" and (s.name, "flashdecode") in by
            and by[(s.name, "flashdecode")]["ratio_vs_torch"]]
    if bf16:
        worst = min(bf16, key=lambda x: x[1])
        geo = math.exp(sum(math.log(r) for _, r in bf16) / len(bf16))
        print("target: >= %.1fx torch SDPA on every bf16 row: lowest %.2fx (%s), geometric mean "
              "%.2fx over %d rows  %s" % (SDPA_BF16_TARGET, worst[1], worst[0], geo, len(bf16),
                                          "MET" if worst[1] >= SDPA_BF16_TARGET else "MISSED"))
    if not peer_path:
        print("llama.cpp peer: unavailable (build it: bash bench/peers/fetch_llamacpp.sh)")
        return
    print("%-30s %10s %7s %7s %12s %7s %7s %7s" % ("shape (ours vs llama.cpp)", "ours µs", "GB/s",
                                                   "% read", "llama.cpp µs", "GB/s", "% read",
                                                   "ratio"))
    ratios = []
    for shape in shapes:
        peer = by.get((shape.name, "llamacpp-" + PEER_TYPE.get(shape.dtype, "")))
        ours = by.get((shape.name, "flashdecode"))
        if not peer or not ours:
            continue
        ratios.append((shape.name, ours["ratio_vs_llamacpp"]))
        print("%-30s %10.1f %7.2f %7.1f %12.1f %7.2f %7.1f %7.2f  (%s)" % (
            shape.name, ours["us"], ours["gbps"], 100.0 * ours["gbps"] / read_bw, peer["us"],
            peer["gbps"], 100.0 * peer["gbps"] / read_bw, ours["ratio_vs_llamacpp"],
            peer["impl"]))
    if ratios:
        worst = min(ratios, key=lambda x: x[1])
        print("target: >= %.1fx llama.cpp CPU flash attention on every f16 / e4m3 (vs q8_0) row: "
              "lowest %.2fx (%s)  %s" % (PEER_TARGET, worst[1], worst[0],
                                         "MET" if worst[1] >= PEER_TARGET else "MISSED"))
    else:
        print("target: >= %.1fx llama.cpp: n/a (no peer row ran)" % PEER_TARGET)


if __name__ == "__main__":
    main()
