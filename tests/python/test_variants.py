"""test_variants.py — the attention variants (sliding window, logit soft-cap, sinks,
non-causal rows, fp32 out) and merge_states on the CPU backend, numpy and torch-CPU
arrays, against the float64 numpy reference (attention_ref.py). Outputs are
poisoned with NaN before every call that takes an out=."""
import math

import numpy as np
import pytest

import flashdecode
from attention_ref import (assert_lse_close, assert_out_close, attention_f64,
                           merge_states_f64)
from cases import Case, make_case
from variant_cases import VARIANT_CASES, VARIANTS, make_sinks, resolve, split_points

try:
    import torch
except ImportError:  # the numpy path is tested without torch
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
NP_DTYPES = {"float32": np.float32, "float16": np.float16}


def numpy_inputs(case, dtype, seed=0):
    q, k, v, kv_len, block_table = make_case(case, seed)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype), kv_len, block_table


def check(out, lse, q, k, v, kv_len, block_table, dtype_name, **kw):
    ref_out, ref_lse = attention_f64(q, k, v, kv_len, block_table, **kw)
    assert_out_close(out, ref_out, dtype_name)
    if lse is not None:
        assert_lse_close(lse, ref_lse)


# ---- every variant, numpy ----------------------------------------------------------------------
@pytest.mark.parametrize("num_splits", [0, 3])
@pytest.mark.parametrize("dtype_name", sorted(NP_DTYPES))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("case", VARIANT_CASES, ids=repr)
def test_variant_numpy(case, variant, dtype_name, num_splits):
    dt = NP_DTYPES[dtype_name]
    q, k, v, kv_len, bt = numpy_inputs(case, dt)
    kw = resolve(VARIANTS[variant], case.num_heads_q)
    out = np.full(q.shape, np.nan, dt)
    res, lse = flashdecode.decode(q, k, v, kv_len, block_table=bt, num_splits=num_splits,
                                  out=out, return_lse=True, **kw)
    assert res is out and lse.dtype == np.float32
    check(out, lse, q, k, v, kv_len, bt, dtype_name, **kw)


# ---- every variant, torch bf16 on the CPU --------------------------------------------------------
def torch_inputs(case, dtype, seed=0):
    q, k, v, kv_len, block_table = make_case(case, seed)
    conv = [torch.from_numpy(x).to(dtype) for x in (q, k, v)]
    bt = None if block_table is None else torch.from_numpy(block_table)
    return conv + [torch.from_numpy(kv_len), bt]


def to_np(t):
    """A float tensor as float64 numpy; an integer one (block_table) as it is."""
    if t is None:
        return None
    return t.detach().numpy() if not t.dtype.is_floating_point else t.detach().double().numpy()


@needs_torch
@pytest.mark.parametrize("out_dtype", [None, "float32"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("case", VARIANT_CASES, ids=repr)
def test_variant_torch_bf16(case, variant, out_dtype):
    q, k, v, kv_len, bt = torch_inputs(case, torch.bfloat16)
    kw = resolve(VARIANTS[variant], case.num_heads_q)
    tkw = dict(kw)
    if "sinks" in kw:  # a bf16 parameter, as models hold it: converted by decode()
        tkw["sinks"] = torch.from_numpy(kw["sinks"]).to(torch.bfloat16)
        kw["sinks"] = to_np(tkw["sinks"])
    odt = None if out_dtype is None else getattr(torch, out_dtype)
    out, lse = flashdecode.decode(q, k, v, kv_len, block_table=bt, return_lse=True,
                                  out_dtype=odt, **tkw)
    assert out.dtype == (odt or torch.bfloat16) and lse.dtype == torch.float32
    check(to_np(out), lse.numpy(), to_np(q), to_np(k), to_np(v), kv_len.numpy(), to_np(bt),
          out_dtype or "bfloat16", **kw)


# ---- DecodePlan -------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_plan_with_variants_matches_decode(variant):
    case = VARIANT_CASES[3]  # paged, q_len 7
    q, k, v, kv_len, bt = numpy_inputs(case, np.float16)
    kw = resolve(VARIANTS[variant], case.num_heads_q)
    sinks = kw.pop("sinks", None)
    plan = flashdecode.DecodePlan(batch=case.batch, q_len=case.q_len,
                                  num_heads_q=case.num_heads_q, num_heads_kv=case.num_heads_kv,
                                  head_dim=case.head_dim, dtype=np.float16, page_size=16,
                                  max_pages_per_seq=bt.shape[1], num_pages=k.shape[0],
                                  device="cpu", num_splits=3, out_dtype=np.float32, **kw)
    assert plan.out_dtype == "float32" and plan.window_left == kw.get("window_left", -1)
    assert plan.logits_soft_cap == pytest.approx(kw.get("logits_soft_cap", 0.0))
    assert plan.non_causal == kw.get("non_causal", False)
    for name in ("window_left", "logits_soft_cap", "non_causal"):
        if name in kw:
            assert name in repr(plan)
    out = np.full(q.shape, np.nan, np.float32)
    lse = np.full((case.batch, case.num_heads_q, case.q_len), np.nan, np.float32)
    assert plan.run(q, k, v, kv_len, block_table=bt, out=out, lse=lse, sinks=sinks) is out
    want, want_lse = flashdecode.decode(q, k, v, kv_len, block_table=bt, num_splits=3,
                                        sinks=sinks, out_dtype=np.float32, return_lse=True,
                                        **kw)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(lse, want_lse)
    check(out, lse, q, k, v, kv_len, bt, "float32", sinks=sinks, **kw)
    allocated = plan.run(q, k, v, kv_len, block_table=bt, sinks=sinks)
    assert allocated.dtype == np.float32
    np.testing.assert_array_equal(allocated, out)


def test_plan_run_reads_each_calls_sinks():
    """The checked-call cache reads the sinks' address of every call."""
    case = Case("plan-sinks", 2, 2, 4, 2, 32, [40, 9])
    q, k, v, kv_len, _ = numpy_inputs(case, np.float32)
    plan = flashdecode.DecodePlan(batch=2, q_len=2, num_heads_q=4, num_heads_kv=2, head_dim=32,
                                  dtype="f32", kv_capacity=case.capacity, device="cpu")
    for seed in range(3):
        sinks = make_sinks(4, seed)
        out = plan.run(q, k, v, kv_len, sinks=sinks)
        check(out, None, q, k, v, kv_len, None, "float32", sinks=sinks)
    out = plan.run(q, k, v, kv_len)  # and none again
    check(out, None, q, k, v, kv_len, None, "float32")


def test_decode_plan_cache_is_keyed_on_the_variant():
    """decode() caches plans per shape: the variant settings are part of the key."""
    case = Case("cache-key", 2, 3, 4, 2, 32, [100, 64])
    q, k, v, kv_len, _ = numpy_inputs(case, np.float32)
    settings = [{}, dict(window_left=5), dict(window_left=6), dict(logits_soft_cap=2.0),
                dict(logits_soft_cap=3.0), dict(non_causal=True), dict(out_dtype="f32"), {}]
    results = []
    for kw in settings:
        out = flashdecode.decode(q, k, v, kv_len, **kw)
        ref_kw = {n: x for n, x in kw.items() if n != "out_dtype"}
        check(out, None, q, k, v, kv_len, None, "float32", **ref_kw)
        results.append(out)
    for i in range(1, len(settings) - 2):
        assert not np.array_equal(results[0], results[i]), settings[i]
    np.testing.assert_array_equal(results[0], results[-1])


# ---- fp32 out ---------------------------------------------------------------------------------
def test_fp32_out_numpy_f16():
    case = Case("f32-out", 3, 4, 8, 2, 64, [300, 4, 77], page_size=16)
    q, k, v, kv_len, bt = numpy_inputs(case, np.float16)
    out = np.full(q.shape, np.nan, np.float32)
    res, lse = flashdecode.decode(q, k, v, kv_len, block_table=bt, out=out, return_lse=True,
                                  logits_soft_cap=4.0)
    assert res is out
    check(out, lse, q, k, v, kv_len, bt, "float32", logits_soft_cap=4.0)
    alloc = flashdecode.decode(q, k, v, kv_len, block_table=bt, out_dtype=np.float32,
                               logits_soft_cap=4.0)
    assert alloc.dtype == np.float32
    np.testing.assert_array_equal(alloc, out)
    # the same call with an f16 out is the f32 one rounded
    out16 = flashdecode.decode(q, k, v, kv_len, block_table=bt, logits_soft_cap=4.0)
    assert out16.dtype == np.float16
    np.testing.assert_allclose(out16.astype(np.float32), out, rtol=2**-10, atol=1e-6)


@needs_torch
def test_fp32_out_torch_bf16_out_tensor():
    case = Case("f32-out-torch", 2, 2, 8, 4, 64, [130, 3])
    q, k, v, kv_len, _ = torch_inputs(case, torch.bfloat16)
    sinks = torch.from_numpy(make_sinks(8))
    out = torch.full(q.shape, float("nan"), dtype=torch.float32)
    assert flashdecode.decode(q, k, v, kv_len, out=out, sinks=sinks, window_left=20) is out
    check(out.numpy(), None, to_np(q), to_np(k), to_np(v), kv_len.numpy(), None, "float32",
          sinks=sinks.numpy(), window_left=20)


def test_out_dtype_errors():
    q, k, v, kv_len = small()
    with pytest.raises(TypeError, match=r"out_dtype: dtype float16, expected float32"):
        flashdecode.decode(q, k, v, kv_len, out_dtype=np.float16)
    with pytest.raises(TypeError, match=r"out: dtype float32, but out_dtype is float16"):
        flashdecode.decode(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16),
                           kv_len, out=np.empty(q.shape, np.float32), out_dtype="f16")
    with pytest.raises(TypeError, match=r"out_dtype: 'int8' is not supported"):
        flashdecode.decode(q, k, v, kv_len, out_dtype="int8")
    plan = flashdecode.DecodePlan(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64,
                                  dtype="f16", kv_capacity=32, device="cpu", out_dtype="f32")
    out16 = np.full(q.shape, np.nan, np.float16)
    with pytest.raises(TypeError, match=r"out: dtype float16, the plan was made for out_dtype "
                                        r"float32"):
        plan.run(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), kv_len,
                 out=out16)
    assert np.isnan(out16).all()


@needs_torch
def test_out_dtype_errors_torch():
    q, k, v, kv_len = (torch.from_numpy(x) for x in small())
    qh, kh, vh = q.half(), k.half(), v.half()
    with pytest.raises(TypeError, match=r"out: dtype bfloat16, expected float16 \(the dtype of "
                                        r"q\) or float32"):
        flashdecode.decode(qh, kh, vh, kv_len, out=torch.empty(q.shape, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"out_dtype: dtype bfloat16, expected float16"):
        flashdecode.decode(qh, kh, vh, kv_len, out_dtype=torch.bfloat16)


# ---- sinks, empty rows, NaN -------------------------------------------------------------------
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_kv_len_zero_with_sinks(paged):
    """A row that sees no key: out 0 exactly and lse = the sink exactly."""
    case = Case("empty-sinks", 3, 2, 6, 3, 32, [0, 1, 40], page_size=8 if paged else 0)
    q, k, v, kv_len, bt = numpy_inputs(case, np.float32)
    sinks = make_sinks(6)
    out = np.full(q.shape, np.nan, np.float32)
    _, lse = flashdecode.decode(q, k, v, kv_len, block_table=bt, sinks=sinks, out=out,
                                return_lse=True)
    assert np.all(out[0] == 0) and np.all(lse[0] == sinks[:, None])
    assert np.all(out[1, 0] == 0) and np.all(lse[1, :, 0] == sinks)  # row 0 sees no key
    check(out, lse, q, k, v, kv_len, bt, "float32", sinks=sinks)
    # with a window too: every row of the last sequence sees keys
    out2, lse2 = flashdecode.decode(q, k, v, kv_len, block_table=bt, sinks=sinks,
                                    window_left=3, return_lse=True)
    assert np.all(lse2[0] == sinks[:, None])
    check(out2, lse2, q, k, v, kv_len, bt, "float32", sinks=sinks, window_left=3)


def test_sinks_without_keys_all_batch_torch_and_lists():
    case = Case("empty-all", 2, 1, 4, 2, 16, [0, 0])
    q, k, v, kv_len, _ = numpy_inputs(case, np.float16)
    out, lse = flashdecode.decode(q, k, v, kv_len, sinks=[0.5, -1, 2, 3], return_lse=True)
    assert np.all(out == 0)
    np.testing.assert_array_equal(lse[:, :, 0], np.array([[0.5, -1, 2, 3]] * 2, np.float32))


@pytest.mark.parametrize("variant", ["sinks", "window-softcap-sinks", "softcap-sinks-noncausal"])
def test_nan_sink_gives_nan_rows(variant):
    case = Case("nan-sink", 3, 3, 4, 2, 32, [50, 0, 2], page_size=8)
    q, k, v, kv_len, bt = numpy_inputs(case, np.float32)
    kw = resolve(VARIANTS[variant], 4)
    kw["sinks"][1] = np.nan
    out = np.full(q.shape, 7.0, np.float32)
    _, lse = flashdecode.decode(q, k, v, kv_len, block_table=bt, out=out, return_lse=True, **kw)
    assert np.isnan(out[:, :, 1]).all() and np.isnan(lse[:, 1]).all()
    assert not np.isnan(out[:, :, [0, 2, 3]]).any() and not np.isnan(lse[:, [0, 2, 3]]).any()
    check(out, lse, q, k, v, kv_len, bt, "float32", **kw)


# ---- non-causal, long q_len -------------------------------------------------------------------
@pytest.mark.parametrize("q_len", [64, 128])
@pytest.mark.parametrize("dtype_name", sorted(NP_DTYPES))
def test_non_causal_long_q_len(q_len, dtype_name):
    case = Case("non-causal", 2, q_len, 8, 2, 64, [100, 30], page_size=16)
    q, k, v, kv_len, bt = numpy_inputs(case, NP_DTYPES[dtype_name])
    out = np.full(q.shape, np.nan, q.dtype)
    _, lse = flashdecode.decode(q, k, v, kv_len, block_table=bt, non_causal=True, out=out,
                                return_lse=True, num_splits=2)
    check(out, lse, q, k, v, kv_len, bt, dtype_name, non_causal=True)
    # every row of a sequence sees the same keys: rows differ only through q
    same_q = np.repeat(q[:, :1], q_len, axis=1)
    out_same = flashdecode.decode(same_q, k, v, kv_len, block_table=bt, non_causal=True)
    assert (out_same == out_same[:, :1]).all()


@needs_torch
def test_non_causal_q_len_64_torch_bf16():
    case = Case("non-causal-torch", 2, 64, 4, 1, 32, [70, 5])
    q, k, v, kv_len, _ = torch_inputs(case, torch.bfloat16)
    out, lse = flashdecode.decode(q, k, v, kv_len, non_causal=True, return_lse=True,
                                  logits_soft_cap=2.5)
    check(to_np(out), lse.numpy(), to_np(q), to_np(k), to_np(v), kv_len.numpy(), None,
          "bfloat16", non_causal=True, logits_soft_cap=2.5)


# ---- errors: named, nothing written -----------------------------------------------------------
def small(q_len=1, hq=4, hkv=2, d=64, cap=32, batch=2, dtype=np.float32):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((batch, q_len, hq, d)).astype(dtype)
    k = rng.standard_normal((batch, cap, hkv, d)).astype(dtype)
    v = rng.standard_normal((batch, cap, hkv, d)).astype(dtype)
    return q, k, v, np.full(batch, min(cap, 10), np.int32)


@pytest.mark.parametrize("shape, call, exc, pattern", [
    ({}, dict(window_left=-2), ValueError, r"window_left: -2, must be >= 0, or -1"),
    ({}, dict(window_left=2**31), ValueError, r"window_left: 2147483648 does not fit int32"),
    ({}, dict(window_left=1.5), TypeError, r"window_left: expected an int"),
    ({}, dict(window_left=4, non_causal=True), ValueError,
     r"window_left: 4 with non_causal"),
    ({}, dict(logits_soft_cap=-1.0), ValueError, r"logits_soft_cap: -1, must be 0 \(off\)"),
    ({}, dict(logits_soft_cap=math.inf), ValueError, r"logits_soft_cap: inf"),
    ({}, dict(logits_soft_cap=math.nan), ValueError, r"logits_soft_cap: nan"),
    ({}, dict(logits_soft_cap=1e50), ValueError, r"logits_soft_cap: 1e\+50 overflows float32"),
    ({}, dict(logits_soft_cap=1e-50), ValueError, r"logits_soft_cap: 1e-50 rounds to 0"),
    ({}, dict(logits_soft_cap="2"), TypeError, r"logits_soft_cap: expected a float"),
    ({}, dict(non_causal=2), TypeError, r"non_causal: expected a bool"),
    ({}, dict(sinks=np.zeros(5, np.float32)), ValueError,
     r"sinks: shape \(5,\), expected \(4,\) \(num_heads_q of q\)"),
    ({}, dict(sinks=np.zeros((1, 4), np.float32)), ValueError, r"sinks: shape \(1, 4\)"),
    ({}, dict(sinks=np.zeros(4, np.complex64)), TypeError, r"sinks: dtype complex64"),
    ({}, dict(sinks=["a"] * 4), TypeError, r"sinks: dtype <U1"),
    (dict(q_len=17), {}, ValueError, r"q_len: 17, must be 1\.\.16 \(0 = 1; up to 128 with "
                                     r"non_causal\)"),
    (dict(q_len=129), dict(non_causal=True), ValueError,
     r"q_len: 129, must be 1\.\.128 with non_causal"),
], ids=["window-2", "window-wide", "window-float", "window+noncausal", "cap-neg", "cap-inf",
        "cap-nan", "cap-overflow", "cap-tiny", "cap-str", "noncausal-2", "sinks-len",
        "sinks-rank", "sinks-complex", "sinks-str", "q_len17", "q_len129-noncausal"])
def test_variant_errors_name_the_argument(shape, call, exc, pattern):
    q, k, v, kv_len = small(**shape)
    out = np.full(q.shape, np.nan, np.float32)
    with pytest.raises(exc, match=pattern):
        flashdecode.decode(q, k, v, kv_len, out=out, **call)
    assert np.isnan(out).all()  # nothing written
    plan_kw = {n: x for n, x in call.items() if n != "sinks"}
    if plan_kw:  # the same settings refused by DecodePlan
        with pytest.raises(exc, match=pattern):
            flashdecode.DecodePlan(batch=2, q_len=q.shape[1], num_heads_q=4, num_heads_kv=2,
                                   head_dim=64, dtype="f32", kv_capacity=32, device="cpu",
                                   **plan_kw)


def test_plan_run_sinks_errors():
    q, k, v, kv_len = small()
    plan = flashdecode.DecodePlan(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64,
                                  dtype="f32", kv_capacity=32, device="cpu")
    out = np.full(q.shape, np.nan, np.float32)
    for sinks, exc, pattern in [
            (np.zeros(4, np.float64), TypeError, r"sinks: dtype float64, expected float32"),
            (np.zeros(3, np.float32), ValueError, r"sinks: shape \(3,\), expected \(4,\)"),
            (np.zeros(8, np.float32)[::2], ValueError, r"sinks: must be contiguous"),
            ([0.0] * 4, TypeError, r"sinks: expected a torch.Tensor or a numpy.ndarray")]:
        for _ in range(2):  # also once the plan has a checked signature cached
            with pytest.raises(exc, match=pattern):
                plan.run(q, k, v, kv_len, out=out, sinks=sinks)
            assert np.isnan(out).all()
            plan.run(q, k, v, kv_len, sinks=np.zeros(4, np.float32))


@needs_torch
def test_torch_sinks_errors():
    q, k, v, kv_len = (torch.from_numpy(x) for x in small())
    with pytest.raises(TypeError, match=r"sinks: dtype int32, expected float32"):
        flashdecode.decode(q, k, v, kv_len, sinks=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"sinks: on device meta, but q is on cpu"):
        flashdecode.decode(q, k, v, kv_len, sinks=torch.zeros(4, device="meta"))
    with pytest.raises(ValueError, match=r"sinks: shape \(2, 2\)"):
        flashdecode.decode(q, k, v, kv_len, sinks=torch.zeros(2, 2))
    # a strided float64 tensor is converted by decode(), not by DecodePlan.run()
    s = torch.arange(8, dtype=torch.float64)[::2]
    ref = flashdecode.decode(q, k, v, kv_len, sinks=s.float().contiguous())
    assert torch.equal(flashdecode.decode(q, k, v, kv_len, sinks=s), ref)
    plan = flashdecode.DecodePlan(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64,
                                  dtype=torch.float32, kv_capacity=32, device="cpu")
    with pytest.raises(TypeError, match=r"sinks: dtype float64, expected float32"):
        plan.run(q, k, v, kv_len, sinks=s)


# ---- torch.compile and the custom ops ---------------------------------------------------------
@needs_torch
def test_torch_compile_variants_without_graph_break():
    case = Case("compile-variants", 2, 3, 8, 2, 64, [40, 90], page_size=16, capacity=96)
    q, k, v, kv_len, bt = torch_inputs(case, torch.bfloat16)
    sinks = torch.from_numpy(make_sinks(8)).to(torch.bfloat16)

    def step(q, k, v, kv_len, bt, sinks, out):
        o, lse = flashdecode.decode(q * 1.0, k, v, kv_len, block_table=bt, return_lse=True,
                                    window_left=17, logits_soft_cap=5.0, sinks=sinks,
                                    out_dtype=torch.float32)
        flashdecode.decode(q, k, v, kv_len, block_table=bt, out=out, non_causal=True,
                           sinks=sinks)
        return o + 0.0, lse

    want = step(q, k, v, kv_len, bt, sinks, torch.empty(q.shape, dtype=torch.float32))
    out = torch.full(q.shape, float("nan"), dtype=torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(q, k, v, kv_len, bt, sinks, out)
    assert got[0].dtype == torch.float32
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
    eager_out = flashdecode.decode(q, k, v, kv_len, block_table=bt, non_causal=True,
                                   sinks=sinks, out_dtype=torch.float32)
    torch.testing.assert_close(out, eager_out, rtol=0, atol=0)


@needs_torch
def test_torch_opcheck_variant_ops():
    flashdecode._api.load_torch_ops()  # (registered on first use when torch came later)
    case = Case("opcheck-variants", 2, 2, 4, 2, 64, [30, 64], capacity=64)
    q, k, v, kv_len, _ = torch_inputs(case, torch.float16)
    sinks = torch.from_numpy(make_sinks(4))
    torch.library.opcheck(torch.ops.flashdecode.decode.default,
                          (q, k, v, kv_len, None, 0.0, 0, True, sinks, 5, 2.0, False,
                           torch.float32))
    out, lse = torch.empty(q.shape, dtype=torch.float32), torch.empty(2, 4, 2)
    torch.library.opcheck(torch.ops.flashdecode.decode_out.default,
                          (q, k, v, kv_len, None, out, lse, 0.0, 0, sinks, -1, 0.0, True))
    states_out = torch.randn(3, 2, 2, 4, 64).half()
    states_lse = torch.randn(3, 2, 4, 2)
    torch.library.opcheck(torch.ops.flashdecode.merge_states.default,
                          (states_out, states_lse, torch.float32))
    torch.library.opcheck(torch.ops.flashdecode.merge_states_out.default,
                          (states_out, states_lse, torch.empty(2, 2, 4, 64).half(),
                           torch.empty(2, 4, 2)))


# ---- merge_states -----------------------------------------------------------------------------
def decode_parts(q, k, v, kv_len, bt, cuts, kw, out_dtype=None):
    """decode() over the parts [0, c1), [c1, c2), ..., [c_last, kv_len) of every
    sequence's keys, through views of the cache (contiguous: k[:, a:b]; paged: the
    block_table's columns) and kv_len offsets; the parts before the last run
    non-causal (every row sees them), the last causally; sinks go to the last call
    only. Returns the states as lists of out [B, q_len, H, D] and lse [B, H, q_len]."""
    bounds = [0] + list(cuts) + [None]
    outs, lses = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        last = b is None
        part_kw = dict(kw)
        if not last:
            part_kw.pop("sinks", None)
            part_kw["non_causal"] = True
        if bt is None:
            kp, vp, btp = k[:, a:b], v[:, a:b], None
        else:
            ps = k.shape[1]
            assert a % ps == 0 and (last or b % ps == 0)
            kp, vp, btp = k, v, bt[:, a // ps: None if last else b // ps]
        lens = kv_len - a if last else np.full_like(kv_len, b - a)
        o, l = flashdecode.decode(q, kp, vp, lens, block_table=btp, return_lse=True,
                                  out_dtype=out_dtype, **part_kw)
        outs.append(o)
        lses.append(l)
    return outs, lses


def cuts_for(case, parts, paged):
    cuts = split_points(case.kv_lens, case.q_len, parts)
    if paged:
        cuts = sorted({c // case.page_size * case.page_size for c in cuts} - {0})
    return cuts


MERGE_VARIANTS = ["plain", "softcap", "sinks", "softcap-sinks-noncausal", "noncausal"]


@pytest.mark.parametrize("states_f32", [False, True], ids=["states-dtype", "states-f32"])
@pytest.mark.parametrize("variant", MERGE_VARIANTS)
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dtype_name", sorted(NP_DTYPES))
def test_merge_states_equals_one_decode(dtype_name, paged, parts, variant, states_f32):
    case = Case("merge", 3, 3, 8, 2, 64, [200, 131, 97], page_size=16 if paged else 0)
    dt = NP_DTYPES[dtype_name]
    q, k, v, kv_len, bt = numpy_inputs(case, dt)
    kw = resolve(VARIANTS.get(variant, {}), case.num_heads_q)
    cuts = cuts_for(case, parts, paged)
    assert len(cuts) == parts - 1
    outs, lses = decode_parts(q, k, v, kv_len, bt, cuts, kw,
                              np.float32 if states_f32 else None)
    states_out, states_lse = np.stack(outs), np.stack(lses)
    out = np.full(q.shape, np.nan, dt)
    lse = np.full((3, 8, 3), np.nan, np.float32)
    res = flashdecode.merge_states(states_out, states_lse, out=out, lse=lse)
    assert res[0] is out and res[1] is lse
    check(out, lse, q, k, v, kv_len, bt, dtype_name, **kw)
    # and against the float64 merge of the same states
    ref_out, ref_lse = merge_states_f64(states_out, states_lse)
    assert_out_close(out, ref_out, dtype_name)
    assert_lse_close(lse, ref_lse, atol=1e-5)
    # lists are stacked; an allocated out has the states' dtype (or out_dtype)
    out2, lse2 = flashdecode.merge_states(outs, lses)
    assert out2.dtype == states_out.dtype
    np.testing.assert_array_equal(out2.astype(dt), out)
    np.testing.assert_array_equal(lse2, lse)
    out3, _ = flashdecode.merge_states(outs, lses, out_dtype=np.float32)
    assert out3.dtype == np.float32


def test_merge_states_all_empty_and_nan():
    """Empty states are neutral, their out is not read; all empty: out 0, lse -inf; a NaN
    lse: a NaN row."""
    rng = np.random.default_rng(5)
    states_out = rng.standard_normal((3, 2, 2, 4, 16)).astype(np.float32)
    states_lse = rng.standard_normal((3, 2, 4, 2)).astype(np.float32)
    states_lse[:, 0] = -np.inf          # sequence 0: no state saw a key
    states_out[:, 0] = np.nan           # (so their out must not be read)
    states_lse[1, 1, 2, 1] = -np.inf    # one empty state in a row with others
    states_out[1, 1, 1, 2] = np.nan
    states_lse[2, 1, 3, 0] = np.nan     # a NaN state: a NaN row
    out = np.full((2, 2, 4, 16), 7.0, np.float32)
    lse = np.full((2, 4, 2), 7.0, np.float32)
    flashdecode.merge_states(states_out, states_lse, out=out, lse=lse)
    assert np.all(out[0] == 0) and np.all(np.isneginf(lse[0]))
    assert np.isnan(out[1, 0, 3]).all() and np.isnan(lse[1, 3, 0])
    ref_out, ref_lse = merge_states_f64(states_out, states_lse)
    assert_out_close(out, ref_out, "float32")
    assert_lse_close(lse, ref_lse, atol=1e-6)


def test_merge_states_single_state_and_strided_inputs():
    rng = np.random.default_rng(6)
    big = rng.standard_normal((2, 2, 3, 4, 32)).astype(np.float16)
    lse = rng.standard_normal((2, 2, 4, 3)).astype(np.float32)
    out, merged = flashdecode.merge_states(big[:1], lse[:1])  # one state: itself
    np.testing.assert_array_equal(out, big[0])
    np.testing.assert_array_equal(merged, lse[0])
    # non-contiguous inputs are copied
    strided_out = np.repeat(big, 2, axis=4)[..., ::2]
    assert not strided_out.flags.c_contiguous
    a = flashdecode.merge_states(strided_out, lse)
    b = flashdecode.merge_states(np.ascontiguousarray(strided_out), lse)
    np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("mutate, exc, pattern", [
    (lambda a: a.update(so=a["so"][0]), ValueError, r"states_out: expected 5 dimensions"),
    (lambda a: a.update(sl=a["sl"][:, :, :, :1]), ValueError,
     r"states_lse: shape \(2, 2, 4, 1\), expected \(2, 2, 4, 3\)"),
    (lambda a: a.update(sl=a["sl"].astype(np.float16)), TypeError,
     r"states_lse: dtype float16, expected float32"),
    (lambda a: a.update(so=a["so"].astype(np.float64)), TypeError, r"states_out: dtype float64"),
    (lambda a: a.update(out=np.empty((2, 3, 4, 16), np.float32)), ValueError,
     r"out: shape \(2, 3, 4, 16\), expected \(2, 3, 4, 32\)"),
    (lambda a: a.update(out=np.empty((2, 3, 4, 32), np.int32)), TypeError, r"out: dtype int32"),
    (lambda a: a.update(out=np.empty((2, 3, 4, 64), np.float32)[..., ::2]), ValueError,
     r"out: must be contiguous"),
    (lambda a: a.update(lse=np.empty((2, 3, 4), np.float32)), ValueError, r"lse: shape"),
    (lambda a: a.update(lse=np.empty((2, 4, 3), np.float64)), TypeError, r"lse: dtype float64"),
    (lambda a: a.update(so=a["so"][:0], sl=a["sl"][:0]), ValueError,
     r"num_states: 0, must be 1\.\."),
    (lambda a: a.update(so=[], sl=[]), ValueError, r"states_out: an empty list"),
    (lambda a: a.update(so=object()), TypeError, r"states_out: expected a torch.Tensor"),
    (lambda a: a.update(so=a["so"].tolist()), TypeError, r"states_out: dtype float64"),
    (lambda a: a.update(out_dtype="int8"), TypeError, r"out_dtype: 'int8' is not supported"),
], ids=["rank", "lse-shape", "lse-dtype", "out-dtype-f64", "out-shape", "out-int", "out-strided",
        "lse-out-shape", "lse-out-dtype", "no-states", "empty-list", "object", "nested-list",
        "out_dtype"])
def test_merge_states_errors_name_the_argument(mutate, exc, pattern):
    rng = np.random.default_rng(1)
    args = dict(so=rng.standard_normal((2, 2, 3, 4, 32)).astype(np.float32),
                sl=rng.standard_normal((2, 2, 4, 3)).astype(np.float32), out=None, lse=None,
                out_dtype=None)
    mutate(args)
    with pytest.raises(exc, match=pattern):
        flashdecode.merge_states(args["so"], args["sl"], out=args["out"], lse=args["lse"],
                                 out_dtype=args["out_dtype"])


@needs_torch
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_merge_states_torch_bf16_and_compile(paged):
    case = Case("merge-torch", 2, 2, 8, 2, 64, [150, 77], page_size=16 if paged else 0)
    q, k, v, kv_len, bt = torch_inputs(case, torch.bfloat16)
    sinks = torch.from_numpy(make_sinks(8))
    kw = dict(sinks=sinks, logits_soft_cap=4.0)
    cuts = cuts_for(case, 3, paged)

    def cascade(q, k, v, kv_len, bt, sinks):
        outs, lses = [], []
        bounds = [0] + cuts + [None]
        for a, b in zip(bounds[:-1], bounds[1:]):
            last = b is None
            if bt is None:
                kp, vp, btp = k[:, a:b], v[:, a:b], None
            else:
                kp, vp, btp = k, v, bt[:, a // 16: None if last else b // 16]
            lens = kv_len - a if last else torch.full_like(kv_len, b - a)
            o, l = flashdecode.decode(q, kp, vp, lens, block_table=btp, return_lse=True,
                                      out_dtype=torch.float32, logits_soft_cap=4.0,
                                      sinks=sinks if last else None, non_causal=not last)
            outs.append(o)
            lses.append(l)
        return flashdecode.merge_states(outs, lses, out_dtype=torch.bfloat16)

    out, lse = cascade(q, k, v, kv_len, bt, sinks)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    check(to_np(out), lse.numpy(), to_np(q), to_np(k), to_np(v), kv_len.numpy(), to_np(bt),
          "bfloat16", sinks=sinks.numpy(), logits_soft_cap=4.0)
    torch._dynamo.reset()
    compiled = torch.compile(cascade, fullgraph=True, backend="aot_eager")
    got_out, got_lse = compiled(q, k, v, kv_len, bt, sinks)
    torch.testing.assert_close(got_out, out, rtol=0, atol=0)
    torch.testing.assert_close(got_lse, lse, rtol=0, atol=0)
    # into given tensors
    o = torch.full(q.shape, float("nan"), dtype=torch.float32)
    l = torch.full((2, 8, 2), float("nan"))
    states = [flashdecode.decode(q, k, v, kv_len, block_table=bt, return_lse=True, **kw)]
    r = flashdecode.merge_states([s[0] for s in states], [s[1] for s in states], out=o, lse=l)
    assert r[0] is o and r[1] is l
    torch.testing.assert_close(o, states[0][0].float(), rtol=0, atol=0)
    torch.testing.assert_close(l, states[0][1], rtol=0, atol=0)
