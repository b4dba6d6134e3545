#!/usr/bin/env python3
"""
cpu_harness.py — runs bench_gpu.py's measurement code on the CPU, to check it without a GPU.

torch.cuda's timing API (events, streams, CUDA graphs) is replaced by host-clock stand-ins
(a "graph" runs its calls once, at capture, and replay does nothing), tensors live on the CPU,
and our library runs through the flashdecode package's CPU backend. So every code path of the
GPU run is exercised — plans, buffer sets, paged and ragged layouts, the variant rows (window,
soft-cap, sinks, head_dim 96, the shared-prefix cascade with fp32 states, the prefix lse
written through a strided view and merge_states; fp8 caches with per-tensor and per-token
scales, contiguous and paged; recorded as unavailable with a library whose
Python API lacks them), the float64 check, the sweep, SDPA and compiled
FlexAttention peers (CPU kernels), copied peers, the CSV / PNG / verdicts — but the timings
mean nothing. FlashInfer (CUDA only) is left out; --self-test checks its call signatures.

Needs torch (a CPU build is enough) and the library built with the CPU backend:
  FLASHDECODE_LIBRARY=/tmp/build/libflashdecode.so PYTHONPATH=python \\
      python3 bench/cpu_harness.py [--no-peers] [--no-variants] [--out-dir DIR]
or, with no library, against a torch stand-in that has the variant API (gpubench/fake_fd.py):
  python3 bench/cpu_harness.py --fake-flashdecode --no-peers
FlexAttention compiles C++ on the CPU: a first run with peers takes a few minutes.
"""
import argparse
import contextlib
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpubench import cli, report, shapes as sh  # noqa: E402
from gpubench.common import OURS, SETTINGS  # noqa: E402
from gpubench.runner import GpuBench  # noqa: E402


class HostEvent:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


class HostGraph:
    def replay(self):
        pass


class HostStream:
    def wait_stream(self, other):
        pass


@contextlib.contextmanager
def _noop_context(*args, **kwargs):
    yield


def patch_cuda():
    c = torch.cuda
    c.Event = HostEvent
    c.CUDAGraph = HostGraph
    c.graph = _noop_context
    c.stream = _noop_context
    c.Stream = HostStream
    c.current_stream = lambda *a: HostStream()
    c.synchronize = lambda *a: None
    c.empty_cache = lambda: None
    c._sleep = lambda cycles: None
    SETTINGS.device = "cpu"


def small_shapes():
    """One tiny shape of every kind the real grid has."""
    rows = sh.load_trace(os.path.join(sh.find_trace_dir(None) or ".", sh.TRACE_FILES["azureconv"]))
    lens = [n // 16 for n in sh.ragged_lens(rows, sh.RAGGED_OFFSET, 8)]
    b1 = sh.uniform_name(1, 8, 2, 512, 64, "bf16")
    S = sh.Shape
    return [
        S(b1, 1, 8, 2, 64, "bf16", [512], sweep=True),
        S(sh.uniform_name(2, 4, 4, 256, 64, "bf16"), 2, 4, 4, 64, "bf16", [256] * 2, sweep=True),
        S("ragged8-azureconv-small", 8, 8, 2, 64, "bf16", lens, sweep=True, note="kv_len / 16"),
        S(sh.uniform_name(1, 8, 2, 512, 64, "fp16"), 1, 8, 2, 64, "fp16", [512], kind="fp16",
          base=b1),
        S(sh.uniform_name(1, 8, 2, 512, 64, "fp32"), 1, 8, 2, 64, "fp32", [512], kind="fp32",
          base=b1),
        S(sh.uniform_name(1, 8, 2, 512, 64, "bf16", 16), 1, 8, 2, 64, "bf16", [512], 16,
          "paged", b1),
        S("ragged8-azureconv-small-paged16", 8, 8, 2, 64, "bf16", lens, 16, "paged",
          "ragged8-azureconv-small"),
        S("paged-without-contiguous-row", 2, 8, 2, 64, "bf16", [100, 37], 16, "paged",
          "not-measured"),
    ]


def small_variants():
    """One tiny row of every variant kind, each with its plain row."""
    S = sh.Shape
    v = dict(kind="variant")
    return [
        S("var-win-plain", 2, 8, 2, 64, "bf16", [129] * 2, family="w", **v),
        S("var-win", 2, 8, 2, 64, "bf16", [700] * 2, base="var-win-plain", window_left=127,
          family="w", **v),
        S("var-cap-plain", 1, 4, 2, 128, "bf16", [600], family="c", **v),
        S("var-cap", 1, 4, 2, 128, "bf16", [600], base="var-cap-plain", softcap=50.0,
          q_scale=sh.SOFTCAP_Q_SCALE, family="c", **v),
        S("var-sinks-plain", 2, 16, 2, 64, "bf16", [500] * 2, family="s", **v),
        S("var-sinks", 2, 16, 2, 64, "bf16", [500] * 2, base="var-sinks-plain", sinks=True,
          family="s", **v),
        S("var-sinks-win", 2, 16, 2, 64, "bf16", [500] * 2, base="var-sinks-plain", sinks=True,
          window_left=31, family="s", **v),
        S("var-d96", 1, 4, 4, 96, "bf16", [300], family="p", **v),
        S("var-prefix-plain", 4, 8, 2, 64, "bf16", [64 + 32] * 4, page_size=16, prefix_len=64,
          family="prefix", **v),
        S("var-prefix-cascade", 4, 8, 2, 64, "bf16", [64 + 32] * 4, page_size=16, prefix_len=64,
          base="var-prefix-plain", cascade=True, family="prefix", **v),
    ] + small_fp8()


def small_fp8():
    """The fp8 rows' kinds, tiny: a bf16 base, e4m3 per-tensor, per-token, per-token paged."""
    S = sh.Shape
    v = dict(kind="variant", family="fp8")
    base = "var-fp8-b2-bf16"
    return [
        S(base, 2, 8, 2, 64, "bf16", [300] * 2, ours_only=True, **v),
        S("var-fp8-b2-e4m3-tensor", 2, 8, 2, 64, "bf16", [300] * 2, base=base, kv_dtype="e4m3",
          kv_scale="tensor", **v),
        S("var-fp8-b2-e4m3-token", 2, 8, 2, 64, "bf16", [300] * 2, base=base, kv_dtype="e4m3",
          kv_scale="token", **v),
        S("var-fp8-b2-e4m3-token-paged16", 2, 8, 2, 64, "bf16", [300] * 2, page_size=16,
          base=base, kv_dtype="e4m3", kv_scale="token", **v),
    ]


def small_mla():
    """The MLA rows' kinds, tiny (64-key pages, scattered): bf16, q_len 2, e4m3 latent."""
    from gpubench.mla import MLA_PAGE, MLA_SCALE
    S = sh.Shape
    kw = dict(kind="mla", family="mla", rope_dim=64, softmax_scale=MLA_SCALE)
    return [
        S("mla-b2-h16-n300-bf16", 2, 16, 1, 512, "bf16", [300, 300], MLA_PAGE, **kw),
        S("mla-b2-h16-n300-bf16-q2", 2, 16, 1, 512, "bf16", [300, 300], MLA_PAGE, q_len=2, **kw),
        S("mla-b2-h16-n300-e4m3", 2, 16, 1, 512, "bf16", [300, 300], MLA_PAGE,
          base="mla-b2-h16-n300-bf16", kv_dtype="e4m3", kv_scale="tensor", **kw),
    ]


def install_fake_flashinfer():
    """A 'flashinfer' module whose only working path is the MLA wrapper stand-in."""
    import types

    from gpubench.mla import _FakeMlaWrapper
    fi = types.ModuleType("flashinfer")
    fi.__version__ = "stand-in"
    fi.mla = types.SimpleNamespace(BatchMLAPagedAttentionWrapper=_FakeMlaWrapper)
    fi.decode = types.ModuleType("flashinfer.decode")
    sys.modules["flashinfer"] = fi
    sys.modules["flashinfer.decode"] = fi.decode


def main():
    ap = argparse.ArgumentParser(description="bench_gpu.py's GPU path, run on the CPU")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--variants-only", action="store_true")
    ap.add_argument("--fp8-only", action="store_true", help="only the fp8 rows (and their base)")
    ap.add_argument("--mla-only", action="store_true", help="only the MLA rows")
    ap.add_argument("--fake-flashinfer", action="store_true",
                    help="the FlashInfer phase with a stand-in for its MLA wrapper "
                         "(gpubench/mla.py _FakeMlaWrapper, float64): checks the MLA rows' peer "
                         "plumbing (plans, records, best peer, ratio, summary); use with "
                         "--mla-only")
    ap.add_argument("--fake-flashdecode", action="store_true",
                    help="run against gpubench/fake_fd.py (torch stand-in with the variant API) "
                         "instead of the library: checks the variant / cascade code of the bench")
    ap.add_argument("--out-dir", default=os.path.join(tempfile.gettempdir(), "flashdecode-bench-cpu"))
    a = ap.parse_args()
    patch_cuda()
    if a.fake_flashdecode:
        from gpubench import fake_fd
        sys.modules["flashdecode"] = fake_fd
    if a.fake_flashinfer:
        install_fake_flashinfer()
    args = cli.parse_args(["--out-dir", a.out_dir, "--commit", "cpu", "--budget-s", "100000",
                           "--flex-variants"]
                          + ([] if a.fake_flashinfer else ["--no-flashinfer"])
                          + (["--no-peers"] if a.no_peers else []))
    shapes, notes = ([] if a.variants_only else small_shapes()), []
    variants = [] if a.no_variants else small_variants()
    mla = small_mla()
    if a.fp8_only:
        shapes, variants, mla = [], small_fp8(), []
    if a.mla_only:
        shapes, variants = [], []
    bench = GpuBench(args, torch, shapes, variants, notes, mla=mla)
    if bench.fd is None:
        print(bench.fd_error)
        return 2
    for _ in bench.run():
        pass
    all_shapes = shapes + variants + mla
    files = report.write_outputs(args.out_dir, "cpu", ["cpu harness: timings are meaningless"],
                                 all_shapes, bench.recs, bench.sweep, 1.0, notes, plot=True)
    report.print_summary(all_shapes, bench.recs, bench.sweep, 1.0, ["cpu harness"], notes, files)
    var_names = {s.name for s in variants + mla}
    bad, unavailable = [], []
    for r in bench.recs:
        if r.status == "FAIL":
            bad.append(r)
        elif r.impl in OURS and r.status != "ok":
            # a variant the library's Python API does not take yet is reported, not failed
            (unavailable if r.shape in var_names and "unavailable" in r.reason else bad).append(r)
    bad += [x for x in bench.sweep if x.status != "ok"]
    for r in unavailable:
        print(f"UNAVAILABLE {r.shape} {r.impl}: {r.reason}")
    for r in bad:
        print(f"BAD {r.shape} {getattr(r, 'impl', 'sweep')} {r.status} {r.reason}")
    print(f"{len(bench.recs) + len(bench.sweep) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
