"""test_argument_types.py — arguments the Python layer must refuse or accept as the C
library does (found by an adversarial review): bools and strings are not floats
(softmax_scale, logits_soft_cap, k_scale), the torch path checks num_splits as the numpy
path does, num_splits_heuristic checks its ints, append_kv with no new token still checks
its arguments and refuses broadcast tensors by name, and DecodePlan.run does not check the
page ids of pages wholly before a window (an engine may have freed them)."""
import numpy as np
import pytest

import flashdecode
from attention_ref import assert_out_close, attention_f64

try:
    import torch
except ImportError:
    torch = None


def small():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    k = rng.standard_normal((1, 16, 1, 8)).astype(np.float32)
    return q, k, k.copy(), np.array([16], np.int32)


@pytest.mark.parametrize("kw", [dict(logits_soft_cap=True), dict(softmax_scale=True),
                                dict(softmax_scale="0.5"), dict(logits_soft_cap=np.True_)])
def test_bool_and_str_are_not_floats(kw):
    q, k, v, kv_len = small()
    name = next(iter(kw))
    with pytest.raises(TypeError, match=name + r": expected a float"):
        flashdecode.decode(q, k, v, kv_len, **kw)


def test_numpy_and_torch_floats_still_pass():
    q, k, v, kv_len = small()
    a = flashdecode.decode(q, k, v, kv_len, softmax_scale=np.float32(0.5))
    b = flashdecode.decode(q, k, v, kv_len, softmax_scale=0.5)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("scale", [True, np.True_, "1.0"])
def test_fp8_scale_refuses_bool_and_str(scale):
    q = np.zeros((1, 1, 2, 8), np.float16)
    k = np.full((1, 16, 1, 8), 0x38, np.uint8)
    with pytest.raises(TypeError, match=r"k_scale: expected a float"):
        flashdecode.decode(q, k, k, [16], k_scale=scale, v_scale=1.0, kv_dtype="e4m3")


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("value", [2.9, "2", True])
def test_torch_num_splits_is_checked(value):
    q, k, v, kv_len = (torch.from_numpy(x) for x in small())
    with pytest.raises(TypeError, match=r"num_splits: expected an int"):
        flashdecode.decode(q, k, v, kv_len, num_splits=value)


def test_num_splits_heuristic_checks_its_ints():
    assert flashdecode.num_splits_heuristic(8, 256, 132, 2) == \
        flashdecode.num_splits_heuristic(np.int64(8), 256, 132, 2)
    with pytest.raises(ValueError, match=r"sm_count: .* does not fit int32"):
        flashdecode.num_splits_heuristic(8, 256, 2**32 + 132, 2)
    with pytest.raises(TypeError, match=r"sm_count: expected an int"):
        flashdecode.num_splits_heuristic(8, 256, 132.0, 2)
    with pytest.raises(TypeError, match=r"work_items: expected an int"):
        flashdecode.num_splits_heuristic(True, 256, 132, 2)


def test_append_nothing_still_checks():
    none = np.zeros((2, 0, 2, 8), np.float16)
    cache = np.full((2, 10, 2, 8), 3.0, np.float16)
    flashdecode.append_kv(none, none, cache, cache, np.array([3, 4], np.int32))
    assert (cache == 3.0).all()  # nothing written
    with pytest.raises(TypeError, match=r"k_cache"):
        flashdecode.append_kv(none, none, "not a cache", cache, np.array([3, 4], np.int32))
    with pytest.raises(ValueError, match=r"k_new: 2 heads"):
        other = np.zeros((2, 10, 3, 8), np.float16)
        flashdecode.append_kv(none, none, other, other, np.array([3, 4], np.int32))
    if torch is not None:
        t = torch.zeros(2, 0, 2, 8, dtype=torch.float16)
        tc = torch.zeros(2, 10, 2, 8, dtype=torch.float16)
        flashdecode.append_kv(t, t, tc, tc.clone(), [0, 0])


def test_append_refuses_broadcast_by_name():
    cache = np.zeros((2, 10, 2, 8), np.float16)
    kn = np.broadcast_to(np.ones((1, 3, 1, 8), np.float16), (2, 3, 2, 8))
    with pytest.raises(ValueError, match=r"k_new: a broadcast \(stride 0\) dimension"):
        flashdecode.append_kv(kn, np.ones((2, 3, 2, 8), np.float16), cache, cache.copy(),
                              np.array([0, 0], np.int32))
    assert (cache == 0).all()


def test_plan_skips_freed_pages_before_the_window():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    k = rng.standard_normal((40, 16, 1, 8)).astype(np.float32)
    table = np.arange(20, dtype=np.int32)[None].copy()
    want = flashdecode.decode(q, k, k, [300], block_table=table, window_left=15)
    table[0, :10] = -1  # pages wholly before the window, freed
    plan = flashdecode.DecodePlan(batch=1, num_heads_q=2, num_heads_kv=1, head_dim=8,
                                  dtype=np.float32, page_size=16, max_pages_per_seq=20,
                                  window_left=15, device="cpu")
    got = plan.run(q, k, k, np.array([300], np.int32), block_table=table)
    np.testing.assert_array_equal(got, want)
    ref = attention_f64(q, k, k, np.array([300]), np.arange(20)[None], window_left=15)[0]
    assert_out_close(got, ref, "float32")
    table[0, 17] = -1  # a page the window reads: refused, named
    with pytest.raises(ValueError, match=r"block_table\[0\]\[17\]: page id -1"):
        plan.run(q, k, k, np.array([300], np.int32), block_table=table)
