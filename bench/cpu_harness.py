#!/usr/bin/env python3
"""
cpu_harness.py — runs bench_gpu.py's measurement code on the CPU, to check it without a GPU.

torch.cuda's timing API (events, streams, CUDA graphs) is replaced by host-clock stand-ins
(a "graph" runs its calls once, at capture, and replay does nothing), tensors live on the CPU,
and our library runs through the flashdecode package's CPU backend. So every code path of the
GPU run is exercised — plans, buffer sets, paged and ragged layouts, the float64 check, the
sweep, SDPA and compiled FlexAttention peers (CPU kernels), copied peers, the CSV / PNG /
verdicts — but the timings mean nothing.

Needs torch (a CPU build is enough) and the library built with the CPU backend:
  FLASHDECODE_LIBRARY=/tmp/build/libflashdecode.so PYTHONPATH=python \
      python3 bench/cpu_harness.py [--no-peers] [--out-dir DIR]
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
import bench_gpu as bg  # noqa: E402


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
    bg.DEVICE = "cpu"


def small_shapes():
    """One tiny shape of every kind the real grid has."""
    rows = bg.load_trace(os.path.join(bg.find_trace_dir(None) or ".", bg.TRACE_FILES["azureconv"]))
    lens = [n // 16 for n in bg.ragged_lens(rows, bg.RAGGED_OFFSET, 8)]
    b1 = bg.uniform_name(1, 8, 2, 512, 64, "bf16")
    return [
        bg.Shape(b1, 1, 8, 2, 64, "bf16", [512], sweep=True),
        bg.Shape(bg.uniform_name(2, 4, 4, 256, 64, "bf16"), 2, 4, 4, 64, "bf16", [256] * 2, sweep=True),
        bg.Shape("ragged8-azureconv-small", 8, 8, 2, 64, "bf16", lens, sweep=True, note="kv_len / 16"),
        bg.Shape(bg.uniform_name(1, 8, 2, 512, 64, "fp16"), 1, 8, 2, 64, "fp16", [512], kind="fp16",
                 base=b1),
        bg.Shape(bg.uniform_name(1, 8, 2, 512, 64, "fp32"), 1, 8, 2, 64, "fp32", [512], kind="fp32",
                 base=b1),
        bg.Shape(bg.uniform_name(1, 8, 2, 512, 64, "bf16", 16), 1, 8, 2, 64, "bf16", [512], 16,
                 "paged", b1),
        bg.Shape("ragged8-azureconv-small-paged16", 8, 8, 2, 64, "bf16", lens, 16, "paged",
                 "ragged8-azureconv-small"),
        bg.Shape("paged-without-contiguous-row", 2, 8, 2, 64, "bf16", [100, 37], 16, "paged",
                 "not-measured"),
    ]


def main():
    ap = argparse.ArgumentParser(description="bench_gpu.py's GPU path, run on the CPU")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--out-dir", default=os.path.join(tempfile.gettempdir(), "flashdecode-bench-cpu"))
    a = ap.parse_args()
    patch_cuda()
    args = bg.parse_args(["--out-dir", a.out_dir, "--commit", "cpu", "--budget-s", "100000"]
                         + (["--no-peers"] if a.no_peers else []))
    shapes, notes = small_shapes(), []
    bench = bg.GpuBench(args, torch, shapes, notes)
    if bench.fd is None:
        print(bench.fd_error)
        return 2
    for _ in bench.run():
        pass
    files = bg.write_outputs(args.out_dir, "cpu", ["cpu harness: timings are meaningless"], shapes,
                             bench.recs, bench.sweep, 1.0, notes, plot=True)
    bg.print_summary(shapes, bench.recs, bench.sweep, 1.0, ["cpu harness"], notes, files)
    bad = [r for r in bench.recs if r.status == "FAIL" or (r.impl in bg.OURS and r.status != "ok")]
    bad += [x for x in bench.sweep if x.status != "ok"]
    for r in bad:
        print(f"BAD {r.shape} {getattr(r, 'impl', 'sweep')} {r.status} {r.reason}")
    print(f"{len(bench.recs) + len(bench.sweep) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
