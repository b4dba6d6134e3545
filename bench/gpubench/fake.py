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
        for impl, f, c in (() if s.rope_dim else  # MLA rows: FlashInfer's MLA paths only
                           (("sdpa-flash", 0.7, 9.0), ("sdpa-cudnn", 0.85, 6.5), ("flex", 0.75, 12))):
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

    fp8_self_test(torch, device, ok)
    fp8_verdict_test(ok)
    from .mla import self_test as mla_self_test
    mla_self_test(torch, device, ok)

    # FlashInfer (where it imports): every call the adapters make binds to its signatures, and
    # the prebuild's module specs have the names the wrappers load
    fi_check(torch, ok)
    print(f"{total - bad} passed, {bad} failed")
    return 1 if bad else 0


def fp8_self_test(torch, device, ok):
    """The fp8 rows' plumbing: quantization (amax scales, saturation, rounding), the same data
    in our contiguous layout and FlashInfer's scattered 16-key pages (scales included), the
    two references, the bytes, the data's peakedness, the peers' n/a reasons, the scales
    passed to run(), the prebuild list."""
    from .data import (attention_f64, compare, dequantize_fp8, fp8_scales, logical_kv, make_set,
                       quantize_fp8, realistic_qkv)
    from .flashinfer_peers import fi_reason, fi_spec_list
    from .peers import flex_reason, ours_call, sdpa_reason, variant_plan_kwargs
    from .shapes import fp8_shapes

    # quantization: |x - deq| <= half an e4m3 step (2^-4 relative; 2^-10 * scale absolute
    # in the subnormals), nothing beyond 448, per-token scale = the row's amax / 448
    x = torch.randn(2, 50, 3, 16) * torch.exp(2 * torch.randn(2, 50, 3, 1))
    x[0, 0, 0] = 0.0
    good = True
    for gran in ("tensor", "head", "token"):
        sc = fp8_scales(torch, x, gran, 448.0)
        x8 = quantize_fp8(torch, x, sc, gran, "e4m3")
        deq = dequantize_fp8(torch, x8, sc, gran)
        bsc = {"tensor": sc, "head": sc[:, None], "token": sc[..., None]}[gran]
        bound = torch.maximum(x.abs() * 2.0 ** -4, bsc * 2.0 ** -10) * (1 + 1e-6)
        good &= bool(((deq - x).abs() <= bound).all()) and bool(x8.float().abs().max() <= 448)
        if gran == "token":
            amax = x.abs().amax(-1)
            good &= bool(torch.allclose(sc[amax > 0], amax[amax > 0] / 448.0)) and sc[0, 0, 0] == 1
    ok(good, "fp8 quantization: amax scales, |error| <= half an e4m3 step, saturated")

    rows = fp8_shapes()
    tok = next(r for r in rows if r.kv_scale == "token" and r.batch == 64)
    ten = next(r for r in rows if r.kv_scale == "tensor" and r.batch == 64)
    bf = next(r for r in rows if r.name == ten.base)
    ok(ten.kv_bytes == bf.kv_bytes // 2 + 8 and tok.kv_bytes == bf.kv_bytes // 2 + 2 * 4 * 64 * 8192 * 8,
       "fp8 bytes = fp8 K+V + scale bytes (per-tensor 8 B, per-token 8 B a key and kv head)")
    ok(all(sdpa_reason(r) and flex_reason(r) for r in rows)
       and all(fi_reason(r, i) for r in rows if r.kv_scale == "token" or not r.kv_dtype
               for i in ("fi-cudacore", "fi-tensorcore", "fi-xqa", "fi-cudnn"))
       and not any(fi_reason(ten, i) for i in ("fi-cudacore", "fi-tensorcore", "fi-xqa"))
       and fi_reason(ten, "fi-cudnn"), "fp8 rows' peers: FlashInfer cudacore / tensor-core / XQA "
                                       "on per-tensor rows, the rest n/a with a reason")
    kw = variant_plan_kwargs(tok)
    ok(kw == {"kv_dtype": "e4m3", "kv_scale": "token"} and variant_plan_kwargs(bf) == {},
       "fp8 plan keywords (kv_dtype, kv_scale)")
    specs = fi_spec_list(rows)
    ok(sorted(map(str, specs)) == sorted(map(str, [
        ["decode", "bf16", 128, False, False, "e4m3"],
        ["prefill", "fa2", "bf16", 128, False, False, "e4m3"],
        ["xqa", "bf16", 16, 128, 4, False, "e4m3"]])), f"fp8 prebuild list: {specs}")

    # the same data in both layouts: ours (contiguous) and FlashInfer's (16-key pages, scattered)
    for gran in ("tensor", "token"):
        sh = Shape(f"t-fp8-{gran}", 2, 8, 2, 64, "bf16", [100, 100], kind="variant",
                   family="fp8", kv_dtype="e4m3", kv_scale=gran)
        a = make_set(torch, sh, device, index=1, want_ref=True)
        perm = torch.randperm(14)
        p = make_set(torch, sh, device, page_size=16, perm=perm, index=1)
        other = make_set(torch, sh, device, index=2)
        same = torch.equal(a.q, p.q) and not torch.equal(a.k.view(torch.uint8),
                                                          other.k.view(torch.uint8))
        deq = torch.zeros(2, 8, 64, dtype=torch.float64)
        for b in range(2):
            ka, va = logical_kv(sh, a, b, page_size=0)
            kp, vp = logical_kv(sh, p, b, page_size=16)
            same &= torch.equal(ka.view(torch.uint8), kp.view(torch.uint8))
            same &= torch.equal(va.view(torch.uint8), vp.view(torch.uint8))
            if gran == "token":
                np_ = 7
                pages = p.block_table[b, :np_].long()
                same &= torch.equal(a.k_scale[b, :100], p.k_scale[pages].reshape(-1, 2)[:100])
                same &= torch.equal(a.v_scale[b, :100], p.v_scale[pages].reshape(-1, 2)[:100])
                ks, vs = a.k_scale[b, :100, :, None], a.v_scale[b, :100, :, None]
            else:
                same &= a.k_scale_f == p.k_scale_f and a.v_scale_f == p.v_scale_f
                ks, vs = a.k_scale_f, a.v_scale_f
            qb = a.q[b, 0].reshape(2, 4, 64)
            deq[b] = attention_f64(torch, qb, ka.double() * ks, va.double() * vs,
                                   1 / math.sqrt(64)).reshape(8, 64)
        ok(same, f"fp8 per-{gran}: the same seeded q / fp8 K, V / scales in our layout and in "
                 f"FlashInfer's scattered pages (another index: other data)")
        rel_d = compare(torch, deq.float(), a.ref.deq)[1]
        rel_q = compare(torch, a.ref.deq.float(), a.ref.orig)[1]
        ok(rel_d < 1e-6 and 0 < rel_q < 0.5, f"fp8 per-{gran} references: dequantized ref "
           f"recomputed {rel_d:.1e}; quantization alone moves the output {rel_q:.3f} rel")
        calls = []

        class Rec_:
            def run(self, *args, **kw):
                calls.append(kw)
        ours_call(Rec_(), [a], None)(0)
        ok(calls and calls[0].get("k_scale") is a.k_scale and calls[0].get("v_scale") is a.v_scale,
           f"fp8 per-{gran}: run() gets the set's k_scale / v_scale")

    # the data is not uniform: a few keys hold most of each row's softmax
    sh = Shape("t-fp8-peak", 1, 32, 8, 128, "bf16", [16384], kind="variant", kv_dtype="e4m3",
               kv_scale="tensor")
    g = torch.Generator(device=device).manual_seed(3)
    q, k, v = realistic_qkv(torch, sh, device, g)
    sc = torch.einsum("hgd,nhd->hgn", q[0, 0].double().reshape(8, 4, 128), k[0].double())
    pr = torch.softmax(sc / math.sqrt(128), -1)
    top = pr.topk(164, dim=-1).values.sum(-1).mean().item()  # the top 1 % of the keys
    sc = torch.einsum("hgd,nhd->hgn", torch.randn(8, 4, 128, dtype=torch.float64),
                      torch.randn(16384, 8, 128, dtype=torch.float64))
    iid = torch.softmax(sc / math.sqrt(128), -1).topk(164, dim=-1).values.sum(-1).mean().item()
    ok(top > 0.5 > iid, f"realistic fp8 data: the top 1 % of keys hold {100 * top:.0f} % of the "
                        f"softmax mass (iid normal q, K: {100 * iid:.0f} %)")


def fp8_verdict_test(ok):
    """fp8_checks on made-up records: each target's PASS and MISS."""
    from .report import fp8_checks
    from .shapes import fp8_shapes

    rows = fp8_shapes()
    ceiling = 4.55

    def recs(fp8_x=0.5, token_x=1.03, fi_x=1.2, ours_rel=0.120, fi_rel=0.121):
        out = []
        for s in rows:
            floor = s.kv_bytes / (ceiling * 1e12) * 1e6
            if not s.kv_dtype:
                out.append(Rec(s.name, "flashdecode", floor / 0.95, rel=2e-3))
                continue
            base = next(r for r in rows if r.name == s.base)
            us = base.kv_bytes / (ceiling * 1e12) * 1e6 / 0.95 * fp8_x
            us *= token_x if s.kv_scale == "token" else 1.0
            out.append(Rec(s.name, "flashdecode", us, rel=ours_rel, rel_deq=2e-3))
            if s.kv_scale == "tensor":
                out.append(Rec(s.name, "fi-xqa", us * fi_x, rel=fi_rel, rel_deq=3e-2,
                               status="FAIL"))
                out.append(Rec(s.name, "fi-cudacore", us * 1.5, rel=fi_rel + 0.01, rel_deq=3e-3))
        return out

    def states(rs):
        return [v for _, v, _ in fp8_checks(rows, rs, ceiling)]

    ok(states(recs()) == ["PASS", "PASS", "PASS", "PASS", "PASS", "info", "PASS"],
       f"fp8 verdicts on a passing made-up run: {states(recs())}")
    bad = [states(recs(fp8_x=0.6))[0], states(recs(fp8_x=1.1))[1],
           states(recs(token_x=1.06))[2], states(recs(fi_x=0.95))[3],
           states(recs(ours_rel=0.125))[4]]
    ok(bad == ["MISS"] * 5, f"fp8 verdicts MISS when each target is missed: {bad}")


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
    from .mla import fi_self_test
    fi_self_test(fi, torch, ok)
    from .fi_prebuild import make_spec
    from flashinfer.jit.attention.modules import get_batch_decode_uri, get_batch_prefill_uri
    from flashinfer.jit.xqa import gen_xqa_module

    bf, f8 = torch.bfloat16, torch.float8_e4m3fn
    pairs = [
        (["decode", "bf16", 128, True, False],
         get_batch_decode_uri(bf, bf, bf, torch.int32, 128, 128, 0, True, False)),
        (["prefill", "fa2", "bf16", 256, False, True],
         get_batch_prefill_uri("fa2", bf, bf, bf, torch.int32, 256, 256, 0, False, True, False)),
        (["prefill", "fa2", "bf16", 128, True, False],
         get_batch_prefill_uri("fa2", bf, bf, bf, torch.int32, 128, 128, 0, True, False, False)),
        (["xqa", "bf16", 16, 64, 8, True], gen_xqa_module(bf, bf, 16, 64, 8, True, bf, 1).name),
        (["cascade"], "cascade"),
        (["decode", "bf16", 128, False, False, "e4m3"],
         get_batch_decode_uri(bf, f8, bf, torch.int32, 128, 128, 0, False, False)),
        (["prefill", "fa2", "bf16", 128, False, False, "e4m3"],
         get_batch_prefill_uri("fa2", bf, f8, bf, torch.int32, 128, 128, 0, False, False, False)),
        (["xqa", "bf16", 16, 128, 4, False, "e4m3"],
         gen_xqa_module(bf, f8, 16, 128, 4, False, bf, 1).name),
    ]
    for sp, uri in pairs:
        try:
            name = make_spec(sp).name
        except Exception as exc:
            name = f"{type(exc).__name__}: {exc}"
        ok(name == uri, f"prebuild spec {sp} -> {name}")
