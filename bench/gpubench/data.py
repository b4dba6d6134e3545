"""Buffer sets in every layout a row needs, the float64 reference (with the variants:
sliding window, soft-cap, sinks) and the output check."""
import math

from .common import SETTINGS


class KVSet:
    """One set of call buffers in our layout."""

    def __init__(self, q, k, v, out, block_table, sinks=None, perm=None):
        self.q = q  # [batch, 1, num_heads_q, head_dim]
        self.k = k  # [batch, kv_capacity, num_heads_kv, head_dim] or [num_pages, page_size, num_heads_kv, head_dim]
        self.v = v  # same as k
        self.out = out  # [batch, 1, num_heads_q, head_dim]
        self.block_table = block_table  # [batch, max_pages_per_seq] int32, or None
        self.sinks = sinks  # [num_heads_q] float32, or None
        self.perm = perm  # the page order (CPU tensor) the table was made from


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


def make_set(torch, shape, device, page_size=None, perm=None):
    """Random q/K/V (never zeros) for shape; page_size None = the shape's own layout.
    perm: the pool's page order (random when None; pool order for -inorder rows)."""
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
