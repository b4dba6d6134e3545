"""Runs without a GPU: --dry-run (made-up timings through the whole reporting path) and
--self-test (the float64 reference and its variants, the layouts and index conversions every
peer is fed, checked against independent computations on tiny shapes; CPU torch is enough)."""
import math

from .common import SDPA_PEERS, SWEEP_COUNTS, TOL, Rec, SweepRec
from .shapes import Shape


def dry_run(shapes, ceiling):
    """Plausible fake timings for every row: exercises the CSV, plot and verdict code."""
    from .flashinfer_peers import fi_impls_for, fi_reason
    from .peers import flex_reason, sdpa_reason

    recs, sweep = [], []
    sms = 132
    for i, s in enumerate(shapes):
        floor = s.kv_bytes / (ceiling * 1e12) * 1e6
        blocks = s.batch * s.hkv
        auto = max(1, min(128, (2 * sms) // blocks)) if blocks < 200 else 1
        extra = 1.0 + (0.02 if s.softcap else 0) + (0.3 if s.cascade else 0)
        recs.append(Rec(s.name, "flashdecode", floor / 0.9 * extra + 2.0, floor / 0.9 + 9.0, auto,
                        err=1e-3, rel=2e-3))
        if not s.is_variant:
            eff = min(1.0, blocks / sms)
            recs.append(Rec(s.name, "flashdecode-nosplit", floor / (0.9 * eff) + 1.5,
                            floor / (0.9 * eff) + 8.0, 1, err=1e-3, rel=2e-3))
        for impl, f, c in (("sdpa-flash", 0.7, 9.0), ("sdpa-cudnn", 0.85, 6.5), ("flex", 0.75, 12)):
            why = sdpa_reason(s) if impl in SDPA_PEERS else flex_reason(s)
            if why:
                recs.append(Rec(s.name, impl, status="n/a", reason=why))
            elif s.ragged and impl == "sdpa-flash":
                recs.append(Rec(s.name, impl, status="n/a", reason="padded batch + kv_len mask: "
                                "RuntimeError: No available kernel. Aborting execution."))
            elif s.dtype == "fp32" and impl != "flex":
                recs.append(Rec(s.name, impl, status="n/a", reason="fp32 not supported"))
            else:
                recs.append(Rec(s.name, impl, floor / f + c, floor / f + c + 20, err=1e-3, rel=3e-3))
        for j, impl in enumerate(fi_impls_for(s)):
            why = fi_reason(s, impl)
            if why:
                recs.append(Rec(s.name, impl, status="n/a", reason=why))
            else:
                recs.append(Rec(s.name, impl, floor / (0.8 + 0.03 * j) + 8.0, floor / 0.8 + 30,
                                err=1e-3, rel=4e-3))
        if s.kv_dtype:  # fp8 rows: errors vs the original K/V (quantization) and dequantized
            for r in recs:
                if r.shape == s.name and r.status == "ok":
                    fi = r.impl.startswith("fi-")
                    r.rel, r.rel_deq = (0.11 + 0.01 * fi, 2e-3 + 2e-3 * fi)
        if i == 3:
            recs[-1].status, recs[-1].reason = "FAIL", "rel err 0.5 > tol 0.02 (fake)"
        if s.sweep:
            for req in SWEEP_COUNTS:
                ns = min(req, max(1, s.capacity // 64))
                if any(x.shape == s.name and x.num_splits == ns for x in sweep):
                    continue
                eff = min(1.0, blocks * ns / (2 * sms))
                sweep.append(SweepRec(s.name, req, ns, floor / (0.9 * eff) + 2.0 + 0.02 * ns,
                                      rel=2e-3))
    return recs, sweep


# ---------------------------------------------------------------------------
# self-test
# ---------------------------------------------------------------------------

def naive_row(q, keys, vals, scale, window_left=-1, softcap=0.0, sink=None):
    """One query row of one head in plain Python floats (independent of the torch code):
    q [d], keys/vals [n][d]."""
    n = len(keys)
    lo = 0 if window_left < 0 else max(0, n - 1 - window_left)
    s = []
    for j in range(lo, n):
        x = scale * sum(a * b for a, b in zip(q, keys[j]))
        if softcap:
            x = softcap * math.tanh(x / softcap)
        s.append(x)
    m = max(s + ([sink] if sink is not None else []))
    e = [math.exp(x - m) for x in s]
    z = sum(e) + (math.exp(sink - m) if sink is not None else 0.0)
    d = len(vals[0])
    return [sum(e[i] * vals[lo + i][c] for i in range(len(e))) / z for c in range(d)]


def self_test(device):
    """Reference vs SDPA's math path and vs naive_row on tiny shapes: contiguous, paged,
    ragged, GQA/MHA, window, soft-cap, sinks, shared prefix; FlashInfer's page indices;
    the cascade's state layout and merge."""
    import torch
    import torch.nn.functional as F

    from .common import SETTINGS
    from .data import (attention_f64, compare, logical_kv, make_set, page_layout, peer_set,
                       prefix_pages, reference, softcap_sensitivity)
    from .flashinfer_peers import fi_page_indices, fi_spec_list

    SETTINGS.device = device
    torch.manual_seed(0)
    bad, total = 0, 0

    def ok(cond, what):
        nonlocal bad, total
        total += 1
        bad += not cond
        print(f"self-test {what}: {'ok' if cond else 'BAD'}")

    cases = [
        Shape("t-gqa", 2, 8, 2, 64, "fp32", [37, 37]),
        Shape("t-mha", 1, 4, 4, 64, "fp32", [100]),
        Shape("t-ragged", 3, 8, 2, 64, "fp32", [5, 130, 64]),
        Shape("t-paged", 3, 8, 2, 64, "fp32", [5, 130, 64], page_size=16),
        Shape("t-paged-bf16", 2, 8, 1, 128, "bf16", [70, 33], page_size=64),
    ]
    for sh in cases:
        s = make_set(torch, sh, device)
        ref = reference(torch, sh, s)
        q, k, v = peer_set(torch, sh, s)
        lens_t = torch.tensor(sh.lens, device=device)
        mask = torch.arange(sh.capacity, device=device)[None, None, None, :] < lens_t[:, None, None, None]
        kk = k.double().repeat_interleave(sh.hq // sh.hkv, dim=1)
        vv = v.double().repeat_interleave(sh.hq // sh.hkv, dim=1)
        o = F.scaled_dot_product_attention(q.double(), kk, vv, attn_mask=mask)[:, :, 0]
        if sh.page_size:  # block_table walked key by key, independently of logical_kv
            good = True
            for b in range(sh.batch):
                kb, vb = logical_kv(sh, s, b)
                for j in range(sh.lens[b]):
                    page = int(s.block_table[b, j // sh.page_size])
                    good &= bool(torch.equal(kb[j], s.k[page, j % sh.page_size])
                                 and torch.equal(vb[j], s.v[page, j % sh.page_size]))
            ok(good, f"{sh.name:14s} paged gather")
        err, rel = compare(torch, o, ref)
        ok(rel < 1e-10, f"{sh.name:14s} reference vs SDPA math, rel err {rel:.2e}")
        s.out.copy_(ref.to(s.out.dtype)[:, None])
        err, rel = compare(torch, s.out[:, 0], ref)
        ok(rel <= TOL[sh.dtype], f"{sh.name:14s} rounded out rel err {rel:.2e} (tol {TOL[sh.dtype]:g})")

    # variants: attention_f64 against naive_row (python floats), every combination
    n, hkv, g, d = 45, 2, 3, 8
    qv = torch.randn(hkv, g, d, dtype=torch.float64)
    kv = torch.randn(n, hkv, d, dtype=torch.float64) * 2.0
    vv = torch.randn(n, hkv, d, dtype=torch.float64)
    for w in (-1, 0, 7, 44, 200):
        for cap in (0.0, 3.0):
            for use_sink in (False, True):
                sinks = torch.randn(hkv, g, dtype=torch.float64) + 2.0 if use_sink else None
                got = attention_f64(torch, qv, kv, vv, 0.4, w, cap, sinks)
                worst = 0.0
                for h in range(hkv):
                    for j in range(g):
                        exp = naive_row(qv[h, j].tolist(), kv[:, h].tolist(), vv[:, h].tolist(),
                                        0.4, w, cap, None if sinks is None else float(sinks[h, j]))
                        worst = max(worst, max(abs(a - b) for a, b in zip(got[h, j].tolist(), exp)))
                ok(worst < 1e-12, f"attention_f64 window {w} cap {cap:g} sinks {use_sink}: "
                                  f"max diff {worst:.1e}")

    # the variant rows' data makes the check see each feature (each dropped feature fails)
    from .shapes import SOFTCAP_Q_SCALE
    gem = Shape("t-gemma", 1, 16, 8, 256, "bf16", [4096], kind="variant", softcap=50.0,
                q_scale=SOFTCAP_Q_SCALE)
    sens = softcap_sensitivity(torch, gem, device)
    ok(sens > 2.5 * TOL["bf16"], f"soft-cap 50 moves the output by {sens:.3f} rel "
                                 f"(> 2.5 x tol {TOL['bf16']:g})")
    oss = Shape("t-gptoss", 2, 64, 8, 64, "bf16", [4096, 4096], kind="variant", sinks=True)
    s = make_set(torch, oss, device)
    ref = reference(torch, oss, s)
    keep, s.sinks = s.sinks, None
    rel = compare(torch, reference(torch, oss, s).float(), ref)[1]
    s.sinks = keep
    ok(rel > 2.5 * TOL["bf16"], f"dropped sinks move the output by {rel:.3f} rel")
    oss.window_left = 127
    s = make_set(torch, oss, device)
    ref = reference(torch, oss, s)
    keep, s.sinks = s.sinks, None
    rel = compare(torch, reference(torch, oss, s).float(), ref)[1]
    ok(rel > 2.5 * TOL["bf16"], f"dropped sinks with window 127 move the output by {rel:.3f} rel")
    oss.window_left, oss.sinks = -1, False
    full = reference(torch, oss, s)
    oss.window_left = 127
    rel = compare(torch, full.float(), reference(torch, oss, s))[1]
    ok(rel > 2.5 * TOL["bf16"], f"a missing window moves the output by {rel:.3f} rel")

    # shared prefix: every row starts with the same pages; FlashInfer's indices rebuild the keys
    pre = Shape("t-prefix", 3, 4, 2, 16, "fp32", [64 + 40] * 3, page_size=16, kind="variant",
                prefix_len=64)
    s = make_set(torch, pre, device)
    p0 = prefix_pages(pre, 16)
    ok(all(torch.equal(s.block_table[b, :p0], s.block_table[0, :p0]) for b in range(3))
       and len(set(s.block_table[:, p0:].flatten().tolist())) == 3 * 3
       and s.k.shape[0] == page_layout(pre, 16)[0] == 4 + 9, "shared-prefix page layout")
    ok(pre.kv_bytes == 2 * (64 + 3 * 40) * 2 * 16 * 4, "shared-prefix bytes count the prefix once")
    for sh, st in ((pre, s), (cases[3], make_set(torch, cases[3], device))):
        indptr, indices, last = fi_page_indices(torch, sh, st.block_table.cpu(), sh.page_size)
        good = True
        for b in range(sh.batch):
            pages = indices[indptr[b]:indptr[b + 1]].long()
            kb = st.k[pages].reshape(-1, sh.hkv, sh.d)
            nk = (len(pages) - 1) * sh.page_size + int(last[b])
            good &= nk == sh.lens[b] and bool(torch.equal(kb[:nk], logical_kv(sh, st, b)[0]))
        ok(good, f"FlashInfer indptr/indices/last_page_len of {sh.name}")

    # cascade: prefix state (non-causal, every row sees the prefix) + suffix state, merged by
    # their lse, equals the whole; the strided lse view lands where merge_states reads it
    b, hq, hkv, d, npre, nsuf = 4, 6, 2, 8, 30, 9
    g = hq // hkv
    q = torch.randn(b, hq, d, dtype=torch.float64)
    kp, vp = torch.randn(npre, hkv, d, dtype=torch.float64), torch.randn(npre, hkv, d, dtype=torch.float64)
    ks, vs = torch.randn(b, nsuf, hkv, d, dtype=torch.float64), torch.randn(b, nsuf, hkv, d, dtype=torch.float64)

    def state(qb, k, v):
        sc = torch.einsum("hgd,nhd->hgn", qb.reshape(hkv, g, d), k) * 0.3
        lse = torch.logsumexp(sc, -1)
        return torch.einsum("hgn,nhd->hgd", torch.softmax(sc, -1), v).reshape(hq, d), lse.reshape(hq)

    worst, l1s = 0.0, []
    st_lse = torch.empty(2, b, hq, 1, dtype=torch.float64)
    view = st_lse[0].view(b, hq).t().unsqueeze(0)  # the prefix call's [1, Hq, q_len=B] lse
    for i in range(b):
        o1, l1 = state(q[i], kp, vp)
        o2, l2 = state(q[i], ks[i], vs[i])
        view[0, :, i] = l1
        l1s.append(l1)
        m = torch.maximum(l1, l2)
        w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)
        merged = (w1[:, None] * o1 + w2[:, None] * o2) / (w1 + w2)[:, None]
        whole, _ = state(q[i], torch.cat([kp, ks[i]]), torch.cat([vp, vs[i]]))
        worst = max(worst, (merged - whole).abs().max().item())
    ok(worst < 1e-12, f"cascade merge = whole attention (max diff {worst:.1e})")
    ok(torch.equal(st_lse[0, :, :, 0], torch.stack(l1s)),
       "the prefix call's strided [1, Hq, B] lse view lands in merge_states' [B, Hq, 1] rows")

    # the prebuild list: one module per distinct configuration, none for fp32 / paged rows
    from .shapes import build_variant_shapes
    specs = fi_spec_list(build_variant_shapes() + [Shape("f32", 1, 32, 8, 128, "fp32", [64]),
                                                  Shape("p", 1, 32, 8, 128, "bf16", [64],
                                                        page_size=16, kind="paged")])
    ok(len(specs) == len({str(x) for x in specs}) and all(sp[0] in ("decode", "prefill", "xqa", "cascade")
                                                         for sp in specs)
       and ["xqa", "bf16", 16, 64, 8, True] in specs and ["decode", "bf16", 256, True, True] in specs
       and not any("fp32" in sp for sp in specs), f"FlashInfer prebuild list ({len(specs)} modules)")

    # FlashInfer (where it imports): every call the adapters make binds to its signatures, and
    # the prebuild's module specs have the names the wrappers load
    fi_check(torch, ok)
    print(f"{total - bad} passed, {bad} failed")
    return 1 if bad else 0


def fi_check(torch, ok):
    import os
    import tempfile

    from .flashinfer_peers import FI_VERSION_PINNED, api_check, import_flashinfer

    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", tempfile.mkdtemp(prefix="fd-fi-selftest-"))
    fi, why = import_flashinfer()
    if fi is None:
        print(f"self-test FlashInfer checks skipped ({why})")
        return
    print(f"self-test FlashInfer {fi.__version__} (pinned {FI_VERSION_PINNED})")
    problems = api_check(fi, torch)
    ok(not problems, "FlashInfer call signatures" + (": " + "; ".join(problems) if problems else ""))
    from .fi_prebuild import make_spec
    from flashinfer.jit.attention.modules import get_batch_decode_uri, get_batch_prefill_uri
    from flashinfer.jit.xqa import gen_xqa_module

    bf = torch.bfloat16
    pairs = [
        (["decode", "bf16", 128, True, False],
         get_batch_decode_uri(bf, bf, bf, torch.int32, 128, 128, 0, True, False)),
        (["prefill", "fa2", "bf16", 256, False, True],
         get_batch_prefill_uri("fa2", bf, bf, bf, torch.int32, 256, 256, 0, False, True, False)),
        (["prefill", "fa2", "bf16", 128, True, False],
         get_batch_prefill_uri("fa2", bf, bf, bf, torch.int32, 128, 128, 0, True, False, False)),
        (["xqa", "bf16", 16, 64, 8, True], gen_xqa_module(bf, bf, 16, 64, 8, True, bf, 1).name),
        (["cascade"], "cascade"),
    ]
    for sp, uri in pairs:
        try:
            name = make_spec(sp).name
        except Exception as exc:
            name = f"{type(exc).__name__}: {exc}"
        ok(name == uri, f"prebuild spec {sp} -> {name}")
