"""What a run writes and prints: the main / sweep / check CSVs, the PNG, the verdicts of
the performance targets and the variants' checks, and the summary table."""
import csv
import json
import math
import os

from .common import (CSV_COLUMNS, FI_PEERS, MIB, OURS, PADDED_PEERS, PEERS, TOL, fmt,
                     recs_by_shape, short)


def tbps_of(shape, us):
    return None if us is None or us <= 0 else shape.kv_bytes / (us * 1e-6) / 1e12


def best_peer(recs_of_shape, shape=None):
    """The fastest peer that ran and passed its check. On a ragged row, the paged peers
    (FlashInfer) when one ran: a padded SDPA / Flex batch is context, not the bar."""
    ok = [r for r in recs_of_shape if r.impl in PEERS and r.status == "ok" and r.us_graph]
    if shape is not None and shape.ragged:
        paged = [r for r in ok if r.impl not in PADDED_PEERS]
        if paged:
            ok = paged
    return min(ok, key=lambda r: r.us_graph) if ok else None


def ratio_of(rec, best):
    if rec is None or rec.status != "ok" or rec.us_graph is None or best is None:
        return None
    return best.us_graph / rec.us_graph


def ours_of(by, name, impl="flashdecode"):
    r = next((r for r in by.get(name, []) if r.impl == impl), None)
    return r if r is not None and r.status == "ok" and r.us_graph else None


def tflops_text(s, r):
    """TFLOPS of an MLA row's timed record ('' on other rows)."""
    from .mla import tflops_of
    if r.status not in ("ok", "FAIL"):
        return ""
    return fmt(tflops_of(s, r.us_graph), 1) if s.rope_dim else ""


def write_main_csv(path, meta_lines, shapes, recs, ceiling):
    by = recs_by_shape(recs)
    with open(path, "w", newline="") as fh:
        for line in meta_lines:
            fh.write("# " + line.replace("\n", " ") + "\n")
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for s in shapes:
            rs = by.get(s.name, [])
            best = best_peer(rs, s)
            for r in rs:
                tb = tbps_of(s, r.us_graph) if r.status in ("ok", "FAIL") else None
                pct = None if tb is None or not ceiling else 100.0 * tb / ceiling
                if r.status == "FAIL":
                    ratio = "FAIL"
                elif r.status == "ok":
                    ratio = fmt(ratio_of(r, best), 3)
                else:
                    ratio = r.status
                w.writerow([s.name, r.impl,
                            fmt(r.us_graph, 2) if r.status in ("ok", "FAIL") else r.status,
                            fmt(r.us_eager, 2) if r.status in ("ok", "FAIL") else r.status,
                            fmt(tb, 3), fmt(pct, 1),
                            "" if r.num_splits is None else r.num_splits, ratio,
                            tflops_text(s, r)])


def write_sweep_csv(path, meta_lines, shapes, sweep, recs, ceiling):
    by = recs_by_shape(recs)
    sw = {}
    for r in sweep:
        sw.setdefault(r.shape, []).append(r)
    with open(path, "w", newline="") as fh:
        for line in meta_lines[:4]:
            fh.write("# " + line + "\n")
        fh.write("# forced num_splits (requested -> what the plan clamped it to); 'auto' = the "
                 "flashdecode row; auto_vs_best = auto us / best forced us (target <= 1.05)\n")
        w = csv.writer(fh)
        w.writerow(["shape", "requested", "num_splits", "us_graph", "tbps", "pct_ceiling", "status",
                    "rel_err", "auto_vs_best"])
        for s in shapes:
            rows = sw.get(s.name)
            if not rows:
                continue
            auto = next((r for r in by.get(s.name, []) if r.impl == "flashdecode"), None)
            ok = [r for r in rows if r.status == "ok" and r.us_graph]
            best = min(ok, key=lambda r: r.us_graph) if ok else None
            for r in rows:
                tb = tbps_of(s, r.us_graph)
                w.writerow([s.name, r.requested, r.num_splits, fmt(r.us_graph, 2), fmt(tb, 3),
                            fmt(None if tb is None else 100 * tb / ceiling, 1), r.status,
                            fmt(r.rel, 5), ""])
            if auto is not None and auto.status == "ok" and best is not None:
                tb = tbps_of(s, auto.us_graph)
                w.writerow([s.name, "auto", auto.num_splits, fmt(auto.us_graph, 2), fmt(tb, 3),
                            fmt(100 * tb / ceiling, 1), auto.status, fmt(auto.rel, 5),
                            fmt(auto.us_graph / best.us_graph, 3)])


def write_check_csv(path, shapes, recs, sweep):
    tol_of = {s.name: TOL[s.dtype] for s in shapes}
    feat = {s.name: s.features() for s in shapes}
    cache = {s.name: s.kv_dtype or s.dtype for s in shapes}
    with open(path, "w", newline="") as fh:
        fh.write("# every timed configuration (peers included) vs a float64 reference on the same "
                 "rounded inputs, computed with the row's variant (window, soft-cap, sinks); "
                 "rel_err = max|out - ref| / max|ref|; n/a rows say why the implementation did "
                 "not run. fp8 rows (kv_cache e4m3): max_abs_err / rel_err are against float64 attention "
                 "over the ORIGINAL bf16 K/V (quantization error included; ours and FlashInfer's "
                 "fp8 paths on the same data), rel_err_dequant against float64 over the "
                 "dequantized cache (the kernel's own error); tol applies to rel_err_dequant "
                 "there\n")
        w = csv.writer(fh)
        w.writerow(["shape", "impl", "num_splits", "max_abs_err", "rel_err", "tol", "status",
                    "reason", "variant", "rel_err_dequant", "kv_cache"])
        for r in recs:
            w.writerow([r.shape, r.impl, "" if r.num_splits is None else r.num_splits,
                        fmt(r.err, 6) if r.err is not None else "",
                        fmt(r.rel, 6) if r.rel is not None else "",
                        tol_of.get(r.shape, ""), r.status, r.reason, feat.get(r.shape, ""),
                        fmt(r.rel_deq, 6) if r.rel_deq is not None else "",
                        cache.get(r.shape, "")])
        for r in sweep:
            w.writerow([r.shape, f"flashdecode-splits{r.requested}", r.num_splits, "",
                        fmt(r.rel, 6) if r.rel is not None else "", tol_of.get(r.shape, ""),
                        r.status, r.reason, feat.get(r.shape, ""), "",
                        cache.get(r.shape, "")])


PLOT_STYLES = {"flashdecode": ("o-", "tab:red"), "flashdecode-nosplit": ("s--", "tab:orange"),
               "sdpa-flash": ("^-", "tab:blue"), "sdpa-cudnn": ("v-", "tab:green"),
               "flex": ("D-", "tab:purple"), "fi-cudacore": ("<:", "tab:brown"),
               "fi-tensorcore": (">-", "tab:pink"), "fi-xqa": ("P-", "tab:olive"),
               "fi-cudnn": ("X:", "tab:cyan"), "fi-cascade": ("*-", "tab:gray"),
               "fi-mla-fa2": ("<:", "tab:brown"), "fi-mla-fa3": (">-", "tab:pink")}


def write_plot(path, shapes, recs, ceiling):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"plot skipped: matplotlib unavailable ({short(exc, 60)})"
    sel = [s for s in shapes if s.kind == "grid" and not s.ragged and s.batch == 1 and s.hq == 32
           and s.hkv == 8 and s.d == 128 and s.dtype == "bf16" and s.page_size == 0]
    sel.sort(key=lambda s: s.lens[0])
    if not sel:
        return "plot skipped: no B=1 32/8 d128 bf16 rows"
    by = recs_by_shape(recs)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for impl in OURS + PEERS:
        xs, ys = [], []
        for s in sel:
            r = next((r for r in by.get(s.name, []) if r.impl == impl), None)
            if r is not None and r.status == "ok" and r.us_graph:
                xs.append(s.lens[0])
                ys.append(r.us_graph)
        if xs:
            mk, col = PLOT_STYLES.get(impl, (".-", "black"))
            ax.plot(xs, ys, mk, color=col, label=impl)
    if ceiling:
        xs = [s.lens[0] for s in sel]
        ax.plot(xs, [s.kv_bytes / (ceiling * 1e12) * 1e6 for s in sel], "k:",
                label=f"floor (bytes / {ceiling:.2f} TB/s)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [s.lens[0] for s in sel]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t // 1024}k" if t % 1024 == 0 else str(t) for t in ticks])
    ax.set_xlabel("kv_len (tokens)")
    ax.set_ylabel("µs per call (CUDA-graph replay, cold L2)")
    ax.set_title("Decode attention, B=1, 32/8 heads, d=128, bf16 (FlashInfer: 16-key pages)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return ""


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def target_verdict(label, vals, ok, fmt_one, empty):
    """(label, PASS | MISS | n/a, detail) of a target checked on every value of vals: PASS
    when ok(v) holds for all, n/a (detail `empty`) when there are none."""
    if not vals:
        return (label, "n/a", empty)
    miss = [v for v in vals if not ok(v)]
    return (label, "PASS" if not miss else "MISS",
            "; ".join(fmt_one(v) for v in vals)
            + (f" (MISS: {len(miss)} of {len(vals)})" if miss else ""))


def verdicts(shapes, recs, sweep, ceiling):
    """[(target, PASS | MISS | n/a, detail)] for the performance targets (variant rows have
    their own checks: variant_checks)."""
    by = recs_by_shape(recs)
    shape_of = {s.name: s for s in shapes}
    shapes = [s for s in shapes if not s.is_variant and not s.rope_dim]  # MLA: mla_checks

    def ours(name, impl="flashdecode"):
        return ours_of(by, name, impl)

    def pct(s, r):
        return 100.0 * tbps_of(s, r.us_graph) / ceiling

    out = []

    def band(lo_mib, target, label):
        rows = [(s, ours(s.name)) for s in shapes
                if s.dtype == "bf16" and s.kv_bytes >= lo_mib * MIB and ours(s.name)
                and s.kind != "paged-inorder"]  # diagnostic rows are no target
        if not rows:
            out.append((label, "n/a", "no bf16 row of that size measured"))
            return
        worst = min(rows, key=lambda sr: pct(*sr))
        miss = [s.name for s, r in rows if pct(s, r) < target]
        over = [f"{s.name} {pct(s, r):.1f}%" for s, r in rows if pct(s, r) > 100.0]
        out.append((label, "PASS" if not miss else "MISS",
                    f"worst {worst[0].name} {pct(*worst):.1f}% ({len(rows)} rows"
                    + (f"; below: {', '.join(miss)}" if miss else "") + ")"
                    + (f"; ABOVE 100% (the probe is wrong): {', '.join(over)}" if over else "")))

    band(256, 95.0, "bf16 K+V >= 256 MiB: >= 95% of ceiling")
    band(64, 85.0, "bf16 K+V >= 64 MiB: >= 85% of ceiling")

    from .shapes import uniform_name
    r = ours(uniform_name(1, 32, 8, 1024, 128, "bf16"))
    out.append(("B=1 32/8 1k: <= 4 us (graph)", "n/a" if r is None else
                ("PASS" if r.us_graph <= 4.0 else "MISS"),
                "not measured" if r is None else f"{r.us_graph:.2f} us"))

    ratios, grid_ratios, no_peer = [], [], []
    for s in shapes:
        r = ours(s.name)
        if r is None or s.kind == "paged-inorder":  # diagnostic rows are no target
            continue
        q = ratio_of(r, best_peer(by.get(s.name, []), s))
        if q is None:
            no_peer.append(s.name)
            continue
        ratios.append((s, q))
        if s.kind == "grid":
            grid_ratios.append(q)
    if ratios:
        worst = min(ratios, key=lambda sq: sq[1])
        miss = [f"{s.name} {q:.2f}" for s, q in ratios if q < 0.98]
        out.append(("ratio vs best peer >= 0.98 every row", "PASS" if not miss else "MISS",
                    f"worst {worst[0].name} {worst[1]:.3f}; {len(ratios)} rows with a peer"
                    + (f"; below: {', '.join(miss)}" if miss else "")
                    + (f"; no peer: {len(no_peer)} rows" if no_peer else "")))
    else:
        out.append(("ratio vs best peer >= 0.98 every row", "n/a", "no row with a peer"))
    g = geomean(grid_ratios)
    g_all = geomean([q for _, q in ratios])
    out.append(("geomean ratio over the grid >= 1.25", "n/a" if g is None else
                ("PASS" if g >= 1.25 else "MISS"),
                "n/a" if g is None else f"{g:.3f} over {len(grid_ratios)} bf16 grid rows "
                f"(all rows with a peer: {g_all:.3f})"))

    sw = {}
    for x in sweep:
        if x.status == "ok" and x.us_graph:
            sw.setdefault(x.shape, []).append(x)
    aut = []
    for name, xs in sw.items():
        r = ours(name)
        if r is None:
            continue
        b = min(xs, key=lambda x: x.us_graph)
        aut.append((name, r.us_graph / b.us_graph, r.num_splits, b.num_splits))
    if aut:
        worst = max(aut, key=lambda a: a[1])
        miss = [f"{n} {q:.2f} (auto {a} vs {b})" for n, q, a, b in aut if q > 1.05]
        out.append(("auto splits within 5% of best forced", "PASS" if not miss else "MISS",
                    f"worst {worst[0]} x{worst[1]:.3f} (auto {worst[2]} vs best {worst[3]}); "
                    f"{len(aut)} rows" + (f"; over: {'; '.join(miss)}" if miss else "")))
    else:
        out.append(("auto splits within 5% of best forced", "n/a", "no sweep"))

    def relative(kind_test, label, limit, what):
        pairs = []
        for s in shapes:
            if not kind_test(s) or not s.base:
                continue
            r, b = ours(s.name), ours(s.base)
            if r is None or b is None:
                continue
            pairs.append((s, r, shape_of.get(s.base), b))
        if not pairs:
            out.append((label, "n/a", "no pair measured"))
            return
        vals = [(s.name, what(s, r, bs, b)) for s, r, bs, b in pairs]
        worst = max(vals, key=lambda v: v[1])
        miss = [f"{n} {v:+.1f}" for n, v in vals if v > limit]
        out.append((label, "PASS" if not miss else "MISS",
                    f"worst {worst[0]} {worst[1]:+.1f}; {len(vals)} rows"
                    + (f"; over: {', '.join(miss)}" if miss else "")))

    relative(lambda s: s.kind == "paged", "paged within 5% of contiguous (% slower)", 5.0,
             lambda s, r, bs, b: 100.0 * (r.us_graph / b.us_graph - 1.0))
    rg = [(s, ours(s.name)) for s in shapes if s.ragged and ours(s.name)]
    if rg:
        worst = min(rg, key=lambda sr: pct(*sr))
        miss = [f"{s.name} {pct(s, r):.1f}%" for s, r in rg if pct(s, r) < 85.0]
        out.append(("ragged trace batches >= 85% of ceiling", "PASS" if not miss else "MISS",
                    f"worst {worst[0].name} {pct(*worst):.1f}%; {len(rg)} rows"
                    + (f"; below: {', '.join(miss)}" if miss else "")))
    else:
        out.append(("ragged trace batches >= 85% of ceiling", "n/a", "no ragged row measured"))
    relative(lambda s: s.kind == "fp16", "fp16 as fast as bf16 (% slower, 3% allowed)", 3.0,
             lambda s, r, bs, b: 100.0 * (r.us_graph / b.us_graph - 1.0))
    relative(lambda s: s.kind == "fp32", "fp32 same % of ceiling as bf16 (points lower, 3 allowed)",
             3.0, lambda s, r, bs, b: pct(bs, b) - pct(s, r))

    fails = [f"{r.shape}:{r.impl}" for r in recs if r.status == "FAIL" and r.impl in OURS]
    fails += [f"{x.shape}:splits{x.requested}" for x in sweep if x.status == "FAIL"]
    peer_fails = [f"{r.shape}:{r.impl}" for r in recs if r.status == "FAIL" and r.impl in PEERS]
    out.append(("every timed flashdecode configuration correct", "PASS" if not fails else "MISS",
                f"{len(fails)} FAIL" + (f": {', '.join(fails[:8])}" if fails else "")
                + (f"; peers FAIL (excluded from best peer): {', '.join(peer_fails[:6])}"
                   if peer_fails else "")))
    return out


def variant_checks(shapes, recs):
    """[(check, PASS | MISS | info | n/a, detail)] for the variant rows: each variant's cost
    against its plain row (Shape.base), the cascade against plain decode, and every variant
    row against its best peer."""
    by = recs_by_shape(recs)
    shape_of = {s.name: s for s in shapes}
    var = [s for s in shapes if s.is_variant and s.family != "fp8"]  # fp8: fp8_checks
    out = []
    if not var:
        return out

    def pair_cost(test, label, limit):
        vals = []
        for s in var:
            if not test(s) or not s.base:
                continue
            r, b = ours_of(by, s.name), ours_of(by, s.base)
            if r is None or b is None:
                continue
            vals.append((s.name, 100.0 * (r.us_graph / b.us_graph - 1.0), r.us_graph, b.us_graph))
        if not vals:
            out.append((label, "n/a", "no pair measured"))
            return
        detail = "; ".join(f"{n} {v:+.1f}% ({a:.2f} vs {b:.2f} us)" for n, v, a, b in vals)
        if limit is None:
            out.append((label, "info", detail))
        else:
            out.append((label, "PASS" if all(v <= limit for _, v, _, _ in vals) else "MISS",
                        detail))

    pair_cost(lambda s: s.window_left >= 0 and not s.softcap and not s.sinks,
              "window 4096 at 32k within 5% of a plain call over 4097 keys (% slower)", 5.0)
    pair_cost(lambda s: s.softcap and s.window_left < 0,
              "soft-cap cost vs the plain call (% slower; predicted <= 3)", 3.0)
    pair_cost(lambda s: s.sinks and s.window_left < 0,
              "sinks cost vs the plain call (% slower; predicted ~0, <= 2)", 2.0)
    pair_cost(lambda s: s.deterministic and s.batch >= 8,
              "deterministic mode cost vs the automatic plan, B >= 8 (% slower; target <= 5)", 5.0)
    pair_cost(lambda s: s.deterministic and s.batch < 8,
              "deterministic mode cost vs the automatic plan, B = 1 (% slower; stated)", None)
    pair_cost(lambda s: (s.softcap or s.sinks) and s.window_left >= 0,
              "windowed soft-cap / sink rows vs the full plain call (% slower)", None)
    for s in var:
        if not s.cascade:
            continue
        r, b = ours_of(by, s.name), ours_of(by, s.base)
        bp = best_peer(by.get(s.name, []), s)
        if r is None or b is None:
            out.append(("cascade vs plain decode of the shared-prefix batch", "n/a",
                        "not measured"))
            continue
        out.append(("cascade vs plain decode of the shared-prefix batch", "info",
                    f"cascade {r.us_graph:.2f} us vs plain {b.us_graph:.2f} us: "
                    f"{b.us_graph / r.us_graph:.2f}x"
                    + (f"; FlashInfer cascade {bp.us_graph:.2f} us" if bp else "")))
    rows = []
    for s in var:
        r = ours_of(by, s.name)
        bp = best_peer(by.get(s.name, []), s)
        q = ratio_of(r, bp)
        rows.append((s.name, q, bp.impl if bp else None))
    have = [(n, q, i) for n, q, i in rows if q is not None]
    if have:
        worst = min(have, key=lambda x: x[1])
        out.append(("variant rows vs best peer (ratio > 1 = faster)", "info",
                    f"worst {worst[0]} {worst[1]:.3f} ({worst[2]}); "
                    + "; ".join(f"{n.replace('var-', '')} {q:.2f}" for n, q, _ in have)
                    + (f"; no peer: {len(rows) - len(have)}" if len(rows) > len(have) else "")))
    missing = [r for r in recs if r.impl == "flashdecode" and r.status != "ok"
               and shape_of.get(r.shape) is not None and shape_of[r.shape].is_variant
               and shape_of[r.shape].family != "fp8"]
    if missing:
        out.append(("variant rows flashdecode could not run or failed", "MISS",
                    "; ".join(f"{r.shape}: {r.status} {short(r.reason, 90)}" for r in missing[:6])))
    return out


MB = 1e6
FP8_TIME_RATIO = 0.55  # fp8 time / our bf16 time, bf16 K+V >= 128 MB
FP8_PCT = 90.0  # % of the read ceiling, fp8 K+V (+ scales) >= 256 MB
FP8_TOKEN_COST = 5.0  # % per-token scales over per-tensor, same shape
FP8_ACC_KEYS = 131072  # the accuracy target's rows: >= 128k keys
FP8_ACC_SLACK = 2.0 ** -9  # "no worse" = within one bf16 output rounding of FlashInfer's best


def fp8_rows(shapes):
    return [s for s in shapes if s.kv_dtype and not s.rope_dim]  # MLA's fp8 rows: mla_checks


def fi_fp8_recs(by, s):
    """FlashInfer records of fp8 row s that produced an output (ok, or FAIL on its check)."""
    return [r for r in by.get(s.name, []) if r.impl in FI_PEERS and r.status in ("ok", "FAIL")
            and r.us_graph]


def fp8_checks(shapes, recs, ceiling):
    """[(target, PASS | MISS | n/a | info, detail)] of the fp8 rows: (1) fp8 time <= 0.55x our
    bf16 time of the same call when the bf16 K+V >= 128 MB; (2) >= 90 % of the read ceiling
    counting fp8 + scale bytes at >= 256 MB; (3) per-token scales <= 5 % over per-tensor;
    (4) faster than every FlashInfer fp8 path on every fp8 row; (5) at >= 128k keys, our
    error against float64 over the original bf16 K/V no worse than FlashInfer's fp8 paths'
    on the same data; and every fp8 configuration within tolerance of its dequantized cache."""
    by = recs_by_shape(recs)
    shape_of = {s.name: s for s in shapes}
    rows = fp8_rows(shapes)
    out = []
    if not rows:
        return out

    def ours(s):
        return ours_of(by, s.name)

    def verdict(label, vals, ok, fmt_one, empty):
        out.append(target_verdict(label, vals, ok, fmt_one, empty))

    # (1) fp8 vs our bf16 time
    vals = []
    for s in rows:
        bs = shape_of.get(s.base)
        r, b = ours(s), (ours_of(by, s.base) if bs else None)
        if r is None or b is None or bs.kv_bytes < 128 * MB:
            continue
        vals.append((s.name, r.us_graph / b.us_graph, r.us_graph, b.us_graph))
    verdict(f"fp8 time <= {FP8_TIME_RATIO}x our bf16 time (bf16 K+V >= 128 MB)", vals,
            lambda v: v[1] <= FP8_TIME_RATIO,
            lambda v: f"{v[0].replace('var-fp8-', '')} {v[1]:.3f}x ({v[2]:.2f} vs {v[3]:.2f} us)",
            "no fp8 row with its bf16 base measured")

    # (2) share of the read ceiling, fp8 + scale bytes
    vals = [(s.name, 100.0 * tbps_of(s, ours(s).us_graph) / ceiling, s.kv_bytes)
            for s in rows if ours(s) and s.kv_bytes >= 256 * MB and ceiling]
    verdict(f"fp8 >= {FP8_PCT:g}% of the read ceiling at >= 256 MB (fp8 + scale bytes)", vals,
            lambda v: v[1] >= FP8_PCT,
            lambda v: f"{v[0].replace('var-fp8-', '')} {v[1]:.1f}% ({v[2] / MIB:.0f} MiB)",
            "no fp8 row of that size measured")

    # (3) per-token against per-tensor scales, the same call
    vals = []
    for s in rows:
        if s.kv_scale != "token":
            continue
        twin = next((t for t in rows if t.kv_scale == "tensor" and t.batch == s.batch
                     and t.lens == s.lens and t.hq == s.hq and t.hkv == s.hkv and t.d == s.d
                     and t.kv_dtype == s.kv_dtype and t.page_size == s.page_size), None)
        r, t = ours(s), (ours(twin) if twin else None)
        if r is None or t is None:
            continue
        vals.append((s.name, 100.0 * (r.us_graph / t.us_graph - 1.0), r.us_graph, t.us_graph))
    verdict(f"per-token scales <= {FP8_TOKEN_COST:g}% over per-tensor (% slower)", vals,
            lambda v: v[1] <= FP8_TOKEN_COST,
            lambda v: f"{v[0].replace('var-fp8-', '')} {v[1]:+.1f}% ({v[2]:.2f} vs {v[3]:.2f} us)",
            "no per-token row with its per-tensor twin measured")

    # (4) ahead of every FlashInfer fp8 path (one that failed its check counts too: XQA's fp8
    # kernel takes q to fp8 by design; its accuracy is target 5's business)
    vals, no_fi = [], []
    for s in rows:
        r = ours(s)
        fis = fi_fp8_recs(by, s)
        if r is None:
            continue
        if not fis:
            no_fi.append(s.name.replace("var-fp8-", ""))
            continue
        best = min(fis, key=lambda x: x.us_graph)
        vals.append((s.name, best.us_graph / r.us_graph,
                     best.impl + (" (FAIL its check)" if best.status == "FAIL" else ""),
                     best.us_graph, r.us_graph))
    verdict("ahead of every FlashInfer fp8 path on every fp8 row (best FI us / ours)", vals,
            lambda v: v[1] > 1.0,
            lambda v: f"{v[0].replace('var-fp8-', '')} {v[1]:.3f} ({v[2]} {v[3]:.2f} vs "
                      f"{v[4]:.2f} us)",
            "no fp8 row with a FlashInfer fp8 path measured")
    if no_fi:
        out[-1] = (out[-1][0], out[-1][1], out[-1][2] + f"; no FlashInfer fp8 path measured "
                   f"(FlashInfer has no per-token scales; or not run): {', '.join(no_fi)}")

    # (5) accuracy against the original bf16 K/V, ours vs FlashInfer's fp8 paths (same data)
    vals = []
    for s in rows:
        r = next((x for x in by.get(s.name, []) if x.impl == "flashdecode"
                  and x.rel is not None), None)
        fis = [x for x in fi_fp8_recs(by, s) if x.rel is not None]
        if s.capacity < FP8_ACC_KEYS or r is None or not fis:
            continue
        best = min(fis, key=lambda x: x.rel)
        vals.append((s.name, r.rel, best.rel, best.impl,
                     ", ".join(f"{x.impl} {x.rel:.4g}" for x in fis)))
    verdict(f"accuracy at >= {FP8_ACC_KEYS // 1024}k keys: rel err vs float64 over the original "
            f"bf16 K/V no worse than FlashInfer fp8 (+ 2^-9)", vals,
            lambda v: v[1] <= v[2] + FP8_ACC_SLACK,
            lambda v: f"{v[0].replace('var-fp8-', '')} ours {v[1]:.4g} vs {v[4]}",
            "no >= 128k fp8 row with ours and a FlashInfer fp8 path")
    info = []
    for s in rows:
        r = next((x for x in by.get(s.name, []) if x.impl == "flashdecode"), None)
        if r is None or r.rel is None:
            continue
        fis = [x for x in fi_fp8_recs(by, s) if x.rel is not None]
        info.append(f"{s.name.replace('var-fp8-', '')} ours {r.rel:.4g} (dequant "
                    f"{fmt(r.rel_deq, 4)})" + ("; " + ", ".join(f"{x.impl} {x.rel:.4g}"
                                                                for x in fis) if fis else ""))
    if info:
        out.append(("fp8 rel err vs the original bf16 K/V, every row (vs the dequantized cache)",
                     "info", " | ".join(info)))

    bad = [r for r in recs if r.impl == "flashdecode" and r.status != "ok"
           and shape_of.get(r.shape) is not None and shape_of[r.shape].family == "fp8"]
    out.append(("every fp8-family flashdecode row ran and matches its dequantized cache (bf16 tol)",
                "PASS" if not bad else "MISS",
                "; ".join(f"{r.shape}: {r.status} {short(r.reason, 90)}" for r in bad[:6])
                or f"{len([s for s in shapes if s.family == 'fp8'])} rows"))
    return out


def _us(r):
    if r is None:
        return "-"
    if r.status == "ok":
        return f"{r.us_graph:.2f}"
    return r.status


def _pct(s, o, ceiling):
    """Our row's % of the read ceiling (None without a timing or a ceiling)."""
    return (100 * tbps_of(s, o.us_graph) / ceiling) if (o and o.status == "ok"
                                                         and ceiling) else None


def _spl(o):
    """Our row's split count for the table ('' when unknown)."""
    return "" if not o or o.num_splits is None else o.num_splits


def _peer_label(bp):
    if bp is None:
        return "n/a"
    name = bp.impl[5:] if bp.impl.startswith("sdpa-") else bp.impl
    return f"{name} {bp.us_graph:.2f}"


def print_summary(shapes, recs, sweep, ceiling, meta_lines, notes, files):
    by = recs_by_shape(recs)
    sw = {}
    for x in sweep:
        if x.status == "ok" and x.us_graph:
            sw.setdefault(x.shape, []).append(x)
    print()
    print("=" * 132)
    for line in meta_lines[:3]:
        print(short(line, 300))
    main = [s for s in shapes if not s.is_variant and not s.rope_dim]
    mla = [s for s in shapes if s.rope_dim]
    var = [s for s in shapes if s.is_variant and s.family != "fp8"]
    fp8 = [s for s in shapes if s.family == "fp8"]
    if main:
        print(f"{'shape':50s} {'MiB':>5s} {'floor':>7s} {'ours':>8s} {'%ceil':>5s} {'spl':>3s} "
              f"{'nosplit':>8s} {'best peer':>20s} {'ratio':>5s} {'FI best':>19s} {'sweep best':>10s}")
    for s in main:
        rs = {r.impl: r for r in by.get(s.name, [])}
        if not rs:
            continue
        floor = s.kv_bytes / (ceiling * 1e12) * 1e6 if ceiling else None
        o, n = rs.get("flashdecode"), rs.get("flashdecode-nosplit")
        bp = best_peer(list(rs.values()), s)
        fib = min((r for r in rs.values() if r.impl in FI_PEERS and r.status == "ok"
                   and r.us_graph), key=lambda r: r.us_graph, default=None)
        pct = _pct(s, o, ceiling)
        ratio = ratio_of(o, bp) if o else None
        swb = ""
        if s.name in sw:
            b = min(sw[s.name], key=lambda x: x.us_graph)
            swb = f"{b.num_splits}:{b.us_graph:.1f}"
        name = s.name if len(s.name) <= 50 else s.name[:22] + "~" + s.name[-27:]
        print(f"{name:50s} {s.kv_bytes / MIB:5.0f} {fmt(floor, 2):>7s} {_us(o):>8s} "
              f"{fmt(pct, 1):>5s} {_spl(o):>3} "
              f"{_us(n):>8s} {_peer_label(bp):>20s} {fmt(ratio, 2):>5s} "
              f"{_peer_label(fib)[3:] if fib else '-':>19s} {swb:>10s}")
    if var:
        print("-" * 132)
        print("VARIANT ROWS (us, CUDA-graph replay; MiB = bytes the call must read; FlashInfer on "
              "16-key pages)")
        print(f"{'shape':52s} {'MiB':>5s} {'ours':>8s} {'%ceil':>5s} {'spl':>3s} {'cudacore':>8s} "
              f"{'tensorc':>8s} {'xqa':>8s} {'fi-cudnn':>8s} {'cascade':>8s} {'sdpa-cud':>8s} "
              f"{'ratio':>5s}")
        for s in var:
            rs = {r.impl: r for r in by.get(s.name, [])}
            if not rs:
                continue
            o = rs.get("flashdecode")
            bp = best_peer(list(rs.values()), s)
            pct = _pct(s, o, ceiling)
            name = s.name if len(s.name) <= 52 else s.name[:24] + "~" + s.name[-27:]
            print(f"{name:52s} {s.kv_bytes / MIB:5.0f} {_us(o):>8s} {fmt(pct, 1):>5s} "
                  f"{_spl(o):>3} "
                  + " ".join(f"{_us(rs.get(i)):>8s}" for i in
                             ("fi-cudacore", "fi-tensorcore", "fi-xqa", "fi-cudnn", "fi-cascade",
                              "sdpa-cudnn"))
                  + f" {fmt(ratio_of(o, bp), 2):>5s}")
    if fp8:
        print("-" * 132)
        print("FP8 ROWS (us, CUDA-graph replay; MiB = fp8 K+V + scales, or bf16 K+V on a base row; "
              "x bf16 = time / our bf16 base; rel = rel err vs float64 over the original bf16 K/V)")
        print(f"{'shape':46s} {'MiB':>5s} {'ours':>8s} {'%ceil':>5s} {'spl':>3s} {'x bf16':>6s} "
              f"{'cudacore':>8s} {'tensorc':>8s} {'xqa':>8s} {'ratio':>5s} {'rel ours':>8s} "
              f"{'rel FI':>8s}")
        for s in fp8:
            rs = {r.impl: r for r in by.get(s.name, [])}
            if not rs:
                continue
            o = rs.get("flashdecode")
            b = ours_of(by, s.base) if s.base else None
            fis = [r for r in rs.values() if r.impl in FI_PEERS and r.status == "ok"
                   and r.us_graph]
            bfi = min(fis, key=lambda r: r.us_graph) if fis else None
            rfi = [r.rel for r in rs.values() if r.impl in FI_PEERS and r.rel is not None]
            pct = _pct(s, o, ceiling)
            xb = (o.us_graph / b.us_graph) if (o and o.status == "ok" and b) else None
            name = s.name.replace("var-fp8-", "fp8-")
            print(f"{name:46s} {s.kv_bytes / MIB:5.0f} {_us(o):>8s} {fmt(pct, 1):>5s} "
                  f"{_spl(o):>3} {fmt(xb, 3):>6s} "
                  + " ".join(f"{_us(rs.get(i)):>8s}" for i in
                             ("fi-cudacore", "fi-tensorcore", "fi-xqa"))
                  + f" {fmt(ratio_of(o, bfi), 2):>5s} "
                  f"{fmt(o.rel if o else None, 4):>8s} {fmt(min(rfi) if rfi else None, 4):>8s}")
    if mla:
        print_mla_table(mla, by, ceiling)
    print("-" * 132)
    if main:
        print("TARGETS:")
        for label, v, detail in verdicts(shapes, recs, sweep, ceiling):
            print(f"  [{v:4s}] {label}: {short(detail, 260)}")
    checks = variant_checks(shapes, recs)
    if checks:
        print("VARIANTS:")
        for label, v, detail in checks:
            print(f"  [{v:4s}] {label}: {short(detail, 400)}")
    checks = fp8_checks(shapes, recs, ceiling)
    if checks:
        print("FP8:")
        for label, v, detail in checks:
            print(f"  [{v:4s}] {label}: {short(detail, 500)}")
    checks = mla_checks(shapes, recs, ceiling)
    if checks:
        print("MLA:")
        for label, v, detail in checks:
            print(f"  [{v:4s}] {label}: {short(detail, 500)}")
    if notes:
        print("NOTES:")
        for n in notes[-14:]:
            print("  " + short(n, 220))
    print("FILES: " + ", ".join(files))


def summary_family(s):
    """The row family a summary row is named by (BENCHMARKING.md): contiguous, paged, ragged,
    window, softcap, sinks, fp8, cascade, deterministic, head_dim96, mla."""
    if s.rope_dim:
        return "mla"
    if s.kind != "variant":
        if s.ragged:
            return "ragged"
        return "paged" if s.page_size else "contiguous"
    if s.family == "fp8":
        return "fp8"
    if s.family == "prefix":
        return "cascade" if s.cascade else "prefix"
    if s.deterministic:
        return "deterministic"
    if s.sinks:
        return "sinks"
    if s.softcap:
        return "softcap"
    if s.window_left >= 0:
        return "window"
    return "plain"


def write_summary_json(path, shapes, recs, ceiling):
    """One object per row: {"row", "ours_us", "best_peer", "best_peer_us", "ratio" (best
    peer's time / ours; > 1: we lead; null without a peer), "pct_ceiling"}; MLA rows also
    "tflops" (ours)."""
    from .mla import tflops_of
    by = recs_by_shape(recs)
    rows = []
    for s in shapes:
        ours = ours_of(by, s.name)
        if ours is None:
            continue
        best = best_peer(by.get(s.name, []), s)
        tb = tbps_of(s, ours.us_graph)
        rows.append({
            "row": f"{summary_family(s)}/{s.name}",
            "ours_us": round(ours.us_graph, 3),
            "best_peer": best.impl if best else None,
            "best_peer_us": round(best.us_graph, 3) if best else None,
            "ratio": round(ratio_of(ours, best), 4) if best else None,
            "pct_ceiling": round(100.0 * tb / ceiling, 2) if tb and ceiling else None,
        })
        if s.rope_dim:
            rows[-1]["tflops"] = round(tflops_of(s, ours.us_graph), 2)
    with open(path, "w") as fh:
        json.dump(rows, fh, indent=1)
        fh.write("\n")


def write_outputs(out_dir, stem, meta_lines, shapes, recs, sweep, ceiling, notes, plot=False):
    os.makedirs(out_dir, exist_ok=True)
    lines = list(meta_lines)
    for s in shapes:
        if s.note:
            lines.append(f"shape {s.name}: {s.note}")
    seen = set()
    for r in recs:
        if r.status in ("n/a", "skipped", "FAIL") and r.reason:
            key = (r.impl, r.reason)
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"{r.status} {r.shape} {r.impl}: {short(r.reason, 300)}")
    lines += [f"note: {n}" for n in notes]
    for label, v, detail in variant_checks(shapes, recs):
        lines.append(f"variant check [{v}] {label}: {detail}")
    for label, v, detail in fp8_checks(shapes, recs, ceiling):
        lines.append(f"fp8 check [{v}] {label}: {detail}")
    for label, v, detail in mla_checks(shapes, recs, ceiling):
        lines.append(f"mla check [{v}] {label}: {detail}")
    files = []
    p = os.path.join(out_dir, stem + ".csv")
    write_main_csv(p, lines, shapes, recs, ceiling)
    files.append(p)
    if sweep:
        p = os.path.join(out_dir, stem + "-sweep.csv")
        write_sweep_csv(p, meta_lines, shapes, sweep, recs, ceiling)
        files.append(p)
    p = os.path.join(out_dir, stem + "-check.csv")
    write_check_csv(p, shapes, recs, sweep)
    files.append(p)
    p = os.path.join(out_dir, stem + "-summary.json")
    write_summary_json(p, shapes, recs, ceiling)
    files.append(p)
    if plot:
        p = os.path.join(out_dir, stem + ".png")
        msg = write_plot(p, shapes, recs, ceiling)
        if msg:
            notes.append(msg)
        else:
            files.append(p)
        if any(s.rope_dim for s in shapes):
            p = os.path.join(out_dir, stem + "-mla.png")
            msg = write_mla_plot(p, shapes, recs, ceiling)
            if msg:
                notes.append(msg)
            else:
                files.append(p)
    return files


# ---------------------------------------------------------------------------
# MLA rows (gpubench/mla.py)
# ---------------------------------------------------------------------------
MLA_RATIO_ALL = 1.0  # every row at or above the best peer
MLA_GEOMEAN = 1.5  # over the bf16 q_len 1 grid
MLA_PCT = 85.0  # 16-head rows from 32 MB of cache: % of the read ceiling
MLA_PCT_BYTES = 32e6
MLA_TFLOPS = 600.0  # 128-head rows, batch >= 16
MLA_FP8_RATIO = 0.6  # fp8 latent time / our bf16 time, 16-head rows


def print_mla_table(rows, by, ceiling):
    from .mla import MLA_PEERS, tflops_of
    print("-" * 132)
    print("MLA ROWS (us, CUDA-graph replay; MB = latent + rope cache read once + q + out; "
          "FlashInfer's MLA wrapper on the same 64-key pages)")
    print(f"{'shape':34s} {'MB':>7s} {'ours':>8s} {'%ceil':>5s} {'TFLOPS':>6s} {'spl':>3s} "
          f"{'nosplit':>8s} {'fa2':>8s} {'fa3':>8s} {'best peer':>20s} {'ratio':>5s}")
    for s in rows:
        rs = {r.impl: r for r in by.get(s.name, [])}
        if not rs:
            continue
        o = rs.get("flashdecode")
        bp = best_peer(list(rs.values()), s)
        ok = o is not None and o.status == "ok"
        print(f"{s.name:34s} {s.kv_bytes / 1e6:7.1f} {_us(o):>8s} {fmt(_pct(s, o, ceiling), 1):>5s} "
              f"{fmt(tflops_of(s, o.us_graph) if ok else None, 0):>6s} {_spl(o):>3} "
              f"{_us(rs.get('flashdecode-nosplit')):>8s} "
              + " ".join(f"{_us(rs.get(i)):>8s}" for i in MLA_PEERS)
              + f" {_peer_label(bp):>20s} {fmt(ratio_of(o, bp), 2):>5s}")


def mla_checks(shapes, recs, ceiling):
    """[(target, PASS | MISS | n/a, detail)] of the MLA rows (issue 33's targets): every row
    at or above the best peer; geomean >= 1.5 over the bf16 grid; 16-head rows from 32 MB of
    cache >= 85 % of the read ceiling; 128-head rows at batch >= 16 >= 600 TFLOPS; the e4m3
    latent <= 0.6x our bf16 time on the 16-head rows; every MLA configuration correct."""
    from .mla import tflops_of
    by = recs_by_shape(recs)
    rows = [s for s in shapes if s.rope_dim]
    shape_of = {s.name: s for s in shapes}
    out = []
    if not rows:
        return out

    def ours(s):
        return ours_of(by, s.name)

    def verdict(label, vals, ok, fmt_one, empty):
        out.append(target_verdict(label, vals, ok, fmt_one, empty))

    def nm(name):
        return name.replace("mla-", "")

    ratios = []
    for s in rows:
        r = ours(s)
        bp = best_peer(by.get(s.name, []), s)
        if r is not None and bp is not None:
            ratios.append((s, ratio_of(r, bp), bp.impl))
    verdict(f"every MLA row >= {MLA_RATIO_ALL:g}x the best FlashInfer MLA path", ratios,
            lambda v: v[1] >= MLA_RATIO_ALL,
            lambda v: f"{nm(v[0].name)} {v[1]:.2f} ({v[2].replace('fi-mla-', '')})",
            "no MLA row with a peer")
    grid = [q for s, q, _ in ratios if not s.kv_dtype and s.q_len == 1]
    g = geomean(grid)
    out.append((f"geomean ratio over the bf16 MLA grid >= {MLA_GEOMEAN:g}", "n/a" if g is None
                else ("PASS" if g >= MLA_GEOMEAN else "MISS"),
                "no bf16 row with a peer" if g is None else f"{g:.3f} over {len(grid)} rows"))
    vals = [(s, 100.0 * tbps_of(s, ours(s).us_graph) / ceiling) for s in rows
            if s.hq <= 16 and not s.kv_dtype and s.kv_bytes >= MLA_PCT_BYTES and ours(s)
            and ceiling]
    verdict(f"16-head bf16 rows from 32 MB of cache >= {MLA_PCT:g}% of the read ceiling", vals,
            lambda v: v[1] >= MLA_PCT, lambda v: f"{nm(v[0].name)} {v[1]:.1f}%",
            "no 16-head row of that size measured")
    vals = [(s, tflops_of(s, ours(s).us_graph)) for s in rows
            if s.hq >= 128 and s.batch >= 16 and not s.kv_dtype and ours(s)]
    verdict(f"128-head rows, batch >= 16: >= {MLA_TFLOPS:g} TFLOPS", vals,
            lambda v: v[1] >= MLA_TFLOPS, lambda v: f"{nm(v[0].name)} {v[1]:.0f}",
            "no 128-head batch row measured")
    vals = []
    for s in rows:
        b = shape_of.get(s.base)
        if not s.kv_dtype or b is None or ours(s) is None or ours(b) is None:
            continue
        vals.append((s, ours(s).us_graph / ours(b).us_graph, ours(s).us_graph, ours(b).us_graph))
    verdict(f"e4m3 latent <= {MLA_FP8_RATIO:g}x our bf16 time (16-head rows)", vals,
            lambda v: v[1] <= MLA_FP8_RATIO,
            lambda v: f"{nm(v[0].name)} {v[1]:.3f}x ({v[2]:.2f} vs {v[3]:.2f} us)",
            "no fp8 row with its bf16 base measured")
    bad = [r for r in recs if r.impl in OURS and r.shape in {s.name for s in rows}
           and r.status != "ok"]
    out.append(("every MLA flashdecode configuration ran and is correct",
                "PASS" if not bad else "MISS",
                "; ".join(f"{r.shape}:{r.impl} {r.status} {short(r.reason, 80)}" for r in bad[:6])
                or f"{len(rows)} rows"))
    return out


def write_mla_plot(path, shapes, recs, ceiling):
    """Bars of us per MLA row (log scale): ours, no split, FlashInfer fa2 / fa3, the floor."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"MLA plot skipped: matplotlib unavailable ({short(exc, 60)})"
    from .mla import MLA_PEERS
    rows = [s for s in shapes if s.rope_dim]
    by = recs_by_shape(recs)
    rows = [s for s in rows if any(r.status == "ok" for r in by.get(s.name, []))]
    if not rows:
        return "MLA plot skipped: no MLA row measured"
    impls = ("flashdecode", "flashdecode-nosplit") + tuple(MLA_PEERS)
    width = 0.8 / len(impls)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.75 * len(rows) + 2), 5.5))
    xs = range(len(rows))
    for k, impl in enumerate(impls):
        ys = []
        for s in rows:
            r = next((r for r in by.get(s.name, []) if r.impl == impl), None)
            ys.append(r.us_graph if r is not None and r.status == "ok" and r.us_graph else 0)
        col = PLOT_STYLES.get(impl, (".-", "black"))[1]
        ax.bar([x + (k - (len(impls) - 1) / 2) * width for x in xs], ys, width, label=impl,
               color=col)
    if ceiling:
        ax.scatter(list(xs), [s.kv_bytes / (ceiling * 1e12) * 1e6 for s in rows], marker="_",
                   s=300, color="black", zorder=3, label=f"floor (bytes / {ceiling:.2f} TB/s)")
    ax.set_yscale("log")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([s.name.replace("mla-", "") for s in rows], rotation=40, ha="right",
                       fontsize=8)
    ax.set_ylabel("µs per call (CUDA-graph replay, cold L2)")
    ax.set_title("MLA decode (512 + 64, one kv head, page 64 scattered) vs FlashInfer's MLA")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return ""
