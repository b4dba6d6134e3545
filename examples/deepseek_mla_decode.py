"""deepseek_mla_decode.py — one DeepSeek-V3 attention layer decoded with flashdecode's MLA.

Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, section 2.1) stores per
token a latent c_kv (kv_lora_rank = 512 values) and a rope key k_pe (64 values) that
all heads share. The plain ("decompressed") form up-projects c_kv per head:

    k_nope_h = W_UK_h c_kv (128)   v_h = W_UV_h c_kv (128)   K_h = [k_nope_h | k_pe] (192)
    q_h = [q_nope_h (128) | q_pe_h (64)]      out_h = softmax(q_h . K_h / sqrt(192)) v_h

The absorbed form that flashdecode.mla_decode runs folds W_UK_h into the query and
W_UV_h into the output, so the cache is read as it is stored, for all heads at once:

    q_nope_h . k_nope_h = (W_UK_h^T q_nope_h) . c_kv      -> q_abs_h (512)
    out_h = W_UV_h (sum_j softmax_j c_kv_j)              -> mla_decode's out (512), then W_UV_h

This script builds one layer with DeepSeek-V3's attention shapes from random weights
(q_lora_rank 1536, kv_lora_rank 512, 16 heads as under 8-way tensor parallelism,
qk_nope 128, qk_rope 64, v 128; the hidden size is scaled down from 7168 for speed,
--hidden 7168 for the real one), fills a paged cache of one 576-wide row per token
(vLLM's / FlashMLA's layout, read as the two views [..., :512] and [..., 512:]) with
flashdecode.mla_append_kv, decodes q_len new tokens per sequence (2: multi-token
prediction) with flashdecode.mla_decode, and compares the layer's output with the
plain decompressed attention computed in torch float64 from the same cache contents.
It prints the largest error and exits 1 above the tolerance.

    python examples/deepseek_mla_decode.py                      # CPU, float32
    python examples/deepseek_mla_decode.py --device cuda        # GPU, bfloat16
    python examples/deepseek_mla_decode.py --kv-dtype e4m3      # fp8 latent, per-token scales

Needs torch. softmax_scale is 1/sqrt(192) (DeepSeek-V3 multiplies it by YaRN's
mscale^2 when the context is extended; pass the model's value).
"""
import argparse
import math
import sys

import torch

import flashdecode

# max |flashdecode - plain| / max |plain| over the layer's output. The flashdecode path
# rounds q_abs, q_pe and out to the compute dtype (the reference does not): bf16 ~2^-8.
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.5e-2}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                    help="default: float32 on the CPU, bfloat16 on CUDA")
    ap.add_argument("--kv-dtype", choices=["e4m3"], default=None,
                    help="fp8 latent cache with per-token scales (16-bit rope part kept)")
    ap.add_argument("--hidden", type=int, default=1024, help="hidden size (DeepSeek-V3: 7168)")
    ap.add_argument("--num-heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--q-len", type=int, default=2, help="new tokens per sequence (1..16)")
    ap.add_argument("--max-len", type=int, default=700, help="longest sequence, in tokens")
    ap.add_argument("--page-size", type=int, default=64, help="0: a contiguous cache")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


Q_LORA, KV_LORA, NOPE, ROPE, V = 1536, 512, 128, 64, 128


def rms_norm(x, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rope(x, pos, theta=10000.0):
    """Rotary embedding of x [..., positions, (heads,) 64] (rotate-half form)."""
    half = x.shape[-1] // 2
    freq = theta ** (-torch.arange(half, dtype=torch.float64) / half)
    ang = pos.to(torch.float64)[..., None] * freq                     # [.., positions, 32]
    if x.dim() == ang.dim() + 1:                                     # a heads dimension
        ang = ang[..., None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


class Layer:
    """DeepSeek-V3's attention weights (random, float64), fan-in scaled."""

    def __init__(self, hidden, heads, gen):
        def w(*shape):
            return torch.randn(*shape, generator=gen, dtype=torch.float64) / math.sqrt(shape[0])

        self.heads = heads
        self.w_dq = w(hidden, Q_LORA)                      # q_a_proj
        self.w_uq = w(Q_LORA, heads * (NOPE + ROPE))       # q_b_proj
        self.w_dkv = w(hidden, KV_LORA + ROPE)             # kv_a_proj_with_mqa
        w_ukv = w(KV_LORA, heads * (NOPE + V))             # kv_b_proj
        w_ukv = w_ukv.view(KV_LORA, heads, NOPE + V)
        self.w_uk = w_ukv[..., :NOPE].permute(1, 0, 2)     # [H, 512, 128]
        self.w_uv = w_ukv[..., NOPE:].permute(1, 0, 2)     # [H, 512, 128]
        self.w_o = w(heads * V, hidden)                    # o_proj

    def latent(self, x, pos):
        """c_kv [.., 512] and the roped k_pe [.., 64] of hidden states x at positions pos."""
        kv = x @ self.w_dkv
        return rms_norm(kv[..., :KV_LORA]), rope(kv[..., KV_LORA:], pos)

    def query(self, x, pos):
        """q_nope [.., H, 128] and the roped q_pe [.., H, 64]."""
        q = (rms_norm(x @ self.w_dq) @ self.w_uq).unflatten(-1, (self.heads, NOPE + ROPE))
        return q[..., :NOPE], rope(q[..., NOPE:], pos)


def plain_attention(layer, q_nope, q_pe, c_kv, k_pe, kv_len, scale):
    """The decompressed attention per sequence in float64 -> the layer output [B, T, hidden].
    c_kv [B, L, 512], k_pe [B, L, 64] as the cache holds them."""
    batch, q_len = q_nope.shape[:2]
    outs = []
    for b in range(batch):
        n = int(kv_len[b])
        k_nope = torch.einsum("jc,hcd->jhd", c_kv[b, :n], layer.w_uk)          # [n, H, 128]
        v = torch.einsum("jc,hcd->jhd", c_kv[b, :n], layer.w_uv)              # [n, H, 128]
        k = torch.cat([k_nope, k_pe[b, :n, None].expand(-1, layer.heads, -1)], -1)  # [n, H, 192]
        q = torch.cat([q_nope[b], q_pe[b]], -1)                                # [T, H, 192]
        s = torch.einsum("thd,jhd->thj", q, k) * scale
        pos = torch.arange(n - q_len, n)[:, None, None]
        s = s.masked_fill(torch.arange(n)[None, None, :] > pos, float("-inf"))  # causal
        outs.append(torch.einsum("thj,jhd->thd", torch.softmax(s, -1), v))     # [T, H, 128]
    return torch.stack(outs).flatten(2) @ layer.w_o


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("deepseek_mla_decode: --device cuda: torch sees no GPU")
    dtype_name = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    if args.kv_dtype and dtype_name == "float32":
        dtype_name = "bfloat16"  # an fp8 cache pairs with a 16-bit q
    dtype, dev = getattr(torch, dtype_name), torch.device(args.device)
    gen = torch.Generator().manual_seed(args.seed)
    layer = Layer(args.hidden, args.num_heads, gen)
    B, T, H = args.batch, args.q_len, args.num_heads
    kv_len = torch.randint(T, args.max_len + 1, (B,), generator=gen)
    kv_len[0] = args.max_len
    L = args.max_len
    x = torch.randn(B, L, args.hidden, generator=gen, dtype=torch.float64)  # hidden states
    pos = torch.arange(L).expand(B, L)
    c_kv, k_pe = layer.latent(x, pos)                                     # [B, L, 512], [B, L, 64]

    # the cache: one 576-wide row per token, paged (or contiguous), in the cache dtype
    page = args.page_size
    cache_dtype = torch.float8_e4m3fn if args.kv_dtype else dtype
    if page:
        per = -(-L // page)
        num_pages = B * per + 5
        block_table = torch.randperm(num_pages, generator=gen)[:B * per].view(B, per)
        block_table = block_table.to(torch.int32).to(dev)
        lead = (num_pages, page)
    else:
        block_table, lead = None, (B, L)
    kv = torch.zeros(*lead, KV_LORA + ROPE, dtype=dtype, device=dev)
    if args.kv_dtype:  # fp8 latent [.., 512] beside a 16-bit rope part: two buffers
        ckv_cache = torch.zeros(*lead, KV_LORA, dtype=cache_dtype, device=dev)
        kpe_cache = torch.zeros(*lead, ROPE, dtype=dtype, device=dev)
        k_scale = torch.ones(*lead, dtype=torch.float32, device=dev)      # per token, written
    else:
        ckv_cache, kpe_cache, k_scale = kv[..., :KV_LORA], kv[..., KV_LORA:], None

    # fill the cache: the earlier tokens one sequence at a time, then the q_len new tokens
    # of every sequence in one call (kv_len before it), as a serving engine's step does
    zero = torch.zeros(1, dtype=torch.int32, device=dev)
    for b in range(B):
        n = int(kv_len[b]) - T
        if n == 0:
            continue
        one = slice(b, b + 1)
        if page:  # the pool is shared: this sequence's row of the block table
            caches, table, scales = (ckv_cache, kpe_cache), block_table[one], k_scale
        else:     # its own rows of the caches
            caches, table = (ckv_cache[one], kpe_cache[one]), None
            scales = None if k_scale is None else k_scale[one]
        flashdecode.mla_append_kv(c_kv[one, :n].to(dtype).to(dev), k_pe[one, :n].to(dtype).to(dev),
                                  *caches, zero, block_table=table, k_scale=scales)
    new = torch.stack([torch.arange(int(n) - T, int(n)) for n in kv_len])  # [B, T]
    idx = new[..., None]
    flashdecode.mla_append_kv(torch.gather(c_kv, 1, idx.expand(-1, -1, KV_LORA)).to(dtype).to(dev),
                              torch.gather(k_pe, 1, idx.expand(-1, -1, ROPE)).to(dtype).to(dev),
                              ckv_cache, kpe_cache, (kv_len - T).to(torch.int32).to(dev),
                              block_table=block_table, k_scale=k_scale)

    # the new tokens' queries, W_UK absorbed
    x_new = torch.gather(x, 1, idx.expand(-1, -1, args.hidden))
    q_nope, q_pe = layer.query(x_new, new)                                 # [B, T, H, 128 / 64]
    q_abs = torch.einsum("bthd,hcd->bthc", q_nope, layer.w_uk)             # [B, T, H, 512]
    scale = 1.0 / math.sqrt(NOPE + ROPE)
    out_latent = flashdecode.mla_decode(
        q_abs.to(dtype).to(dev), q_pe.to(dtype).to(dev), ckv_cache, kpe_cache,
        kv_len.to(torch.int32).to(dev), block_table=block_table, softmax_scale=scale,
        k_scale=k_scale)                                                   # [B, T, H, 512]
    attn = torch.einsum("bthc,hcd->bthd", out_latent.double().cpu(), layer.w_uv)  # W_UV absorbed
    got = attn.flatten(2) @ layer.w_o

    # the reference: the plain decompressed attention over what the cache holds
    def stored(cache, scales):
        vals = cache.double().cpu()
        if scales is not None:
            vals = vals * scales.double().cpu()[..., None]
        if block_table is None:
            return vals
        return vals[block_table.long().cpu()].flatten(1, 2)[:, :L]

    want = plain_attention(layer, q_nope, q_pe, stored(ckv_cache, k_scale),
                           stored(kpe_cache, None), kv_len, scale)
    err = float((got - want).abs().max() / want.abs().max())
    tol = TOLERANCE[dtype_name]
    ok = math.isfinite(err) and err <= tol
    print("DeepSeek-V3 MLA layer: batch %d, q_len %d, %d heads, hidden %d, kv_len %s, %s%s, "
          "page %d, %s" % (B, T, H, args.hidden, kv_len.tolist(), dtype_name,
                           " + e4m3 latent" if args.kv_dtype else "", page, args.device))
    print("absorbed MLA (flashdecode) vs decompressed attention (float64): max error %.3g of "
          "the output's max (tolerance %.3g): %s" % (err, tol, "PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
