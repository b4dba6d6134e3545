"""test_trust.py — what the C API's guards mean from Python: broadcast input views (stride 0)
are passed as FD_STRIDE_BROADCAST and give what a materialised copy gives (the C API refuses
a literal 0 stride beside nonzero ones); an output sharing memory with an input is refused
by the C library's overlap check, naming both; a contiguous cache of capacity 0 is refused
at plan time, naming kv_capacity."""
import numpy as np
import pytest

import flashdecode
from flashdecode import _tensors

try:
    import torch
except ImportError:  # the numpy path is tested without torch
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def _inputs(batch=3, hq=4, hkv=2, d=16, cap=40, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, 1, hq, d)).astype(np.float32)
    k = rng.standard_normal((batch, cap, hkv, d)).astype(np.float32)
    v = rng.standard_normal((batch, cap, hkv, d)).astype(np.float32)
    kv_len = np.array([cap, 7, 23][:batch], dtype=np.int32)
    return q, k, v, kv_len


def test_broadcast_constant_matches_the_header():
    assert _tensors.STRIDE_BROADCAST == -(2 ** 63)


def test_kv_broadcast_over_the_batch_equals_a_copy():
    q, k, v, kv_len = _inputs()
    kb = np.broadcast_to(k[:1], k.shape)   # one cache shared by every sequence: stride 0
    vb = np.broadcast_to(v[:1], v.shape)
    assert kb.strides[0] == 0
    got = flashdecode.decode(q, kb, vb, kv_len)
    want = flashdecode.decode(q, np.ascontiguousarray(kb), np.ascontiguousarray(vb), kv_len)
    np.testing.assert_array_equal(got, want)


def test_q_broadcast_over_every_dimension_equals_a_copy():
    # strides (0, 0, 0, 1): once refused as 'read as contiguous by the C API'
    q, k, v, kv_len = _inputs()
    qb = np.broadcast_to(q[:1, :1, :1], q.shape)
    assert qb.strides[:3] == (0, 0, 0)
    got, lse = flashdecode.decode(qb, k, v, kv_len, return_lse=True)
    want, want_lse = flashdecode.decode(np.ascontiguousarray(qb), k, v, kv_len, return_lse=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(lse, want_lse)


def test_plan_run_with_a_broadcast_view_and_the_cached_path():
    q, k, v, kv_len = _inputs()
    plan = flashdecode.DecodePlan(batch=3, num_heads_q=4, num_heads_kv=2, head_dim=16,
                                  dtype=np.float32, kv_capacity=40, device="cpu")
    kb, vb = np.broadcast_to(k[1:2], k.shape), np.broadcast_to(v[1:2], v.shape)
    want = plan.run(q, np.ascontiguousarray(kb), np.ascontiguousarray(vb), kv_len)
    for _ in range(2):  # the second call takes the plan's cached call layout
        np.testing.assert_array_equal(plan.run(q, kb, vb, kv_len), want)


def test_out_sharing_memory_with_q_is_refused():
    q, k, v, kv_len = _inputs()
    before = q.copy()
    with pytest.raises(ValueError, match=r"out: its bytes .* overlap q's"):
        flashdecode.decode(q, k, v, kv_len, out=q)
    np.testing.assert_array_equal(q, before)  # nothing written


def test_lse_sharing_memory_with_out_is_refused():
    q, k, v, kv_len = _inputs()
    buf = np.zeros(q.size + 16, np.float32)
    out = buf[:q.size].reshape(q.shape)
    lse = buf[q.size - 4:q.size - 4 + 12].reshape(3, 4, 1)  # its first floats are out's last
    plan = flashdecode.DecodePlan(batch=3, num_heads_q=4, num_heads_kv=2, head_dim=16,
                                  dtype=np.float32, kv_capacity=40, device="cpu")
    with pytest.raises(ValueError, match=r"lse: its bytes .* overlap out's"):
        plan.run(q, k, v, kv_len, out=out, lse=lse)
    assert not buf.any()


def test_contiguous_cache_of_capacity_zero_is_named():
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match=r"kv_capacity: 0 for a contiguous cache"):
        flashdecode.decode(q, k[:, :0], v[:, :0], np.zeros(3, np.int32))


@needs_torch
def test_torch_expanded_kv_equals_a_copy():
    q, k, v, kv_len = (torch.from_numpy(a) for a in _inputs())
    kb, vb = k[:1].expand_as(k), v[:1].expand_as(v)
    got = flashdecode.decode(q, kb, vb, kv_len)
    want = flashdecode.decode(q, kb.contiguous(), vb.contiguous(), kv_len)
    assert torch.equal(got, want)
