"""test_cpu.py — flashdecode on the CPU backend, numpy and torch-CPU arrays,
against the float64 numpy oracle (attention_ref.py)."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import flashdecode
from attention_ref import assert_lse_close, attention_f64, output_tolerance
from cases import CPU_CASES, Case, make_case

try:
    import torch
except ImportError:  # the numpy path is tested without torch
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
NP_DTYPES = {"float32": np.float32, "float16": np.float16}


def check_against_reference(out, lse, q, k, v, kv_len, block_table, dtype_name, scale=None):
    ref_out, ref_lse = attention_f64(q, k, v, kv_len, block_table, scale)
    np.testing.assert_allclose(np.asarray(out, dtype=np.float64), ref_out, rtol=0,
                               atol=output_tolerance(dtype_name, ref_out))
    if lse is not None:
        assert_lse_close(lse, ref_lse)


# ---- numpy ---------------------------------------------------------------------------------
@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("dtype_name", sorted(NP_DTYPES))
@pytest.mark.parametrize("case", CPU_CASES, ids=repr)
def test_numpy_matches_reference(case, dtype_name, num_splits):
    q, k, v, kv_len, block_table = make_case(case)
    dt = NP_DTYPES[dtype_name]
    q, k, v = q.astype(dt), k.astype(dt), v.astype(dt)
    out, lse = flashdecode.decode(q, k, v, kv_len, block_table=block_table,
                                  num_splits=num_splits, return_lse=True)
    assert out.dtype == dt and out.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (case.batch, case.num_heads_q, case.q_len)
    check_against_reference(out, lse, q, k, v, kv_len, block_table, dtype_name)


def test_numpy_softmax_scale_and_list_kv_len():
    case = Case("scale", 2, 1, 4, 2, 64, [33, 100])
    q, k, v, kv_len, _ = make_case(case, seed=1)
    out = flashdecode.decode(q, k, v, [33, 100], softmax_scale=0.3)
    check_against_reference(out, None, q, k, v, kv_len, None, "float32", scale=0.3)
    out64 = flashdecode.decode(q, k, v, kv_len.astype(np.int64), softmax_scale=0.3)
    np.testing.assert_array_equal(out, out64)


def test_numpy_subnormal_softmax_scale_is_used():
    # 1e-40 is a float32 subnormal, not 0: the C API uses it (scores ~0: a plain mean of V).
    case = Case("subnormal", 1, 1, 2, 1, 64, [37])
    q, k, v, kv_len, _ = make_case(case, seed=3)
    out = flashdecode.decode(q, k, v, kv_len, softmax_scale=1e-40)
    check_against_reference(out, None, q, k, v, kv_len, None, "float32", scale=1e-40)


def test_numpy_empty_rows_are_zero_and_minus_inf():
    case = Case("empty", 2, 2, 4, 2, 64, [0, 1], capacity=64)
    q, k, v, kv_len, _ = make_case(case)
    out, lse = flashdecode.decode(q, k, v, kv_len, return_lse=True)
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[0]))
    assert np.all(out[1, 0] == 0) and np.all(np.isneginf(lse[1, :, 0]))  # row 0 sees no key
    assert np.all(np.isfinite(lse[1, :, 1]))
    check_against_reference(out, lse, q, k, v, kv_len, None, "float32")


def test_numpy_strided_tensors():
    """Cache as a [B, Hkv, cap, D] buffer, q with a head stride, out/lse views."""
    case = Case("strided", 2, 2, 8, 2, 64, [70, 131])
    q, k, v, kv_len, _ = make_case(case)
    k_bhsd = np.ascontiguousarray(k.transpose(0, 2, 1, 3))
    v_bhsd = np.ascontiguousarray(v.transpose(0, 2, 1, 3))
    q_wide = np.zeros((2, 2, 16, 64), np.float32)
    q_wide[:, :, ::2] = q
    out_buf = np.full((2, 2, 8, 128), 7.0, np.float32)
    out = out_buf[:, :, :, 32:96]
    args = (q_wide[:, :, ::2], k_bhsd.transpose(0, 2, 1, 3), v_bhsd.transpose(0, 2, 1, 3))
    result = flashdecode.decode(*args, kv_len, out=out, return_lse=True)
    assert result[0] is out
    check_against_reference(out, result[1], q, k, v, kv_len, None, "float32")
    assert np.all(out_buf[..., :32] == 7.0) and np.all(out_buf[..., 96:] == 7.0)
    # lse as a transposed view ([B, q_len, Hq] buffer), through DecodePlan.run
    lse_buf = np.empty((2, 2, 8), np.float32)
    plan = flashdecode.DecodePlan(batch=2, q_len=2, num_heads_q=8, num_heads_kv=2, head_dim=64,
                                  dtype="f32", kv_capacity=case.capacity, device="cpu")
    out2 = plan.run(*args, kv_len, lse=lse_buf.transpose(0, 2, 1))
    check_against_reference(out2, lse_buf.transpose(0, 2, 1), q, k, v, kv_len, None, "float32")


def test_numpy_same_inputs_bitwise_identical():
    case = Case("det", 2, 1, 8, 2, 64, [500, 1000], capacity=1024)
    q, k, v, kv_len, _ = make_case(case)
    a = flashdecode.decode(q, k, v, kv_len, num_splits=5)
    b = flashdecode.decode(q, k, v, kv_len, num_splits=5)
    assert np.array_equal(a, b)


# ---- errors ---------------------------------------------------------------------------------
def small(q_len=1, hq=4, hkv=2, d=64, cap=32, batch=2, dtype=np.float32):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((batch, q_len, hq, d)).astype(dtype)
    k = rng.standard_normal((batch, cap, hkv, d)).astype(dtype)
    v = rng.standard_normal((batch, cap, hkv, d)).astype(dtype)
    return q, k, v, np.full(batch, min(cap, 10), np.int32)


@pytest.mark.parametrize("kwargs, call, pattern", [
    (dict(q_len=17), {}, r"q_len: 17, must be 1\.\.16"),
    (dict(hq=6, hkv=4), {}, r"num_heads_q: 6 is not a multiple of num_heads_kv \(4\)"),
    (dict(d=300), {}, r"head_dim: 300, must be 1\.\.256"),
    ({}, dict(softmax_scale=float("inf")), r"softmax_scale: not finite"),
    ({}, dict(num_splits=-1), r"num_splits: -1, must be >= 0"),
], ids=["q_len", "heads", "head_dim", "scale", "num_splits"])
def test_c_errors_carry_the_library_message(kwargs, call, pattern):
    q, k, v, kv_len = small(**kwargs)
    with pytest.raises(ValueError, match=pattern) as info:
        flashdecode.decode(q, k, v, kv_len, **call)
    assert isinstance(info.value, flashdecode.InvalidArgumentError)
    assert info.value.status_name == "FD_STATUS_INVALID_ARGUMENT"


def test_c_error_kv_len_out_of_range():
    q, k, v, _ = small(cap=32)
    with pytest.raises(flashdecode.InvalidArgumentError,
                       match=r"kv_len\[1\]: 33 is outside \[0, kv_capacity = 32\]"):
        flashdecode.decode(q, k, v, np.array([5, 33], np.int32))
    with pytest.raises(ValueError, match=r"kv_len\[0\]: -1 is outside"):
        flashdecode.decode(q, k, v, np.array([-1, 3], np.int32))


def test_paged_cache_without_pages_or_page_columns():
    case = Case("paged", 2, 1, 4, 2, 64, [20, 40], page_size=16, capacity=48)
    q, k, v, kv_len, block_table = make_case(case)
    with pytest.raises(ValueError, match=r"block_table: shape \(2, 0\) has no page columns"):
        flashdecode.decode(q, k, v, kv_len, block_table=block_table[:, :0])
    with pytest.raises(ValueError, match=r"k_cache: page_size \(dimension 1\) is 0"):
        flashdecode.decode(q, k[:, :0], v[:, :0], np.zeros(2, np.int32), block_table=block_table)


def test_c_error_page_id_out_of_range():
    case = Case("paged", 2, 1, 4, 2, 64, [20, 40], page_size=16, capacity=48)
    q, k, v, kv_len, block_table = make_case(case)
    block_table[1, 1] = k.shape[0]  # one past the last page
    with pytest.raises(ValueError, match=r"block_table\[1\]\[1\]: page id %d is outside"
                       % k.shape[0]):
        flashdecode.decode(q, k, v, kv_len, block_table=block_table)


@pytest.mark.parametrize("mutate, exc, pattern", [
    (lambda a: a.update(q=a["q"].astype(np.float64)), TypeError, r"q: dtype float64"),
    (lambda a: a.update(k=a["k"].astype(np.float16)), TypeError, r"k_cache: dtype float16"),
    (lambda a: a.update(q=a["q"].tolist()), TypeError, r"q: expected a torch.Tensor"),
    (lambda a: a.update(kv_len=a["kv_len"].astype(np.float32)), TypeError, r"kv_len: dtype"),
    (lambda a: a.update(kv_len=a["kv_len"][:1]), ValueError, r"kv_len: shape \(1,\)"),
    (lambda a: a.update(v=a["v"][:, :16]), ValueError, r"v_cache: shape .* differs"),
    (lambda a: a.update(q=a["q"][..., ::2]), ValueError, r"q: the head_dim dimension must be "
                                                         r"unit-stride"),
    (lambda a: a.update(q=a["q"][0]), ValueError, r"q: expected 4 dimensions"),
    (lambda a: a.update(k=a["k"][:1], v=a["v"][:1]), ValueError, r"k_cache: batch dimension"),
    (lambda a: a.update(q=a["q"][:, :0]), ValueError, r"q: q_len \(dimension 1\) is 0"),
    (lambda a: a.update(out=np.empty((2, 1, 4, 32), np.float32)), ValueError, r"out: shape"),
    (lambda a: a.update(out=np.broadcast_to(np.zeros((1, 1, 4, 64), np.float32), (2, 1, 4, 64))),
     ValueError, r"out: "),
    (lambda a: a.update(scale=0.0), ValueError, r"softmax_scale: 0 is not supported"),
    (lambda a: a.update(scale=1e-46), ValueError, r"softmax_scale: 1e-46 rounds to 0"),
    # zero-size arrays: the zero dimension is named, not a stride numpy reports for them
    (lambda a: a.update(q=a["q"][:, :, :0]), ValueError, r"num_heads_q: 0, must be >= 1"),
    (lambda a: a.update(k=a["k"][:, :, :0], v=a["v"][:, :, :0]), ValueError,
     r"num_heads_kv: 0, must be >= 1"),
    (lambda a: a.update(q=a["q"][..., :0], k=a["k"][..., :0], v=a["v"][..., :0]), ValueError,
     r"head_dim: 0, must be"),
    (lambda a: a.update(kv_len=[]), ValueError, r"kv_len: shape \(0,\), expected \(2,\)"),
], ids=["q-f64", "k-dtype", "q-list", "kv_len-float", "kv_len-len", "v-shape", "q-stride",
        "q-rank", "k-batch", "q_len-0", "out-shape", "out-broadcast", "scale-0", "scale-tiny",
        "heads-0", "heads_kv-0", "head_dim-0", "kv_len-empty-list"])
def test_python_checks(mutate, exc, pattern):
    q, k, v, kv_len = small()
    args = dict(q=q, k=k, v=v, kv_len=kv_len, out=None, scale=None)
    mutate(args)
    with pytest.raises(exc, match=pattern):
        flashdecode.decode(args["q"], args["k"], args["v"], args["kv_len"], out=args["out"],
                           softmax_scale=args["scale"])


@pytest.mark.skipif(flashdecode.backend_available("cuda"), reason="a CUDA GPU is present")
def test_cuda_plan_unsupported_without_gpu():
    with pytest.raises(ValueError, match=r"backend: ") as info:
        flashdecode.DecodePlan(batch=1, num_heads_q=8, num_heads_kv=8, head_dim=128,
                               dtype="bf16", kv_capacity=1024, device="cuda")
    assert isinstance(info.value, flashdecode.UnsupportedError)


@pytest.mark.skipif(flashdecode.backend_available("cuda"), reason="a CUDA GPU is present")
def test_plan_default_device_without_cuda_says_pass_cpu():
    """device=None (the default) without a usable CUDA device: UnsupportedError that says
    no CUDA device is usable, the C library's reason, and to pass device="cpu"; an explicit
    'cuda' gets the same hint after the library's message."""
    kw = dict(batch=1, num_heads_q=8, num_heads_kv=8, head_dim=128, dtype="bf16",
              kv_capacity=1024)
    with pytest.raises(flashdecode.UnsupportedError) as info:
        flashdecode.DecodePlan(**kw)
    msg = str(info.value)
    assert msg.startswith("device: no CUDA device is usable (backend: "), msg
    assert 'pass device="cpu" for the CPU backend' in msg, msg
    assert info.value.status_name == "FD_STATUS_UNSUPPORTED"
    with pytest.raises(flashdecode.UnsupportedError,
                       match=r"^backend: .*no CUDA device is usable: pass device=\"cpu\""):
        flashdecode.DecodePlan(device="cuda:0", **kw)
    assert flashdecode.DecodePlan(device="cpu", **kw).device == "cpu"


@pytest.mark.skipif(not flashdecode.backend_available("cuda"), reason="no usable CUDA device")
def test_plan_default_device_is_cuda():
    plan = flashdecode.DecodePlan(batch=1, num_heads_q=8, num_heads_kv=8, head_dim=128,
                                  dtype="bf16", kv_capacity=1024)
    assert plan.backend == "cuda" and plan.device.startswith("cuda:")


# ---- DecodePlan on the CPU ---------------------------------------------------------------------
def test_plan_cpu_runs_many_lengths():
    case = Case("plan", 3, 1, 8, 2, 64, [300, 1, 511], capacity=512)
    q, k, v, kv_len, _ = make_case(case)
    plan = flashdecode.DecodePlan(batch=3, num_heads_q=8, num_heads_kv=2, head_dim=64,
                                  dtype=np.float32, kv_capacity=512, device="cpu", num_splits=4)
    assert plan.backend == "cpu" and plan.num_splits == 4 and plan.workspace_size > 0
    assert plan.workspace is not None and plan.softmax_scale == pytest.approx(1 / 8)
    out = np.empty_like(q)
    lse = np.empty((3, 8, 1), np.float32)
    for lens in ([300, 1, 511], [0, 512, 64], [65, 63, 129]):
        kv = np.array(lens, np.int32)
        assert plan.run(q, k, v, kv, out=out, lse=lse) is out
        check_against_reference(out, lse, q, k, v, kv, None, "float32")
        np.testing.assert_array_equal(out, flashdecode.decode(q, k, v, kv, num_splits=4))


def test_plan_run_takes_kv_len_as_python_ints():
    """run() takes kv_len as decode() does: a list, a tuple, an int (every sequence's); and
    block_table as nested lists; numpy and torch inputs alike."""
    case = Case("plan-lists", 2, 1, 4, 2, 64, [100, 37], page_size=16, capacity=128)
    q, k, v, kv_len, block_table = make_case(case)
    plan = flashdecode.DecodePlan(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64,
                                  dtype="f32", page_size=16, max_pages_per_seq=8, device="cpu")
    want = flashdecode.decode(q, k, v, kv_len, block_table=block_table)
    check_against_reference(want, None, q, k, v, kv_len, block_table, "float32")
    arrays = [(q, k, v)]
    if torch is not None:
        arrays.append(tuple(torch.from_numpy(x) for x in (q, k, v)))
    for qq, kk, vv in arrays:
        for lens in ([100, 37], (100, 37)):
            for table in (block_table, block_table.tolist()):
                got = plan.run(qq, kk, vv, lens, block_table=table)
                np.testing.assert_array_equal(np.asarray(got), want)
        got = plan.run(qq, kk, vv, 37, block_table=block_table)
        np.testing.assert_array_equal(
            np.asarray(got), flashdecode.decode(q, k, v, [37, 37], block_table=block_table))
    with pytest.raises(ValueError, match=r"kv_len: shape \(3,\), expected \(2,\)"):
        plan.run(q, k, v, [1, 2, 3], block_table=block_table)
    with pytest.raises(TypeError, match=r"kv_len: dtype float64, expected int32"):
        plan.run(q, k, v, [1.0, 2.0], block_table=block_table)


LAYOUT = r"k_cache: shape \(%s\) looks like \[%s, num_heads_kv, %s, head_dim\]%s: pass " \
         r"k\.transpose\(1, 2\) and v\.transpose\(1, 2\)"


def test_head_major_cache_is_named():
    """A cache in transformers' layout [batch, num_heads_kv, capacity, head_dim] (paged:
    [num_pages, num_heads_kv, page_size, head_dim]) is named as such: by decode where
    dimension 2 cannot be the kv heads, by a plan, append_kv (which know num_heads_kv)
    also where the capacity divides num_heads_q (which decode reads as another valid
    problem); the transposed view runs."""
    rng = np.random.default_rng(11)
    hq, hkv, d = 8, 2, 16
    q = rng.standard_normal((2, 1, hq, d), dtype=np.float32)
    contiguous = (r"batch", r"capacity", r" \(transformers' layout\)")
    for cap in (64, 4):
        k = rng.standard_normal((2, hkv, cap, d), dtype=np.float32)
        v = rng.standard_normal((2, hkv, cap, d), dtype=np.float32)
        kv_len = np.array([1, cap], np.int32)
        pattern = LAYOUT % (("2, 2, %d, 16" % cap,) + contiguous)
        if cap == 64:   # (cap 4 divides num_heads_q: decode cannot tell)
            with pytest.raises(ValueError, match=pattern):
                flashdecode.decode(q, k, v, kv_len)
            if torch is not None:
                with pytest.raises(ValueError, match=pattern):
                    flashdecode.decode(torch.from_numpy(q), torch.from_numpy(k),
                                       torch.from_numpy(v), kv_len)
        plan = flashdecode.DecodePlan(batch=2, num_heads_q=hq, num_heads_kv=hkv, head_dim=d,
                                      dtype="f32", kv_capacity=cap, device="cpu")
        with pytest.raises(ValueError, match=pattern):
            plan.run(q, k, v, kv_len)
        new = rng.standard_normal((2, 1, hkv, d), dtype=np.float32)
        with pytest.raises(ValueError, match=pattern):
            flashdecode.append_kv(new, new, k, v, [0, 0])
        kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
        got = plan.run(q, kt, vt, kv_len)
        check_against_reference(got, None, q, kt, vt, kv_len, None, "float32")
        np.testing.assert_array_equal(got, flashdecode.decode(q, kt, vt, kv_len))
    # paged: [num_pages, num_heads_kv, page_size, head_dim]
    k = rng.standard_normal((6, hkv, 16, d), dtype=np.float32)
    table = np.arange(6, dtype=np.int32).reshape(2, 3)
    pattern = LAYOUT % ("6, 2, 16, 16", "num_pages", "page_size", "")
    plan = flashdecode.DecodePlan(batch=2, num_heads_q=hq, num_heads_kv=hkv, head_dim=d,
                                  dtype="f32", page_size=16, max_pages_per_seq=3, device="cpu")
    for run in (lambda: plan.run(q, k, k, [5, 40], block_table=table),
                lambda: flashdecode.decode(q, k, k, [5, 40], block_table=table)):
        with pytest.raises(ValueError, match=pattern):
            run()


def test_plan_cpu_paged_hint_threads_and_shared_workspace():
    case = Case("plan-paged", 2, 2, 4, 4, 64, [100, 37], page_size=16, capacity=128)
    q, k, v, kv_len, block_table = make_case(case)
    q, k, v = q.astype(np.float16), k.astype(np.float16), v.astype(np.float16)
    kwargs = dict(batch=2, q_len=2, num_heads_q=4, num_heads_kv=4, head_dim=64, dtype="f16",
                  page_size=16, max_pages_per_seq=8, device="cpu", num_threads=1)
    plan = flashdecode.DecodePlan(kv_len_hint=[100, 37], num_splits=2, **kwargs)
    assert plan.kv_capacity == 128
    shared = flashdecode.DecodePlan(workspace=np.empty(plan.workspace_size + 64, np.uint8),
                                    num_splits=2, **kwargs)
    for p in (plan, shared):
        out = p.run(q, k, v, kv_len, block_table=block_table)
        check_against_reference(out, None, q, k, v, kv_len, block_table, "float16")
    block_table[0, 0] = -1
    with pytest.raises(ValueError, match=r"block_table\[0\]\[0\]: page id -1"):
        plan.run(q, k, v, kv_len, block_table=block_table)


def test_plan_rejects_tensors_that_do_not_match():
    q, k, v, kv_len = small(cap=32)
    plan = flashdecode.DecodePlan(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64,
                                  dtype="f32", kv_capacity=32, device="cpu")
    with pytest.raises(TypeError, match="the plan was made for float32"):
        plan.run(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), kv_len)
    with pytest.raises(ValueError, match="the plan was made for"):
        plan.run(q[:1], k[:1], v[:1], kv_len[:1])
    with pytest.raises(ValueError, match="below the plan's kv_capacity"):
        plan.run(q, k[:, :16], v[:, :16], kv_len)
    with pytest.raises(ValueError, match="block_table: given"):
        plan.run(q, k, v, kv_len, block_table=np.zeros((2, 2), np.int32))
    with pytest.raises(ValueError, match="kv_capacity: required"):
        flashdecode.DecodePlan(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64,
                               dtype="f32", device="cpu")
    with pytest.raises(TypeError, match="dtype"):
        flashdecode.DecodePlan(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64,
                               dtype="int8", kv_capacity=32, device="cpu")
    with pytest.raises(ValueError, match="workspace: .* bytes"):
        flashdecode.DecodePlan(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64,
                               dtype="f32", kv_capacity=4096, device="cpu", num_splits=8,
                               workspace=np.empty(16, np.uint8))


# ---- the binding itself -----------------------------------------------------------------------
@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="LP64 layout")
def test_struct_sizes_match_the_header_on_lp64():
    from flashdecode import _lib

    assert ctypes.sizeof(_lib.FdProblem) == 120
    assert _lib.FdProblem.has_window.offset == 72 and _lib.FdProblem.out_dtype.offset == 88
    assert _lib.FdProblem.deterministic.offset == 92
    assert _lib.FdProblem.kv_dtype.offset == 96 and _lib.FdProblem.kv_scale.offset == 100
    assert _lib.FdProblem.no_pdl.offset == 104
    assert _lib.FdProblem.rope_dim.offset == 108 and _lib.FdProblem.rope_dtype.offset == 112
    assert _lib.FdProblem.tree_mask.offset == 116
    assert ctypes.sizeof(_lib.FdPlan) == 200 and _lib.FdPlan.cpu_isa.offset == 192
    assert ctypes.sizeof(_lib.FdTensors) == 312 and _lib.FdTensors.sinks.offset == 184
    assert _lib.FdTensors.tree_mask.offset == 296 and _lib.FdTensors.tree_mask_stride.offset == 304
    assert _lib.FdTensors.k_scale.offset == 192 and _lib.FdTensors.scale_strides.offset == 208
    assert _lib.FdTensors.q_pe.offset == 232 and _lib.FdTensors.k_pe_cache.offset == 264
    assert ctypes.sizeof(_lib.FdAppendTensors) == 256
    assert _lib.FdAppendTensors.k_pe_new.offset == 192
    assert _lib.FdAppendTensors.k_pe_cache.offset == 224
    assert ctypes.sizeof(_lib.FdError) == 260
    assert ctypes.sizeof(_lib.FdMergeProblem) == 36
    assert _lib.FdPlan.workspace_size.offset == 152 and _lib.FdPlan.ws_counters.offset == 184
    size = _lib.lib.fd_struct_size
    for name, cls in (("fd_problem", _lib.FdProblem), ("fd_plan", _lib.FdPlan),
                      ("fd_tensors", _lib.FdTensors), ("fd_error", _lib.FdError),
                      ("fd_merge_problem", _lib.FdMergeProblem),
                      ("fd_append_tensors", _lib.FdAppendTensors)):
        assert size(name.encode()) == ctypes.sizeof(cls), name


def test_version_and_backends():
    assert flashdecode.version() == flashdecode.__version__
    assert flashdecode.backend_available("cpu") and flashdecode.backend_available("reference")
    assert flashdecode.num_splits_heuristic(1, 1, 132, 2) == 1
    assert 1 <= flashdecode.num_splits_heuristic(8, 1000, 132, 2) <= 128


def test_import_without_torch_and_missing_library(tmp_path):
    """The numpy path needs no torch; a missing library is a clear ImportError."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, flashdecode\n"
            "q = np.ones((1, 1, 2, 8), np.float32); k = np.ones((1, 4, 2, 8), np.float32)\n"
            "out = flashdecode.decode(q, k, k, [4])\n"
            "assert np.allclose(out, 1.0), out\n"
            "assert sys.modules['torch'] is None\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    env["FLASHDECODE_LIBRARY"] = str(tmp_path / "libflashdecode.so")
    res = subprocess.run([sys.executable, "-c", "import flashdecode"], env=env,
                         capture_output=True, text=True)
    assert res.returncode != 0 and "ImportError" in res.stderr
    assert "FLASHDECODE_LIBRARY" in res.stderr


# ---- torch on the CPU ---------------------------------------------------------------------------
def torch_inputs(case, dtype, seed=0):
    q, k, v, kv_len, block_table = make_case(case, seed)
    conv = [torch.from_numpy(x).to(dtype) for x in (q, k, v)]
    bt = None if block_table is None else torch.from_numpy(block_table)
    return conv + [torch.from_numpy(kv_len), bt]


def to_np(t):
    return t.detach().to(torch.float64).numpy()


@needs_torch
@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", CPU_CASES, ids=repr)
def test_torch_cpu_matches_reference(case, dtype_name):
    q, k, v, kv_len, block_table = torch_inputs(case, getattr(torch, dtype_name))
    out, lse = flashdecode.decode(q, k, v, kv_len, block_table=block_table, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == torch.float32
    check_against_reference(to_np(out), lse.numpy(), to_np(q), to_np(k), to_np(v),
                            kv_len.numpy(), None if block_table is None else block_table.numpy(),
                            dtype_name)


@needs_torch
def test_torch_cpu_plan_and_out():
    case = Case("torch-plan", 2, 1, 8, 2, 128, [1000, 17], capacity=1024)
    q, k, v, kv_len, _ = torch_inputs(case, torch.bfloat16)
    plan = flashdecode.DecodePlan(batch=2, num_heads_q=8, num_heads_kv=2, head_dim=128,
                                  dtype=torch.bfloat16, kv_capacity=1024,
                                  device=torch.device("cpu"), num_splits=6)
    assert isinstance(plan.workspace, torch.Tensor) and plan.workspace.dtype == torch.uint8
    out = torch.empty_like(q)
    lse = torch.empty(2, 8, 1)
    assert plan.run(q, k, v, kv_len, out=out, lse=lse) is out
    check_against_reference(to_np(out), lse.numpy(), to_np(q), to_np(k), to_np(v),
                            kv_len.numpy(), None, "bfloat16")
    out2 = torch.empty_like(q)
    r = flashdecode.decode(q, k, v, kv_len.to(torch.int64), num_splits=6, out=out2)
    assert r is out2 and torch.equal(out, out2)


@needs_torch
def test_torch_cpu_errors():
    case = Case("torch-err", 2, 1, 4, 2, 64, [10, 20], capacity=32)
    q, k, v, kv_len, _ = torch_inputs(case, torch.float16)
    with pytest.raises(ValueError, match=r"kv_len: shape \(0,\), expected \(2,\)"):
        flashdecode.decode(q, k, v, [])  # an empty list is int32, not numpy's float64
    with pytest.raises(TypeError, match=r"kv_len: expected int32 values, got list"):
        flashdecode.decode(q, k, v, [[1], [1, 2]])
    with pytest.raises(TypeError, match=r"k_cache: dtype bfloat16"):
        flashdecode.decode(q, k.bfloat16(), v.bfloat16(), kv_len)
    with pytest.raises(ValueError, match=r"kv_len\[0\]: 40 is outside"):
        flashdecode.decode(q, k, v, torch.tensor([40, 1], dtype=torch.int32))
    with pytest.raises(TypeError, match=r"k_cache: expected a torch.Tensor"):
        flashdecode.decode(q, k.numpy(), v, kv_len)


@needs_torch
def test_torch_compile_traces_without_graph_break():
    case = Case("compile", 2, 2, 8, 2, 64, [40, 90], page_size=16, capacity=96)
    q, k, v, kv_len, block_table = torch_inputs(case, torch.float32)
    want, want_lse = flashdecode.decode(q, k, v, kv_len, block_table=block_table,
                                        return_lse=True)

    def step(q, k, v, kv_len, block_table, out):
        o, lse = flashdecode.decode(q * 1.0, k, v, kv_len, block_table=block_table,
                                    return_lse=True)
        flashdecode.decode(q, k, v, kv_len, block_table=block_table, out=out)
        return o + 0.0, lse

    out = torch.empty_like(q)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got, got_lse = compiled(q, k, v, kv_len, block_table, out)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_lse, want_lse, rtol=0, atol=0)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


@needs_torch
@pytest.mark.parametrize("imports", ["torch, flashdecode", "flashdecode, torch"])
def test_torch_compile_as_the_first_call(imports):
    """A fresh process whose first flashdecode call is a compiled one (float16 and bfloat16
    never seen eagerly; torch imported before flashdecode, so that the custom ops register
    at import, or after): tracing must not fill a cache or set a global that its guards
    read (the fake implementation runs for real under the trace), else the guards fail
    on the frame that made them."""
    code = ("import %s\n" % imports +
            "for dtype in (torch.float16, torch.bfloat16):\n"
            "    q = torch.randn(2, 1, 4, 16).to(dtype); k = torch.randn(2, 32, 2, 16).to(dtype)\n"
            "    kv_len = torch.tensor([5, 32], dtype=torch.int32)\n"
            "    step = torch.compile(lambda q, k, n: flashdecode.decode(q, k, k, n),\n"
            "                         fullgraph=True, backend='eager')\n"
            "    for _ in range(2):\n"
            "        got = step(q, k, kv_len)\n"
            "        assert torch.equal(got, flashdecode.decode(q, k, k, kv_len))\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]


@needs_torch
def test_torch_opcheck():
    case = Case("opcheck", 2, 2, 4, 2, 64, [30, 64], capacity=64)
    q, k, v, kv_len, _ = torch_inputs(case, torch.float32)
    torch.library.opcheck(torch.ops.flashdecode.decode.default,
                          (q, k, v, kv_len, None, 0.0, 0, True))
    out, lse = torch.empty_like(q), torch.empty(2, 4, 2)
    torch.library.opcheck(torch.ops.flashdecode.decode_out.default,
                          (q, k, v, kv_len, None, out, lse, 0.0, 0))


class _Foreign:
    """An array known only through DLPack (stands in for another framework's arrays)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_foreign_cpu_arrays():
    case = Case("dlpack", 2, 1, 4, 2, 64, [30, 7])
    q, k, v, kv_len, _ = make_case(case)
    out, lse = flashdecode.decode(*(_Foreign(x) for x in (q, k, v, kv_len)), return_lse=True)
    check_against_reference(out, lse, q, k, v, kv_len, None, "float32")
    plan = flashdecode.DecodePlan(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64,
                                  dtype="f32", kv_capacity=case.capacity, device="cpu")
    out2 = np.empty_like(q)
    assert plan.run(*(_Foreign(x) for x in (q, k, v, kv_len)), out=out2) is out2
    np.testing.assert_array_equal(out2, out)


@needs_torch
def test_dlpack_foreign_bfloat16_goes_through_torch():
    case = Case("dlpack-bf16", 2, 1, 4, 2, 64, [30, 7])
    q, k, v, kv_len, _ = torch_inputs(case, torch.bfloat16)
    out = flashdecode.decode(*(_Foreign(x) for x in (q, k, v, kv_len)))
    assert torch.equal(out, flashdecode.decode(q, k, v, kv_len))


@needs_torch
@pytest.mark.parametrize("make", [
    lambda: torch.tensor([2**32 + 5]),           # int64 tensor: would wrap to 5
    lambda: torch.tensor([-2**32 + 7]),          # would wrap to 7
    lambda: np.array([2**32 + 5]),               # numpy int64 with a torch q
    lambda: [2**32 + 5],
    lambda: 2**32 + 5,
])
def test_torch_index_values_outside_int32_are_refused(make):
    q = torch.randn(1, 1, 4, 16)
    k = torch.randn(1, 64, 2, 16)
    with pytest.raises(ValueError, match="kv_len.*int32 range"):
        flashdecode.decode(q, k, k, make())
    # a page id that would wrap onto a real page
    kp = torch.randn(8, 16, 2, 16)
    with pytest.raises(ValueError, match="block_table.*int32 range"):
        flashdecode.decode(q, kp, kp, [20], block_table=torch.tensor([[2**32 + 3, 1]]))
    # in range, int64 gives the int32 result
    want = flashdecode.decode(q, k, k, torch.tensor([5], dtype=torch.int32))
    assert torch.equal(flashdecode.decode(q, k, k, torch.tensor([5])), want)


def test_unaligned_numpy_array_is_refused():
    buf = np.zeros(2 * 1 * 4 * 8 * 4 + 1, np.uint8)
    q = np.ndarray((2, 1, 4, 8), np.float32, buffer=buf, offset=1)
    assert not q.flags.aligned
    k = np.random.default_rng(1).standard_normal((2, 16, 2, 8), dtype=np.float32)
    kv_len = np.array([10, 5], np.int32)
    with pytest.raises(ValueError, match="q: the array's address"):
        flashdecode.decode(q, k, k, kv_len)
    plan = flashdecode.DecodePlan(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=8,
                                  dtype=np.float32, kv_capacity=16, device="cpu")
    plan.run(q.copy(), k, k, kv_len)  # an aligned call first (cached checks)
    with pytest.raises(ValueError, match="q: the array's address"):
        plan.run(q, k, k, kv_len)


def test_argument_slips_name_the_argument():
    q = np.random.default_rng(3).standard_normal((1, 1, 4, 16), dtype=np.float32)
    k = np.random.default_rng(4).standard_normal((1, 64, 2, 16), dtype=np.float32)
    with pytest.raises(ValueError, match="softmax_scale: 1e\\+50 overflows float32"):
        flashdecode.decode(q, k, k, [5], softmax_scale=1e50)
    with pytest.raises(TypeError, match="batch: expected an int, got bool"):
        flashdecode.DecodePlan(batch=True, num_heads_q=4, num_heads_kv=2, head_dim=16,
                               dtype=np.float32, kv_capacity=64, device="cpu")
    if torch is not None:
        qt, kt = torch.randn(0, 1, 4, 16), torch.randn(0, 64, 2, 16)
        with pytest.raises(ValueError, match="batch: 0, must be >= 1"):
            flashdecode.decode(qt, kt, kt, torch.zeros(0, dtype=torch.int32))
