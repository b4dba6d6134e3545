"""A stand-in for the flashdecode package with the variant API the benchmark is written
against (torch, float64, CPU; slow): DecodePlan(..., window_left, logits_soft_cap,
non_causal, out_dtype), plan.run(q, k, v, kv_len, block_table=, out=, lse=, sinks=) and
merge_states(out [S, B, q_len, H, D], lse [S, B, H, q_len], out=) -> (out, lse).

Only for bench/cpu_harness.py --fake-flashdecode: it exercises the benchmark's variant and
cascade code (plans, sinks, the strided lse, merge_states) before the library has that API.
It is not the library and says nothing about it."""
import math

import torch

from .data import attention_f64


class DecodePlan:
    def __init__(self, *, batch, q_len=1, num_heads_q, num_heads_kv, head_dim, dtype,
                 kv_capacity=None, page_size=0, max_pages_per_seq=0, num_pages=0, num_splits=0,
                 softmax_scale=None, device="cuda", kv_len_hint=None, num_threads=0,
                 workspace=None, window_left=-1, logits_soft_cap=0.0, non_causal=False,
                 out_dtype=None, deterministic=False):
        self.batch, self.q_len = batch, q_len
        self.hq, self.hkv, self.d = num_heads_q, num_heads_kv, head_dim
        self.page_size = page_size
        self.scale = softmax_scale or 1.0 / math.sqrt(head_dim)
        self.window_left, self.cap, self.non_causal = window_left, logits_soft_cap, non_causal
        self.num_splits = max(1, num_splits)
        if non_causal and window_left >= 0:
            raise ValueError("non_causal with a window")

    def _kv(self, k, v, kv_len, block_table, b):
        n = int(kv_len[b])
        if not self.page_size:
            return k[b, :n], v[b, :n]
        np_ = (n + self.page_size - 1) // self.page_size
        pages = block_table[b, :np_].long()
        return (k[pages].reshape(-1, self.hkv, self.d)[:n],
                v[pages].reshape(-1, self.hkv, self.d)[:n])

    def run(self, q, k_cache, v_cache, kv_len, block_table=None, out=None, lse=None, sinks=None):
        g = self.hq // self.hkv
        if out is None:
            out = torch.empty_like(q)
        for b in range(self.batch):
            kb, vb = self._kv(k_cache, v_cache, kv_len, block_table, b)
            n = kb.shape[0]
            for t in range(self.q_len):
                upto = n if self.non_causal else n - self.q_len + t + 1
                qt = q[b, t].reshape(self.hkv, g, self.d)
                sk = None if sinks is None else sinks.reshape(self.hkv, g)
                o = attention_f64(torch, qt, kb[:upto], vb[:upto], self.scale, self.window_left,
                                  self.cap, sk)
                out[b, t] = o.reshape(self.hq, self.d).to(out.dtype)
                if lse is not None:
                    lo = 0 if self.window_left < 0 else max(0, upto - 1 - self.window_left)
                    s = torch.einsum("hgd,nhd->hgn", qt.double(), kb[lo:upto].double()) * self.scale
                    if self.cap:
                        s = self.cap * torch.tanh(s / self.cap)
                    val = torch.logsumexp(s, -1)
                    if sk is not None:
                        val = torch.logaddexp(val, sk.double())
                    lse[b, :, t] = val.reshape(self.hq).to(lse.dtype)
        return out


def merge_states(states_out, states_lse, out=None):
    m = states_lse.double().amax(dim=0)  # [B, H, q]
    w = torch.exp(states_lse.double() - m)  # [S, B, H, q]
    num = torch.einsum("sbhq,sbqhd->bqhd", w, states_out.double())
    den = w.sum(dim=0)  # [B, H, q]
    merged = num / den.permute(0, 2, 1)[..., None]
    if out is None:
        out = torch.empty(states_out.shape[1:], dtype=states_out.dtype)
    out.copy_(merged.to(out.dtype))
    return out, (m + torch.log(den)).float()


def mla_decode(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, *, block_table=None, softmax_scale,
               num_splits=0, return_lse=False, out=None, kv_dtype=None, k_scale=None,
               deterministic=False):
    """MLA decode in float64 (the benchmark's MLA plumbing only): q_nope [B, q_len, Hq, D],
    q_pe [.., R], caches [B, cap, D] or paged [pages, page_size, D] (+ block_table); an fp8
    ckv_cache is read times k_scale."""
    b_, ql, hq, d = q_nope.shape
    ckv = ckv_cache.double() * (k_scale.double() if k_scale is not None else 1.0)
    kpe = kpe_cache.double()
    if out is None:
        out = torch.empty_like(q_nope)
    for b in range(b_):
        n = int(kv_len[b])
        if block_table is None:
            ck, kp = ckv[b, :n], kpe[b, :n]
        else:
            ps = ckv.shape[1]
            np_ = (n + ps - 1) // ps
            pages = block_table[b, :np_].long()
            ck, kp = ckv[pages].reshape(-1, d)[:n], kpe[pages].reshape(-1, kpe.shape[-1])[:n]
        for t in range(ql):
            upto = n - ql + t + 1
            s = (q_nope[b, t].double() @ ck[:upto].t() + q_pe[b, t].double() @ kp[:upto].t())
            out[b, t] = (torch.softmax(s * softmax_scale, -1) @ ck[:upto]).to(out.dtype)
    return out
