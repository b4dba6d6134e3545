"""test_deterministic.py — deterministic=True (fd_problem.deterministic, batch-invariant
results) from Python on the CPU backend: one sequence decoded alone and inside batches of
other sequences of other lengths, with other kv_capacity values, kv_len_hint and thread
counts, gives bitwise-identical out and lse through flashdecode.decode (numpy and torch),
DecodePlan, the torch custom ops and torch.compile; without it the same comparisons
differ (the control that shows the tests can fail). Argument errors name the argument;
the module constants match the header and the library."""
import math
import os
import re

import numpy as np
import pytest

import flashdecode
from flashdecode import _lib
from attention_ref import assert_lse_close, assert_out_close, attention_f64

try:
    import torch
except ImportError:  # the numpy path is tested without torch
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

HQ, HKV, D = 4, 2, 64
TARGET_LEN = 5000          # the sequence under test: 3 splits of 2048 keys
OTHER_LENS = [20000, 7, 0, 12345]
INDEX = 2                  # its place in the batch


def rng_inputs(seed, q_len, lens, capacity, target=None, index=INDEX, dtype=np.float32):
    """q, k, v, kv_len of a batch with sequences of ``lens``; with ``target`` (a (q, k, v)
    of one sequence) it is written at ``index`` (its keys at positions 0..len-1)."""
    rng = np.random.default_rng(seed)
    batch = len(lens)
    q = rng.standard_normal((batch, q_len, HQ, D), dtype=np.float32)
    k = rng.standard_normal((batch, capacity, HKV, D), dtype=np.float32)
    v = rng.standard_normal((batch, capacity, HKV, D), dtype=np.float32)
    if target is not None:
        tq, tk, tv = target
        q[index] = tq[0]
        k[index, :tk.shape[1]] = tk[0]
        v[index, :tv.shape[1]] = tv[0]
    return (q.astype(dtype), k.astype(dtype), v.astype(dtype),
            np.array(lens, dtype=np.int32))


def alone_and_batched(q_len=1, dtype=np.float32, batch_capacity=24000, alone_capacity=None):
    """The target alone (batch 1, capacity alone_capacity or its length) and inside a batch
    of five (the others 20000, 7, 0 and 12345 keys long; capacity batch_capacity)."""
    alone_capacity = alone_capacity or TARGET_LEN
    alone = rng_inputs(1, q_len, [TARGET_LEN], alone_capacity, dtype=dtype)
    lens = OTHER_LENS[:INDEX] + [TARGET_LEN] + OTHER_LENS[INDEX:]
    batched = rng_inputs(2, q_len, lens, batch_capacity, target=alone[:3], dtype=dtype)
    return alone, batched


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def assert_flag_matters(*args, **kw):
    """deterministic=True changes the bits of a call (fp32 out, so that 16-bit rounding
    hides nothing): the flag reached the library. The alone-vs-batched comparisons need
    this: on a machine whose default splits happen to agree alone and batched, they
    would pass without the flag."""
    f32 = np.float32 if isinstance(args[0], np.ndarray) else torch.float32
    plain = flashdecode.decode(*args, out_dtype=f32, **kw)
    det = flashdecode.decode(*args, out_dtype=f32, deterministic=True, **kw)
    if isinstance(plain, np.ndarray):
        assert not same_bits(plain, det), "deterministic=True changed nothing"
    else:
        assert not torch.equal(plain, det), "deterministic=True changed nothing"


def assert_same_bits(a, b, what):
    assert same_bits(a, b), "%s: not bitwise identical (max |diff| %g)" % (
        what, float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))))


# ---- flashdecode.decode, numpy --------------------------------------------------------------
@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_decode_numpy_alone_equals_batched(q_len, dtype):
    alone, batched = alone_and_batched(q_len, dtype)
    out1, lse1 = flashdecode.decode(*alone, return_lse=True, deterministic=True)
    outb, lseb = flashdecode.decode(*batched, return_lse=True, deterministic=True)
    assert_same_bits(outb[INDEX], out1[0], "out")
    assert_same_bits(lseb[INDEX], lse1[0], "lse")
    assert_flag_matters(*batched)
    # a larger cache around the same sequence (kv_capacity 9000, the same kv_len)
    big = rng_inputs(3, q_len, [TARGET_LEN], 9000, target=alone[:3], index=0, dtype=dtype)
    outc, lsec = flashdecode.decode(*big, return_lse=True, deterministic=True)
    assert_same_bits(outc, out1, "out, capacity 9000")
    assert_same_bits(lsec, lse1, "lse, capacity 9000")
    # and it is still the attention (the float64 reference)
    q, k, v, kv_len = (x.astype(np.float32) for x in alone)
    ref_out, ref_lse = attention_f64(q, k, v, kv_len, None)
    assert_out_close(out1, ref_out, np.dtype(dtype).name)
    assert_lse_close(lse1, ref_lse)


def test_decode_numpy_without_deterministic_differs():
    """The control: the default mode sizes its splits from the batch (kv_len_hint, the
    longest sequence), so the batched sequence gets other split boundaries and other
    bits. (If this ever passes with identical bits, the tests above prove nothing.)"""
    alone, batched = alone_and_batched()
    plan1 = flashdecode.DecodePlan(batch=1, num_heads_q=HQ, num_heads_kv=HKV, head_dim=D,
                                   dtype="f32", kv_capacity=TARGET_LEN, device="cpu",
                                   num_threads=2)
    planb = flashdecode.DecodePlan(batch=5, num_heads_q=HQ, num_heads_kv=HKV, head_dim=D,
                                   dtype="f32", kv_capacity=24000, device="cpu",
                                   num_threads=16)
    assert plan1.num_splits != planb.num_splits
    lse1 = np.empty((1, HQ, 1), np.float32)
    lseb = np.empty((5, HQ, 1), np.float32)
    out1 = plan1.run(*alone, lse=lse1)
    outb = planb.run(*batched, lse=lseb)
    assert not (same_bits(outb[INDEX], out1[0]) and same_bits(lseb[INDEX], lse1[0]))


def test_decode_numpy_paged_alone_equals_batched():
    """Paged caches: the sequence's pages shuffled into a larger pool, a wider block
    table, other sequences around it."""
    ps = 16
    alone, batched = alone_and_batched(q_len=2)

    def paged(q, k, v, kv_len, capacity, seed):
        rng = np.random.default_rng(seed)
        batch = q.shape[0]
        per_seq = capacity // ps
        num_pages = batch * per_seq + 5
        table = rng.permutation(num_pages)[:batch * per_seq].reshape(batch, per_seq)
        kp = rng.standard_normal((num_pages, ps, HKV, D), dtype=np.float32)
        vp = rng.standard_normal((num_pages, ps, HKV, D), dtype=np.float32)
        for b in range(batch):
            n = (int(kv_len[b]) + ps - 1) // ps
            for j in range(n):
                rows = k[b, j * ps:(j + 1) * ps]   # (the last page of a sequence: fewer)
                kp[table[b, j], :len(rows)] = rows
                vp[table[b, j], :len(rows)] = v[b, j * ps:(j + 1) * ps]
        return q, kp, vp, kv_len, table.astype(np.int32)

    q, k, v, kv_len, bt = paged(*alone, capacity=5008, seed=4)
    out1, lse1 = flashdecode.decode(q, k, v, kv_len, block_table=bt, return_lse=True,
                                    deterministic=True)
    q, k, v, kv_len, bt = paged(*batched, capacity=24000, seed=5)
    outb, lseb = flashdecode.decode(q, k, v, kv_len, block_table=bt, return_lse=True,
                                    deterministic=True)
    assert_same_bits(outb[INDEX], out1[0], "out")
    assert_same_bits(lseb[INDEX], lse1[0], "lse")
    assert_flag_matters(q, k, v, kv_len, block_table=bt)


def test_decode_numpy_window_alone_equals_batched():
    alone, batched = alone_and_batched(q_len=2)
    kw = dict(window_left=3000, logits_soft_cap=20.0, return_lse=True, deterministic=True)
    out1, lse1 = flashdecode.decode(*alone, **kw)
    outb, lseb = flashdecode.decode(*batched, **kw)
    assert_same_bits(outb[INDEX], out1[0], "out")
    assert_same_bits(lseb[INDEX], lse1[0], "lse")
    assert_flag_matters(*batched, window_left=3000, logits_soft_cap=20.0)


# ---- DecodePlan -----------------------------------------------------------------------------
def test_plan_alone_equals_batched_whatever_capacity_hint_and_threads():
    alone, batched = alone_and_batched()
    plan1 = flashdecode.DecodePlan(batch=1, num_heads_q=HQ, num_heads_kv=HKV, head_dim=D,
                                   dtype="f32", kv_capacity=TARGET_LEN, device="cpu",
                                   num_threads=1, deterministic=True)
    planb = flashdecode.DecodePlan(batch=5, num_heads_q=HQ, num_heads_kv=HKV, head_dim=D,
                                   dtype="f32", kv_capacity=24000, device="cpu",
                                   num_threads=16, kv_len_hint=[100] * 5, deterministic=True)
    assert plan1.deterministic and planb.deterministic
    assert plan1.num_splits == math.ceil(TARGET_LEN / flashdecode.DETERMINISTIC_SPLIT_LEN)
    assert planb.num_splits == math.ceil(24000 / flashdecode.DETERMINISTIC_SPLIT_LEN)
    assert "deterministic=True" in repr(plan1)
    lse1 = np.full((1, HQ, 1), np.nan, np.float32)
    lseb = np.full((5, HQ, 1), np.nan, np.float32)
    out1 = plan1.run(*alone, lse=lse1)
    for _ in range(2):  # also through the plan's cached call signature
        outb = planb.run(*batched, lse=lseb)
        assert_same_bits(outb[INDEX], out1[0], "out")
        assert_same_bits(lseb[INDEX], lse1[0], "lse")
    # decode() of the same sequence plans for itself: the same bits again
    out, lse = flashdecode.decode(*alone, return_lse=True, deterministic=True)
    assert_same_bits(out, out1, "out, decode")
    assert_same_bits(lse, lse1, "lse, decode")


def test_plan_default_is_not_deterministic():
    plan = flashdecode.DecodePlan(batch=1, num_heads_q=HQ, num_heads_kv=HKV, head_dim=D,
                                  dtype="f32", kv_capacity=64, device="cpu")
    assert plan.deterministic is False and "deterministic" not in repr(plan)
    with pytest.raises(AttributeError):
        plan.deterministic = True   # read-only


# ---- torch: decode, the custom ops, torch.compile -------------------------------------------
def torch_pair(q_len=1, dtype=None):
    alone, batched = alone_and_batched(q_len)
    dtype = dtype or torch.bfloat16
    conv = lambda xs: [torch.from_numpy(x).to(dtype) for x in xs[:3]] + [  # noqa: E731
        torch.from_numpy(xs[3])]
    return conv(alone), conv(batched)


@needs_torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_torch_decode_alone_equals_batched(dtype):
    alone, batched = torch_pair(2, getattr(torch, dtype))
    out1, lse1 = flashdecode.decode(*alone, return_lse=True, deterministic=True)
    outb, lseb = flashdecode.decode(*batched, return_lse=True, deterministic=True)
    assert torch.equal(outb[INDEX], out1[0]) and torch.equal(lseb[INDEX], lse1[0])
    assert_flag_matters(*batched)
    # decode_out (out given), and fp32 out
    out = torch.full(batched[0].shape, float("nan"), dtype=torch.float32)
    lse = flashdecode.decode(*batched, out=out, return_lse=True, deterministic=True)[1]
    out1f = flashdecode.decode(*alone, out_dtype=torch.float32, deterministic=True)
    assert torch.equal(out[INDEX], out1f[0]) and torch.equal(lse, lseb)


@needs_torch
def test_torch_ops_take_deterministic_last():
    alone, batched = torch_pair()
    ops = torch.ops.flashdecode
    f32 = torch.float32  # (fp32 out: 16-bit rounding hides no difference)
    args1 = (*alone, None, 0.0, 0, True, None, -1, 0.0, False, f32, None, None, None)
    argsb = (*batched, None, 0.0, 0, True, None, -1, 0.0, False, f32, None, None, None)
    out1, lse1 = ops.decode(*args1, True)
    outb, lseb = ops.decode(*argsb, deterministic=True)
    assert torch.equal(outb[INDEX], out1[0]) and torch.equal(lseb[INDEX], lse1[0])
    out = torch.empty(batched[0].shape, dtype=f32)
    lse = torch.empty(lseb.shape)
    ops.decode_out(*batched, None, out, lse, 0.0, 0, None, -1, 0.0, False, None, None, None,
                   True)
    assert torch.equal(out, outb) and torch.equal(lse, lseb)
    # the default is off: the op without the argument is the op with False, other bits
    plain = ops.decode(*argsb)[0]
    assert torch.equal(plain, ops.decode(*argsb, False)[0])
    assert not torch.equal(plain, outb)
    with pytest.raises(flashdecode.InvalidArgumentError, match=r"num_splits: 3 with "
                                                               r"deterministic"):
        ops.decode(*batched, None, 0.0, 3, True, deterministic=True)


@needs_torch
def test_torch_compile_deterministic_without_graph_break():
    alone, batched = torch_pair(2)

    f32 = torch.float32  # (fp32 out: 16-bit rounding hides no difference)

    def step(q, k, v, kv_len, out):
        o, lse = flashdecode.decode(q * 1.0, k, v, kv_len, return_lse=True, out_dtype=f32,
                                    deterministic=True)
        flashdecode.decode(q, k, v, kv_len, out=out, deterministic=True)
        return o + 0.0, lse

    out1, lse1 = flashdecode.decode(*alone, return_lse=True, out_dtype=f32, deterministic=True)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    out = torch.full(batched[0].shape, float("nan"), dtype=f32)
    got, lse = compiled(*batched, out)
    assert torch.equal(got[INDEX], out1[0]) and torch.equal(lse[INDEX], lse1[0])
    assert torch.equal(out[INDEX], out1[0])
    # (the default mode gives other bits: the flag went through the compiled graph)
    assert not torch.equal(flashdecode.decode(*batched, out_dtype=f32)[INDEX], out1[0])


@needs_torch
def test_torch_opcheck_with_deterministic():
    flashdecode._api.load_torch_ops()
    alone, _ = torch_pair(2, torch.float16)
    q, k, v, kv_len = alone
    torch.library.opcheck(torch.ops.flashdecode.decode.default,
                          (q, k, v, kv_len, None, 0.0, 0, True, None, -1, 0.0, False,
                           torch.float32, None, None, None, True))
    out, lse = torch.empty(q.shape, dtype=torch.float16), torch.empty(1, HQ, 2)
    torch.library.opcheck(torch.ops.flashdecode.decode_out.default,
                          (q, k, v, kv_len, None, out, lse, 0.0, 0, None, -1, 0.0, False,
                           None, None, None, True))


# ---- errors ---------------------------------------------------------------------------------
def small():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 1, 4, 64), dtype=np.float32)
    k = rng.standard_normal((2, 32, 2, 64), dtype=np.float32)
    return q, k, k.copy(), np.array([32, 10], np.int32)


PLAN = dict(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64, dtype="f32", kv_capacity=32,
            device="cpu")


@pytest.mark.parametrize("value", [2, -1, "yes", 1.0, None])
def test_deterministic_must_be_a_bool(value):
    q, k, v, kv_len = small()
    with pytest.raises(TypeError, match=r"deterministic: expected a bool"):
        flashdecode.decode(q, k, v, kv_len, deterministic=value)
    with pytest.raises(TypeError, match=r"deterministic: expected a bool"):
        flashdecode.DecodePlan(**PLAN, deterministic=value)
    if torch is not None:
        with pytest.raises(TypeError, match=r"deterministic: expected a bool"):
            flashdecode.decode(*(torch.from_numpy(x) for x in (q, k, v, kv_len)),
                               deterministic=value)


def test_deterministic_takes_0_1_and_numpy_bools():
    q, k, v, kv_len = small()
    a = flashdecode.decode(q, k, v, kv_len, deterministic=1)
    b = flashdecode.decode(q, k, v, kv_len, deterministic=np.bool_(True))
    assert same_bits(a, b)
    assert flashdecode.DecodePlan(**PLAN, deterministic=1).deterministic is True
    assert flashdecode.DecodePlan(**PLAN, deterministic=0).deterministic is False


def test_num_splits_with_deterministic_is_refused():
    q, k, v, kv_len = small()
    out = np.full(q.shape, np.nan, np.float32)
    pattern = r"num_splits: 3 with deterministic.* 2048 keys \(num_splits must be 0\)"
    with pytest.raises(flashdecode.InvalidArgumentError, match=pattern):
        flashdecode.decode(q, k, v, kv_len, num_splits=3, out=out, deterministic=True)
    assert np.isnan(out).all()  # nothing written
    with pytest.raises(ValueError, match=pattern):
        flashdecode.DecodePlan(**PLAN, num_splits=3, deterministic=True)
    if torch is not None:
        with pytest.raises(flashdecode.InvalidArgumentError, match=pattern):
            flashdecode.decode(*(torch.from_numpy(x) for x in (q, k, v, kv_len)),
                               num_splits=3, deterministic=True)
    flashdecode.DecodePlan(**PLAN, num_splits=1)  # (fine without it)


def test_kv_capacity_above_the_deterministic_limit_is_refused():
    limit = flashdecode.DETERMINISTIC_MAX_KEYS
    plan = flashdecode.DecodePlan(**dict(PLAN, kv_capacity=limit), deterministic=True)
    assert plan.num_splits == limit // flashdecode.DETERMINISTIC_SPLIT_LEN
    pattern = r"kv_capacity: %d keys read a sequence exceed the deterministic mode's %d" % (
        limit + 1, limit)
    with pytest.raises(flashdecode.InvalidArgumentError, match=pattern):
        flashdecode.DecodePlan(**dict(PLAN, kv_capacity=limit + 1), deterministic=True)
    flashdecode.DecodePlan(**dict(PLAN, kv_capacity=limit + 1))  # (fine without it)
    # decode() plans for the cache's capacity: a broadcast view of more keys, no memory
    q = np.ones((1, 1, 2, 8), np.float32)
    k = np.broadcast_to(np.ones((1, 1, 1, 8), np.float32), (1, limit + 1, 1, 8))
    with pytest.raises(flashdecode.InvalidArgumentError, match=pattern):
        flashdecode.decode(q, k, k, [4], deterministic=True)
    # a window reads fewer keys: window_left + q_len + 63 of them
    out = flashdecode.decode(q, k, k, [4], window_left=100, deterministic=True)
    assert np.allclose(out, 1.0)


# ---- the constants --------------------------------------------------------------------------
HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include",
                      "flashdecode.h")


@pytest.mark.skipif(not os.path.exists(HEADER), reason="include/flashdecode.h not in this tree")
def test_constants_match_the_header():
    """Every FD_* limit the binding mirrors has the header's value (the import-time check
    also plans the deterministic mode's two limits against the library)."""
    text = open(HEADER).read()
    defines = dict(re.findall(r"^#define (FD_[A-Z0-9_]+) (.+?)\s*(?:/\*.*)?$", text, re.M))
    values = {}
    for name, expr in defines.items():
        expr = re.sub(r"FD_[A-Z0-9_]+", lambda m: str(values.get(m.group(0), m.group(0))), expr)
        if re.fullmatch(r"[0-9 ()*+\-]+", expr):
            values[name] = eval(expr)  # noqa: S307 (integer arithmetic of the header)
    for name in ("FD_MAX_SPLITS", "FD_MAX_Q_LEN", "FD_MAX_Q_LEN_NON_CAUSAL",
                 "FD_MAX_MERGE_STATES", "FD_DETERMINISTIC_SPLIT_LEN",
                 "FD_DETERMINISTIC_MAX_KEYS"):
        assert getattr(_lib, name) == values[name], name
    assert (_lib.VERSION_MAJOR, _lib.VERSION_MINOR, _lib.VERSION_PATCH) == (
        values["FD_VERSION_MAJOR"], values["FD_VERSION_MINOR"], values["FD_VERSION_PATCH"])
    assert flashdecode.DETERMINISTIC_SPLIT_LEN == values["FD_DETERMINISTIC_SPLIT_LEN"] == 2048
    assert flashdecode.DETERMINISTIC_MAX_KEYS == values["FD_DETERMINISTIC_MAX_KEYS"]
    assert flashdecode.MAX_SPLITS == values["FD_MAX_SPLITS"]
