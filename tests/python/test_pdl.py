"""test_pdl.py — pdl=False (fd_problem.no_pdl: plain kernel launches instead of programmatic
dependent launch): accepted by decode, DecodePlan and the torch op and handed to the plan
on every path (numpy, DLPack, torch, out=, torch.compile), read back from the C plan,
refused when not a bool; on CUDA the same bits as pdl=True, eager and in a CUDA graph of
several calls back to back, and within tolerance of the float64 reference."""
import numpy as np
import pytest

import flashdecode
from attention_ref import assert_out_close, attention_f64

try:
    import torch
except ImportError:  # the numpy half runs without torch
    torch = None

PLAN = dict(batch=2, num_heads_q=4, num_heads_kv=2, head_dim=64, dtype="f32", kv_capacity=40,
            device="cpu")


def small(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 1, 4, 64), dtype=np.float32)
    k = rng.standard_normal((2, 40, 2, 64), dtype=np.float32)
    v = rng.standard_normal((2, 40, 2, 64), dtype=np.float32)
    return q, k, v, np.array([40, 13], np.int32)


@pytest.mark.parametrize("value", [2, -1, "no", 0.5, None])
def test_pdl_must_be_a_bool(value):
    q, k, v, kv_len = small()
    with pytest.raises(TypeError, match=r"pdl: expected a bool"):
        flashdecode.decode(q, k, v, kv_len, pdl=value)
    with pytest.raises(TypeError, match=r"pdl: expected a bool"):
        flashdecode.DecodePlan(**PLAN, pdl=value)


def test_pdl_reaches_the_plan():
    assert flashdecode.DecodePlan(**PLAN).pdl is True
    plan = flashdecode.DecodePlan(**PLAN, pdl=False)
    assert plan.pdl is False and plan._problem.no_pdl == 1
    assert "pdl=False" in repr(plan)
    assert flashdecode.DecodePlan(**PLAN, pdl=0).pdl is False


class _Foreign:
    """An array of another framework: only the DLPack protocol."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def _planned_pdl(monkeypatch, call):
    """The pdl every plan that ``call`` makes receives (the plan cache emptied first)."""
    from flashdecode import _core

    seen = []
    make_plan = _core.make_plan

    def spy(**kw):
        seen.append(kw.get("pdl", True))
        return make_plan(**kw)

    monkeypatch.setattr(_core, "make_plan", spy)
    _core.cached_plan.cache_clear()
    try:
        call()
    finally:
        _core.cached_plan.cache_clear()
    assert seen, "no plan was made"
    return seen


def test_pdl_reaches_the_plan_on_every_path(monkeypatch):
    q, k, v, kv_len = small(3)
    assert _planned_pdl(monkeypatch, lambda: flashdecode.decode(q, k, v, kv_len)) == [True]
    assert _planned_pdl(monkeypatch,
                        lambda: flashdecode.decode(q, k, v, kv_len, pdl=False)) == [False]
    foreign = [_Foreign(x) for x in (q, k, v, kv_len)]
    assert _planned_pdl(monkeypatch,
                        lambda: flashdecode.decode(*foreign, pdl=False)) == [False]
    if torch is None:
        return
    tq, tk, tv, tl = (torch.from_numpy(x) for x in (q, k, v, kv_len))
    assert _planned_pdl(monkeypatch,
                        lambda: flashdecode.decode(tq, tk, tv, tl, pdl=False)) == [False]
    out = torch.empty_like(tq)
    assert _planned_pdl(monkeypatch, lambda: flashdecode.decode(tq, tk, tv, tl, out=out,
                                                                pdl=False)) == [False]
    compiled = torch.compile(lambda *a: flashdecode.decode(*a, pdl=False), fullgraph=True)
    assert set(_planned_pdl(monkeypatch, lambda: compiled(tq, tk, tv, tl))) == {False}


def test_pdl_false_on_the_cpu_is_the_same_call():
    q, k, v, kv_len = small(1)
    a = flashdecode.decode(q, k, v, kv_len)
    b = flashdecode.decode(q, k, v, kv_len, pdl=False)
    np.testing.assert_array_equal(a, b)
    assert_out_close(b, attention_f64(q, k, v, kv_len)[0], "float32")


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_op_takes_pdl():
    q, k, v, kv_len = (torch.from_numpy(x) for x in small(2))
    ref = flashdecode.decode(q, k, v, kv_len)  # (loads the torch ops)
    out, _ = torch.ops.flashdecode.decode(q, k, v, kv_len, None, 0.0, 0, False, None, -1, 0.0,
                                          False, None, None, None, None, False, False)
    assert torch.equal(out, ref)
    torch.library.opcheck(torch.ops.flashdecode.decode.default,
                          (q, k, v, kv_len, None, 0.0, 0, True, None, -1, 0.0, False, None,
                           None, None, None, False, False))


def _cuda():
    if torch is None or not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available")
    return torch.device("cuda")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("kv_len", [[8193], [300, 4097, 1]])
def test_cuda_pdl_off_same_bits(dtype, kv_len):
    dev = _cuda()
    g = torch.Generator(device="cpu").manual_seed(sum(kv_len))
    b, cap = len(kv_len), max(kv_len)
    q = torch.randn(b, 1, 32, 128, generator=g).to(dev, getattr(torch, dtype))
    k = torch.randn(b, cap, 8, 128, generator=g).to(dev, getattr(torch, dtype))
    v = torch.randn(b, cap, 8, 128, generator=g).to(dev, getattr(torch, dtype))
    lens = torch.tensor(kv_len, dtype=torch.int32, device=dev)
    on, lse_on = flashdecode.decode(q, k, v, lens, return_lse=True)
    off, lse_off = flashdecode.decode(q, k, v, lens, return_lse=True, pdl=False)
    assert torch.equal(on, off) and torch.equal(lse_on, lse_off)
    want = attention_f64(*(t.float().cpu().numpy() for t in (q, k, v)), lens.cpu().numpy())[0]
    assert_out_close(off.float().cpu().numpy(), want, dtype)
    # a graph of layers back to back through one plan without PDL, replayed
    plan = flashdecode.DecodePlan(batch=b, num_heads_q=32, num_heads_kv=8, head_dim=128,
                                  dtype=q.dtype, kv_capacity=cap, device="cuda", pdl=False)
    assert plan.pdl is False and plan.num_splits > 1
    outs = [torch.full_like(q, float("nan")) for _ in range(3)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        plan.run(q, k, v, lens, out=outs[0])  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for out in outs:
            plan.run(q, k, v, lens, out=out)
    for out in outs:
        out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for out in outs:
        assert torch.equal(out, on)
