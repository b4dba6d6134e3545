"""Buffer sets in every layout a row needs, the float64 reference (with the variants:
sliding window, soft-cap, sinks) and the output check."""
import math
import zlib

from .common import SETTINGS


class KVSet:
    """One set of call buffers in our layout."""

    def __init__(self, q, k, v, out, block_table, sinks=None, perm=None, k_scale=None,
                 v_scale=None):
        self.q = q  # [batch, 1, num_heads_q, head_dim]
        self.k = k  # [batch, kv_capacity, num_heads_kv, head_dim] or [num_pages, page_size, num_heads_kv, head_dim]
        self.v = v  # same as k
        self.out = out  # [batch, 1, num_heads_q, head_dim]
        self.block_table = block_table  # [batch, max_pages_per_seq] int32, or None
        self.sinks = sinks  # [num_heads_q] float32, or None
        self.perm = perm  # the page order (CPU tensor) the table was made from
        # fp8 caches: float32 scales on the device (per-tensor (1,), per-head [Hkv], per-token
        # the cache's shape without head_dim); k_scale_f / v_scale_f: per-tensor as floats
        self.k_scale = k_scale
        self.v_scale = v_scale
        self.k_scale_f = self.v_scale_f = None
        self.ref = None  # an fp8 set's Fp8Ref (set 0 only)


def torch_dtype(torch, dt):
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dt]


def prefix_pages(shape, page_size):
    if shape.prefix_len % page_size:
        raise ValueError(f"{shape.name}: prefix {shape.prefix_len} is not a whole number of "
                         f"{page_size}-key pages")
    return shape.prefix_len // page_size


def page_layout(shape, page_size):
    """(pages in the pool, pages of each sequence's table row): a shared prefix is one set
    of pages every row starts with."""
    pps = [(n + page_size - 1) // page_size for n in shape.lens]
    if not shape.prefix_len:
        return sum(pps), pps
    p0 = prefix_pages(shape, page_size)
    return p0 + sum(p - p0 for p in pps), pps


def make_table(torch, shape, page_size, perm):
    """block_table [B, max pages] int32 (CPU) from a page order perm of the pool."""
    num_pages, pps = page_layout(shape, page_size)
    table = torch.zeros(shape.batch, max(pps), dtype=torch.int32)
    if shape.prefix_len:
        p0 = prefix_pages(shape, page_size)
        shared = perm[:p0].to(torch.int32)
        at = p0
        for i, np_ in enumerate(pps):
            table[i, :p0] = shared
            table[i, p0:np_] = perm[at:at + np_ - p0].to(torch.int32)
            at += np_ - p0
    else:
        at = 0
        for i, np_ in enumerate(pps):
            table[i, :np_] = perm[at:at + np_].to(torch.int32)
            at += np_
    return table


def make_sinks(torch, shape, device):
    """One sink logit per query head, ~ the log of the keys a row sees (+ N(0, 1)), so that
    the sink holds a sizeable share of every row's softmax and a dropped sink fails the check."""
    n = max(1, shape.needed_keys(0))
    return (torch.randn(shape.hq, dtype=torch.float32) + math.log(n)).to(device)


def make_set(torch, shape, device, page_size=None, perm=None, index=0, want_ref=False):
    """Random q/K/V (never zeros) for shape; page_size None = the shape's own layout.
    perm: the pool's page order (random when None; pool order for -inorder rows).
    fp8 rows: make_fp8_set (seeded by the row's name and index: the same data in every
    layout, so FlashInfer's paged copy of set i holds our set i's keys)."""
    if shape.kv_dtype:
        return make_fp8_set(torch, shape, device, page_size, perm, index, want_ref)
    dt = torch_dtype(torch, shape.dtype)
    b, hq, hkv, d = shape.batch, shape.hq, shape.hkv, shape.d
    ps = shape.page_size if page_size is None else page_size
    q = torch.randn(b, 1, hq, d, dtype=torch.float32, device=device)
    if shape.q_scale != 1.0:
        q.mul_(shape.q_scale)
    q = q.to(dt)
    table = None
    if ps:
        num_pages, _ = page_layout(shape, ps)
        k = torch.randn(num_pages, ps, hkv, d, dtype=dt, device=device)
        v = torch.randn(num_pages, ps, hkv, d, dtype=dt, device=device)
        if perm is None:
            # pages scattered over the pool, as in a serving engine; in pool order for
            # the diagnostic "-inorder" rows
            perm = (torch.arange(num_pages) if shape.kind == "paged-inorder"
                    else torch.randperm(num_pages))
        table = make_table(torch, shape, ps, perm).to(device)
    else:
        k = torch.randn(b, shape.capacity, hkv, d, dtype=dt, device=device)
        v = torch.randn(b, shape.capacity, hkv, d, dtype=dt, device=device)
    out = torch.empty(b, 1, hq, d, dtype=dt, device=device)
    sinks = make_sinks(torch, shape, device) if shape.sinks else None
    return KVSet(q, k, v, out, table, sinks, perm)


def logical_kv(shape, s, b, page_size=None):
    """K and V of sequence b, [kv_len[b], num_heads_kv, head_dim], from either layout."""
    n = shape.lens[b]
    ps = shape.page_size if page_size is None else page_size
    if not ps:
        return s.k[b, :n], s.v[b, :n]
    np_ = (n + ps - 1) // ps
    pages = s.block_table[b, :np_].long()
    k = s.k[pages].reshape(np_ * ps, shape.hkv, shape.d)[:n]
    v = s.v[pages].reshape(np_ * ps, shape.hkv, shape.d)[:n]
    return k, v


def attention_f64(torch, q, k, v, scale, window_left=-1, softcap=0.0, sinks=None):
    """One sequence's decode row, float64, as plainly as it gets: q [hkv, g, d] (the query
    heads of each kv head), k/v [n, hkv, d]; the row sits at position n - 1 and sees keys
    max(0, n - 1 - window_left) .. n - 1 (all with window_left < 0). Soft-cap:
    s = cap * tanh(s / cap). Sinks [hkv, g]: one more logit in the denominator only.
    Returns [hkv, g, d]."""
    n = k.shape[0]
    lo = 0 if window_left < 0 else max(0, n - 1 - window_left)
    kb = k[lo:n].double().permute(1, 2, 0)  # [hkv, d, n']
    vb = v[lo:n].double().permute(1, 0, 2)  # [hkv, n', d]
    s = torch.matmul(q.double(), kb) * scale  # [hkv, g, n']
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if sinks is None:
        p = torch.softmax(s, dim=-1)
        return torch.matmul(p, vb)
    sink = sinks.double()[..., None]  # [hkv, g, 1]
    m = torch.maximum(s.amax(dim=-1, keepdim=True), sink)
    e = torch.exp(s - m)
    denom = e.sum(dim=-1, keepdim=True) + torch.exp(sink - m)
    return torch.matmul(e / denom, vb)


def reference(torch, shape, s, page_size=None):
    """float64 attention of set s: [batch, num_heads_q, head_dim]."""
    b_, hq, hkv, d = shape.batch, shape.hq, shape.hkv, shape.d
    g = hq // hkv
    scale = 1.0 / math.sqrt(d)
    ref = torch.zeros(b_, hq, d, dtype=torch.float64, device=s.q.device)
    sinks = None if s.sinks is None else s.sinks.reshape(hkv, g)
    for b in range(b_):
        if shape.lens[b] == 0:
            continue
        k, v = logical_kv(shape, s, b, page_size)
        qb = s.q[b, 0].reshape(hkv, g, d)
        ref[b] = attention_f64(torch, qb, k, v, scale, shape.window_left, shape.softcap,
                               sinks).reshape(hq, d)
    return ref


def compare(torch, out_bhd, ref):
    """(max abs error, relative error) of out [batch, num_heads_q, head_dim] against ref."""
    o = out_bhd.double()
    if not bool(torch.isfinite(o).all()):
        return float("inf"), float("inf")
    err = (o - ref).abs().max().item()
    scale = ref.abs().max().item() or 1.0
    return err, err / scale


def peer_set(torch, shape, s):
    """The SDPA / Flex peers' buffers for set s: q [B, Hq, 1, D] (a view of ours), K/V
    [B, Hkv, N, D] contiguous (their native layout; paged caches become their contiguous
    equivalent, zero-padded past kv_len)."""
    q = s.q.transpose(1, 2)
    if not shape.page_size:
        return q, s.k.transpose(1, 2).contiguous(), s.v.transpose(1, 2).contiguous()
    k = torch.zeros(shape.batch, shape.hkv, shape.capacity, shape.d, dtype=s.k.dtype,
                    device=s.k.device)
    v = torch.zeros_like(k)
    for b in range(shape.batch):
        kb, vb = logical_kv(shape, s, b)
        k[b, :, :kb.shape[0]] = kb.transpose(0, 1)
        v[b, :, :vb.shape[0]] = vb.transpose(0, 1)
    return q, k, v


def softcap_sensitivity(torch, shape, device=None):
    """rel difference between the reference with and without the soft-cap on one random set
    of this shape (how strongly the check sees a missing cap); used by --self-test."""
    device = device or SETTINGS.device
    s = make_set(torch, shape, device)
    ref = reference(torch, shape, s)
    cap = shape.softcap
    shape.softcap = 0.0
    try:
        plain = reference(torch, shape, s)
    finally:
        shape.softcap = cap
    return compare(torch, plain.float(), ref)[1]


# ---------------------------------------------------------------------------
# fp8 rows: realistic bf16 data, quantized
# ---------------------------------------------------------------------------
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
SINK_BOOST = 12.0  # score of key 0 above the mean score (an attention sink)
HIT_BOOST = 9.0  # score of the "relevant" keys above the mean
HIT_FRACTION = 1e-3  # share of keys that are relevant to the query


def fp8_torch_dtype(torch, kv_dtype):
    return {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[kv_dtype]


class Fp8Ref:
    """float64 references of an fp8 set: over the ORIGINAL bf16 K/V (what the cache stands
    for: quantization error included) and over the dequantized cache (the kernel's own
    error)."""

    def __init__(self, orig, deq):
        self.orig, self.deq = orig, deq


def fp8_seed(shape, index):
    return (zlib.crc32(shape.name.encode()) * 1009 + index) % (2 ** 62)


def realistic_qkv(torch, shape, device, gen):
    """q [B, 1, Hq, D] and logical K, V [B, N, Hkv, D] in the row's dtype, shaped like a
    trained model's rather than iid normal (so that attention is peaked, not uniform):
      K: per-(kv head, channel) gains lognormal(0, 0.5) with 4 outlier channels a head x8,
         a per-head mean vector, per-token magnitudes lognormal(0, 0.3);
      key 0 of every sequence an attention sink (score ~ SINK_BOOST above the mean, small
         value), a random HIT_FRACTION of the keys relevant to the query (score ~ HIT_BOOST
         above the mean): most of the softmax mass sits on a few keys, at 128k too;
      V: gains lognormal(0, 0.3), a per-head mean, per-token magnitudes lognormal(0, 0.3).
    Drawn in float32 from gen, rounded once to the row's dtype."""
    f32 = torch.float32
    b, hq, hkv, d, n = shape.batch, shape.hq, shape.hkv, shape.d, shape.capacity
    g = hq // hkv

    def rn(*size):
        return torch.randn(*size, dtype=f32, device=device, generator=gen)

    q = rn(b, 1, hq, d)
    gain_k = torch.exp(0.5 * rn(hkv, d))
    out_ch = torch.rand(hkv, d, device=device, generator=gen).argsort(dim=1)[:, :4]
    gain_k.scatter_(1, out_ch, 8.0)
    mean_k = 0.5 * rn(hkv, d) * gain_k
    k = rn(b, n, hkv, d) * gain_k
    k.mul_(torch.exp(0.3 * rn(b, n, hkv, 1))).add_(mean_k)
    # the query direction of each (sequence, kv head): the mean of its q heads
    qdir = q[:, 0].reshape(b, hkv, g, d).mean(dim=2)  # [B, Hkv, D]
    qdir = qdir / qdir.norm(dim=-1, keepdim=True)
    # a key k + t * qdir scores t * (q . qdir) / sqrt(d) ~ t * |q| / sqrt(g) / sqrt(d) higher
    unit = math.sqrt(g)  # t per unit of score (|q| ~ sqrt(d))
    hits = torch.rand(b, n, hkv, 1, device=device, generator=gen) < HIT_FRACTION
    k.add_(hits * (HIT_BOOST * unit) * qdir[:, None])
    k[:, 0].add_((SINK_BOOST * unit) * qdir)
    gain_v = torch.exp(0.3 * rn(hkv, d))
    mean_v = 0.5 * rn(hkv, d)
    v = rn(b, n, hkv, d) * gain_v
    v.mul_(torch.exp(0.3 * rn(b, n, hkv, 1))).add_(mean_v)
    v[:, 0].mul_(0.1)
    dt = torch_dtype(torch, shape.dtype)
    return q.to(dt), k.to(dt), v.to(dt)


def fp8_scales(torch, x, gran, fmax):
    """float32 scales of x [B, N, Hkv, D] at granularity gran, amax / fmax (at least 2^-126;
    1 where the amax is 0): per-token [B, N, Hkv] (append_kv's rule), per-head [Hkv],
    per-tensor (1,)."""
    a = x.float().abs()
    if gran == "token":
        amax = a.amax(dim=-1)
    elif gran == "head":
        amax = a.amax(dim=(0, 1, 3))
    else:
        amax = a.amax().reshape(1)
    sc = torch.clamp(amax / fmax, min=2.0 ** -126)
    return torch.where(amax > 0, sc, torch.ones_like(sc))


def _bcast(scale, gran):
    if gran == "token":
        return scale[..., None]
    if gran == "head":
        return scale[:, None]
    return scale


def quantize_fp8(torch, x, scale, gran, kv_dtype):
    """fp8(x / scale), rounded to nearest even, saturated to the format's finite range (as
    flashdecode.append_kv stores it)."""
    fmax = FP8_MAX[kv_dtype]
    y = (x.float() / _bcast(scale, gran)).clamp_(-fmax, fmax)
    return y.to(fp8_torch_dtype(torch, kv_dtype))


def dequantize_fp8(torch, x8, scale, gran):
    return x8.float() * _bcast(scale, gran)


def to_pages(torch, shape, x, table, num_pages, ps):
    """Logical [B, N, ...] -> a pool [num_pages, ps, ...] through table (zero padding)."""
    pool = torch.zeros((num_pages, ps) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
    flat = pool.view((num_pages * ps,) + tuple(x.shape[2:]))
    for b in range(shape.batch):
        n = shape.lens[b]
        np_ = (n + ps - 1) // ps
        pages = table[b, :np_].long().to(x.device)
        idx = (pages[:, None] * ps + torch.arange(ps, device=x.device)[None]).reshape(-1)[:n]
        flat[idx] = x[b, :n]
    return pool


def make_fp8_set(torch, shape, device, page_size=None, perm=None, index=0, want_ref=False):
    """An fp8 row's set: realistic bf16 q/K/V (seeded by row and index), K and V quantized to
    shape.kv_dtype with amax scales of shape.kv_scale, in the shape's layout or paged
    (page_size). want_ref: also the Fp8Ref (float64 over the original and the dequantized
    K/V)."""
    if shape.prefix_len or shape.sinks:
        raise ValueError("fp8 rows take no shared prefix / sinks here")
    gen = torch.Generator(device=device)
    gen.manual_seed(fp8_seed(shape, index))
    q, k, v = realistic_qkv(torch, shape, device, gen)
    gran, fmt_ = shape.kv_scale or "tensor", shape.kv_dtype
    fmax = FP8_MAX[fmt_]
    ks, vs = fp8_scales(torch, k, gran, fmax), fp8_scales(torch, v, gran, fmax)
    k8, v8 = quantize_fp8(torch, k, ks, gran, fmt_), quantize_fp8(torch, v, vs, gran, fmt_)
    ref = None
    if want_ref:
        plain = KVSet(q, k, v, None, None)
        r_orig = reference(torch, shape, plain, page_size=0)
        deq = KVSet(q, dequantize_fp8(torch, k8, ks, gran), dequantize_fp8(torch, v8, vs, gran),
                    None, None)
        r_deq = reference(torch, shape, deq, page_size=0)
        ref = Fp8Ref(r_orig, r_deq)
        del plain, deq
    del k, v
    ps = shape.page_size if page_size is None else page_size
    table = None
    if ps:
        num_pages, _ = page_layout(shape, ps)
        if perm is None:
            perm = torch.randperm(num_pages)
        table = make_table(torch, shape, ps, perm).to(device)
        k8 = to_pages(torch, shape, k8, table, num_pages, ps)
        v8 = to_pages(torch, shape, v8, table, num_pages, ps)
        if gran == "token":
            ks = to_pages(torch, shape, ks, table, num_pages, ps)
            vs = to_pages(torch, shape, vs, table, num_pages, ps)
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    s = KVSet(q, k8, v8, out, table, None, perm, ks.contiguous(), vs.contiguous())
    if gran == "tensor":
        s.k_scale_f, s.v_scale_f = float(ks[0]), float(vs[0])
    s.ref = ref
    return s
