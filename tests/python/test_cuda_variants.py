"""test_cuda_variants.py — the attention variants and merge_states on the CUDA backend
(torch CUDA tensors) against the float64 numpy reference; torch.compile and CUDA-graph
capture of decode with variants and of merge_states. Skipped when torch.cuda is
unavailable. Outputs are poisoned with NaN before every call that takes an out=."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available", allow_module_level=True)

import flashdecode  # noqa: E402
from attention_ref import (assert_lse_close, assert_out_close, attention_f64,  # noqa: E402
                           merge_states_f64)
from cases import Case, make_case  # noqa: E402
from variant_cases import VARIANTS, make_sinks, resolve, split_points  # noqa: E402

DEV = torch.device("cuda")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

# CUDA head_dims 64/80/96/128/256; q_len 1..16; GQA 1/4/8; paged 16/64; kv_len 0 and < q_len
CUDA_VARIANT_CASES = [
    Case("gqa4-d128", 3, 1, 32, 8, 128, [1, 1300, 4001]),
    Case("paged16-q7-d64", 3, 7, 16, 4, 64, [5, 0, 2000], page_size=16),
    Case("mqa-q16-d96", 2, 16, 8, 1, 96, [16, 700]),
    Case("paged64-q3-d80", 2, 3, 8, 2, 80, [3, 900], page_size=64),
    Case("mha-q2-d256", 2, 2, 8, 8, 256, [300, 1]),
]


def cuda_inputs(case, dtype, seed=0):
    q, k, v, kv_len, block_table = make_case(case, seed)
    conv = [torch.from_numpy(x).to(device=DEV, dtype=dtype) for x in (q, k, v)]
    kv = torch.from_numpy(kv_len).to(DEV)
    bt = None if block_table is None else torch.from_numpy(block_table).to(DEV)
    return conv + [kv, bt]


def host(t):
    """A CUDA tensor as numpy: floats in float64 (the rounded values), integers as they are."""
    if t is None:
        return None
    t = t.detach().cpu()
    return t.double().numpy() if t.dtype.is_floating_point else t.numpy()


def cuda_kwargs(kw):
    """decode() keyword arguments with the sinks as a float32 CUDA tensor."""
    out = dict(kw)
    if out.get("sinks") is not None:
        out["sinks"] = torch.from_numpy(np.asarray(kw["sinks"], np.float32)).to(DEV)
    return out


def check(out, lse, q, k, v, kv_len, bt, dtype_name, **kw):
    torch.cuda.synchronize()
    ref_out, ref_lse = attention_f64(host(q), host(k), host(v), host(kv_len), host(bt), **kw)
    assert_out_close(host(out), ref_out, dtype_name)
    if lse is not None:
        assert_lse_close(host(lse), ref_lse)


@pytest.mark.parametrize("num_splits", [0, 7])
@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("case", CUDA_VARIANT_CASES, ids=repr)
def test_cuda_variant(case, variant, dtype_name, num_splits):
    q, k, v, kv_len, bt = cuda_inputs(case, DTYPES[dtype_name])
    kw = resolve(VARIANTS[variant], case.num_heads_q)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=DEV)
    res, lse = flashdecode.decode(q, k, v, kv_len, block_table=bt, num_splits=num_splits,
                                  out=out, return_lse=True, **cuda_kwargs(kw))
    assert res is out and lse.is_cuda
    check(out, lse, q, k, v, kv_len, bt, dtype_name, **kw)


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_cuda_fp32_out(dtype_name):
    case = Case("f32-out", 3, 4, 32, 8, 128, [3000, 4, 77], page_size=16)
    q, k, v, kv_len, bt = cuda_inputs(case, DTYPES[dtype_name])
    kw = dict(sinks=make_sinks(32), window_left=500, logits_soft_cap=30.0)
    out = torch.full(q.shape, float("nan"), dtype=torch.float32, device=DEV)
    _, lse = flashdecode.decode(q, k, v, kv_len, block_table=bt, out=out, return_lse=True,
                                **cuda_kwargs(kw))
    # (the tolerance of the inputs' dtype: the tensor-core kernels round the softmax
    # weights to it for P.V; fp32 out only drops the final rounding)
    check(out, lse, q, k, v, kv_len, bt, dtype_name, **kw)
    alloc = flashdecode.decode(q, k, v, kv_len, block_table=bt, out_dtype=torch.float32,
                               **cuda_kwargs(kw))
    assert alloc.dtype == torch.float32 and torch.equal(alloc, out)


def test_cuda_non_causal_q_len_128_and_empty_rows_with_sinks():
    case = Case("non-causal", 2, 128, 16, 4, 128, [1000, 0])
    q, k, v, kv_len, _ = cuda_inputs(case, torch.bfloat16)
    sinks = make_sinks(16)
    out, lse = flashdecode.decode(q, k, v, kv_len, non_causal=True, return_lse=True,
                                  sinks=torch.from_numpy(sinks).to(DEV))
    check(out, lse, q, k, v, kv_len, None, "bfloat16", non_causal=True, sinks=sinks)
    assert bool((out[1] == 0).all())
    assert torch.equal(lse[1].cpu(), torch.from_numpy(sinks)[:, None].expand(16, 128))


def test_cuda_nan_sink_gives_nan_rows():
    case = Case("nan-sink", 2, 2, 16, 4, 64, [500, 0])
    q, k, v, kv_len, _ = cuda_inputs(case, torch.float16)
    sinks = make_sinks(16)
    sinks[3] = np.nan
    out, lse = flashdecode.decode(q, k, v, kv_len, return_lse=True,
                                  sinks=torch.from_numpy(sinks).to(DEV))
    check(out, lse, q, k, v, kv_len, None, "float16", sinks=sinks)
    assert bool(out[:, :, 3].isnan().all()) and bool(lse[:, 3].isnan().all())


def test_cuda_sinks_on_the_host_are_refused():
    case = Case("sinks-host", 1, 1, 8, 2, 64, [100])
    q, k, v, kv_len, _ = cuda_inputs(case, torch.bfloat16)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=DEV)
    with pytest.raises(ValueError, match=r"sinks: on device cpu, but q is on cuda"):
        flashdecode.decode(q, k, v, kv_len, sinks=torch.zeros(8), out=out)
    with pytest.raises(ValueError, match=r"window_left: -3"):
        flashdecode.decode(q, k, v, kv_len, window_left=-3, out=out)
    torch.cuda.synchronize()
    assert bool(out.isnan().all())


def test_cuda_compile_fullgraph_with_variants():
    case = Case("compile", 2, 3, 32, 8, 128, [1000, 77], capacity=1024)
    q, k, v, kv_len, _ = cuda_inputs(case, torch.bfloat16)
    sinks = torch.from_numpy(make_sinks(32)).to(DEV, torch.bfloat16)

    def attn(q, k, v, kv_len, sinks):
        o, lse = flashdecode.decode(q * 1.0, k, v, kv_len, return_lse=True, window_left=255,
                                    logits_soft_cap=30.0, sinks=sinks,
                                    out_dtype=torch.float32)
        return o * 2.0, lse

    torch._dynamo.reset()
    compiled = torch.compile(attn, fullgraph=True)
    got, got_lse = compiled(q, k, v, kv_len, sinks)
    want, want_lse = attn(q, k, v, kv_len, sinks)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_cuda_graph_plan_replay_with_variants(paged):
    capacity = 2048
    case = Case("graph", 4, 2, 32, 8, 128, [2, 3, 4, 5], capacity=capacity,
                page_size=32 if paged else 0)
    q, k, v, kv_len, bt = cuda_inputs(case, torch.bfloat16)
    extra = dict(page_size=32, max_pages_per_seq=capacity // 32, num_pages=k.shape[0]) \
        if paged else {}
    plan = flashdecode.DecodePlan(batch=4, q_len=2, num_heads_q=32, num_heads_kv=8,
                                  head_dim=128, dtype=torch.bfloat16, kv_capacity=capacity,
                                  device="cuda", window_left=300, logits_soft_cap=20.0,
                                  out_dtype=torch.float32, **extra)
    sinks = torch.zeros(32, device=DEV)
    out = torch.empty(q.shape, dtype=torch.float32, device=DEV)
    lse = torch.empty(4, 32, 2, device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            plan.run(q, k, v, kv_len, block_table=bt, out=out, lse=lse, sinks=sinks)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k, v, kv_len, block_table=bt, out=out, lse=lse, sinks=sinks)
    for seed, lens in enumerate(([2, 3, 4, 5], [2048, 1000, 64, 0], [65, 301, 299, 1999])):
        kv_len.copy_(torch.tensor(lens, dtype=torch.int32))
        new_sinks = make_sinks(32, seed)
        sinks.copy_(torch.from_numpy(new_sinks))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        check(out, lse, q, k, v, kv_len, bt, "bfloat16", window_left=300, logits_soft_cap=20.0,
              sinks=new_sinks)


def test_cuda_graph_decode_replay_with_variants():
    case = Case("graph-decode", 2, 4, 16, 4, 64, [100, 200], capacity=512)
    q, k, v, kv_len, _ = cuda_inputs(case, torch.float16)
    sinks = torch.from_numpy(make_sinks(16)).to(DEV, torch.float16)  # converted in the graph
    out = torch.empty(q.shape, dtype=torch.float16, device=DEV)
    kw = dict(window_left=50, logits_soft_cap=8.0, sinks=sinks)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashdecode.decode(q, k, v, kv_len, out=out, **kw)  # warm up: plan cached
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashdecode.decode(q, k, v, kv_len, out=out, **kw)
    for lens in ([512, 4], [300, 0]):
        kv_len.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        check(out, None, q, k, v, kv_len, None, "float16", window_left=50, logits_soft_cap=8.0,
              sinks=host(sinks))


# ---- merge_states -----------------------------------------------------------------------------
def cascade_states(q, k, v, kv_len, bt, cuts, page_size, kw, out_dtype=torch.float32):
    """decode() over the parts of every sequence's keys (views / block_table columns and
    kv_len offsets); parts before the last non-causal, sinks to the last only."""
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
            kp, vp, btp = k, v, bt[:, a // page_size: None if last else b // page_size]
        lens = kv_len - a if last else torch.full_like(kv_len, b - a)
        o, l = flashdecode.decode(q, kp, vp, lens, block_table=btp, return_lse=True,
                                  out_dtype=out_dtype, **part_kw)
        outs.append(o)
        lses.append(l)
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16", "float32"])
def test_cuda_merge_states_equals_one_decode(dtype_name, paged, parts):
    case = Case("merge", 3, 3, 32, 8, 128, [2000, 1311, 977], page_size=64 if paged else 0)
    q, k, v, kv_len, bt = cuda_inputs(case, DTYPES[dtype_name])
    kw = dict(sinks=make_sinks(32), logits_soft_cap=25.0)
    cuts = split_points(case.kv_lens, case.q_len, parts)
    if paged:
        cuts = sorted({c // 64 * 64 for c in cuts} - {0})
    states_out, states_lse = cascade_states(q, k, v, kv_len, bt, cuts, 64, cuda_kwargs(kw))
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=DEV)
    lse = torch.full((3, 32, 3), float("nan"), device=DEV)
    res = flashdecode.merge_states(states_out, states_lse, out=out, lse=lse)
    assert res[0] is out and res[1] is lse
    check(out, lse, q, k, v, kv_len, bt, dtype_name, **kw)
    torch.cuda.synchronize()
    ref_out, ref_lse = merge_states_f64(host(states_out), host(states_lse))
    assert_out_close(host(out), ref_out, dtype_name)
    assert_lse_close(host(lse), ref_lse, atol=2e-5)
    one = flashdecode.decode(q, k, v, kv_len, block_table=bt, **cuda_kwargs(kw))
    assert_out_close(host(one), ref_out, dtype_name)


def test_cuda_merge_states_all_empty():
    states_out = torch.full((2, 2, 1, 8, 64), float("nan"), device=DEV, dtype=torch.bfloat16)
    states_lse = torch.full((2, 2, 8, 1), float("-inf"), device=DEV)
    out, lse = flashdecode.merge_states(states_out, states_lse)
    torch.cuda.synchronize()
    assert bool((out == 0).all()) and bool(lse.isneginf().all())


def test_cuda_merge_states_compile_and_graph_capture():
    case = Case("merge-graph", 2, 1, 16, 4, 128, [900, 300], capacity=1024)
    q, k, v, kv_len, _ = cuda_inputs(case, torch.bfloat16)
    cut = 256

    def cascade(q, k, v, kv_len):
        o1, l1 = flashdecode.decode(q, k[:, :cut], v[:, :cut], torch.full_like(kv_len, cut),
                                    non_causal=True, return_lse=True, out_dtype=torch.float32)
        o2, l2 = flashdecode.decode(q, k[:, cut:], v[:, cut:], kv_len - cut, return_lse=True,
                                    out_dtype=torch.float32)
        return flashdecode.merge_states([o1, o2], [l1, l2], out_dtype=torch.bfloat16)

    torch._dynamo.reset()
    compiled = torch.compile(cascade, fullgraph=True)
    got_out, got_lse = compiled(q, k, v, kv_len)
    want_out, want_lse = cascade(q, k, v, kv_len)
    torch.testing.assert_close(got_out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(got_lse, want_lse, rtol=0, atol=0)
    check(want_out, want_lse, q, k, v, kv_len, None, "bfloat16")

    # CUDA graph: merge into given buffers, replayed as the states change
    states_out = torch.randn(3, 2, 1, 16, 128, device=DEV)
    states_lse = torch.randn(3, 2, 16, 1, device=DEV)
    out = torch.empty(2, 1, 16, 128, device=DEV, dtype=torch.bfloat16)
    lse = torch.empty(2, 16, 1, device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashdecode.merge_states(states_out, states_lse, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashdecode.merge_states(states_out, states_lse, out=out, lse=lse)
    for seed in range(3):
        gen = torch.Generator(device=DEV).manual_seed(seed)
        states_out.copy_(torch.randn(states_out.shape, device=DEV, generator=gen))
        states_lse.copy_(torch.randn(states_lse.shape, device=DEV, generator=gen) * 3)
        states_lse[seed, 0] = float("-inf")
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = merge_states_f64(host(states_out), host(states_lse))
        assert_out_close(host(out), ref_out, "bfloat16")
        assert_lse_close(host(lse), ref_lse, atol=2e-5)
