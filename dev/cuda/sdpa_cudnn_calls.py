"""sdpa_cudnn_calls.py — PyTorch SDPA on its cuDNN backend at one decode shape, called
ITERS times (for Nsight Compute: dev/cuda/profile.sh OUTDIR cudnn). bf16, q [B, Hq, 1, D],
k/v [B, Hkv, kv_len, D] (exact length, no mask, enable_gqa), as bench_e2e.py's sdpa-cudnn
peer runs it.

  python3 dev/cuda/sdpa_cudnn_calls.py --batch 16 --kv-len 8193
"""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--kv-len", type=int, default=32769)
    ap.add_argument("--num-heads-q", type=int, default=32)
    ap.add_argument("--num-heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=8)
    a = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    q = torch.randn(a.batch, a.num_heads_q, 1, a.head_dim, device=dev, dtype=dt)
    k = torch.randn(a.batch, a.num_heads_kv, a.kv_len, a.head_dim, device=dev, dtype=dt)
    v = torch.randn_like(k)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        for _ in range(a.iters):
            scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.cuda.synchronize()
    print("sdpa-cudnn B=%d kv_len=%d: %d calls" % (a.batch, a.kv_len, a.iters))


if __name__ == "__main__":
    main()
