"""attention_ref.py — the float64 oracle of the Python tests, in plain numpy.

Written from the definition in flashdecode.h (not from the library's own
reference backend): for sequence b, query row t and head h, keys 0..n_t-1
with n_t = kv_len[b] - q_len + t + 1, kv head h // (num_heads_q // num_heads_kv).
"""
import numpy as np


def gather_keys(cache, b, n, block_table=None):
    """Keys 0..n-1 of sequence b as [n, num_heads_kv, head_dim] (contiguous or paged)."""
    if block_table is None:
        return cache[b, :n]
    page_size = cache.shape[1]
    pages = block_table[b, : (n + page_size - 1) // page_size]
    return cache[pages].reshape(-1, cache.shape[2], cache.shape[3])[:n]


def attention_f64(q, k_cache, v_cache, kv_len, block_table=None, softmax_scale=None):
    """out [batch, q_len, num_heads_q, head_dim] and lse [batch, num_heads_q, q_len], float64.

    Inputs are numpy arrays of any float dtype (converted to float64 first);
    kv_len [batch] and block_table [batch, max_pages_per_seq] integer arrays.
    Rows with no visible key get out = 0, lse = -inf.
    """
    q = np.asarray(q, dtype=np.float64)
    k_cache = np.asarray(k_cache, dtype=np.float64)
    v_cache = np.asarray(v_cache, dtype=np.float64)
    batch, q_len, num_heads_q, head_dim = q.shape
    num_heads_kv = k_cache.shape[2]
    group = num_heads_q // num_heads_kv
    scale = 1.0 / np.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    out = np.zeros(q.shape, dtype=np.float64)
    lse = np.full((batch, num_heads_q, q_len), -np.inf, dtype=np.float64)
    for b in range(batch):
        n = int(kv_len[b])
        keys = np.repeat(gather_keys(k_cache, b, n, block_table), group, axis=1)    # [n, Hq, D]
        values = np.repeat(gather_keys(v_cache, b, n, block_table), group, axis=1)  # [n, Hq, D]
        for t in range(q_len):
            n_t = n - q_len + t + 1
            if n_t <= 0:
                continue
            s = np.einsum("hd,jhd->hj", q[b, t], keys[:n_t]) * scale                 # [Hq, n_t]
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            l = p.sum(axis=1, keepdims=True)
            out[b, t] = np.einsum("hj,jhd->hd", p, values[:n_t]) / l
            lse[b, :, t] = (m + np.log(l))[:, 0]
    return out, lse


def output_tolerance(dtype_name, ref_out):
    """Absolute tolerance on out: fp32 accumulation plus the rounding of out to its dtype."""
    eps = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype_name]
    scale = max(1.0, float(np.max(np.abs(ref_out))) if ref_out.size else 1.0)
    return (2 * eps + 2e-5) * scale


def assert_lse_close(got, want, atol=5e-4, rtol=1e-5):
    got = np.asarray(got, dtype=np.float64)
    inf = np.isneginf(want)
    assert np.array_equal(np.isneginf(got), inf), "lse: -inf where the reference differs"
    np.testing.assert_allclose(got[~inf], want[~inf], atol=atol, rtol=rtol)
