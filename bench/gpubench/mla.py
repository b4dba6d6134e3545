"""The MLA rows: multi-head latent attention decode in the absorbed form (DeepSeek-V3/R1,
Kimi-K2, GLM-5): one kv head whose key is [latent c_kv (512) | rope k_pe (64)] = 576 values a
token and whose value is the latent, q as q_nope [.., Hq, 512] + q_pe [.., Hq, 64].

  rows        bf16, 64-key pages scattered over the pool, softmax_scale 1/sqrt(192): the
              issue's grid (B=1 4k / 32k, B=16 / 64 8k at 16 and 128 heads), B=128 4k at 16
              and 128 heads, e4m3 latent rows (per-tensor scale, rope bf16) for the 16-head
              rows, one q_len 2 row (multi-token prediction)
  data        MlaSet: q_nope, q_pe, ckv [pages, 64, 512], kpe [pages, 64, 64] (two buffers,
              FlashInfer's / SGLang's layout), one block table shared by a row's R sets; seeded
              by row and set, so the FlashInfer phase rebuilds the same data; q_len > 1 rows
              make the newest key score high (causal_probe) so the check sees the causal mask
  reference   float64 over the same rounded inputs (fp8: over the dequantized latent, and over
              the bf16 latent before quantization, as the fp8 rows of the decode grid)
  ours        ours_mla(): the one adapter to flashdecode's MLA Python API
  peers       FlashInfer's BatchMLAPagedAttentionWrapper, backends fa2 and fa3, on the same
              pages (planned outside the timed region); its fp8 path takes an e4m3 rope part
              too (kpe_cache of kv_data_type), so its fp8 sets carry an e4m3 copy of k_pe
  counting    bytes = the cache read once (keys x (512 x esize + 64 x 2)) + one float scale
              (fp8) + q + out; TFLOPS = 2 x q_len x Hq x keys x (576 + 512) / time
"""
import math
import os

from .common import SETTINGS, exc_text, short
from .data import FP8_MAX, Fp8Ref, compare, fp8_seed, fp8_torch_dtype, torch_dtype

MLA_D, MLA_R = 512, 64
MLA_PAGE = 64
MLA_SCALE = 1.0 / math.sqrt(192)  # DeepSeek-V3: the head dim before absorption (128 + 64)
MLA_PEERS = ("fi-mla-fa2", "fi-mla-fa3")
FI_MLA_WS_BYTES = 128 << 20

# (batch, kv_len, num_heads_q): the grid, then B=128 4k
MLA_GRID = [(1, 4096, 16), (1, 32768, 16), (16, 8192, 16), (64, 8192, 16),
            (1, 32768, 128), (16, 8192, 128), (64, 8192, 128),
            (128, 4096, 16), (128, 4096, 128)]
MLA_QUICK = [(1, 32768, 16), (64, 8192, 128)]
MLA_MTP = (64, 8192, 16, 2)  # (batch, kv_len, heads, q_len)


def mla_name(b, hq, n, kv="bf16", q_len=1):
    return f"mla-b{b}-h{hq}-n{n}-{kv}" + (f"-q{q_len}" if q_len > 1 else "")


def build_mla_shapes(quick=False):
    """The MLA rows (kind "mla"): bf16 grid, e4m3 latent rows for the 16-head rows (base: the
    bf16 row of the same call), one q_len 2 row."""
    from .shapes import Shape

    out = []

    def add(b, n, hq, kv="", q_len=1, base=""):
        name = mla_name(b, hq, n, kv or "bf16", q_len)
        note = (f"MLA {MLA_D}+{MLA_R}, {hq} query heads, q_len {q_len}, page {MLA_PAGE} "
                f"scattered, scale 1/sqrt(192)"
                + (", e4m3 latent (per-tensor scale, amax/448), rope bf16" if kv else ""))
        out.append(Shape(name, b, hq, 1, MLA_D, "bf16", [n] * b, MLA_PAGE, "mla", base, False,
                         note, family="mla", kv_dtype=kv, kv_scale="tensor" if kv else "",
                         rope_dim=MLA_R, q_len=q_len, softmax_scale=MLA_SCALE))
        return name

    grid = MLA_QUICK if quick else MLA_GRID
    for b, n, hq in grid:
        add(b, n, hq)
    for b, n, hq in grid:
        if hq == 16:
            add(b, n, hq, "e4m3", base=mla_name(b, hq, n))
    if not quick:
        b, n, hq, ql = MLA_MTP
        add(b, n, hq, q_len=ql)
    return out


def is_mla(shape):
    return bool(getattr(shape, "rope_dim", 0))


def mla_bytes(shape):
    """Bytes one call must move: the latent + rope cache once (rope 16-bit), one float32
    scale (fp8), q_nope + q_pe, out."""
    e16 = 2
    keys = sum(shape.lens)
    cache = keys * (shape.d * (1 if shape.kv_dtype else e16) + shape.rope_dim * e16)
    rows = shape.batch * shape.q_len * shape.hq
    return cache + (4 if shape.kv_dtype else 0) + rows * (shape.d + shape.rope_dim) * e16 \
        + rows * shape.d * e16


def mla_flops(shape):
    """2 x (q_len x Hq) rows x keys x (576 for the scores + 512 for the values), the keys of
    every row counted as kv_len (the causal rows of a q_len > 1 call see a few fewer)."""
    return 2.0 * shape.q_len * shape.hq * sum(shape.lens) * (shape.d + shape.rope_dim + shape.d)


def tflops_of(shape, us):
    return None if not us or us <= 0 or not is_mla(shape) else mla_flops(shape) / (us * 1e-6) / 1e12


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------

class MlaSet:
    """One set of call buffers: q_nope [B, q_len, Hq, 512], q_pe [B, q_len, Hq, 64],
    ckv [pages, page_size, 512] (bf16 or e4m3), kpe [pages, page_size, 64] bf16, out like
    q_nope, block_table [B, pages a sequence] int32. fp8: k_scale float32 (1,) on the device
    and as a float; kpe8 / kpe_scale_f: FlashInfer's e4m3 copy of the rope part."""

    def __init__(self, q_nope, q_pe, ckv, kpe, out, block_table):
        self.q_nope, self.q_pe, self.ckv, self.kpe, self.out = q_nope, q_pe, ckv, kpe, out
        self.block_table = block_table
        self.k_scale = None
        self.k_scale_f = None
        self.kpe8 = None
        self.kpe_scale_f = None
        self.ref = None  # set 0: float64 [B, q_len, Hq, 512], or an Fp8Ref


def mla_pages(shape):
    pps = [(n + shape.page_size - 1) // shape.page_size for n in shape.lens]
    return sum(pps), pps


def mla_table(torch, shape, device):
    """The row's block table (CPU seeded permutation: pages scattered over the pool)."""
    num_pages, pps = mla_pages(shape)
    g = torch.Generator().manual_seed(fp8_seed(shape, 10 ** 6))
    perm = torch.randperm(num_pages, generator=g).to(torch.int32)
    table = torch.zeros(shape.batch, max(pps), dtype=torch.int32)
    at = 0
    for b, np_ in enumerate(pps):
        table[b, :np_] = perm[at:at + np_]
        at += np_
    return table.to(device)


def make_mla_set(torch, shape, device, table, index=0, want_ref=False, fi_fp8=False):
    """Set `index` of an MLA row (the same bytes whenever it is rebuilt): random normal q and
    caches in bf16; an fp8 row quantizes the latent to e4m3 with one amax/448 scale. want_ref:
    also the float64 reference(s). fi_fp8: also FlashInfer's e4m3 rope copy (kpe8)."""
    dt = torch_dtype(torch, shape.dtype)
    b, ql, hq, d, r = shape.batch, shape.q_len, shape.hq, shape.d, shape.rope_dim
    num_pages, _ = mla_pages(shape)
    ps = shape.page_size
    gen = torch.Generator(device=device)
    gen.manual_seed(fp8_seed(shape, index))

    def rn(*size):
        return torch.randn(*size, dtype=torch.float32, device=device, generator=gen).to(dt)

    q_nope, q_pe = rn(b, ql, hq, d), rn(b, ql, hq, r)
    ckv, kpe = rn(num_pages, ps, d), rn(num_pages, ps, r)
    if ql > 1:
        causal_probe(torch, shape, q_nope, ckv, table)
    out = torch.empty(b, ql, hq, d, dtype=dt, device=device)
    s = MlaSet(q_nope, q_pe, ckv, kpe, out, table)
    if shape.kv_dtype:
        fmax = FP8_MAX[shape.kv_dtype]
        f8 = fp8_torch_dtype(torch, shape.kv_dtype)
        scale = max(ckv.float().abs().max().item() / fmax, 2.0 ** -126)
        ckv8 = (ckv.float() / scale).clamp_(-fmax, fmax).to(f8)
        s.k_scale = torch.tensor([scale], dtype=torch.float32, device=device)
        s.k_scale_f = scale
        if want_ref:
            orig = mla_reference(torch, shape, s)  # the bf16 latent before quantization
            s.ckv = ckv8
            deq = mla_reference(torch, shape, s, ckv=ckv8.float() * scale)
            s.ref = Fp8Ref(orig, deq)
        s.ckv = ckv8
        del ckv
        if fi_fp8:
            ks = max(kpe.float().abs().max().item() / fmax, 2.0 ** -126)
            s.kpe8 = (kpe.float() / ks).clamp_(-fmax, fmax).to(f8)
            s.kpe_scale_f = ks
            if want_ref:  # FlashInfer's own cache: e4m3 rope too
                s.ref_fi = Fp8Ref(s.ref.orig, mla_reference(
                    torch, shape, s, ckv=s.ckv.float() * scale, kpe=s.kpe8.float() * ks))
    elif want_ref:
        s.ref = mla_reference(torch, shape, s)
    return s


def causal_probe(torch, shape, q_nope, ckv, table):
    """q_len > 1 rows: the newest key of every sequence (which only the last query row may
    see) gets a latent along the mean direction of the sequence's queries, scaled so that it
    scores ~log(kv_len) above the others on average: it then holds about half of the softmax
    of the rows that see it, and a kernel that lets an earlier row see it fails the check."""
    scale = shape.softmax_scale or 1.0 / math.sqrt(shape.d)
    ps = shape.page_size
    for b in range(shape.batch):
        n = shape.lens[b]
        if n < 2:
            continue
        q = q_nope[b].float().reshape(-1, shape.d)
        u = q.sum(dim=0)
        u = u / u.norm()
        per_unit = (q @ u).mean().item() * scale
        page, row = int(table[b, (n - 1) // ps]), (n - 1) % ps
        ckv[page, row] = (u * (math.log(n) / per_unit)).to(ckv.dtype)


def mla_reference(torch, shape, s, ckv=None, kpe=None, causal=True):
    """float64 MLA attention of set s: [B, q_len, Hq, 512]. Row t of sequence b sees keys
    0 .. kv_len - q_len + t (every key with causal=False: self-test only); score = scale *
    (q_nope . c_kv + q_pe . k_pe); out = softmax . c_kv. ckv / kpe: the caches to read
    (default the set's own, as stored)."""
    ckv = s.ckv if ckv is None else ckv
    kpe = s.kpe if kpe is None else kpe
    b_, ql, hq, d = shape.batch, shape.q_len, shape.hq, shape.d
    scale = shape.softmax_scale or 1.0 / math.sqrt(d)
    ps = shape.page_size
    ref = torch.zeros(b_, ql, hq, d, dtype=torch.float64, device=s.q_nope.device)
    for b in range(b_):
        n = shape.lens[b]
        if n == 0:
            continue
        np_ = (n + ps - 1) // ps
        pages = s.block_table[b, :np_].long()
        ck = ckv[pages].reshape(np_ * ps, -1)[:n].double()  # [n, 512]
        kp = kpe[pages].reshape(np_ * ps, -1)[:n].double()  # [n, 64]
        sc = (torch.matmul(s.q_nope[b].double(), ck.t())
              + torch.matmul(s.q_pe[b].double(), kp.t())) * scale  # [q_len, Hq, n]
        if ql > 1 and causal:
            j = torch.arange(n, device=sc.device)
            last = n - ql + torch.arange(ql, device=sc.device)  # row t's last key
            sc = sc.masked_fill((j[None, :] > last[:, None])[:, None, :], float("-inf"))
        ref[b] = torch.matmul(torch.softmax(sc, dim=-1), ck)
    return ref


# ---------------------------------------------------------------------------
# ours: the one adapter to flashdecode's MLA Python API
# ---------------------------------------------------------------------------

MLA_PLAN_CLASS = "MLADecodePlan"  # flashdecode's MLA plan object, when the package has it


def ours_mla(fd, torch, shape, num_splits):
    """(run, planned num_splits or None): run(s) runs flashdecode's MLA decode of shape on set
    s into s.out. Planned here, outside the timed region, with the plan object when the
    package has one; else through flashdecode.mla_decode (which caches its plan). Raises
    Unavailable when the package has no MLA."""
    from .peers import Unavailable

    dt = torch_dtype(torch, shape.dtype)
    kv = shape.kv_dtype or None
    Plan = getattr(fd, MLA_PLAN_CLASS, None)
    if Plan is not None:
        num_pages, pps = mla_pages(shape)
        try:
            plan = Plan(batch=shape.batch, q_len=shape.q_len, num_heads_q=shape.hq,
                        head_dim=shape.d, rope_dim=shape.rope_dim, dtype=dt,
                        kv_capacity=shape.capacity, page_size=shape.page_size,
                        max_pages_per_seq=max(pps), num_pages=num_pages, num_splits=num_splits,
                        softmax_scale=shape.softmax_scale, device=SETTINGS.device,
                        kv_len_hint=list(shape.lens), kv_dtype=kv,
                        # fp8 rows: an e4m3 latent beside a bf16 rope part, one scale
                        rope_dtype=dt if kv else None, kv_scale=shape.kv_scale or None)
        except TypeError:
            plan = None  # another constructor: the one-call API below
        if plan is not None:
            def run(s, kv_len):
                kw = {"k_scale": s.k_scale} if s.k_scale is not None else {}
                plan.run(s.q_nope, s.q_pe, s.ckv, s.kpe, kv_len, block_table=s.block_table,
                         out=s.out, **kw)
                return s.out
            return run, getattr(plan, "num_splits", None)
    if not hasattr(fd, "mla_decode"):
        raise Unavailable("unavailable: flashdecode has no mla_decode")

    def run(s, kv_len):
        kw = {"k_scale": s.k_scale, "kv_dtype": kv} if s.k_scale is not None else {}
        fd.mla_decode(s.q_nope, s.q_pe, s.ckv, s.kpe, kv_len, block_table=s.block_table,
                      softmax_scale=shape.softmax_scale, num_splits=num_splits, out=s.out, **kw)
        return s.out
    return run, None


# ---------------------------------------------------------------------------
# FlashInfer's MLA wrapper
# ---------------------------------------------------------------------------

def fi_mla_reason(shape, impl):
    if impl not in MLA_PEERS:
        return "n/a: not an MLA path"
    if shape.kv_dtype and shape.kv_dtype != "e4m3":
        return "n/a: FlashInfer's MLA fp8 cache is e4m3 only"
    if shape.kv_dtype and (shape.kv_scale or "tensor") != "tensor":
        return "n/a: FlashInfer's MLA takes one ckv_scale float (no per-token scales here)"
    return ""


def fi_mla_specs(shapes):
    """fi_prebuild.py specs of the MLA modules these rows load."""
    out = []
    for s in shapes:
        if not is_mla(s):
            continue
        for impl in MLA_PEERS:
            if fi_mla_reason(s, impl):
                continue
            sp = ["mla", impl.rsplit("-", 1)[1], s.dtype, s.d, s.rope_dim]
            sp += [s.kv_dtype] if s.kv_dtype else []
            if sp not in out:
                out.append(sp)
    return out


class FiMla:
    """FlashInfer's BatchMLAPagedAttentionWrapper (fa2, fa3) on a row's sets: one wrapper per
    backend planned once (qo_indptr = q_len steps, kv indices = the block table's pages,
    causal for q_len > 1), the R sets sharing the table."""

    def __init__(self, torch, fi):
        self.torch, self.fi = torch, fi
        self.ws = torch.zeros(FI_MLA_WS_BYTES, dtype=torch.uint8, device=SETTINGS.device)

    def build(self, impl, shape, sets):
        from .peers import Unavailable

        why = fi_mla_reason(shape, impl)
        if why:
            raise Unavailable(why)
        torch, dev = self.torch, SETTINGS.device
        i32 = torch.int32
        _, pps = mla_pages(shape)
        table = sets[0].block_table
        qo_indptr = torch.arange(shape.batch + 1, dtype=i32, device=dev) * shape.q_len
        kv_indptr = torch.zeros(shape.batch + 1, dtype=i32)
        kv_indptr[1:] = torch.cumsum(torch.tensor(pps), 0).to(i32)
        kv_indices = torch.cat([table[b, :pps[b]] for b in range(shape.batch)]).to(i32)
        kv_lens = torch.tensor(shape.lens, dtype=i32, device=dev)
        dt = torch_dtype(torch, shape.dtype)
        kv_dt = fp8_torch_dtype(torch, shape.kv_dtype) if shape.kv_dtype else dt
        w = self.fi.mla.BatchMLAPagedAttentionWrapper(self.ws, backend=impl.rsplit("-", 1)[1])
        w.plan(qo_indptr, kv_indptr.to(dev), kv_indices, kv_lens, shape.hq, shape.d,
               shape.rope_dim, shape.page_size, shape.q_len > 1, shape.softmax_scale, dt, kv_dt)
        rows = shape.batch * shape.q_len
        fp8 = bool(shape.kv_dtype)

        def call(i):
            s = sets[i]
            qn = s.q_nope.view(rows, shape.hq, shape.d)
            qp = s.q_pe.view(rows, shape.hq, shape.rope_dim)
            o = s.out.view(rows, shape.hq, shape.d)
            if fp8:
                w.run(qn, qp, s.ckv, s.kpe8, out=o, ckv_scale=s.k_scale_f,
                      kpe_scale=s.kpe_scale_f)
            else:
                w.run(qn, qp, s.ckv, s.kpe, out=o)
            return s.out
        call.keep = (w, qo_indptr, kv_indptr, kv_indices, kv_lens)
        return call


def fi_mla_api_check(fi, torch):
    """Binds the wrapper calls FiMla makes to the installed signatures (no GPU)."""
    import inspect

    problems = []
    t = torch.zeros(4, dtype=torch.int32)
    W = fi.mla.BatchMLAPagedAttentionWrapper
    for label, fn, a, kw in (
            ("mla __init__", W.__init__, (None, t), {"backend": "fa3"}),
            ("mla plan", W.plan, (None, t, t, t, t, 16, 512, 64, 64, False, 0.1,
                                  torch.bfloat16, torch.float8_e4m3fn), {}),
            ("mla run", W.run, (None, t, t, t, t), {"out": t}),
            ("mla run (fp8)", W.run, (None, t, t, t, t), {"out": t, "ckv_scale": 0.5,
                                                           "kpe_scale": 0.25})):
        try:
            inspect.signature(fn).bind(*a, **kw)
        except Exception as exc:
            problems.append(f"{label}: {exc_text(exc, 120)}")
    return problems


# ---------------------------------------------------------------------------
# the phases (GpuBench calls these)
# ---------------------------------------------------------------------------

def build_sets(bench, shape, fi_fp8=False):
    """(R, kv_len on the device, sets, reference of set 0) of an MLA row."""
    from .timing import replicas_for

    torch, dev = bench.torch, SETTINGS.device
    replicas = replicas_for(shape.kv_bytes)
    table = mla_table(torch, shape, dev)
    sets = [make_mla_set(torch, shape, dev, table, index=i, want_ref=(i == 0), fi_fp8=fi_fp8)
            for i in range(replicas)]
    kv_len = torch.tensor(shape.lens, dtype=torch.int32, device=dev)
    ref = sets[0].ref
    if fi_fp8 and shape.kv_dtype:
        ref = sets[0].ref_fi
    torch.cuda.synchronize()
    return replicas, kv_len, sets, ref


def run_ours(bench, shape):
    """flashdecode (automatic splits) and flashdecode-nosplit on an MLA row: records."""
    from .common import na
    from .peers import Unavailable
    from .timing import measure, replays_for

    torch = bench.torch
    replicas, kv_len, sets, ref = build_sets(bench, shape)
    if shape.kv_dtype:
        err, rel = compare(torch, ref.deq, ref.orig)
        bench.notes.append(f"{shape.name}: quantization alone (float64 over the dequantized "
                           f"latent vs over the bf16 latent): rel err {rel:.4g}")
    recs = []
    if bench.fd is None:
        return [na(shape.name, impl, bench.fd_error) for impl in ("flashdecode",
                                                                 "flashdecode-nosplit")]
    for impl, ns in (("flashdecode", 0), ("flashdecode-nosplit", 1)):
        try:
            run, planned = ours_mla(bench.fd, torch, shape, ns)
        except Unavailable as exc:
            recs.append(na(shape.name, impl, str(exc)))
            continue
        except Exception as exc:
            bench.cuda_ok()
            recs.append(na(shape.name, impl, f"MLA plan: {exc_text(exc)}"))
            continue
        if impl == "flashdecode":  # one untimed pass first (as the decode rows' warm())
            try:
                measure(torch, lambda i: run(sets[i], kv_len), replicas,
                        replays_for(shape.kv_bytes, replicas), 0, lambda out: None)
            except Exception:
                bench.cuda_ok()
        recs.append(bench.run_one(shape, impl, lambda i, run=run: run(sets[i], kv_len), replicas,
                                  ref, num_splits=planned))
        if bench.fatal:
            break
    sets.clear()  # the buffers go before the next row's
    torch.cuda.empty_cache()
    return recs


def run_fi(bench, shape, fi):
    """FlashInfer's MLA paths on a row (its sets rebuilt: the same data as ours)."""
    from .common import Rec, na
    from .flashinfer_peers import describe_first, first_call_seconds
    from .peers import Unavailable

    torch = bench.torch
    todo = [impl for impl in MLA_PEERS if not fi_mla_reason(shape, impl)]
    recs = [na(shape.name, impl, fi_mla_reason(shape, impl)) for impl in MLA_PEERS
            if fi_mla_reason(shape, impl)]
    replicas, _, sets, ref = build_sets(bench, shape, fi_fp8=True)
    firsts = []
    for impl in todo:
        if bench.fatal:
            recs.append(Rec(shape.name, impl, status="skipped", reason=bench.fatal))
            continue
        try:
            call = fi.build(impl, shape, sets)
            secs = first_call_seconds(torch, call)
            if secs > 5:
                firsts.append(describe_first(impl, secs))
            rec = bench.run_one(shape, impl, call, replicas, ref)
            if shape.kv_dtype and rec.status in ("ok", "FAIL"):
                rec.reason = (rec.reason + " " if rec.reason else "") + \
                    "(FlashInfer's fp8 MLA: e4m3 rope part too, 64 B a token fewer)"
        except Unavailable as exc:
            rec = na(shape.name, impl, str(exc))
        except Exception as exc:
            rec = na(shape.name, impl, exc_text(exc, 200))
            bench.cuda_ok()
        recs.append(rec)
    del sets
    torch.cuda.empty_cache()
    return recs, firsts


def self_test(torch, device, ok):
    """The MLA rows' plumbing on tiny shapes: the reference against plain Python floats (causal
    q_len 2 included), the page gather, the rebuilt data, the bytes and FLOPs, fp8 quantization
    and both references, FlashInfer's page indices, the prebuild list."""
    from .shapes import Shape

    sh = Shape("t-mla", 2, 4, 1, 16, "fp32", [37, 20], 8, "mla", family="mla", rope_dim=4,
               q_len=2, softmax_scale=0.3)
    table = mla_table(torch, sh, device)
    s = make_mla_set(torch, sh, device, table, index=3, want_ref=True)
    again = make_mla_set(torch, sh, device, table, index=3)
    other = make_mla_set(torch, sh, device, table, index=4)
    ok(torch.equal(s.ckv, again.ckv) and torch.equal(s.q_pe, again.q_pe)
       and not torch.equal(s.ckv, other.ckv), "MLA sets: rebuilt from (row, index) alike, "
                                             "another index differs")
    worst = 0.0
    for b in range(sh.batch):
        n = sh.lens[b]
        for t in range(sh.q_len):
            upto = n - sh.q_len + t + 1
            keys = []
            for j in range(upto):
                page = int(table[b, j // sh.page_size])
                keys.append((s.ckv[page, j % sh.page_size].tolist(),
                             s.kpe[page, j % sh.page_size].tolist()))
            for h in range(sh.hq):
                qn, qp = s.q_nope[b, t, h].tolist(), s.q_pe[b, t, h].tolist()
                sc = [0.3 * (sum(a * c for a, c in zip(qn, k)) + sum(a * c for a, c in zip(qp, r)))
                      for k, r in keys]
                m = max(sc)
                e = [math.exp(x - m) for x in sc]
                z = sum(e)
                for c in range(sh.d):
                    exp = sum(e[j] * keys[j][0][c] for j in range(upto)) / z
                    worst = max(worst, abs(exp - float(s.ref[b, t, h, c])))
    ok(worst < 1e-10, f"MLA reference vs plain Python (paged, causal q_len 2): {worst:.1e}")
    from .common import TOL
    mtp = Shape("t-mla-q2", 2, 16, 1, 512, "bf16", [500, 300], 64, "mla", family="mla",
                rope_dim=64, q_len=2, softmax_scale=MLA_SCALE)
    sq = make_mla_set(torch, mtp, device, mla_table(torch, mtp, device), want_ref=True)
    rel_c = compare(torch, mla_reference(torch, mtp, sq, causal=False).float(), sq.ref)[1]
    no_pe = MlaSet(sq.q_nope, torch.zeros_like(sq.q_pe), sq.ckv, sq.kpe, None, sq.block_table)
    rel_r = compare(torch, mla_reference(torch, mtp, no_pe).float(), sq.ref)[1]
    ok(rel_c > 2.5 * TOL["bf16"] and rel_r > 2.5 * TOL["bf16"],
       f"the check sees a missing causal mask (rel {rel_c:.3f}) and a dropped rope part "
       f"(rel {rel_r:.3f}) on a q_len 2 row")
    rows = build_mla_shapes()
    names = [r.name for r in rows]
    ok(len(names) == len(set(names)) == 15 and all(r.hkv == 1 and r.d == 512 and r.rope_dim == 64
                                                   for r in rows),
       f"MLA rows: {len(rows)} (9 bf16, 5 e4m3, 1 q_len 2), one kv head, 512 + 64")
    r = next(x for x in rows if x.name == mla_name(1, 16, 4096))
    f = next(x for x in rows if x.name == mla_name(1, 16, 4096, "e4m3"))
    ok(r.kv_bytes == 4096 * 576 * 2 + 16 * 576 * 2 + 16 * 512 * 2
       and f.kv_bytes == 4096 * (512 + 128) + 4 + 16 * 576 * 2 + 16 * 512 * 2
       and abs(mla_flops(r) - 2 * 16 * 4096 * 1088) < 1, "MLA bytes and FLOPs")
    f8 = Shape("t-mla-fp8", 2, 4, 1, 16, "bf16", [70, 64], 16, "mla", family="mla",
               kv_dtype="e4m3", kv_scale="tensor", rope_dim=8, softmax_scale=0.25)
    s8 = make_mla_set(torch, f8, device, mla_table(torch, f8, device), want_ref=True,
                      fi_fp8=True)
    deq = s8.ckv.float() * s8.k_scale_f
    rel_d = compare(torch, mla_reference(torch, f8, s8, ckv=deq).float(), s8.ref.deq)[1]
    rel_q = compare(torch, s8.ref.deq.float(), s8.ref.orig)[1]
    rel_fi = compare(torch, s8.ref_fi.deq.float(), s8.ref.deq)[1]
    ok(s8.ckv.dtype == torch.float8_e4m3fn and s8.kpe.dtype == torch.bfloat16
       and s8.kpe8.dtype == torch.float8_e4m3fn and rel_d < 1e-6 and 0 < rel_q < 0.2
       and 0 < rel_fi < 0.2, f"MLA fp8: e4m3 latent, bf16 rope (FlashInfer: e4m3 copy); "
                             f"quantization moves the output {rel_q:.3f}, an e4m3 rope {rel_fi:.3f}")
    fi_wiring_test(torch, device, ok)
    specs = fi_mla_specs(rows)
    ok(sorted(map(str, specs)) == sorted(map(str, [
        ["mla", "fa2", "bf16", 512, 64], ["mla", "fa3", "bf16", 512, 64],
        ["mla", "fa2", "bf16", 512, 64, "e4m3"], ["mla", "fa3", "bf16", 512, 64, "e4m3"]])),
       f"MLA prebuild list: {specs}")


def fi_self_test(fi, torch, ok):
    problems = fi_mla_api_check(fi, torch)
    ok(not problems, "FlashInfer MLA call signatures" + (": " + "; ".join(problems)
                                                         if problems else ""))
    from flashinfer.jit.attention.modules import get_batch_mla_uri

    from .fi_prebuild import make_spec
    bf, f8 = torch.bfloat16, torch.float8_e4m3fn
    for backend in ("fa2", "fa3"):
        for kv, tag in ((bf, []), (f8, ["e4m3"])):
            sp = ["mla", backend, "bf16", 512, 64] + tag
            uri = get_batch_mla_uri(backend, bf, kv, bf, torch.int32, 512, 64, False)
            try:
                name = make_spec(sp).name
            except Exception as exc:
                name = exc_text(exc)
            ok(name == uri, f"prebuild spec {sp} -> {short(name, 60)}")
    aot = os.path.join(os.path.dirname(fi.__file__), "data", "aot")
    have = sorted(d for d in os.listdir(aot) if d.startswith("batch_mla")) \
        if os.path.isdir(aot) else []
    print(f"self-test FlashInfer AOT MLA modules present: {len(have)}")


class _FakeMlaWrapper:
    """FlashInfer's BatchMLAPagedAttentionWrapper as its documentation describes it, in
    float64 (self-test only: checks the arguments FiMla builds, not FlashInfer)."""

    def __init__(self, ws, backend="auto"):
        self.backend = backend

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv,
             head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type):
        self.a = (qo_indptr.tolist(), kv_indptr.tolist(), kv_indices.long(),
                  kv_len_arr.tolist(), page_size, causal, sm_scale, kv_data_type)

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, ckv_scale=None, kpe_scale=None):
        import torch
        qo, kvp, idx, lens, ps, causal, scale, kv_dt = self.a
        assert ckv_cache.dtype == kv_dt and kpe_cache.dtype == kv_dt
        ck_all = ckv_cache.double() * (ckv_scale or 1.0)
        kp_all = kpe_cache.double() * (kpe_scale or 1.0)
        for b in range(len(lens)):
            pages = idx[kvp[b]:kvp[b + 1]]
            n = lens[b]
            ck = ck_all[pages].reshape(-1, ck_all.shape[-1])[:n]
            kp = kp_all[pages].reshape(-1, kp_all.shape[-1])[:n]
            rows = qo[b + 1] - qo[b]
            for t in range(rows):
                upto = n - rows + t + 1 if causal else n
                r = qo[b] + t
                sc = (q_nope[r].double() @ ck[:upto].t() + q_pe[r].double() @ kp[:upto].t())
                out[r] = (torch.softmax(sc * scale, -1) @ ck[:upto]).to(out.dtype)
        return out


def fi_wiring_test(torch, device, ok):
    """FiMla's plan / run arguments (indptrs, page indices, causal, scales, the e4m3 rope copy)
    against the float64 reference, through _FakeMlaWrapper."""
    from types import SimpleNamespace

    from .shapes import Shape

    fake = SimpleNamespace(mla=SimpleNamespace(BatchMLAPagedAttentionWrapper=_FakeMlaWrapper))
    fi = FiMla.__new__(FiMla)
    fi.torch, fi.fi, fi.ws = torch, fake, None
    for kv, ql in (("", 2), ("e4m3", 1)):
        sh = Shape(f"t-fi-mla-{kv or 'bf16'}", 3, 4, 1, 32, "bf16", [130, 64, 7], 16, "mla",
                   family="mla", kv_dtype=kv, kv_scale="tensor" if kv else "", rope_dim=8,
                   q_len=ql, softmax_scale=0.2)
        table = mla_table(torch, sh, device)
        sets = [make_mla_set(torch, sh, device, table, index=i, want_ref=(i == 0), fi_fp8=True)
                for i in range(2)]
        ref = sets[0].ref_fi.deq if kv else sets[0].ref
        call = fi.build("fi-mla-fa3", sh, sets)
        rel = compare(torch, call(0), ref)[1]
        other = compare(torch, call(1), ref)[1]
        ok(rel < 1e-2 < other, f"FlashInfer MLA arguments ({kv or 'bf16'}, q_len {ql}): "
                               f"rel err {rel:.1e} (set 1: {other:.2f})")
