"""tree_verify.py — verify a speculative-decoding draft tree with one flashdecode call.

EAGLE-2/3 (Li et al. 2024) and Medusa (Cai et al. 2024) draft a TREE of candidate
tokens; the target model verifies all of them in one forward pass. In attention, each
draft token (a query row) must see the committed prefix and its own ancestors in the
tree, never its siblings or cousins. flashdecode takes that as a tree mask: one 64-bit
word per row (bit j = the row sees draft key j), or a bool [batch, q_len, q_len] tensor
that decode() packs.

This example draws an EAGLE-shaped tree of N nodes (default 60: a root, then each node
the child of a recent node, so paths are deep and bushy), appends the N draft tokens'
K/V after a prefix of P committed keys, runs

    out = flashdecode.decode(q, k_cache, v_cache, kv_len, tree_mask=mask)

and checks every row against attention computed one root-to-node path at a time in
float64 (the row's prefix keys and its ancestors' keys, nothing else). It prints the
largest error and exits 1 above tolerance. --device cuda runs it on the GPU (fp16 / bf16,
head_dim 64 or 128 there).

    python examples/tree_verify.py
    python examples/tree_verify.py --nodes 64 --prefix-len 3000 --dtype bfloat16
    python examples/tree_verify.py --device cuda --dtype bfloat16
"""
import argparse
import sys

import torch

import flashdecode


def eagle_tree(n, gen):
    """parent[t] for t >= 1 (parent[0] = -1): each node hangs off one of the last 6
    nodes, the shape of EAGLE's dynamic trees (top-k expansions of the best leaves)."""
    parent = [-1]
    for t in range(1, n):
        lo = max(0, t - 6)
        parent.append(lo + int(torch.randint(t - lo, (1,), generator=gen)))
    return parent


def path_of(parent, t):
    """Node t's root-to-node path (ancestors first)."""
    path = []
    while t >= 0:
        path.append(t)
        t = parent[t]
    return path[::-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=60, help="draft tokens (q_len), 1..64")
    ap.add_argument("--prefix-len", type=int, default=700)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--num-heads-q", type=int, default=8)
    ap.add_argument("--num-heads-kv", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (fp16 / bf16, head_dim 64/128)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(args.seed)
    B, N, P = args.batch, args.nodes, args.prefix_len
    Hq, Hkv, D = args.num_heads_q, args.num_heads_kv, args.head_dim
    group = Hq // Hkv

    # one tree per sequence; mask[b, t, j] = draft j is node t or one of its ancestors
    parents = [eagle_tree(N, gen) for _ in range(B)]
    mask = torch.zeros(B, N, N, dtype=torch.bool)
    for b in range(B):
        for t in range(N):
            mask[b, t, path_of(parents[b], t)] = True

    # the cache: P committed keys, then the N draft tokens' K/V (appended before verify)
    kv_len = torch.full((B,), P + N, dtype=torch.int32)
    k_cache = torch.randn(B, P + N, Hkv, D, generator=gen).to(dtype)
    v_cache = torch.randn(B, P + N, Hkv, D, generator=gen).to(dtype)
    q = (2.0 * torch.randn(B, N, Hq, D, generator=gen)).to(dtype)

    dev = args.device
    out, lse = flashdecode.decode(q.to(dev), k_cache.to(dev), v_cache.to(dev), kv_len.to(dev),
                                  tree_mask=mask.to(dev), return_lse=True)
    out, lse = out.cpu(), lse.cpu()

    # float64, one path at a time: row t of sequence b over its prefix + its path's keys
    scale = D ** -0.5
    worst, worst_lse = 0.0, 0.0
    for b in range(B):
        for t in range(N):
            keys = list(range(P)) + [P + j for j in path_of(parents[b], t)]
            k = k_cache[b, keys].double()  # [n, Hkv, D]
            v = v_cache[b, keys].double()
            for h in range(Hq):
                s = (k[:, h // group] @ q[b, t, h].double()) * scale
                w = torch.softmax(s, 0)
                ref = w @ v[:, h // group]
                worst = max(worst, (out[b, t, h].double() - ref).abs().max().item()
                            / max(1.0, ref.abs().max().item()))
                worst_lse = max(worst_lse, abs(lse[b, h, t].item()
                                               - torch.logsumexp(s, 0).item()))
    tol = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}[args.dtype]
    depth = max(len(path_of(p, t)) for p in parents for t in range(N))
    print("tree of %d nodes (depth %d) over a %d-key prefix, batch %d, %s, %s"
          % (N, depth, P, B, args.dtype, args.device))
    print("per-path float64 vs flashdecode: max error %.3g (out, relative to max|ref|), "
          "%.3g (lse)" % (worst, worst_lse))
    lse_tol = 1e-4 if args.device == "cpu" else 1e-3  # the GPU's exp2 in fp32
    ok = worst <= tol and worst_lse <= lse_tol
    print("PASS" if ok else "FAIL (tolerance %g)" % tol)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
