"""Arguments and main() of bench/bench_gpu.py."""
import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time

from benchutil import REPO, git_commit

from .common import GIB, MIB, OURS, ROTATE_BYTES, TOL, fmt
from .shapes import build_shapes, build_variant_shapes, find_trace_dir, select

DOC = """bench_gpu.py — the decode-attention benchmark of flashdecode, one run on one H200.

In one process it
  1. measures the read-bandwidth ceiling with bench/probe/read_probe.cu (CUDA C, 16-byte
     loads, the best of 18 grid x block x loads-in-flight configurations, median of repeats
     over 4 GiB of random data; a device-to-device copy too, for information);
  2. for every shape of the benchmark grid (shapes.GRID; bf16, head_dim 128 unless the name
     says), fp16 / fp32 rows, paged rows (page_size 16 and 64) and two ragged batches of 64
     requests from the serving traces, times our CUDA backend (automatic splits:
     `flashdecode`; num_splits = 1: `flashdecode-nosplit`) and sweeps forced split counts;
  3. times the attention-variant rows (Mistral-7B window 4096, Gemma-2-9B soft-cap 50,
     gpt-oss-120b sinks with full and 128-key windows, Phi-3-mini head_dim 96, and 64
     sequences sharing a 16k prefix: cascade against plain decode), each against the plain
     row it is costed with, and the fp8 KV-cache rows (32/8 d128 bf16 q, e4m3 cache with
     per-tensor or per-token scales; realistic data quantized with amax scales; each after
     its bf16-cache base row; FlashInfer's fp8 paths on the same data);
  4. times the peers on the same rows: PyTorch SDPA (flash, cuDNN backends), FlashInfer's
     decode paths (CUDA-core and tensor-core wrappers, XQA, cuDNN, the cascade wrapper; on
     16-key scattered pages; their JIT modules compile in a background process meanwhile)
     and FlexAttention under torch.compile;
  4b. with --mla / --mla-only (or --shapes naming mla-), the MLA rows (gpubench/mla.py:
     512 + 64, one kv head, bf16 and e4m3 latent, 64-key scattered pages): ours and
     FlashInfer's BatchMLAPagedAttentionWrapper (fa2, fa3) on the same pages, % of the read
     ceiling and TFLOPS; issue 33's targets in the MLA checks, a -mla.png;
  5. checks every timed configuration once against a float64 reference that implements the
     row's variant;
  6. writes <date>-<commit>-<gpu>.csv (+ -sweep.csv, -check.csv, -summary.json, .png; <gpu> is
     h100 or h200) and prints the table,
     the verdict of every performance target and the variants' checks.

Timing method: CUDA events around a CUDA graph that replays R calls
back to back over R distinct buffer sets (R >= 2, K+V read over the R sets >= 256 MiB > 2 x
the 60 MiB L2), time per call = graph time / R, median of >= 10 replays after warm-up; eager
time = median of single calls. Plans (ours and FlashInfer's) are made outside the timed region.

Run it on the GPU machine from the repository root, after building the library:
  PYTHONPATH=python:/tmp/site FLASHDECODE_LIBRARY=build/libflashdecode.so \\
      python3 bench/bench_gpu.py --out-dir "$OUT" --commit <short-sha>
(scripts/device_run.sh bench does this, FlashInfer's wheels installed into /tmp/site first.)
`--dry-run` exercises the reporting with made-up timings (no GPU, no torch); `--self-test`
checks the reference, its variants and the layout conversions on tiny shapes (CPU is enough).
"""


def today():
    try:
        d = subprocess.run(["date", "+%F"], capture_output=True, text=True, timeout=5).stdout.strip()
        if d:
            return d
    except Exception:
        pass
    return datetime.date.today().isoformat()


def parse_args(argv):
    ap = argparse.ArgumentParser(description=DOC.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(DOC.split("\n\n")[1:]))
    ap.add_argument("--quick", action="store_true", help="a handful of rows (smoke test)")
    ap.add_argument("--no-peers", action="store_true", help="skip every peer (SDPA, FlashInfer, Flex)")
    ap.add_argument("--no-flashinfer", action="store_true", help="skip FlashInfer")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention")
    ap.add_argument("--flex-variants", action="store_true",
                    help="FlexAttention on the variant rows too (window as a block mask, soft-cap "
                         "as a score_mod; ~20 s of compile per row)")
    ap.add_argument("--no-sweep", action="store_true", help="skip the forced split-count sweep")
    ap.add_argument("--variants-only", action="store_true",
                    help="only the variant rows (window, soft-cap, sinks, head_dim 96, cascade)")
    ap.add_argument("--no-variants", action="store_true", help="skip the variant rows")
    ap.add_argument("--mla", action="store_true",
                    help="add the MLA rows (multi-head latent attention; names start with 'mla-')")
    ap.add_argument("--mla-only", action="store_true",
                    help="only the MLA rows (with --shapes: the MLA rows it selects)")
    ap.add_argument("--out-dir", default=None,
                    help="where the CSVs and the PNG go (default bench/results; with --dry-run, "
                         "a folder under the system's temporary directory)")
    ap.add_argument("--traces", default=None,
                    help="folder of the trace CSVs (default bench/data)")
    ap.add_argument("--commit", default=None, help="commit id for the file names (default: git)")
    ap.add_argument("--tag", default="",
                    help="a word in the file names, <date>-<commit>-<tag>-<gpu>.* (e.g. 'variants' "
                         "for a --variants-only run)")
    ap.add_argument("--shapes", default=None,
                    help="comma-separated substrings: run only rows whose name has one "
                         "(variant rows start with 'var-')")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="seconds (after the ceiling) past which sweeps (at 75%%), then rows, then "
                         "FlashInfer and FlexAttention rows (measured last) are skipped")
    ap.add_argument("--ceiling-reps", type=int, default=10)
    ap.add_argument("--log-dir", default=None,
                    help="where the FlashInfer prebuild writes its log (default a new folder under "
                         "the system's temporary directory)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: made-up timings, to test the CSV / plot / verdict code")
    ap.add_argument("--self-test", action="store_true",
                    help="check the reference (and its variants) and the layout conversions on "
                         "tiny shapes, then exit")
    ap.add_argument("--device", default="cpu", help="device for --self-test")
    return ap.parse_args(argv)


def gpu_tag(dry_run):
    """The card in the file names: h100 or h200 (lower case), else the device's name in
    lower-case letters and digits; 'dryrun' without a GPU."""
    if dry_run:
        return "nogpu"
    try:
        import torch
        name = torch.cuda.get_device_name(0).lower()
    except Exception:  # no torch or no device: the run fails later with its own message
        return "gpu"
    for tag in ("h100", "h200", "b200", "a100"):
        if tag in name:
            return tag
    return re.sub(r"[^a-z0-9]+", "", name) or "gpu"


def want_mla(args):
    """MLA rows with --mla, --mla-only, or a --shapes key that names them ('mla...')."""
    keys = [k for k in (args.shapes or "").split(",") if k]
    return args.mla or args.mla_only or any(k.startswith("mla") for k in keys)


def select_shapes(args, notes):
    """(grid rows, variant rows, MLA rows, trace folder) of this run."""
    from .mla import build_mla_shapes

    trace_dir = find_trace_dir(args.traces)
    only = args.mla_only
    shapes = [] if (args.variants_only or only) else build_shapes(args.quick, trace_dir, notes)
    variants = [] if (args.no_variants or only) else build_variant_shapes(args.quick)
    mla = build_mla_shapes(args.quick) if want_mla(args) else []
    if args.shapes:
        shapes, variants = select(shapes, args.shapes), select(variants, args.shapes)
        # --mla with other rows' keys keeps every MLA row; --mla-only or an 'mla...' key selects
        if only or any(k.startswith("mla") for k in args.shapes.split(",")):
            mla = select(mla, args.shapes)
    return shapes, variants, mla, trace_dir


def main(argv=None):
    args = parse_args(argv)
    if args.self_test:
        from .fake import self_test
        return self_test(args.device)
    if args.out_dir is None:
        args.out_dir = (os.path.join(tempfile.gettempdir(), "flashdecode-bench-dryrun")
                        if args.dry_run else os.path.join(REPO, "bench", "results"))
    notes = []
    shapes, variants, mla, trace_dir = select_shapes(args, notes)
    all_shapes = shapes + variants + mla
    commit = args.commit or git_commit()
    date = today()
    stem = f"{date}-{commit}" + (f"-{args.tag}" if args.tag else "") + "-" + gpu_tag(args.dry_run)
    print(f"bench_gpu: {len(shapes)} rows + {len(variants)} variant rows + {len(mla)} MLA rows, "
          f"traces from {trace_dir}, "
          f"out {args.out_dir}/{stem}.*", flush=True)
    from .report import print_summary, write_outputs

    if args.dry_run:
        from .fake import dry_run
        ceiling = 4.55
        meta = [f"DRY RUN (made-up timings) date {date} commit {commit}",
                f"read_ceiling_tbps {ceiling:.3f} (fake)"]
        recs, sweep = dry_run(all_shapes, ceiling)
        files = write_outputs(args.out_dir, stem + "-dryrun", meta, all_shapes, recs, sweep,
                              ceiling, notes, plot=True)
        print_summary(all_shapes, recs, sweep, ceiling, meta, notes, files)
        return 0

    import torch

    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device (use --dry-run or --self-test here)", file=sys.stderr)
        return 2
    from .ceiling import measure_ceiling
    from .runner import GpuBench

    torch.manual_seed(1234)
    props = torch.cuda.get_device_properties(0)
    sm_count = props.multi_processor_count
    l2 = getattr(props, "L2_cache_size", 0)
    bench = GpuBench(args, torch, shapes, variants, notes,
                     log_dir=args.log_dir or os.path.join(tempfile.gettempdir(),
                                                          f"fd-bench-{os.getpid()}"), mla=mla)
    bench.start_prebuild()  # FlashInfer's kernels compile on the CPU while we measure
    t0 = time.monotonic()
    ceiling, ceiling_desc, copy_tbps = measure_ceiling(torch, sm_count, args.ceiling_reps)
    print(f"[{time.monotonic() - t0:6.1f}s] read ceiling {ceiling:.3f} TB/s ({ceiling_desc}); "
          f"d2d copy {fmt(copy_tbps, 3)} TB/s", flush=True)
    bench.t0 = time.monotonic()  # the budget counts from here
    try:
        import triton
        triton_v = triton.__version__
    except Exception:
        triton_v = "n/a"
    meta = [
        f"flashdecode decode-attention benchmark (bench/bench_gpu.py) date {date} commit {commit}",
        f"gpu {props.name} ({sm_count} SMs, L2 {l2 / MIB:.0f} MiB, {props.total_memory / GIB:.0f} GiB); "
        f"torch {torch.__version__}; cuda {torch.version.cuda}; cudnn "
        f"{torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else 'n/a'}; "
        f"triton {triton_v}",
        f"read_ceiling_tbps {ceiling:.3f} ({ceiling_desc})",
        f"d2d_copy_tbps {fmt(copy_tbps, 3)} (read + write bytes)",
        "bytes = 2 * keys * num_heads_kv * head_dim * sizeof(dtype) (K+V; q and out not counted); "
        "keys = sum of kv_len, or of the keys each row must see: a window's keys, a shared "
        "prefix once; fp8 rows: 1 byte an element + the scales' bytes (float32 per key and kv "
        "head for per-token scales); tbps = bytes / us_graph; pct_ceiling = tbps / read_ceiling_tbps (a row "
        "above 100 means the probe is wrong)",
        f"us_graph: CUDA events around a CUDA graph of R back-to-back calls over R distinct buffer "
        f"sets (R >= 2, K+V read per replay >= {ROTATE_BYTES // MIB} MiB, L2 60 MiB), / R, median "
        f"of 10-20 replays after warm-up; us_eager: median of 10 single calls (events, "
        f"synchronised); plans outside the timed region",
        "impl flashdecode = automatic num_splits planned with kv_len_hint = the real lengths; "
        "flashdecode-nosplit = num_splits 1; sdpa-*/flex get q [B,Hq,1,D], K/V [B,Hkv,N,D] "
        "contiguous, enable_gqa=True; paged rows: peers timed on the contiguous row (copied)",
        "fi-* = FlashInfer (CUDA-core / tensor-core decode wrappers, XQA, cuDNN paged decode, "
        "cascade wrapper) on a 16-key paged copy of the row, pages scattered over the pool, one "
        "page table for the R sets; paged rows restate their contiguous row's fi-* numbers",
        "ragged rows: sdpa/flex get the padded batch with a kv_len mask (context, not the bar: "
        "best peer there = the best fi-* path when one ran)",
        "MLA rows (mla-*): bytes = the latent + rope cache read once (keys x (512 x esize + 64 "
        "x 2); e4m3 latent: 1 byte, rope bf16, + one float32 scale) + q_nope + q_pe + out; "
        "tflops = 2 x q_len x Hq x keys x (576 + 512) / us_graph; fi-mla-fa2 / fi-mla-fa3 = "
        "FlashInfer's BatchMLAPagedAttentionWrapper on the same 64-key scattered pages (its fp8 "
        "path: e4m3 rope too); flashdecode through mla.ours_mla",
        f"ratio_vs_best_peer = best peer us_graph / this us_graph (> 1 = faster); FAIL = output "
        f"outside tolerance (rel err > {TOL}) vs float64 (see -check.csv); n/a = unsupported / "
        f"failed / not a fair peer (reason in the header and -check.csv)",
    ]
    if bench.fd_error:
        notes.append(bench.fd_error)
        print("bench_gpu: " + bench.fd_error, flush=True)
    files = []
    try:
        for _ in bench.run():
            files = write_outputs(args.out_dir, stem, meta, all_shapes, bench.recs, bench.sweep,
                                  ceiling, notes)
    finally:
        bench.stop_prebuild()
    if bench.prebuild is not None and bench.prebuild.started is not None:
        notes.append(f"eager times of rows measured during the FlashInfer prebuild share the "
                     f"CPU with {bench.prebuild.jobs} compilers; graph times do not depend on "
                     f"the host")
    if bench.fatal:
        notes.append(bench.fatal)
    files = write_outputs(args.out_dir, stem, meta, all_shapes, bench.recs, bench.sweep, ceiling,
                          notes, plot=True)
    print(f"total {bench.elapsed():.0f}s after the ceiling")
    print_summary(all_shapes, bench.recs, bench.sweep, ceiling, meta, notes, files)
    if bench.fatal:
        return 2
    return 1 if any(r.status == "FAIL" and r.impl in OURS for r in bench.recs) else 0
