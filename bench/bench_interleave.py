#!/usr/bin/env python3
"""bench_interleave.py — what one attention call costs between a model's GEMMs (H200).

The end-to-end benchmark (bench_e2e.py) put flashdecode ~8 us a layer behind SDPA's cuDNN
backend at B=1 8k while the kernels alone tie in bench_gpu.py. This isolates that: L
"layers", each with its own bf16 weight [4096, 4096] and its own KV cache (so nothing stays
in L2 from layer to layer), timed as CUDA graphs of

  gemm         L x (x @ W_l)                     the model's other work, reduced to one GEMM
  attn:<impl>  L x attention(q, K_l, V_l)        back to back, as bench_gpu.py times them
  both:<impl>  L x (x @ W_l, then attention)     interleaved, as in a model

and reports, per impl, the cost of an attention call inside the model, (both - gemm) / L,
against its cost back to back, attn / L. impls: flashdecode (DecodePlan.run on a
[B, S, Hkv, D] cache), sdpa-cudnn and sdpa-flash (exact-length [B, Hkv, S, D] K/V,
enable_gqa); then the end-to-end benchmark's conditions: a head-major [B, Hkv, S + pad,
D] static cache read through flashdecode.decode() or a DecodePlan, and cuDNN over its exact
slice. A gap only flashdecode shows points at what differs between the kernels in a
model's stream: the split kernel's large shared-memory carveout beside cuBLAS's, its second
(combine) launch, programmatic dependent launch inside a graph.

  PYTHONPATH=python FLASHDECODE_LIBRARY=build/libflashdecode.so \\
      python3 bench/bench_interleave.py [--batch 1] [--context 8192] [--layers 32]
Prints one line per measurement and writes nothing (a diagnostic; its numbers go to
dev/NOTES.md with the run's log).
"""
import argparse
import statistics
import sys

import torch


def time_graph(fn, reps=20):
    """(median ms of one replay, the graph) for a CUDA graph of fn()."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up, plans, cuDNN's choice
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts), g


ATTN_KERNELS = ("fd_", "cudnn", "flash", "sdpa", "fmha")


def attention_calls(rows):
    """The attention calls among a replay's kernels (graphtrace rows), each a dict: idle
    (before its first kernel), durs (its kernels' durations), start and end (first start,
    last end). A call starts at the first attention kernel's name, or after another kernel,
    and takes the attention kernels that follow."""
    first, calls, prev = None, [], False
    for start, dur, idle, name in rows:
        attn = any(k in name for k in ATTN_KERNELS)
        if attn:
            first = first or name
            if name == first or not prev:
                calls.append({"idle": idle, "start": start, "end": start + dur, "durs": [dur]})
            else:
                calls[-1]["durs"].append(dur)
                calls[-1]["end"] = max(calls[-1]["end"], start + dur)
        prev = attn
    return calls


def profile_line(name, where, graph):
    from graphtrace import replay_kernels
    calls = attention_calls(replay_kernels(graph.replay))
    if not calls:
        return f"    profile {name:22s} {where}: no attention kernels in the trace"
    med = statistics.median
    n = max(len(c["durs"]) for c in calls)
    durs = [med([c["durs"][i] for c in calls if len(c["durs"]) > i]) for i in range(n)]
    return (f"    profile {name:22s} {where}: idle before {med([c['idle'] for c in calls]):5.2f}, "
            f"kernels {' + '.join('%.2f' % d for d in durs)}, span "
            f"{med([c['end'] - c['start'] for c in calls]):6.2f} us (medians of {len(calls)} calls)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--between", default="gemm",
                    choices=["gemm", "gemm+small", "gemm+small+tinygemm"],
                    help="a layer's other work: one GEMM, or the GEMM and then what a "
                    "transformers layer runs just before attention: six small elementwise "
                    "kernels (rotary's) and the new token's K and V written into the cache "
                    "(index_copy_), so the attention follows kernels without shared memory; "
                    "+tinygemm: then a [1, 128] x [128, 128] GEMM (cuBLAS, shared memory) "
                    "right before the attention")
    ap.add_argument("--pad", type=int, default=84,
                    help="the head-major rows' cache capacity beyond the context (bench_e2e's "
                    "static cache: 84 keys at its defaults)")
    ap.add_argument("--splits", default="",
                    help="comma-separated split counts: one more flashdecode row per count "
                    "(a DecodePlan with num_splits=N), to find the count a model's stream "
                    "prefers (the automatic count was tuned back to back)")
    ap.add_argument("--impls", default="",
                    help="comma-separated names of the rows to run (default: all)")
    ap.add_argument("--profile", action="store_true",
                    help="also profile one replay of each graph (torch.profiler): each attention "
                    "call's kernels, the idle time before it and its span")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_interleave: needs a CUDA GPU", file=sys.stderr)
        return 2
    import flashdecode
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, S, L, H = args.batch, args.context, args.layers, args.hidden
    HQ, HKV, D = 32, 8, 128
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(B, H, device=dev, dtype=dt, generator=g)
    W = [torch.randn(H, H, device=dev, dtype=dt, generator=g) * 0.02 for _ in range(L)]
    q = torch.randn(B, 1, HQ, D, device=dev, dtype=dt, generator=g)
    # one cache per layer, [B, S, Hkv, D] (flashdecode) and its [B, Hkv, S, D] view (SDPA)
    K = [torch.randn(B, S, HKV, D, device=dev, dtype=dt, generator=g) for _ in range(L)]
    V = [torch.randn(B, S, HKV, D, device=dev, dtype=dt, generator=g) for _ in range(L)]
    kv_len = torch.full((B,), S, dtype=torch.int32, device=dev)
    plan = flashdecode.DecodePlan(batch=B, q_len=1, num_heads_q=HQ, num_heads_kv=HKV,
                                  head_dim=D, dtype=dt, kv_capacity=S, device=dev,
                                  kv_len_hint=[S] * B)
    out = torch.empty_like(q)
    qs = q.transpose(1, 2)  # [B, HQ, 1, D]
    # the end-to-end benchmark's conditions: transformers' static cache, head-major
    # [B, Hkv, capacity, D] with capacity = context + pad, kv_len on the device, and
    # flashdecode.decode (the torch op flashdecode.hf calls) or a DecodePlan over it
    cap = S + args.pad
    KH = [torch.randn(B, HKV, cap, D, device=dev, dtype=dt, generator=g) for _ in range(L)]
    VH = [torch.randn(B, HKV, cap, D, device=dev, dtype=dt, generator=g) for _ in range(L)]
    plan_h = flashdecode.DecodePlan(batch=B, q_len=1, num_heads_q=HQ, num_heads_kv=HKV,
                                    head_dim=D, dtype=dt, kv_capacity=cap, device=dev)
    # each layer's (K, V) as flashdecode takes them ([B, S, Hkv, D]) and as SDPA does
    # ([B, Hkv, S, D]; the head-major cache sliced to the context's keys)
    seq_fd = list(zip(K, V))
    seq_sdpa = [(k.transpose(1, 2), v.transpose(1, 2)) for k, v in seq_fd]
    head_fd = [(k.transpose(1, 2), v.transpose(1, 2)) for k, v in zip(KH, VH)]
    head_sdpa = [(k[:, :, :S], v[:, :, :S]) for k, v in zip(KH, VH)]

    def fd_plan(pl, kv):
        return lambda l: pl.run(q, *kv[l], kv_len, out=out)

    def fd_decode(kv):
        return lambda l: flashdecode.decode(q, *kv[l], kv_len)

    def sdpa(backend, kv):
        def call(l):
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qs, *kv[l], enable_gqa=True)
        return call

    impls = {"flashdecode": fd_plan(plan, seq_fd),
             "sdpa-cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, seq_sdpa),
             "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION, seq_sdpa),
             "fd decode()": fd_decode(seq_fd),
             "fd head-major plan": fd_plan(plan_h, head_fd),
             "fd head-major decode()": fd_decode(head_fd),
             "sdpa-cudnn head-major": sdpa(SDPBackend.CUDNN_ATTENTION, head_sdpa)}
    for n in [int(v) for v in args.splits.split(",") if v]:
        pl = flashdecode.DecodePlan(batch=B, q_len=1, num_heads_q=HQ, num_heads_kv=HKV,
                                    head_dim=D, dtype=dt, kv_capacity=S, device=dev,
                                    num_splits=n)
        impls["fd splits=%d" % n] = fd_plan(pl, seq_fd)
    if args.impls:
        keep = args.impls.split(",") + ["fd splits=%s" % v for v in args.splits.split(",") if v]
        impls = {k: v for k, v in impls.items() if k in keep}
    ys = [None] * L

    small = torch.randn(B, HQ, 1, D, device=dev, dtype=dt, generator=g)
    pos = torch.tensor([S - 1], device=dev)
    newk = torch.randn(B, HKV, 1, D, device=dev, dtype=dt, generator=g)

    tiny_a = torch.randn(1, 128, device=dev, dtype=dt, generator=g)
    tiny_w = torch.randn(128, 128, device=dev, dtype=dt, generator=g)
    tiny_out = [None] * L

    def other(l):
        ys[l] = x @ W[l]
        if args.between.startswith("gemm+small"):
            for _ in range(6):
                small.mul_(1.0)
            KH[l].index_copy_(2, pos, newk)
            VH[l].index_copy_(2, pos, newk)
        if args.between.endswith("+tinygemm"):
            tiny_out[l] = tiny_a @ tiny_w

    def gemm():
        for l in range(L):
            other(l)

    t_gemm = time_graph(gemm)[0]
    print(f"bench_interleave: {torch.cuda.get_device_name()} B={B} context={S} layers={L} "
          f"32/8 d128 bf16; flashdecode {flashdecode.version()} ({plan.num_splits} splits; "
          f"head-major capacity {cap}: {plan_h.num_splits} splits)")
    print(f"  {args.between:24s} {t_gemm * 1e3 / L:8.2f} us a layer")
    for name, call in impls.items():
        def attn(call=call):
            for l in range(L):
                call(l)

        def both(call=call):
            for l in range(L):
                other(l)
                call(l)
        try:
            (t_attn, g_attn), (t_both, g_both) = time_graph(attn), time_graph(both)
        except Exception as exc:  # a backend this torch build lacks
            print(f"  {name:24s} unavailable: {type(exc).__name__}: {str(exc)[:100]}")
            continue
        alone, inside = t_attn * 1e3 / L, (t_both - t_gemm) * 1e3 / L
        print(f"  {name:24s} back to back {alone:8.2f} us, between layers ({args.between}) {inside:8.2f} us "
              f"(+{inside - alone:.2f})")
        if args.profile:
            for where, graph in (("back to back", g_attn), ("between", g_both)):
                try:
                    print(profile_line(name, where, graph))
                except Exception as exc:  # a diagnostic: never lose the timing for it
                    print(f"    profile {name}: failed: {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
