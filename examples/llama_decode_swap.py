"""llama_decode_swap.py — swap torch SDPA for flashdecode.decode in a Llama attention layer.

A decode loop over one Llama-shaped attention layer (q/k/v/o projections,
rotary embeddings, grouped-query attention, a KV cache of variable lengths
per sequence). Two copies of the layer share their weights and start from the
same cache; one attends with torch.nn.functional.scaled_dot_product_attention
(the cache sliced to the longest sequence, a mask for the shorter ones), the
other with flashdecode.decode on the cache as it is. Every step the outputs
are compared, and the attention call of each is timed.

    python examples/llama_decode_swap.py                 # GPU: Llama-3-8B shapes, bf16
    python examples/llama_decode_swap.py --device cpu    # CPU: small shapes, float32

Prints, per backend, the median time of the attention call and of the whole
layer step (CUDA events on the GPU, perf_counter on the CPU), the speedup,
and the largest difference between the two outputs over the run.
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F

import flashdecode


def rotary(x, pos, theta=500000.0):
    """Rotary position embedding of x [B, 1, H, D] at positions pos [B] (Llama's half split)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = pos.to(torch.float32)[:, None] * inv[None, :]                 # [B, D/2]
    cos, sin = ang.cos()[:, None, None, :], ang.sin()[:, None, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class LlamaAttention(torch.nn.Module):
    """One attention layer with its own KV cache [batch, capacity, num_heads_kv, head_dim]."""

    def __init__(self, weights, num_heads_q, num_heads_kv, head_dim, k_cache, v_cache, use_flash):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = weights
        self.num_heads_q, self.num_heads_kv, self.head_dim = num_heads_q, num_heads_kv, head_dim
        self.k_cache, self.v_cache = k_cache, v_cache
        self.use_flash = use_flash
        self.attn_seconds = []

    def attend(self, q, kv_len, max_len):
        """q [B, 1, Hq, D] -> out [B, 1, Hq, D]; kv_len [B] int32 (device), max_len its max (host)."""
        if self.use_flash:
            return flashdecode.decode(q, self.k_cache, self.v_cache, kv_len)
        group = self.num_heads_q // self.num_heads_kv
        k = self.k_cache[:, :max_len].transpose(1, 2)                  # [B, Hkv, S, D]
        v = self.v_cache[:, :max_len].transpose(1, 2)
        if group > 1:  # GQA as Hugging Face's sdpa attention does it (repeat_kv)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        mask = torch.arange(max_len, device=q.device)[None, :] < kv_len[:, None]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v,
                                             attn_mask=mask[:, None, None, :])
        return out.transpose(1, 2)

    def forward(self, x, pos, kv_len, max_len, timer):
        """x [B, 1, hidden]; pos [B] the new token's position; kv_len = pos + 1."""
        b = x.shape[0]
        q = (x @ self.wq).view(b, 1, self.num_heads_q, self.head_dim)
        k = (x @ self.wk).view(b, 1, self.num_heads_kv, self.head_dim)
        v = (x @ self.wv).view(b, 1, self.num_heads_kv, self.head_dim)
        q, k = rotary(q, pos), rotary(k, pos)
        rows = torch.arange(b, device=x.device)
        self.k_cache[rows, pos] = k[:, 0]
        self.v_cache[rows, pos] = v[:, 0]
        with timer(self.attn_seconds):
            o = self.attend(q, kv_len, max_len)
        return o.reshape(b, 1, -1) @ self.wo


class Timer:
    """Context manager factory: appends the elapsed seconds of its block to a list."""

    def __init__(self, cuda):
        self.cuda = cuda

    def __call__(self, sink):
        timer = self

        class _Block:
            def __enter__(self):
                if timer.cuda:
                    self.start = torch.cuda.Event(enable_timing=True)
                    self.end = torch.cuda.Event(enable_timing=True)
                    self.start.record()
                else:
                    self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                if timer.cuda:
                    self.end.record()
                    self.end.synchronize()
                    sink.append(self.start.elapsed_time(self.end) / 1e3)
                else:
                    sink.append(time.perf_counter() - self.t0)

        return _Block()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--prompt-len", type=int, help="longest prompt; the others are shorter")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    if cuda:  # Llama-3-8B: hidden 4096, 32 query heads, 8 kv heads, head_dim 128
        hidden, hq, hkv, d, dtype = 4096, 32, 8, 128, torch.bfloat16
        batch, prompt, steps = args.batch or 8, args.prompt_len or 8192, args.steps or 64
    else:  # small enough for a laptop
        hidden, hq, hkv, d, dtype = 512, 8, 2, 64, torch.float32
        batch, prompt, steps = args.batch or 2, args.prompt_len or 512, args.steps or 16
    dev = torch.device(args.device)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=dev, dtype=dtype)

    capacity = prompt + steps
    weights = [randn(hidden, hq * d, scale=hidden ** -0.5), randn(hidden, hkv * d, scale=hidden ** -0.5),
               randn(hidden, hkv * d, scale=hidden ** -0.5), randn(hq * d, hidden, scale=(hq * d) ** -0.5)]
    k_cache = randn(batch, capacity, hkv, d)
    v_cache = randn(batch, capacity, hkv, d)
    # prompts of different lengths: the longest is `prompt`
    pos = torch.tensor([prompt - (i * prompt) // (2 * batch) for i in range(batch)], device=dev)
    layers = {name: LlamaAttention(weights, hq, hkv, d, k_cache.clone(), v_cache.clone(), flash)
              for name, flash in (("torch sdpa", False), ("flashdecode", True))}
    timer = Timer(cuda)
    step_seconds = {name: [] for name in layers}
    x = randn(batch, 1, hidden)
    worst = 0.0
    with torch.inference_mode():
        for step in range(steps):
            kv_len = (pos + 1).to(torch.int32)
            max_len = prompt + step + 1  # known on the host: no synchronisation
            outs = {}
            for name, layer in layers.items():
                with timer(step_seconds[name]):
                    outs[name] = layer(x, pos, kv_len, max_len, timer)
            a, b = outs["torch sdpa"].float(), outs["flashdecode"].float()
            diff = (a - b).abs().max().item() / max(a.abs().max().item(), 1e-6)
            worst = max(worst, diff)
            # the next token's input, the same for both (so any difference is this step's)
            x = F.layer_norm(a, (hidden,)).to(dtype)
            pos = pos + 1

    tol = 2e-2 if dtype != torch.float32 else 1e-4
    skip = min(3, steps - 1)  # warm-up steps (first-call planning, kernel loads)
    print("Llama attention layer: batch %d, %d/%d heads, head_dim %d, %s, kv_len up to %d, %s"
          % (batch, hq, hkv, d, str(dtype).replace("torch.", ""), prompt + steps, args.device))
    print("%-12s %14s %14s" % ("backend", "attention", "layer step"))
    med = {}
    for name, layer in layers.items():
        med[name] = (statistics.median(layer.attn_seconds[skip:]),
                     statistics.median(step_seconds[name][skip:]))
        print("%-12s %11.1f us %11.1f us" % (name, med[name][0] * 1e6, med[name][1] * 1e6))
    print("speedup      %13.2fx %13.2fx" % (med["torch sdpa"][0] / med["flashdecode"][0],
                                            med["torch sdpa"][1] / med["flashdecode"][1]))
    print("largest relative difference of the layer outputs over %d steps: %.2e (tolerance %.0e)"
          % (steps, worst, tol))
    if not math.isfinite(worst) or worst > tol:
        raise SystemExit("outputs differ beyond the tolerance")


if __name__ == "__main__":
    main()
