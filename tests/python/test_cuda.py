"""test_cuda.py — flashdecode on the CUDA backend (torch CUDA tensors), against
torch's scaled_dot_product_attention computed in float64; torch.compile and
CUDA-graph capture/replay. Skipped when torch.cuda is unavailable."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available", allow_module_level=True)

import torch.nn.functional as F  # noqa: E402

import flashdecode  # noqa: E402
from attention_ref import output_tolerance  # noqa: E402
from cases import Case, make_case  # noqa: E402

DEV = torch.device("cuda")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}

CUDA_CASES = [
    Case("llama-gqa", 4, 1, 32, 8, 128, [1, 100, 4096, 7000], capacity=8192),
    Case("mha64", 2, 1, 16, 16, 64, [513, 64]),
    Case("mqa256", 2, 1, 8, 1, 256, [1000, 3]),
    Case("paged16", 3, 1, 32, 8, 128, [300, 0, 2000], page_size=16),
    Case("paged64-qlen4", 2, 4, 16, 4, 128, [4, 1500], page_size=64),
    Case("qlen16", 1, 16, 8, 8, 64, [40]),
    Case("qlen3-short", 2, 3, 8, 2, 128, [2, 1]),
    Case("paged1", 2, 2, 8, 2, 64, [33, 9], page_size=1),
]


def cuda_inputs(case, dtype, seed=0):
    q, k, v, kv_len, block_table = make_case(case, seed)
    conv = [torch.from_numpy(x).to(device=DEV, dtype=dtype) for x in (q, k, v)]
    kv = torch.from_numpy(kv_len).to(DEV)
    bt = None if block_table is None else torch.from_numpy(block_table).to(DEV)
    return conv + [kv, bt]


def sdpa_f64(q, k, v, kv_len, block_table=None, scale=None):
    """out [B, q_len, Hq, D] and lse [B, Hq, q_len] in float64, from torch SDPA (math, f64)."""
    batch, q_len, hq, d = q.shape
    hkv = k.shape[2]
    group = hq // hkv
    scale = d ** -0.5 if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((batch, hq, q_len), float("-inf"), dtype=torch.float64, device=q.device)
    for b in range(batch):
        n = int(kv_len[b])
        if n == 0:
            continue
        if block_table is None:
            kk, vv = k[b, :n], v[b, :n]
        else:
            ps = k.shape[1]
            pages = block_table[b, : (n + ps - 1) // ps].long()
            kk = k[pages].reshape(-1, hkv, d)[:n]
            vv = v[pages].reshape(-1, hkv, d)[:n]
        kk = kk.double().repeat_interleave(group, dim=1).transpose(0, 1)   # [Hq, n, D]
        vv = vv.double().repeat_interleave(group, dim=1).transpose(0, 1)
        qq = q[b].double().transpose(0, 1)                                # [Hq, q_len, D]
        t = torch.arange(q_len, device=q.device)[:, None]
        j = torch.arange(n, device=q.device)[None, :]
        mask = j < (n - q_len + t + 1)                                    # [q_len, n]
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=scale)
        seen = mask.any(dim=1)                                            # rows with a key
        out[b] = torch.where(seen[None, :, None], o, torch.zeros_like(o)).transpose(0, 1)
        s = (qq @ kk.transpose(1, 2)) * scale
        lse[b] = torch.logsumexp(s.masked_fill(~mask, float("-inf")), dim=-1)
    return out, lse


def assert_close_to_ref(out, lse, ref_out, ref_lse, dtype_name):
    atol = output_tolerance(dtype_name, ref_out.cpu().numpy())
    torch.testing.assert_close(out.double(), ref_out, rtol=0, atol=atol)
    if lse is not None:
        inf = torch.isneginf(ref_lse)
        assert torch.equal(torch.isneginf(lse), inf)
        torch.testing.assert_close(lse.double()[~inf], ref_lse[~inf], rtol=1e-5, atol=5e-4)


def test_cuda_backend_available():
    assert flashdecode.backend_available("cuda"), "library built without CUDA, or no GPU of compute capability 8.0+"


@pytest.mark.parametrize("num_splits", [0, 1, 7])
@pytest.mark.parametrize("dtype_name", sorted(DTYPES))
@pytest.mark.parametrize("case", CUDA_CASES, ids=repr)
def test_cuda_matches_sdpa_f64(case, dtype_name, num_splits):
    q, k, v, kv_len, bt = cuda_inputs(case, DTYPES[dtype_name])
    out, lse = flashdecode.decode(q, k, v, kv_len, block_table=bt, num_splits=num_splits,
                                  return_lse=True)
    assert out.device == q.device and out.dtype == q.dtype and lse.dtype == torch.float32
    ref_out, ref_lse = sdpa_f64(q, k, v, kv_len, bt)
    assert_close_to_ref(out, lse, ref_out, ref_lse, dtype_name)


def test_cuda_strided_and_scale():
    case = Case("strided", 2, 2, 16, 4, 64, [700, 65])
    q, k, v, kv_len, _ = cuda_inputs(case, torch.bfloat16)
    k_bhsd, v_bhsd = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    q_wide = torch.zeros(2, 2, 32, 64, dtype=torch.bfloat16, device=DEV)
    q_wide[:, :, ::2] = q
    out_buf = torch.full((2, 2, 16, 192), 7.0, dtype=torch.bfloat16, device=DEV)
    out = out_buf[..., 64:128]
    r, lse = flashdecode.decode(q_wide[:, :, ::2], k_bhsd.transpose(1, 2),
                                v_bhsd.transpose(1, 2), kv_len, softmax_scale=0.05, out=out,
                                return_lse=True)
    assert r is out
    ref_out, ref_lse = sdpa_f64(q, k, v, kv_len, scale=0.05)
    assert_close_to_ref(out, lse, ref_out, ref_lse, "bfloat16")
    assert bool((out_buf[..., :64] == 7).all()) and bool((out_buf[..., 128:] == 7).all())


def test_cuda_runs_on_the_current_stream():
    case = Case("stream", 2, 1, 32, 8, 128, [3000, 10], capacity=4096)
    q, k, v, kv_len, _ = cuda_inputs(case, torch.float16)
    ref_out, _ = sdpa_f64(q, k, v, kv_len)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        q2 = q * 1.0                      # produced on the side stream
        torch.cuda._sleep(1_000_000)      # delay it: a launch on another stream would race
        q2 = q2 * 1.0
        out = flashdecode.decode(q2, k, v, kv_len, num_splits=4)
    side.synchronize()
    assert_close_to_ref(out, None, ref_out, None, "float16")


def test_cuda_plan_matches_decode_bitwise_and_allocates_nothing():
    case = Case("plan", 8, 1, 32, 8, 128, [4000] * 8, capacity=4096)
    q, k, v, kv_len, _ = cuda_inputs(case, torch.bfloat16)
    plan = flashdecode.DecodePlan(batch=8, num_heads_q=32, num_heads_kv=8, head_dim=128,
                                  dtype=torch.bfloat16, kv_capacity=4096, device="cuda")
    assert plan.backend == "cuda" and plan.num_splits >= 1
    if plan.num_splits > 1:
        assert isinstance(plan.workspace, torch.Tensor) and plan.workspace.is_cuda
        assert plan.workspace.numel() == plan.workspace_size
    out = torch.empty_like(q)
    lse = torch.empty(8, 32, 1, device=DEV)
    plan.run(q, k, v, kv_len, out=out, lse=lse)  # warm up
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    assert plan.run(q, k, v, kv_len, out=out, lse=lse) is out
    assert torch.cuda.memory_allocated() == before
    want = flashdecode.decode(q, k, v, kv_len, num_splits=plan.num_splits)
    assert torch.equal(out, want)
    ref_out, ref_lse = sdpa_f64(q, k, v, kv_len)
    assert_close_to_ref(out, lse, ref_out, ref_lse, "bfloat16")
    # kv_len as a list or a tuple (copied to the device), and the default device
    for lens in (kv_len.tolist(), tuple(kv_len.tolist())):
        assert torch.equal(plan.run(q, k, v, lens), want)
    assert flashdecode.DecodePlan(batch=8, num_heads_q=32, num_heads_kv=8, head_dim=128,
                                  dtype=torch.bfloat16, kv_capacity=4096).device == (
        "cuda:%d" % torch.cuda.current_device())


def test_cuda_kv_len_beyond_capacity_is_clamped_on_device():
    case = Case("clamp", 2, 1, 8, 2, 128, [64, 64], capacity=64)
    q, k, v, _, _ = cuda_inputs(case, torch.float16)
    big = flashdecode.decode(q, k, v, torch.tensor([64, 1000], dtype=torch.int32, device=DEV))
    full = flashdecode.decode(q, k, v, torch.tensor([64, 64], dtype=torch.int32, device=DEV))
    torch.cuda.synchronize()
    assert torch.equal(big, full)


def test_cuda_compile_fullgraph():
    case = Case("compile", 2, 1, 32, 8, 128, [1000, 77], capacity=1024)
    q, k, v, kv_len, _ = cuda_inputs(case, torch.bfloat16)
    w = torch.randn(32 * 128, 32 * 128, device=DEV, dtype=torch.bfloat16) * 0.01
    x = torch.randn(2, 1, 32 * 128, device=DEV, dtype=torch.bfloat16)

    def attn(x, k, v, kv_len):
        qx = (x @ w).view(2, 1, 32, 128)
        o, lse = flashdecode.decode(qx, k, v, kv_len, return_lse=True)
        return (o.reshape(2, 1, -1) @ w) + 1.0, lse

    torch._dynamo.reset()
    compiled = torch.compile(attn, fullgraph=True)
    got, got_lse = compiled(x, k, v, kv_len)
    want, want_lse = attn(x, k, v, kv_len)
    # (inductor may round the projection differently from eager: loose tolerances)
    torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(got_lse, want_lse, rtol=2e-2, atol=2e-2)
    # new kv_len values, same graph
    kv2 = torch.tensor([5, 1024], dtype=torch.int32, device=DEV)
    torch.testing.assert_close(compiled(x, k, v, kv2)[0], attn(x, k, v, kv2)[0], rtol=2e-2,
                               atol=2e-2)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_cuda_graph_plan_replay_with_new_kv_len(paged):
    capacity = 2048
    case = Case("graph", 4, 1, 32, 8, 128, [1, 2, 3, 4], capacity=capacity,
                page_size=32 if paged else 0)
    q, k, v, kv_len, bt = cuda_inputs(case, torch.bfloat16)
    kwargs = dict(page_size=32, max_pages_per_seq=capacity // 32, num_pages=k.shape[0]) \
        if paged else {}
    plan = flashdecode.DecodePlan(batch=4, q_len=1, num_heads_q=32, num_heads_kv=8,
                                  head_dim=128, dtype=torch.bfloat16, kv_capacity=capacity,
                                  device="cuda", **kwargs)
    out = torch.empty_like(q)
    lse = torch.empty(4, 32, 1, device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            plan.run(q, k, v, kv_len, block_table=bt, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k, v, kv_len, block_table=bt, out=out, lse=lse)
    for lens in ([1, 2, 3, 4], [2048, 1000, 64, 0], [65, 127, 129, 1999]):
        kv_len.copy_(torch.tensor(lens, dtype=torch.int32))
        if paged:
            bt.copy_(bt.flip(1))  # new page assignment, same pages
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        ref_out, ref_lse = sdpa_f64(q, k, v, kv_len, bt)
        assert_close_to_ref(out, lse, ref_out, ref_lse, "bfloat16")


def test_cuda_graph_decode_replay():
    case = Case("graph-decode", 2, 1, 16, 4, 64, [100, 200], capacity=512)
    q, k, v, kv_len, _ = cuda_inputs(case, torch.float16)
    out = torch.empty_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashdecode.decode(q, k, v, kv_len, out=out)  # warm up: plan cached
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashdecode.decode(q, k, v, kv_len, out=out)
    for lens in ([512, 1], [300, 0]):
        kv_len.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_ref(out, None, sdpa_f64(q, k, v, kv_len)[0], None, "float16")


def test_cuda_errors_carry_the_library_message():
    case = Case("err", 1, 1, 4, 2, 72, [10], capacity=16)
    q, k, v, kv_len, _ = cuda_inputs(case, torch.float16)
    with pytest.raises(ValueError, match=r"head_dim: 72 is not supported by the CUDA backend") \
            as info:
        flashdecode.decode(q, k, v, kv_len)
    assert isinstance(info.value, flashdecode.UnsupportedError)
    case = Case("err", 1, 1, 4, 2, 64, [10], capacity=16)
    q, k, v, kv_len, _ = cuda_inputs(case, torch.float16)
    buf = torch.zeros(1, 1, 4, 65, dtype=torch.float16, device=DEV)
    with pytest.raises(flashdecode.UnsupportedError, match=r"q: CUDA needs 16-byte aligned"):
        flashdecode.decode(buf[..., 1:], k, v, kv_len)
    with pytest.raises(ValueError, match=r"k_cache: on device cpu"):
        flashdecode.decode(q, k.cpu(), v.cpu(), kv_len)
    plan = flashdecode.DecodePlan(batch=1, num_heads_q=4, num_heads_kv=2, head_dim=64,
                                  dtype="f16", kv_capacity=16, device="cuda")
    with pytest.raises(ValueError, match=r"the plan runs on cuda"):
        plan.run(q.cpu(), k.cpu(), v.cpu(), kv_len.cpu())


class _Foreign:
    """An array known only through DLPack (stands in for CuPy / JAX arrays)."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, **kwargs):
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def test_cuda_dlpack_foreign_arrays():
    case = Case("dlpack", 2, 1, 8, 2, 128, [100, 7])
    q, k, v, kv_len, _ = cuda_inputs(case, torch.float16)
    out = flashdecode.decode(*(_Foreign(x) for x in (q, k, v, kv_len)))
    torch.cuda.synchronize()
    got = torch.from_dlpack(out) if not isinstance(out, torch.Tensor) else out
    assert_close_to_ref(got, None, sdpa_f64(q, k, v, kv_len)[0], None, "float16")
    np.testing.assert_array_equal(kv_len.cpu().numpy(), [100, 7])
