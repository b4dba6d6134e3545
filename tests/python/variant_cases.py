"""variant_cases.py — attention-variant settings and problems shared by the CPU and
CUDA tests of the variants (test_variants.py, test_cuda_variants.py).

A variant is a dict of decode() keyword arguments; ``sinks="random"`` stands for
sinks drawn per head by make_sinks (values from -1 to 5: from no weight to most
of a row's).
"""
import numpy as np

from cases import Case

VARIANTS = {
    "window0": dict(window_left=0),
    "window5": dict(window_left=5),
    "window70": dict(window_left=70),
    "softcap": dict(logits_soft_cap=1.5),
    "sinks": dict(sinks="random"),
    "noncausal": dict(non_causal=True),
    "window-softcap-sinks": dict(window_left=9, logits_soft_cap=2.0, sinks="random"),
    "softcap-sinks-noncausal": dict(logits_soft_cap=3.0, sinks="random", non_causal=True),
    "window-sinks": dict(window_left=40, sinks="random"),
}

# q_len 1..16, GQA ratios 1, 4, 6 (MQA) and 8, odd kv_len, kv_len 0 and kv_len < q_len,
# contiguous and paged
VARIANT_CASES = [
    Case("gqa4", 3, 1, 8, 2, 64, [1, 130, 301]),
    Case("mha-q3-paged8", 2, 3, 4, 4, 32, [2, 99], page_size=8),
    Case("mqa-q16", 2, 16, 6, 1, 40, [16, 257]),
    Case("gqa4-q7-paged16", 3, 7, 8, 2, 64, [5, 0, 200], page_size=16),
    Case("gqa8-q4-short", 2, 4, 8, 1, 16, [3, 1]),
]


def make_sinks(num_heads_q, seed=7):
    return np.random.default_rng(seed).uniform(-1.0, 5.0, num_heads_q).astype(np.float32)


def resolve(variant, num_heads_q):
    """The variant's decode() keyword arguments, with its sinks drawn (numpy float32)."""
    kw = dict(variant)
    if isinstance(kw.get("sinks"), str):
        kw["sinks"] = make_sinks(num_heads_q)
    return kw


def split_points(kv_lens, q_len, parts):
    """Cut points 0 < c_1 < ... < c_{parts-1} of every sequence's keys such that the
    keys before the last cut are seen by every query row (c_last <= min kv_len -
    q_len + 1): the parts before it run non-causal, the last one causal."""
    top = min(kv_lens) - q_len + 1
    assert top >= parts - 1, "sequences too short to split"
    return [max(1, top * i // (parts - 1)) for i in range(1, parts)] if parts > 1 else []
