"""cases.py — test problems shared by the CPU and CUDA Python tests.

Every case has printable parameters (its id) so a failure names a problem you
can rebuild. make_case draws inputs with a fixed seed, rounds them to the
dtype, and computes the float64 reference from the rounded values.
"""
import numpy as np


class Case:
    def __init__(self, name, batch, q_len, num_heads_q, num_heads_kv, head_dim, kv_lens,
                 page_size=0, capacity=None):
        self.name, self.batch, self.q_len = name, batch, q_len
        self.num_heads_q, self.num_heads_kv, self.head_dim = num_heads_q, num_heads_kv, head_dim
        self.kv_lens, self.page_size = list(kv_lens), page_size
        self.capacity = capacity if capacity is not None else max(max(kv_lens), 1) + 5

    def __repr__(self):
        return "%s-b%d-t%d-h%d/%d-d%d-kv%s-p%d" % (
            self.name, self.batch, self.q_len, self.num_heads_q, self.num_heads_kv,
            self.head_dim, "_".join(map(str, self.kv_lens)), self.page_size)


CPU_CASES = [
    Case("mha", 2, 1, 4, 4, 64, [77, 200]),
    Case("gqa", 3, 1, 8, 2, 128, [1, 130, 300]),
    Case("mqa", 2, 1, 6, 1, 32, [64, 65]),
    Case("gqa-paged", 3, 1, 8, 2, 64, [50, 257, 0], page_size=16),
    Case("qlen4", 2, 4, 8, 4, 64, [4, 190]),
    Case("qlen3-paged", 2, 3, 4, 2, 64, [2, 99], page_size=8),
    Case("odd-dim", 1, 1, 2, 1, 40, [129]),
]


def make_case(case, seed=0):
    """numpy float32 q, k, v (before rounding), int32 kv_len, block_table (or None)."""
    rng = np.random.default_rng(seed)
    b, t, hq, hkv, d = case.batch, case.q_len, case.num_heads_q, case.num_heads_kv, case.head_dim
    q = rng.standard_normal((b, t, hq, d), dtype=np.float32)
    kv_len = np.array(case.kv_lens, dtype=np.int32)
    block_table = None
    if case.page_size:
        ps = case.page_size
        max_pages = (case.capacity + ps - 1) // ps
        num_pages = b * max_pages + 3
        block_table = rng.permutation(num_pages)[: b * max_pages].reshape(b, max_pages)
        block_table = block_table.astype(np.int32)
        shape = (num_pages, ps, hkv, d)
    else:
        shape = (b, case.capacity, hkv, d)
    k = rng.standard_normal(shape, dtype=np.float32)
    v = rng.standard_normal(shape, dtype=np.float32)
    return q, k, v, kv_len, block_table
