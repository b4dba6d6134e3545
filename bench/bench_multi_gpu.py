#!/usr/bin/env python3
"""
bench_multi_gpu.py — decode attention with the KV cache spread across GPUs:
time per step and its parts, measured on 1..N GPUs, and a model of 8 GPUs.

Shapes: batch 1 and 8, 32 query / 8 kv heads, head_dim 128, bf16 cache,
kv_len 128k, 256k, 512k, 1M (and 2M where the memory allows), one query row.
A step is what flashdecode.distributed.decode does on each rank:
  local     flashdecode over the rank's kv_len / N keys of every sequence
            (DecodePlan.run, fp32 out and lse written into one packed buffer)
  exchange  the all-gather of the N packed fp32 states, m bytes each:
            m = batch x 32 heads x (128 x 4 + 4) bytes (16.1 KiB at B = 1,
            129 KiB at B = 8)
  merge     flashdecode.merge_states of the N states (it first copies the
            gathered out parts into one dense tensor: included)
Modes (CSV column `mode`):
  one-gpu   N shards on GPU 0 (any machine with one GPU): `local` is one
            shard's attention, `exchange` a device copy of the N states (what
            the gather costs without a link), `merge` the N-state merge,
            `step` all N shard attentions one after the other + copy + merge
            in one CUDA graph (one GPU doing the work of N: for reference).
  nccl      N GPUs, one process each (torch.multiprocessing, NCCL group over
            the first N): each rank's parts and whole step captured in CUDA
            graphs and replayed together; the slowest rank's median counts.
            Checked once per N against GPU 0's decode of the whole cache
            (column check_max_abs).
  allgather the NCCL all-gather alone over a size sweep (the model's fit).
  model     8 GPUs on paper (below).
The model of N = 8 GPUs from one-GPU measurements and the measured link:
    t_step(8) = t_local(B, kv_len / 8) + t_exchange(8, m) + t_merge(B, 8)
    t_exchange(N, m) = (N - 1) x (alpha + m / beta)     (ring all-gather:
        N - 1 steps, each moving one rank's m bytes over a link)
t_local and t_merge come from the one-gpu rows (measured on GPU 0); alpha
(latency per step) and beta (link bytes/s) are fitted by least squares to the
`allgather` rows (N = 2..visible GPUs, 4 KiB..16 MiB) when 2+ GPUs are
visible; otherwise they are the assumed --alpha-us / --link-gbps (the note
says so; NVLink 4 on H200: 450 GB/s a direction, NCCL's small-message step
a few us). NCCL may pick other algorithms (tree, NVLS on NVSwitch), so this
is an estimate, stated as such; with 8 GPUs visible the nccl rows measure it.
Speedup = t_step(1 GPU, whole kv_len) / t_step(8).

Usage (GPU machine, repository root, after `make`):
  PYTHONPATH=python FLASHDECODE_LIBRARY=build/libflashdecode.so \\
      python3 bench/bench_multi_gpu.py --out-dir bench/results
  --quick: kv_len 128k only. --gpus N: use the first N GPUs.
  --cpu: the same code on the CPU (flashdecode's CPU backend, host timers,
    gloo between 2 forked processes for the nccl mode, tiny kv_len): checks
    the script, not the hardware (its timings mean nothing).
  --dry-run: print the configurations and their memory, measure nothing.
Writes <date>-<commit>-<gpu>-multi.csv (# lines: date, commit, GPU, versions,
the model's parameters and formula) under --out-dir.
"""
import argparse
import csv
import datetime
import math
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import REPO, git_commit  # noqa: E402

HQ, HKV, D = 32, 8, 128
KV_LENS = (131072, 262144, 524288, 1048576, 2097152)
CPU_KV_LENS = (2048, 8192)
BATCHES = (1, 8)
ROTATE_BYTES = 256 << 20  # K+V read by one replay over the rotating sets (> 2 x L2)
SWEEP_BYTES = tuple(4096 << (2 * i) for i in range(6))  # 4 KiB .. 4 MiB
COLUMNS = ["date", "commit", "gpu", "gpus_visible", "mode", "batch", "kv_len", "shards",
           "us_local", "us_exchange", "us_merge", "us_step", "us_parts_sum", "state_bytes",
           "check_max_abs", "note"]


def state_bytes(batch):
    return batch * HQ * (D * 4 + 4)


def kv_bytes(batch, keys):
    return 2 * batch * keys * HKV * D * 2  # K and V, bf16


def shard_counts(n_max):
    """1, 2, 4, ... up to n_max, and n_max itself."""
    out, n = [], 1
    while n <= n_max:
        out.append(n)
        n *= 2
    if out[-1] != n_max:
        out.append(n_max)
    return out


def import_flashdecode():
    lib = os.path.join(REPO, "build", "libflashdecode.so")
    if "FLASHDECODE_LIBRARY" not in os.environ and os.path.exists(lib):
        os.environ["FLASHDECODE_LIBRARY"] = lib
    pkg = os.path.join(REPO, "python")
    if pkg not in sys.path:
        sys.path.append(pkg)
    import flashdecode

    return flashdecode


# ---------------------------------------------------------------------------
# Clocks: CUDA graphs + events on a GPU, perf_counter on the CPU.


class CudaClock:
    def __init__(self, torch, replays=20):
        self.torch, self.replays = torch, replays

    def time(self, fn, replicas=1):
        """Median us of one fn(i) call: a graph of fn(0..replicas-1) replayed."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture
            for i in range(replicas):
                fn(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(replicas):
                fn(i)
        graph.replay()
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(self.replays)]
        for s, e in ev:
            s.record()
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        us = statistics.median(s.elapsed_time(e) * 1e3 / replicas for s, e in ev)
        del graph
        return us


class HostClock:
    def __init__(self, reps=5):
        self.reps = reps

    def time(self, fn, replicas=1):
        for i in range(replicas):
            fn(i)
        ts = []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            for i in range(replicas):
                fn(i)
            ts.append((time.perf_counter() - t0) * 1e6 / replicas)
        return statistics.median(ts)


# ---------------------------------------------------------------------------
# One rank's step: buffers, and the three parts as callables.


class Step:
    """The buffers and calls of one rank's decode step over `keys` keys a sequence."""

    def __init__(self, torch, fd, device, batch, keys, shards, exchange, cpu):
        self.torch, self.fd, self.batch, self.keys, self.shards = torch, fd, batch, keys, shards
        rows = batch * HQ
        self.rows = rows
        per_set = kv_bytes(batch, keys)
        self.sets = 1 if cpu else max(1, min(8, math.ceil(ROTATE_BYTES / per_set)))
        dtype = torch.bfloat16
        self.q = torch.randn(batch, 1, HQ, D, device=device).to(dtype)
        self.k = [torch.randn(batch, keys, HKV, D, device=device, dtype=dtype)
                  for _ in range(self.sets)]
        self.v = [torch.randn_like(self.k[0]) for _ in range(self.sets)]
        self.kv_len = torch.full((batch,), keys, dtype=torch.int32, device=device)
        self.plan = fd.DecodePlan(batch=batch, num_heads_q=HQ, num_heads_kv=HKV, head_dim=D,
                                  dtype=dtype, kv_capacity=keys, device=str(device),
                                  out_dtype=torch.float32)
        self.packed = torch.empty(rows * (D + 1), dtype=torch.float32, device=device)
        self.local_out = self.packed[:rows * D].view(batch, 1, HQ, D)
        self.local_lse = self.packed[rows * D:].view(batch, HQ, 1)
        self.gathered = torch.empty(shards, rows * (D + 1), dtype=torch.float32, device=device)
        self.out = torch.empty(batch, 1, HQ, D, dtype=dtype, device=device)
        self.lse = torch.empty(batch, HQ, 1, dtype=torch.float32, device=device)
        self.exchange_fn = exchange  # (gathered, packed) -> None

    def local(self, i=0):
        s = i % self.sets
        self.plan.run(self.q, self.k[s], self.v[s], self.kv_len, out=self.local_out,
                      lse=self.local_lse)

    def exchange(self, i=0):
        self.exchange_fn(self.gathered, self.packed)

    def merge(self, i=0):
        n, rows = self.shards, self.rows
        so = self.gathered[:, :rows * D].view(n, self.batch, 1, HQ, D)
        sl = self.gathered[:, rows * D:].view(n, self.batch, HQ, 1)
        self.fd.merge_states(so, sl, out=self.out, lse=self.lse)

    def step(self, i=0):
        self.local(i)
        self.exchange(i)
        self.merge(i)


def copy_exchange(gathered, packed):
    """N shards on one GPU: the states are already there; the gather is a copy."""
    gathered.copy_(packed.unsqueeze(0).expand_as(gathered))


# ---------------------------------------------------------------------------
# Mode one-gpu: N shards on one device.


def run_one_gpu(torch, fd, clock, device, batches, kv_lens, shard_list, mem_bytes, rows_out, log):
    for batch in batches:
        for kv_len in kv_lens:
            for n in shard_list:
                keys = kv_len // n
                need = kv_bytes(batch, keys) * 1.05 + (64 << 20)
                if need > mem_bytes:
                    log("  one-gpu B=%d kv=%d N=%d: skipped (%.1f GiB of K+V > memory)"
                        % (batch, kv_len, n, need / 2**30))
                    rows_out.append(dict(mode="one-gpu", batch=batch, kv_len=kv_len, shards=n,
                                         note="skipped: K+V %.1f GiB > memory" % (need / 2**30)))
                    continue
                st = Step(torch, fd, device, batch, keys, n, copy_exchange, device == "cpu")
                t_local = clock.time(st.local, st.sets)
                t_ex = clock.time(st.exchange)
                t_merge = clock.time(st.merge)

                def whole(i, st=st, n=n):  # one GPU doing all N shards, then copy + merge
                    for j in range(n):
                        st.local(i * n + j)
                    st.exchange()
                    st.merge()

                t_step = clock.time(whole, max(1, st.sets // n)) if n > 1 else clock.time(st.step, st.sets)
                rows_out.append(dict(mode="one-gpu", batch=batch, kv_len=kv_len, shards=n,
                                     us_local=t_local, us_exchange=t_ex, us_merge=t_merge,
                                     us_step=t_step, us_parts_sum=t_local + t_ex + t_merge,
                                     state_bytes=state_bytes(batch),
                                     note="step = the %d shards one after the other" % n
                                     if n > 1 else ""))
                log("  one-gpu B=%d kv=%-8d N=%d: local %8.1f  copy %6.1f  merge %6.1f  step %8.1f us"
                    % (batch, kv_len, n, t_local, t_ex, t_merge, t_step))
                del st
                if device != "cpu":
                    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------
# Mode nccl: one process per GPU.


def _rank_main(rank, world, args_dict, store_path, result_path):
    import torch
    import torch.distributed as dist

    cpu = args_dict["cpu"]
    if cpu:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        torch.set_num_threads(1)
        device = "cpu"
    else:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    fd = import_flashdecode()
    backend = "gloo" if cpu else "nccl"
    kw = {} if cpu else {"device_id": device}
    dist.init_process_group(backend, init_method="file://" + store_path, rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300), **kw)
    clock = HostClock(reps=2) if cpu else CudaClock(torch)
    results = []
    try:
        for n in [s for s in shard_counts(world) if s >= 2]:
            group = dist.new_group(ranks=list(range(n)))  # every rank takes part in the creation
            if rank < n:
                results += _measure_group(torch, dist, fd, clock, device, rank, n, group, args_dict)
            dist.barrier()
    finally:
        everyone = [None] * world
        dist.all_gather_object(everyone, results)
        if rank == 0:
            torch.save(everyone, result_path)
        dist.destroy_process_group()


def _measure_group(torch, dist, fd, clock, device, rank, n, group, a):
    def gather(gathered, packed):  # what flashdecode.distributed does (flat tensors)
        dist.all_gather_into_tensor(gathered.view(-1), packed, group=group)

    out = []
    # correctness once: rank r holds keys [r*L/n, (r+1)*L/n) of a seeded cache
    keys = a["check_kv"]
    torch.manual_seed(1234)
    q = torch.randn(1, 1, HQ, D, device=device).to(torch.bfloat16)
    k = torch.randn(1, keys, HKV, D, device=device).to(torch.bfloat16)
    v = torch.randn(1, keys, HKV, D, device=device).to(torch.bfloat16)
    lo, hi = rank * keys // n, (rank + 1) * keys // n
    import flashdecode.distributed as fdd

    got = fdd.decode(q, k[:, lo:hi].contiguous(), v[:, lo:hi].contiguous(),
                     torch.tensor([hi - lo], dtype=torch.int32, device=device), group=group,
                     out_dtype=torch.float32)
    want = fd.decode(q, k, v, torch.tensor([keys], dtype=torch.int32, device=device),
                     out_dtype=torch.float32)
    err = float((got - want).abs().max())
    del q, k, v
    # the all-gather over a size sweep (the model's fit)
    for nbytes in a["sweep"]:
        src = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty(n * (nbytes // 4), dtype=torch.float32, device=device)
        dist.barrier(group=group)
        out.append(dict(mode="allgather", shards=n, state_bytes=nbytes,
                        us_exchange=clock.time(lambda i: gather(dst, src)), rank=rank))
    for batch in a["batches"]:
        for kv_len in a["kv_lens"]:
            keys = kv_len // n
            if kv_bytes(batch, keys) * 1.05 + (64 << 20) > a["mem_bytes"]:
                out.append(dict(mode="nccl", batch=batch, kv_len=kv_len, shards=n, rank=rank,
                                note="skipped: K+V > memory"))
                continue
            st = Step(torch, fd, device, batch, keys, n, gather, a["cpu"])
            r = {}
            for name, fn, reps in (("local", st.local, st.sets), ("exchange", st.exchange, 1),
                                   ("merge", st.merge, 1), ("step", st.step, st.sets)):
                dist.barrier(group=group)  # the ranks replay together
                r[name] = clock.time(fn, reps)
            out.append(dict(mode="nccl", batch=batch, kv_len=kv_len, shards=n, rank=rank,
                            us_local=r["local"], us_exchange=r["exchange"], us_merge=r["merge"],
                            us_step=r["step"], us_parts_sum=r["local"] + r["exchange"] + r["merge"],
                            state_bytes=state_bytes(batch), check_max_abs=err))
            del st
            if not a["cpu"]:
                torch.cuda.empty_cache()
    return out


def run_multi(torch, world, args_dict, rows_out, log, start_method):
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        store, result = os.path.join(tmp, "store"), os.path.join(tmp, "result.pt")
        ctx = mp.start_processes(_rank_main, args=(world, args_dict, store, result), nprocs=world,
                                 join=False, start_method=start_method)
        t0 = time.monotonic()
        while not ctx.join(timeout=5):
            if time.monotonic() - t0 > args_dict["timeout_s"]:
                for p in ctx.processes:
                    p.kill()
                raise RuntimeError("the %d-process run did not finish in %d s"
                                   % (world, args_dict["timeout_s"]))
        everyone = torch.load(result)
    # the slowest rank of each configuration counts
    merged = {}
    for rank_rows in everyone:
        for r in rank_rows:
            key = (r["mode"], r.get("batch"), r.get("kv_len"), r["shards"], r.get("state_bytes"))
            cur = merged.setdefault(key, dict(r))
            for f in ("us_local", "us_exchange", "us_merge", "us_step", "us_parts_sum",
                      "check_max_abs"):
                if f in r and r[f] is not None:
                    cur[f] = max(cur.get(f) or 0.0, r[f])
    for r in merged.values():
        r.pop("rank", None)
        rows_out.append(r)
        if r["mode"] == "nccl" and "us_step" in r:
            log("  nccl    B=%d kv=%-8d N=%d: local %8.1f  gather %6.1f  merge %6.1f  step %8.1f us"
                "  (check %.2g)" % (r["batch"], r["kv_len"], r["shards"], r["us_local"],
                                    r["us_exchange"], r["us_merge"], r["us_step"],
                                    r["check_max_abs"]))


# ---------------------------------------------------------------------------
# The model.


def fit_link(rows):
    """(alpha_us, beta_bytes_per_us) from the allgather rows: t = (N-1)(alpha + m/beta)."""
    pts = [((r["shards"] - 1), (r["shards"] - 1) * r["state_bytes"], r["us_exchange"])
           for r in rows if r["mode"] == "allgather" and r.get("us_exchange")]
    if len(pts) < 2:
        return None
    # least squares for t = a * x1 + b * x2 (no intercept): 2x2 normal equations
    s11 = sum(x1 * x1 for x1, _, _ in pts)
    s12 = sum(x1 * x2 for x1, x2, _ in pts)
    s22 = sum(x2 * x2 for _, x2, _ in pts)
    t1 = sum(x1 * t for x1, _, t in pts)
    t2 = sum(x2 * t for _, x2, t in pts)
    det = s11 * s22 - s12 * s12
    if det <= 0:
        return None
    a = (t1 * s22 - t2 * s12) / det
    b = (s11 * t2 - s12 * t1) / det
    if b <= 0:
        return None
    return max(a, 0.0), 1.0 / b


def model_rows(rows, link, n_model, batches, kv_lens):
    alpha, beta = link
    out = []
    one = {(r["batch"], r["kv_len"], r["shards"]): r for r in rows
           if r["mode"] == "one-gpu" and r.get("us_local") is not None}
    for batch in batches:
        for kv_len in kv_lens:
            shard = one.get((batch, kv_len, n_model))
            whole = one.get((batch, kv_len, 1))
            if shard is None:
                continue
            m = state_bytes(batch)
            t_ex = (n_model - 1) * (alpha + m / beta)
            t = shard["us_local"] + t_ex + shard["us_merge"]
            note = "t_local(kv/%d) + (%d-1)(alpha + m/beta) + t_merge(%d)" % (n_model, n_model,
                                                                             n_model)
            if whole is not None and whole.get("us_step"):
                note += "; speedup vs 1 GPU %.2fx" % (whole["us_step"] / t)
            out.append(dict(mode="model", batch=batch, kv_len=kv_len, shards=n_model,
                            us_local=shard["us_local"], us_exchange=t_ex,
                            us_merge=shard["us_merge"], us_step=t, us_parts_sum=t,
                            state_bytes=m, note=note))
    return out


# ---------------------------------------------------------------------------


def nccl_version(torch):
    try:
        v = torch.cuda.nccl.version()
        return ", NCCL " + (".".join(map(str, v)) if isinstance(v, tuple) else str(v))
    except Exception:
        return ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--out-dir", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--commit", default=None)
    ap.add_argument("--gpus", type=int, default=0, help="use the first N GPUs (default all)")
    ap.add_argument("--quick", action="store_true", help="kv_len 128k only")
    ap.add_argument("--cpu", action="store_true", help="the code path on the CPU (tiny shapes)")
    ap.add_argument("--dry-run", action="store_true", help="list the configurations only")
    ap.add_argument("--model-gpus", type=int, default=8)
    ap.add_argument("--alpha-us", type=float, default=5.0,
                    help="assumed all-gather step latency when fewer than 2 GPUs are measured")
    ap.add_argument("--link-gbps", type=float, default=450.0,
                    help="assumed link bandwidth (GB/s a direction; NVLink 4: 450)")
    ap.add_argument("--timeout-s", type=int, default=1800)
    args = ap.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    commit = args.commit or git_commit()
    date = datetime.date.today().isoformat()

    if args.dry_run:
        kv_lens = KV_LENS[:1] if args.quick else KV_LENS
        for batch in BATCHES:
            for kv_len in kv_lens:
                for n in shard_counts(args.model_gpus):
                    log("B=%d kv_len=%d shards=%d: K+V %.2f GiB a GPU, state %d bytes a rank"
                        % (batch, kv_len, n, kv_bytes(batch, kv_len // n) / 2**30,
                           state_bytes(batch)))
        return 0

    import torch

    fd = import_flashdecode()
    if args.cpu:
        import torch._dynamo  # noqa: F401  (a custom op's first call imports it: once, before forking)

        device, gpu_name, visible = "cpu", "cpu", 0
        mem = 4 << 30
        clock = HostClock(reps=2)
        kv_lens = CPU_KV_LENS[:1] if args.quick else CPU_KV_LENS
        world = 2
    else:
        if not torch.cuda.is_available():
            log("bench_multi_gpu: no GPU (use --cpu for the CPU path or --dry-run)")
            return 2
        visible = torch.cuda.device_count()
        world = min(visible, args.gpus) if args.gpus else visible
        device = torch.device("cuda", 0)
        gpu_name = torch.cuda.get_device_name(0).replace(" ", "-")
        mem = torch.cuda.mem_get_info(0)[0] * 0.9
        clock = CudaClock(torch)
        kv_lens = KV_LENS[:1] if args.quick else KV_LENS
    shard_list = sorted(set(shard_counts(max(world, 1)) + [args.model_gpus]))
    rows = []
    notes = []
    log("bench_multi_gpu: %s, %d %s, commit %s"
        % (gpu_name, world, "CPU ranks" if args.cpu else "GPU(s) used", commit))

    if world >= 2:  # multi-process first: forked ranks must not inherit a used OpenMP/CUDA
        log("== nccl: one process per %s, N = 2..%d" % ("CPU rank" if args.cpu else "GPU", world))
        a = dict(cpu=args.cpu, batches=BATCHES, kv_lens=kv_lens, mem_bytes=mem,
                 sweep=SWEEP_BYTES[:3] if args.cpu else SWEEP_BYTES,
                 check_kv=1024 if args.cpu else 131072, timeout_s=args.timeout_s)
        run_multi(torch, world, a, rows, log, "fork" if args.cpu else "spawn")

    log("== one-gpu: N shards on %s" % ("the CPU" if args.cpu else "GPU 0"))
    run_one_gpu(torch, fd, clock, device, BATCHES, kv_lens, shard_list, mem, rows, log)

    link = fit_link(rows)
    if link is not None and world >= 2:
        notes.append("model: alpha %.2f us, beta %.1f GB/s, fitted to the allgather rows "
                     "(N = 2..%d)" % (link[0], link[1] / 1e3, world))
    else:
        link = (args.alpha_us, args.link_gbps * 1e3)
        notes.append("model: alpha %.2f us, beta %.1f GB/s ASSUMED (fewer than 2 GPUs measured)"
                     % (link[0], link[1] / 1e3))
    rows += model_rows(rows, link, args.model_gpus, BATCHES, kv_lens)
    for r in rows:
        if r["mode"] == "model":
            log("  model   B=%d kv=%-8d N=%d: step %8.1f us (exchange %.1f)  %s"
                % (r["batch"], r["kv_len"], r["shards"], r["us_step"], r["us_exchange"], r["note"]))

    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, "%s-%s-%s-multi.csv" % (date, commit, gpu_name.lower()))
    with open(path, "w", newline="") as f:
        f.write("# bench_multi_gpu.py, %s, commit %s, %s x %d visible (%d used), torch %s%s\n"
                % (date, commit, gpu_name, visible, world, torch.__version__, nccl_version(torch)))
        f.write("# shapes: Hq %d / Hkv %d, head_dim %d, bf16 cache, fp32 states, q_len 1\n"
                % (HQ, HKV, D))
        f.write("# t_step(N) = t_local(B, kv_len/N) + (N-1)(alpha + m/beta) + t_merge(B, N); "
                "m = B x %d x (%d x 4 + 4) bytes\n" % (HQ, D))
        for n in notes:
            f.write("# %s\n" % n)
        if args.cpu:
            f.write("# --cpu: the code path on the CPU; timings mean nothing\n")
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            full = {c: "" for c in COLUMNS}
            full.update(date=date, commit=commit, gpu=gpu_name, gpus_visible=visible)
            for k, v in r.items():
                full[k] = ("%.2f" % v if k.startswith("us_") else "%.3g" % v) \
                    if isinstance(v, float) else v
            w.writerow(full)
    log("wrote %s" % path)
    bad = [r for r in rows if r.get("check_max_abs") is not None and not r["check_max_abs"] <= 1e-3]
    if bad:
        log("FAIL: the merged result differs from the whole-cache decode: %s" % bad[0])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
