"""attention_ref.py — the float64 oracle of the Python tests, in plain numpy.

Written from the definition in flashdecode.h (not from the library's own
reference backend): for sequence b, query row t at position
p_t = kv_len[b] - q_len + t and query head h (kv head h // (num_heads_q //
num_heads_kv)), the row sees keys lo_t .. hi_t - 1 with

    causal:      lo_t = 0, or max(0, p_t - window_left) with a window;  hi_t = p_t + 1
    non_causal:  lo_t = 0;                                              hi_t = kv_len[b]

and, with x_j = softmax_scale * q . k_j,

    s_j = x_j, or cap * tanh(x_j / cap) with a soft-cap
    Z   = sum_j exp(s_j) (+ exp(sinks[h]))
    lse = log Z,   out = sum_j exp(s_j - lse) v_j.

A row that sees no key: out = 0, lse = -inf (= sinks[h] with sinks). A NaN
(or +inf) sink: a NaN row (out and lse NaN).
"""
import numpy as np


def gather_keys(cache, b, n, block_table=None):
    """Keys 0..n-1 of sequence b as [n, num_heads_kv, head_dim] (contiguous or paged)."""
    if block_table is None:
        return cache[b, :n]
    page_size = cache.shape[1]
    pages = block_table[b, : (n + page_size - 1) // page_size]
    return cache[pages].reshape(-1, cache.shape[2], cache.shape[3])[:n]


def visible_keys(kv_len, q_len, t, window_left=-1, non_causal=False):
    """[lo, hi): the keys query row t of a sequence of kv_len keys sees."""
    if non_causal:
        return 0, kv_len
    pos = kv_len - q_len + t
    lo = max(0, pos - window_left) if window_left >= 0 else 0
    return lo, max(lo, pos + 1)


def attention_f64(q, k_cache, v_cache, kv_len, block_table=None, softmax_scale=None, *,
                  window_left=-1, logits_soft_cap=0.0, sinks=None, non_causal=False):
    """out [batch, q_len, num_heads_q, head_dim] and lse [batch, num_heads_q, q_len], float64.

    Inputs are numpy arrays of any float dtype (converted to float64 first);
    kv_len [batch] and block_table [batch, max_pages_per_seq] integer arrays;
    sinks [num_heads_q] or None. Rows with no visible key get out = 0,
    lse = -inf (the sink with sinks).
    """
    q = np.asarray(q, dtype=np.float64)
    k_cache = np.asarray(k_cache, dtype=np.float64)
    v_cache = np.asarray(v_cache, dtype=np.float64)
    batch, q_len, num_heads_q, head_dim = q.shape
    num_heads_kv = k_cache.shape[2]
    group = num_heads_q // num_heads_kv
    scale = 1.0 / np.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    cap = float(logits_soft_cap)
    sink = None if sinks is None else np.asarray(sinks, dtype=np.float64).reshape(num_heads_q)
    out = np.zeros(q.shape, dtype=np.float64)
    lse = np.full((batch, num_heads_q, q_len), -np.inf, dtype=np.float64)
    for b in range(batch):
        n = int(kv_len[b])
        keys = np.repeat(gather_keys(k_cache, b, n, block_table), group, axis=1)    # [n, Hq, D]
        values = np.repeat(gather_keys(v_cache, b, n, block_table), group, axis=1)  # [n, Hq, D]
        for t in range(q_len):
            lo, hi = visible_keys(n, q_len, t, window_left, non_causal)
            if hi <= lo:  # no visible key: out 0, lse = log(exp(sink))
                if sink is not None:
                    lse[b, :, t] = sink
                continue
            s = np.einsum("hd,jhd->hj", q[b, t], keys[lo:hi]) * scale                # [Hq, hi-lo]
            if cap > 0:
                s = cap * np.tanh(s / cap)
            if sink is not None:
                s = np.concatenate([s, sink[:, None]], axis=1)  # the sink: a logit without value
            with np.errstate(invalid="ignore"):
                m = s.max(axis=1, keepdims=True)
                p = np.exp(s - m)
                l = p.sum(axis=1, keepdims=True)
                out[b, t] = np.einsum("hj,jhd->hd", p[:, : hi - lo], values[lo:hi]) / l
                lse[b, :, t] = (m + np.log(l))[:, 0]
    if sink is not None:  # a NaN or +inf sink blows its head's rows up (exp(inf - inf))
        bad = ~(sink < np.inf)
        out[:, :, bad] = np.nan
        lse[:, bad] = np.nan
    return out, lse


def merge_states_f64(states_out, states_lse):
    """The float64 merge of S states: out [S, B, q_len, H, D], lse [S, B, H, q_len] ->
    (out [B, q_len, H, D], lse [B, H, q_len]). Empty states (lse = -inf) are neutral
    and their out is not read; all empty: out 0, lse -inf; a NaN (or +inf) lse: a NaN
    row. Every other state's out is read (a NaN there propagates even where its weight
    underflows to 0)."""
    so = np.asarray(states_out, dtype=np.float64)
    sl = np.asarray(states_lse, dtype=np.float64)          # [S, B, H, T]
    sl = np.where(sl == np.inf, np.nan, sl)
    with np.errstate(invalid="ignore"):
        m = sl.max(axis=0)                                  # [B, H, T]
        safe = np.where(np.isneginf(m), 0.0, m)
        w = np.exp(sl - safe[None])                         # [S, B, H, T], 0 for empty states
        total = w.sum(axis=0)
        wt = np.transpose(w, (0, 1, 3, 2))[..., None]      # [S, B, T, H, 1]
        empty = np.transpose(np.isneginf(sl), (0, 1, 3, 2))[..., None]
        so = np.where(empty, 0.0, so)                       # an empty state's out is not read
        out = (wt * so).sum(axis=0) / np.transpose(np.where(total > 0, total, 1.0),
                                                   (0, 2, 1))[..., None]
        lse = np.where(total > 0, safe + np.log(np.where(total > 0, total, 1.0)), -np.inf)
    nan = np.isnan(m)
    lse = np.where(nan, np.nan, lse)
    out = np.where(np.transpose(nan, (0, 2, 1))[..., None], np.nan, out)
    return out, lse


EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def output_tolerance(dtype_name, ref_out):
    """Absolute tolerance on out: fp32 accumulation plus the rounding of out to its dtype."""
    eps = EPS[dtype_name]
    finite = ref_out[np.isfinite(ref_out)] if ref_out.size else ref_out
    scale = max(1.0, float(np.max(np.abs(finite))) if finite.size else 1.0)
    return (2 * eps + 2e-5) * scale


def assert_lse_close(got, want, atol=5e-4, rtol=1e-5):
    got = np.asarray(got, dtype=np.float64)
    inf = np.isneginf(want)
    assert np.array_equal(np.isneginf(got), inf), "lse: -inf where the reference differs"
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), "lse: NaN where the reference differs"
    ok = ~inf & ~nan
    np.testing.assert_allclose(got[ok], want[ok], atol=atol, rtol=rtol)


def assert_out_close(got, want, dtype_name):
    """out against the float64 reference: NaN exactly where it has NaN, else within
    output_tolerance of the out dtype."""
    got = np.asarray(got, dtype=np.float64)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), "out: NaN where the reference differs"
    np.testing.assert_allclose(got[~nan], want[~nan], rtol=0,
                               atol=output_tolerance(dtype_name, want))


def mla_attention_f64(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table=None,
                      softmax_scale=None):
    """MLA decode (absorbed form, flashdecode.h MULTI-HEAD LATENT ATTENTION) in float64.

    q_nope [batch, q_len, Hq, D], q_pe [batch, q_len, Hq, R]; ckv_cache [batch, cap, D]
    or paged [pages, page_size, D] (with block_table), kpe_cache likewise with R (already
    dequantized). Row t at position p_t = kv_len[b] - q_len + t sees keys 0..p_t:

        x_j = scale * (q_nope . ckv_j + q_pe . kpe_j),  lse = log sum_j exp(x_j),
        out = sum_j exp(x_j - lse) ckv_j

    Returns out [batch, q_len, Hq, D] and lse [batch, Hq, q_len]; a row that sees no key:
    out 0, lse -inf.
    """
    q_nope = np.asarray(q_nope, dtype=np.float64)
    q_pe = np.asarray(q_pe, dtype=np.float64)
    ckv = np.asarray(ckv_cache, dtype=np.float64)
    kpe = np.asarray(kpe_cache, dtype=np.float64)
    batch, q_len, num_heads, _ = q_nope.shape
    out = np.zeros(q_nope.shape, dtype=np.float64)
    lse = np.full((batch, num_heads, q_len), -np.inf, dtype=np.float64)
    for b in range(batch):
        n = int(kv_len[b])
        c = gather_keys(ckv[:, :, None, :], b, n, block_table)[:, 0]   # [n, D]
        r = gather_keys(kpe[:, :, None, :], b, n, block_table)[:, 0]   # [n, R]
        for t in range(q_len):
            hi = n - q_len + t + 1
            if hi <= 0:
                continue
            s = (q_nope[b, t] @ c[:hi].T + q_pe[b, t] @ r[:hi].T) * softmax_scale  # [Hq, hi]
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            l = p.sum(axis=1, keepdims=True)
            out[b, t] = (p @ c[:hi]) / l
            lse[b, :, t] = (m + np.log(l))[:, 0]
    return out, lse
