"""test_plan_cache.py — DecodePlan.run's checked-call cache (CPU backend).

run() remembers, per plan, the outcome of the checks for one signature of
argument metadata (type, shape, strides, dtype, device, writeable) and then
only reads the new addresses. These tests make sure a warmed-up plan checks
exactly what a fresh one does, reads the addresses of the arrays of this call
(not of an earlier one), and stays correct across threads.
"""
import threading

import numpy as np
import pytest

import flashdecode
from attention_ref import attention_f64, output_tolerance
from cases import Case, make_case

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

B, HQ, HKV, D, CAP = 2, 4, 2, 16, 96


def plan_for(**kw):
    args = dict(batch=B, num_heads_q=HQ, num_heads_kv=HKV, head_dim=D, dtype="f32",
                kv_capacity=CAP, device="cpu", num_threads=1)
    args.update(kw)
    return flashdecode.DecodePlan(**args)


def inputs(seed, cap=CAP, lens=(70, 9)):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, 1, HQ, D), dtype=np.float32)
    k = rng.standard_normal((B, cap, HKV, D), dtype=np.float32)
    v = rng.standard_normal((B, cap, HKV, D), dtype=np.float32)
    return q, k, v, np.array(lens, np.int32)


def assert_matches(out, q, k, v, kv_len, block_table=None):
    ref, _ = attention_f64(np.asarray(q), np.asarray(k), np.asarray(v), np.asarray(kv_len),
                           block_table)
    np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=0,
                               atol=output_tolerance("float32", ref))


def error_of(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the type and message are what is compared
        return type(exc), str(exc)
    return None


def test_cached_runs_read_the_addresses_of_each_call():
    plan = plan_for()
    for seed in range(4):  # new arrays every call, one signature
        q, k, v, kv_len = inputs(seed, lens=(70 - seed, 9 + seed))
        out = np.full_like(q, np.nan)
        lse = np.empty((B, HQ, 1), np.float32)
        assert plan.run(q, k, v, kv_len, out=out, lse=lse) is out
        assert_matches(out, q, k, v, kv_len)
        fresh = plan.run(q, k, v, kv_len)  # allocated out: a new array each call
        assert fresh is not out and fresh.flags.c_contiguous and fresh.dtype == np.float32
        np.testing.assert_array_equal(fresh, out)
    assert len(plan._checked) == 2  # (out and lse given), (out allocated)


@pytest.mark.parametrize("bad", [
    "q-f16", "k-capacity", "q-head-stride", "out-read-only", "lse-read-only", "out-broadcast",
    "out-unaligned", "kv_len-int64", "kv_len-short", "block_table", "lse-shape", "q-list",
    "out-shape"])
def test_warm_plan_checks_like_a_fresh_one(bad):
    q, k, v, kv_len = inputs(1)
    out = np.empty_like(q)
    lse = np.empty((B, HQ, 1), np.float32)
    args = dict(q=q, k_cache=k, v_cache=v, kv_len=kv_len, out=out, lse=lse)
    if bad == "q-f16":
        args["q"] = q.astype(np.float16)
    elif bad == "k-capacity":
        args["k_cache"], args["v_cache"] = k[:, :CAP // 2], v[:, :CAP // 2]
    elif bad == "q-head-stride":
        args["q"] = np.repeat(q, 2, axis=3)[..., ::2]
    elif bad == "out-read-only":
        out.flags.writeable = False
    elif bad == "lse-read-only":
        lse.flags.writeable = False
    elif bad == "out-broadcast":
        args["out"] = np.broadcast_to(np.zeros((1, 1, HQ, D), np.float32), q.shape)
    elif bad == "out-unaligned":
        raw = np.zeros(q.size * 4 + 1, np.uint8)[1:].view(np.float32).reshape(q.shape)
        args["out"] = np.lib.stride_tricks.as_strided(
            raw, strides=tuple(s // 4 * 4 + 1 if i == 0 else s
                               for i, s in enumerate(raw.strides)))
    elif bad == "kv_len-int64":
        args["kv_len"] = kv_len.astype(np.int64)
    elif bad == "kv_len-short":
        args["kv_len"] = kv_len[:1]
    elif bad == "block_table":
        args["block_table"] = np.zeros((B, 4), np.int32)
    elif bad == "lse-shape":
        args["lse"] = np.empty((B, 1, HQ), np.float32)[:, :, :2]
    elif bad == "q-list":
        args["q"] = q.tolist()
    elif bad == "out-shape":
        args["out"] = np.empty((B, 1, HQ, D // 2), np.float32)
    want = error_of(lambda: plan_for().run(**args))
    assert want is not None
    warm = plan_for()
    good = dict(q=q, k_cache=k, v_cache=v, kv_len=kv_len, out=np.empty_like(q),
                lse=np.empty((B, HQ, 1), np.float32))
    for _ in range(2):
        warm.run(**good)
    assert error_of(lambda: warm.run(**args)) == want
    assert error_of(lambda: warm.run(**args)) == want  # the failure is not remembered
    warm.run(**good)


def test_read_only_and_strided_inputs_on_the_cached_path():
    q, k, v, kv_len = inputs(2)
    plan = plan_for()
    kt = np.ascontiguousarray(k.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # [B, H, T, D]
    ro = [np.frombuffer(x.tobytes(), np.float32).reshape(x.shape) for x in (q, k, v)]
    for _ in range(3):
        assert_matches(plan.run(q, kt, v, kv_len), q, k, v, kv_len)
        assert_matches(plan.run(*ro, kv_len), q, k, v, kv_len)
    # an input made read-only after its signature was cached
    k2, v2 = k.copy(), v.copy()
    plan.run(q, k2, v2, kv_len)
    k2.flags.writeable = False
    assert_matches(plan.run(q, k2, v2, kv_len), q, k, v, kv_len)


def test_kv_len_and_page_ids_are_checked_on_every_call():
    q, k, v, kv_len = inputs(3)
    plan = plan_for()
    plan.run(q, k, v, kv_len)
    with pytest.raises(ValueError, match=r"kv_len\[1\]: %d is outside" % (CAP + 1)):
        plan.run(q, k, v, np.array([5, CAP + 1], np.int32))

    case = Case("paged", 2, 1, 4, 2, 64, [20, 40], page_size=16, capacity=48)
    q, k, v, kv_len, block_table = make_case(case)
    paged = flashdecode.DecodePlan(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64,
                                   dtype="f32", page_size=16, max_pages_per_seq=3,
                                   device="cpu")
    for _ in range(2):
        out = paged.run(q, k, v, kv_len, block_table=block_table)
        assert_matches(out, q, k, v, kv_len, block_table)
    bad = block_table.copy()
    bad[1, 2] = k.shape[0]
    bad_table = error_of(lambda: flashdecode.DecodePlan(
        batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64, dtype="f32", page_size=16,
        max_pages_per_seq=3, device="cpu").run(q, k, v, kv_len, block_table=bad))
    # (the C library's check, as for kv_len: InvalidArgumentError, a ValueError)
    assert bad_table[0] is flashdecode.InvalidArgumentError and "block_table[1][2]" in bad_table[1]
    assert "page id %d is outside [0, num_pages = %d)" % (k.shape[0], k.shape[0]) in bad_table[1]
    assert error_of(lambda: paged.run(q, k, v, kv_len, block_table=bad)) == bad_table
    # the same table memory, changed in place after a good run
    table = block_table.copy()
    paged.run(q, k, v, kv_len, block_table=table)
    table[1, 2] = -1
    with pytest.raises(ValueError, match=r"block_table\[1\]\[2\]: page id -1"):
        paged.run(q, k, v, kv_len, block_table=table)


def test_the_cache_is_bounded():
    plan = plan_for()
    q, k, v, kv_len = inputs(4, cap=CAP + 40)
    for extra in range(40):
        plan.run(q, k[:, :CAP + extra], v[:, :CAP + extra], kv_len)
    assert 1 <= len(plan._checked) <= 16
    assert_matches(plan.run(q, k[:, :CAP], v[:, :CAP], kv_len), q, k[:, :CAP], v[:, :CAP],
                   kv_len)


@pytest.mark.parametrize("num_splits", [0, 16])
def test_threads_share_a_plan(num_splits):
    # ctypes releases the GIL in fd_run: runs of one plan overlap, each with its own arrays;
    # with splits they share the plan's workspace and must take turns
    cap = 2048
    plan = plan_for(kv_capacity=cap, num_splits=num_splits)
    if num_splits:
        assert plan.workspace_size > 0
    sets = [inputs(10 + i, cap=cap, lens=(cap - 300 * i, cap - 1 - 200 * i)) for i in range(4)]
    want = [plan.run(*x) for x in sets]
    for w, x in zip(want, sets):
        assert_matches(w, *x)
    errors = []

    def work(i):
        try:
            q, k, v, kv_len = sets[i]
            out = np.empty_like(q)
            for _ in range(50):
                out[...] = np.nan
                plan.run(q, k, v, kv_len, out=out)
                np.testing.assert_array_equal(out, want[i])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@needs_torch
def test_torch_cached_path():
    q, k, v, kv_len = (torch.from_numpy(x) for x in inputs(5))
    plan = plan_for()
    out = torch.empty_like(q)
    for _ in range(3):
        assert plan.run(q, k, v, kv_len, out=out) is out
        assert_matches(out.numpy(), q, k, v, kv_len)
        fresh = plan.run(q, k, v, kv_len)
        assert fresh is not out and fresh.is_contiguous() and fresh.dtype == torch.float32
        assert torch.equal(fresh, out)
    # a strided q: the allocated out is still contiguous, as q.new_empty gives
    qs = torch.cat([q, q], dim=2)[:, :, ::2]
    for _ in range(2):
        fresh = plan.run(qs, k, v, kv_len)
        assert fresh.is_contiguous() and torch.equal(fresh, plan.run(qs.contiguous(), k, v, kv_len))
    # metadata changed in place after the signature was cached: checked again
    o2 = torch.empty_like(q)
    plan.run(q, k, v, kv_len, out=o2)
    o3 = torch.empty_like(q)
    plan.run(q, k, v, kv_len, out=o3)
    o3.as_strided_(o3.shape, (0,) + o3.stride()[1:])
    want = error_of(lambda: plan_for().run(q, k, v, kv_len, out=o3))
    assert want is not None and error_of(lambda: plan.run(q, k, v, kv_len, out=o3)) == want
    with pytest.raises(TypeError, match="the plan was made for float32"):
        plan.run(q.half(), k.half(), v.half(), kv_len)
    with pytest.raises(TypeError, match=r"kv_len: dtype int64"):
        plan.run(q, k, v, kv_len.long())
    for _ in range(2):  # torch and numpy arrays mix on the CPU
        assert torch.equal(torch.from_numpy(plan.run(q, k.numpy(), v, kv_len.numpy(),
                                                     out=o2.numpy())), o2)
        np.testing.assert_array_equal(plan.run(q.numpy(), k, v.numpy(), kv_len), o2.numpy())
    sparse = q.to_sparse()
    want = error_of(lambda: plan_for().run(sparse, k, v, kv_len))
    assert want is not None and error_of(lambda: plan.run(sparse, k, v, kv_len)) == want
