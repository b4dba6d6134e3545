"""shared_prefix_decode.py — cascade (shared-prefix) decoding with flashdecode.

B sequences share a prompt prefix of P keys (a system prompt; n samples of one
prompt) and each has its own suffix after it (its own prompt tail and generated
tokens; the last q_len of them are the new tokens whose queries attend). A plain
decode reads the prefix's K/V once per sequence, from a cache that holds a copy of
it per sequence. Cascade decoding stores the prefix once and reads it once:

1. prefix: ONE non-causal call over the prefix cache [1, P, Hkv, D] with the B
   sequences' query rows packed as the q_len rows of one sequence:
   q [B, q_len, Hq, D] -> [1, B*q_len, Hq, D], packed row b*q_len + t being
   sequence b's row t (a plain reshape). non_causal=True: every packed row sees all
   P keys (the causal mask would hide keys from the early rows). A call takes up to
   flashdecode.MAX_Q_LEN_NON_CAUSAL (128) rows, so the sequences go in groups of
   128 // q_len. The out [1, B*q_len, Hq, D] reshapes back to [B, q_len, Hq, D];
   the lse [1, Hq, B*q_len] puts the heads before the rows, so it is
   [Hq, B, q_len] -> permuted to [B, Hq, q_len].
2. suffixes: a normal (causal) decode over each sequence's own cache, kv_len = its
   suffix length, return_lse=True. Sinks (--sinks), if the model has them, go to
   this call only: they join a row's softmax denominator once.
3. merge_states of the two states: the attention over prefix + suffix. The states
   are computed in float32 (out_dtype) so the merge loses nothing to 16-bit
   rounding; the merged out has the model's dtype.

The result is compared with a plain decode over a cache holding prefix + suffix per
sequence; the largest errors are printed, and the exit code is 1 above tolerance.

    python examples/shared_prefix_decode.py                   # CPU, numpy float32
    python examples/shared_prefix_decode.py --device cuda     # GPU, torch bfloat16

The CPU path uses numpy arrays only (no torch needed); --device cuda uses torch.
The flashdecode calls are the same for both.
"""
import argparse
import sys

import numpy as np

import flashdecode

# max |cascade - plain| / (1 + |plain|): twice the CLI check's tolerance against the
# float64 reference (both sides round)
TOLERANCE = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3.2e-2}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                    help="default: float32 on the CPU, bfloat16 on CUDA (numpy has no bfloat16)")
    ap.add_argument("--batch", type=int, default=6, help="sequences sharing the prefix")
    ap.add_argument("--q-len", type=int, default=1, help="new tokens per sequence (1..16)")
    ap.add_argument("--prefix-len", type=int, default=1500, help="keys of the shared prefix")
    ap.add_argument("--max-suffix-len", type=int, default=300,
                    help="suffix lengths are drawn from q_len..this")
    ap.add_argument("--num-heads-q", type=int, default=8)
    ap.add_argument("--num-heads-kv", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--sinks", action="store_true", help="random attention sinks per head")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    a.dtype = a.dtype or ("float32" if a.device == "cpu" else "bfloat16")
    if a.device == "cpu" and a.dtype == "bfloat16":
        ap.error("--dtype bfloat16: numpy has no bfloat16; use --device cuda")
    if not 1 <= a.q_len <= flashdecode.MAX_Q_LEN:
        ap.error("--q-len: %d is outside 1..%d" % (a.q_len, flashdecode.MAX_Q_LEN))
    if a.max_suffix_len < a.q_len or a.prefix_len < 1 or a.batch < 1:
        ap.error("--max-suffix-len must be >= --q-len; --prefix-len and --batch >= 1")
    return a


class Arrays:
    """The few array operations the example needs, for numpy (CPU) or torch (CUDA)."""

    def __init__(self, device, dtype):
        self.torch = None
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                sys.exit("shared_prefix_decode: --device cuda: torch sees no GPU")
            self.torch = torch
        self.dtype = dtype

    def array(self, x, dtype=None):
        """numpy data on the device, in the model dtype (or `dtype`)."""
        dtype = dtype or self.dtype
        if self.torch is None:
            return np.ascontiguousarray(x, dtype=dtype)
        return self.torch.from_numpy(np.asarray(x)).to("cuda", getattr(self.torch, dtype))

    def float32(self):
        return np.float32 if self.torch is None else self.torch.float32

    def permute(self, x, dims):
        return x.transpose(dims) if self.torch is None else x.permute(dims)

    def concat(self, xs, axis):
        return np.concatenate(xs, axis) if self.torch is None else self.torch.cat(xs, axis)

    def host(self, x):
        if self.torch is None:
            return np.asarray(x, dtype=np.float64)
        return x.detach().double().cpu().numpy()


def cascade_decode(xp, q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_len, sinks):
    """Attention of q [B, q_len, Hq, D] over prefix (shared) + suffix (per sequence) keys."""
    batch, q_len, hq, d = q.shape
    # 1. the shared prefix: packed rows, non-causal, in groups of at most 128 rows
    group = flashdecode.MAX_Q_LEN_NON_CAUSAL // q_len
    prefix_len = prefix_k.shape[1]
    pre_out, pre_lse = [], []
    for start in range(0, batch, group):
        n = min(group, batch - start)
        rows = q[start:start + n].reshape(1, n * q_len, hq, d)        # row b*q_len + t
        o, lse = flashdecode.decode(rows, prefix_k, prefix_v, [prefix_len], non_causal=True,
                                    return_lse=True, out_dtype=xp.float32())
        pre_out.append(o.reshape(n, q_len, hq, d))                    # [n, q_len, Hq, D]
        pre_lse.append(xp.permute(lse.reshape(hq, n, q_len), (1, 0, 2)))  # [n, Hq, q_len]
    pre_out, pre_lse = xp.concat(pre_out, 0), xp.concat(pre_lse, 0)
    # 2. each sequence's own suffix: causal; the sinks (if any) here only
    suf_out, suf_lse = flashdecode.decode(q, suffix_k, suffix_v, suffix_len, sinks=sinks,
                                          return_lse=True, out_dtype=xp.float32())
    # 3. merge the two states, into the model's dtype
    return flashdecode.merge_states([pre_out, suf_out], [pre_lse, suf_lse], out_dtype=xp.dtype)


def main(argv=None):
    a = parse_args(argv)
    xp = Arrays(a.device, a.dtype)
    rng = np.random.default_rng(a.seed)
    B, T, P = a.batch, a.q_len, a.prefix_len
    Hq, Hkv, D, S = a.num_heads_q, a.num_heads_kv, a.head_dim, a.max_suffix_len
    suffix_len = rng.integers(T, S + 1, size=B).astype(np.int32)
    q = rng.standard_normal((B, T, Hq, D), dtype=np.float32)
    prefix_k = rng.standard_normal((1, P, Hkv, D), dtype=np.float32)
    prefix_v = rng.standard_normal((1, P, Hkv, D), dtype=np.float32)
    suffix_k = rng.standard_normal((B, S, Hkv, D), dtype=np.float32)
    suffix_v = rng.standard_normal((B, S, Hkv, D), dtype=np.float32)
    sinks = rng.uniform(0.0, 6.0, Hq).astype(np.float32) if a.sinks else None

    # what a plain decode needs: each sequence's cache with its own copy of the prefix
    full_k = np.concatenate([np.repeat(prefix_k, B, axis=0), suffix_k], axis=1)
    full_v = np.concatenate([np.repeat(prefix_v, B, axis=0), suffix_v], axis=1)

    dev = [xp.array(x) for x in (q, prefix_k, prefix_v, suffix_k, suffix_v, full_k, full_v)]
    q_d, pk, pv, sk, sv, fk, fv = dev
    suffix_len_d = xp.array(suffix_len, "int32")
    sinks_d = None if sinks is None else xp.array(sinks, "float32")

    out, lse = cascade_decode(xp, q_d, pk, pv, sk, sv, suffix_len_d, sinks_d)
    ref, ref_lse = flashdecode.decode(q_d, fk, fv, xp.array(P + suffix_len, "int32"),
                                      sinks=sinks_d, return_lse=True)

    got, want = xp.host(out), xp.host(ref)
    max_abs = float(np.max(np.abs(got - want)))
    max_err = float(np.max(np.abs(got - want) / (1.0 + np.abs(want))))
    lse_err = float(np.max(np.abs(xp.host(lse) - xp.host(ref_lse))))
    elem = 2 if a.dtype != "float32" else 4
    per_key = 2 * Hkv * D * elem  # K and V bytes of one key
    cascade_mb = (P + int(suffix_len.sum())) * per_key / 1e6
    plain_mb = (B * P + int(suffix_len.sum())) * per_key / 1e6
    tol = TOLERANCE[a.dtype]
    ok = max_err <= tol and lse_err <= 1e-3 * max(1.0, float(np.max(np.abs(xp.host(ref_lse)))))
    print("shared_prefix_decode: device=%s dtype=%s batch=%d q_len=%d prefix_len=%d "
          "suffix_len=%d..%d heads=%d/%d head_dim=%d sinks=%s"
          % (a.device, a.dtype, B, T, P, int(suffix_len.min()), int(suffix_len.max()), Hq, Hkv,
             D, "yes" if a.sinks else "no"))
    print("K/V read: cascade %.2f MB (prefix once), plain decode %.2f MB (prefix per sequence)"
          % (cascade_mb, plain_mb))
    print("cascade vs plain decode: max_abs=%.3e max_err=%.3e (tolerance %.1e) lse_err=%.3e %s"
          % (max_abs, max_err, tol, lse_err, "PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
