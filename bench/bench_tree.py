#!/usr/bin/env python3
"""bench_tree.py — speculative-decoding tree verify on the GPU: flashdecode's decode with a
tree mask against FlashInfer's BatchPrefillWithPagedKVCacheWrapper (fa2) with a custom mask,
on the same data, in one process.

Rows: B in {1, 8, 32} x committed prefix {1k, 8k, 32k} x trees of {8, 16, 64} draft nodes
(random EAGLE-shaped: each node's parent a recent earlier node), for Llama-3-8B heads (32
query / 8 kv heads, head_dim 128) and gpt-oss heads (64 / 8, head_dim 64), bf16, 16-key
pages scattered over the pool (one block table for ours and FlashInfer's page indices).
Beside each (model, B, prefix): our plain q_len = 1 decode of the same prefix
(`tree-...-plain`), the bar of the issue's cost target (a 64-node verify over a 32k prefix
at B=1 <= 1.3x it).

FlashInfer gets the same K/V pages, q as [B * T, Hq, D] (qo_indptr), and the mask as its
flattened bool custom_mask (q_len x kv_len a request: the prefix columns all True, the
draft columns the tree), packed by its plan, which runs outside the timed region.

Timing (gpubench.timing.measure): CUDA events around a CUDA graph of R calls over R buffer
sets (K+V over the sets >= 256 MiB), median of replays; the read ceiling from
bench/probe/read_probe.cu in the same run. bytes = K+V of every key once + q + out;
pct_ceiling = bytes / time / ceiling. Both outputs of set 0 are checked against float64
attention computed per row (one sequence; the row's prefix and the keys of its own path).

Writes <date>-<commit>-<gpu>-tree.csv and -tree-summary.json ({"row", "ours_us",
"best_peer", "best_peer_us", "ratio", "pct_ceiling"}, the format of bench_gpu.py's summary)
into --out-dir and prints the table and the targets' verdicts.

  PYTHONPATH=python:bench:/tmp/site FLASHDECODE_LIBRARY=build/libflashdecode.so \\
      python3 bench/bench_tree.py --out-dir "$OUT" --commit <short-sha>
"""
import argparse
import csv
import json
import math
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpubench.cli import gpu_tag, today  # noqa: E402
from gpubench.common import ROTATE_BYTES  # noqa: E402
from gpubench.timing import GraphFailed, measure, replicas_for  # noqa: E402

MODELS = {"llama8b": (32, 8, 128), "gptoss": (64, 8, 64)}
BATCHES = (1, 8, 32)
PREFIXES = (1024, 8192, 32768)
TREES = (8, 16, 64)
PAGE = 16
TOL = 2e-2  # bf16: max |out - ref| / max |ref|
FI_WS_BYTES = 256 << 20


def eagle_tree(torch, n, gen):
    """bool [n, n]: row t sees t and its ancestors; node t's parent is one of the 8 before it."""
    m = torch.zeros(n, n, dtype=torch.bool)
    for t in range(n):
        m[t, t] = True
        if t:
            lo = max(0, t - 8)
            m[t] |= m[lo + int(torch.randint(t - lo, (1,), generator=gen))]
    return m


class TreeSet:
    """One row's data: R buffer sets of q, paged K/V pools and outputs, one block table."""

    def __init__(self, torch, model, B, prefix, T, replicas, seed):
        Hq, Hkv, D = MODELS[model]
        self.B, self.T, self.Hq, self.Hkv, self.D = B, T, Hq, Hkv, D
        self.kv = prefix + T
        gen = torch.Generator().manual_seed(seed)
        pages_per_seq = math.ceil(self.kv / PAGE)
        self.num_pages = B * pages_per_seq
        perm = torch.randperm(self.num_pages, generator=gen)
        self.block_table = perm.view(B, pages_per_seq).to(torch.int32).cuda()
        self.kv_len = torch.full((B,), self.kv, dtype=torch.int32, device="cuda")
        self.masks = torch.stack([eagle_tree(torch, T, gen) for _ in range(B)]).cuda()
        self.sets = []
        g = torch.Generator(device="cuda").manual_seed(seed)  # the same data for every impl
        for _ in range(replicas):
            q = torch.randn(B, T, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
            k = torch.randn(self.num_pages, PAGE, Hkv, D, device="cuda", dtype=torch.bfloat16,
                            generator=g)
            v = torch.randn(self.num_pages, PAGE, Hkv, D, device="cuda", dtype=torch.bfloat16,
                            generator=g)
            self.sets.append((q, k, v))

    def kv_bytes(self):
        return 2 * self.B * self.kv * self.Hkv * self.D * 2

    def io_bytes(self):
        return self.kv_bytes() + 2 * self.B * self.T * self.Hq * self.D * 2

    def reference(self, torch, out, b=0):
        """max |out - ref| / max |ref| of sequence b (float64, one row at a time)."""
        q, k, v = self.sets[0]
        pages = self.block_table[b].long()
        kk = k[pages].reshape(-1, self.Hkv, self.D)[: self.kv].double()
        vv = v[pages].reshape(-1, self.Hkv, self.D)[: self.kv].double()
        group = self.Hq // self.Hkv
        kk = kk.repeat_interleave(group, dim=1)  # [kv, Hq, D]
        vv = vv.repeat_interleave(group, dim=1)
        P = self.kv - self.T
        ref = torch.empty(self.T, self.Hq, self.D, dtype=torch.float64, device="cuda")
        for t in range(self.T):
            keep = torch.cat([torch.ones(P, dtype=torch.bool, device="cuda"), self.masks[b, t]])
            s = torch.einsum("hd,khd->hk", q[b, t].double(), kk[keep]) / math.sqrt(self.D)
            ref[t] = torch.einsum("hk,khd->hd", torch.softmax(s, -1), vv[keep])
        got = out.reshape(self.B, self.T, self.Hq, self.D)[b].double()
        if torch.isnan(got).any():
            return float("nan")
        return ((got - ref).abs().max() / ref.abs().max()).item()


def ours_call(torch, fd, ts, tree):
    """flashdecode over set i: a plan made once (outside the timed region), outs per set."""
    plan = fd.DecodePlan(batch=ts.B, q_len=ts.T if tree else 1, num_heads_q=ts.Hq,
                         num_heads_kv=ts.Hkv, head_dim=ts.D, dtype=torch.bfloat16,
                         page_size=PAGE, max_pages_per_seq=ts.block_table.shape[1],
                         num_pages=ts.num_pages, kv_len_hint=[ts.kv] * ts.B, device="cuda",
                         tree_mask=tree)
    packed = fd.pack_tree_mask(ts.masks) if tree else None
    outs = [torch.empty_like(q if tree else q[:, -1:]) for q, _, _ in ts.sets]

    def call(i):
        q, k, v = ts.sets[i]
        if tree:
            plan.run(q, k, v, ts.kv_len, block_table=ts.block_table, out=outs[i],
                     tree_mask=packed)
        else:
            plan.run(q[:, -1:], k, v, ts.kv_len, block_table=ts.block_table, out=outs[i])
        return outs[i]
    return call, plan.num_splits


def fi_call(torch, fi, ts, ws):
    """FlashInfer's fa2 prefill wrapper with the tree as a custom mask over the same pages."""
    B, T, kv = ts.B, ts.T, ts.kv
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    qo_indptr = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device="cuda")
    per = ts.block_table.shape[1]
    kv_indptr = torch.arange(0, (B + 1) * per, per, dtype=torch.int32, device="cuda")
    indices = ts.block_table.reshape(-1).contiguous()
    last = torch.full((B,), kv - (per - 1) * PAGE, dtype=torch.int32, device="cuda")
    prefix = torch.ones(B, T, kv - T, dtype=torch.bool, device="cuda")
    mask = torch.cat([prefix, ts.masks], dim=2).reshape(-1)
    w.plan(qo_indptr, kv_indptr, indices, last, ts.Hq, ts.Hkv, ts.D, PAGE, custom_mask=mask,
           q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
           sm_scale=1.0 / math.sqrt(ts.D))
    del mask, prefix
    outs = [torch.empty(B * T, ts.Hq, ts.D, device="cuda", dtype=torch.bfloat16)
            for _ in ts.sets]

    def call(i):
        q, k, v = ts.sets[i]
        w.run(q.reshape(B * T, ts.Hq, ts.D), (k, v), out=outs[i])
        return outs[i]
    return call


def timed(torch, call, ts, check):
    reps = 10 if ts.kv_bytes() * len(ts.sets) > 64 << 20 else 20
    try:
        us, _, rel = measure(torch, call, len(ts.sets), reps, 0, check)
        return us, rel, ""
    except GraphFailed as exc:
        return None, None, str(exc)[:200]
    except Exception as exc:  # a peer that cannot run this row: n/a with the reason
        return None, None, f"{type(exc).__name__}: {exc}"[:200]


def seed_of(key):
    model, B, prefix, T = key
    return (list(MODELS).index(model) * 1000003 + B * 10007 + prefix * 101 + T) & 0x7fffffff


def rows(quick):
    if quick:
        return [("llama8b", 1, 32768, 64), ("gptoss", 8, 8192, 16)]
    return [(m, b, p, t) for m in MODELS for b in BATCHES for p in PREFIXES for t in TREES]


def prebuild_flashinfer(log_dir):
    """FlashInfer's fa2 prefill modules (bf16, head_dim 128 and 64) compile in a background
    process while our rows are measured (gpubench.flashinfer_peers.Prebuild)."""
    from gpubench.flashinfer_peers import Prebuild
    specs = [["prefill", "fa2", "bf16", d, False, False] for d in sorted({m[2] for m in
                                                                          MODELS.values()})]
    pb = Prebuild(specs, log_dir)
    pb.start()
    return pb


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--quick", action="store_true", help="two rows (a smoke test)")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--only", default="",
                    help="comma-separated parts of row names (tree-<model>-b<B>-p<k>k-t<T>): "
                         "only the rows whose name holds one of them")
    ap.add_argument("--fi-wait-s", type=float, default=240.0,
                    help="how long to wait for FlashInfer's modules after our rows")
    args = ap.parse_args(argv)
    import torch
    import flashdecode as fd
    from gpubench.ceiling import measure_ceiling

    props = torch.cuda.get_device_properties(0)
    log_dir = tempfile.mkdtemp(prefix="fd-tree-")
    pb = None if args.no_flashinfer else prebuild_flashinfer(log_dir)
    ceiling, desc, _ = measure_ceiling(torch, props.multi_processor_count, 6)
    print(f"read ceiling {ceiling:.3f} TB/s ({desc}); gpu {props.name}", flush=True)

    results = {}  # (model, B, prefix, T) -> dict
    plain = {}    # (model, B, prefix) -> us
    t0 = time.monotonic()
    only = [x for x in args.only.split(",") if x]
    for model, B, prefix, T in rows(args.quick):
        if only and not any(x in row_name(model, B, prefix, T) for x in only):
            continue
        Hq, Hkv, D = MODELS[model]
        kvb = 2 * B * (prefix + T) * Hkv * D * 2
        R = replicas_for(kvb)
        ts = TreeSet(torch, model, B, prefix, T, R, seed=seed_of((model, B, prefix, T)))
        call, splits = ours_call(torch, fd, ts, True)
        us, rel, why = timed(torch, call, ts, lambda o: ts.reference(torch, o))
        rec = {"model": model, "B": B, "prefix": prefix, "T": T, "ours_us": us, "ours_rel": rel,
               "splits": splits, "ours_why": why, "bytes": ts.io_bytes(), "ts": None}
        if (model, B, prefix) not in plain:
            pcall, _ = ours_call(torch, fd, ts, False)
            pus, _, _ = timed(torch, pcall, ts, lambda o: 0.0)
            plain[(model, B, prefix)] = pus
        results[(model, B, prefix, T)] = rec
        print(f"[{time.monotonic() - t0:6.1f}s] {model} B={B} prefix={prefix} T={T}: ours "
              f"{us if us is None else round(us, 2)} us (splits {splits}, rel {rel}) {why}",
              flush=True)
        del ts, call
        torch.cuda.empty_cache()

    fi = None
    if pb is not None:
        pb.wait(args.fi_wait_s)
        print(pb.summary(), flush=True)
        try:
            from gpubench.flashinfer_peers import import_flashinfer
            fi, why = import_flashinfer()
            if fi is None:
                print("flashinfer: " + why, flush=True)
        except Exception as exc:
            print(f"flashinfer: {exc}", flush=True)
        pb.stop()
    if fi is not None:
        ws = torch.empty(FI_WS_BYTES, dtype=torch.uint8, device="cuda")
        for key, rec in results.items():
            model, B, prefix, T = key
            Hq, Hkv, D = MODELS[model]
            R = replicas_for(2 * B * (prefix + T) * Hkv * D * 2)
            ts = TreeSet(torch, model, B, prefix, T, R, seed=seed_of(key))
            try:
                call = fi_call(torch, fi, ts, ws)
                us, rel, why = timed(torch, call, ts, lambda o: ts.reference(torch, o))
            except Exception as exc:
                us, rel, why = None, None, f"{type(exc).__name__}: {exc}"[:200]
            rec.update(fi_us=us, fi_rel=rel, fi_why=why)
            print(f"[{time.monotonic() - t0:6.1f}s] {model} B={B} prefix={prefix} T={T}: "
                  f"fi-prefill-mask {us if us is None else round(us, 2)} us (rel {rel}) {why}",
                  flush=True)
            del ts
            torch.cuda.empty_cache()
    write(args, props, ceiling, desc, results, plain)
    return 0


def row_name(model, B, prefix, T):
    return f"tree-{model}-b{B}-p{prefix // 1024}k-t{T}"


def write(args, props, ceiling, desc, results, plain):
    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, f"{today()}-{args.commit}-{gpu_tag(False)}-tree")
    summary, table, ratios = [], [], []
    with open(stem + ".csv", "w", newline="") as fh:
        fh.write(f"# bench_tree.py date {today()} commit {args.commit} gpu {props.name}; read "
                 f"ceiling {ceiling:.3f} TB/s ({desc}); bf16, page {PAGE} scattered, "
                 f"EAGLE-shaped trees; ours = flashdecode.decode with tree_mask, fi-prefill-mask "
                 f"= FlashInfer BatchPrefillWithPagedKVCacheWrapper fa2 with custom_mask; "
                 f"plain = our q_len 1 decode of the same prefix; CUDA-graph replay medians\n")
        wr = csv.writer(fh)
        wr.writerow(["row", "model", "batch", "prefix", "tree_nodes", "ours_us", "ours_splits",
                     "ours_rel_err", "fi_prefill_mask_us", "fi_rel_err", "ratio_vs_fi",
                     "plain_q1_us", "tree_over_plain", "pct_ceiling", "note"])
        for (model, B, prefix, T), r in results.items():
            name = row_name(model, B, prefix, T)
            ours, fi_us = r["ours_us"], r.get("fi_us")
            ok = ours is not None and r["ours_rel"] is not None and r["ours_rel"] <= TOL
            fi_ok = fi_us is not None and r.get("fi_rel") is not None and r["fi_rel"] <= TOL
            ratio = fi_us / ours if ok and fi_ok else None
            if ratio:
                ratios.append(ratio)
            pl = plain.get((model, B, prefix))
            over = ours / pl if ok and pl else None
            pct = 100.0 * r["bytes"] / (ours * 1e-6) / (ceiling * 1e12) if ok else None
            note = "; ".join(x for x in (r.get("ours_why"), r.get("fi_why")) if x)
            wr.writerow([name, model, B, prefix, T, _f(ours), r["splits"], _f(r["ours_rel"], 6),
                         _f(fi_us), _f(r.get("fi_rel"), 6), _f(ratio, 3), _f(pl), _f(over, 3),
                         _f(pct, 1), note])
            summary.append({"row": name, "ours_us": ours if ok else None,
                            "best_peer": "fi-prefill-mask" if fi_ok else None,
                            "best_peer_us": fi_us if fi_ok else None, "ratio": ratio,
                            "pct_ceiling": pct})
            table.append(f"{name:32s} ours {_f(ours):>9s} us  fi {_f(fi_us):>9s} us  ratio "
                         f"{_f(ratio, 2):>5s}  /plain {_f(over, 2):>5s}  {_f(pct, 1):>5s}%")
    with open(stem + "-summary.json", "w") as fh:
        json.dump(summary, fh, indent=1)
    print("\n".join(table))
    geo = math.exp(statistics.mean(math.log(x) for x in ratios)) if ratios else None
    worst = min(ratios) if ratios else None
    print(f"rows ahead of FlashInfer's masked prefill: {sum(x >= 1 for x in ratios)}/"
          f"{len(ratios)}; geomean {_f(geo, 3)} (target >= 1.5), worst {_f(worst, 3)}")
    r = results.get(("llama8b", 1, 32768, 64))
    pl = plain.get(("llama8b", 1, 32768))
    if r and r["ours_us"] and pl:
        print(f"target: 64-node verify / plain decode at B=1 32k (llama8b) = "
              f"{r['ours_us'] / pl:.3f} (target <= 1.3)")
    r = results.get(("gptoss", 1, 32768, 64))
    pl = plain.get(("gptoss", 1, 32768))
    if r and r["ours_us"] and pl:
        print(f"target: 64-node verify / plain decode at B=1 32k (gptoss) = "
              f"{r['ours_us'] / pl:.3f} (target <= 1.3)")
    print(f"wrote {stem}.csv, {stem}-summary.json")


def _f(x, nd=2):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


if __name__ == "__main__":
    sys.exit(main())
