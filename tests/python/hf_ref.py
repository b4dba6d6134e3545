"""hf_ref.py — helpers shared by the transformers tests: a torch reference of
flashdecode.decode with the attention variants (sliding window, soft-cap, sinks) as
include/flashdecode.h defines them, to check the integration's plumbing before (and
after) the C library computes them."""
import torch


def reference_decode(q, k_cache, v_cache, kv_len, *, block_table=None, softmax_scale=None,
                     num_splits=0, return_lse=False, out=None, window_left=-1,
                     logits_soft_cap=0.0, sinks=None):
    """flashdecode.decode's result computed with torch ops in float32 (contiguous caches).

    q [B, T, Hq, D], k/v [B, S, Hkv, D] (any strides), kv_len [B]. Row t sits at
    p = kv_len - T + t and sees keys max(0, p - window_left) .. p (all keys up to p
    without a window); scores x*scale, cap*tanh(x/cap) with a soft-cap; sinks[h] joins
    the softmax denominator."""
    assert block_table is None and out is None and not return_lse
    batch, q_len, heads_q, head_dim = q.shape
    group = heads_q // k_cache.shape[2]
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    kk = k_cache.float().repeat_interleave(group, dim=2)                 # [B, S, Hq, D]
    vv = v_cache.float().repeat_interleave(group, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q.float(), kk) * scale
    if logits_soft_cap:
        s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
    num_keys = k_cache.shape[1]
    pos = (kv_len.to(q.device).long().view(batch, 1, 1, 1) - q_len
           + torch.arange(q_len, device=q.device).view(1, 1, q_len, 1))
    keys = torch.arange(num_keys, device=q.device).view(1, 1, 1, num_keys)
    allowed = keys <= pos
    if window_left is not None and window_left >= 0:
        allowed = allowed & (keys >= pos - window_left)
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(1, heads_q, 1, 1).expand(batch, heads_q, q_len, 1)
        lse = torch.logsumexp(torch.cat([s, sink], dim=-1), dim=-1, keepdim=True)
    else:
        lse = torch.logsumexp(s, dim=-1, keepdim=True)
    p = torch.exp(s - lse).nan_to_num(0.0)
    return torch.einsum("bhts,bshd->bthd", p, vv).to(q.dtype)


class Recorder:
    """Wraps a decode function and records the keyword arguments of each call."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, *args, **kwargs):
        self.calls.append(dict(kwargs))
        return self.fn(*args, **kwargs)
