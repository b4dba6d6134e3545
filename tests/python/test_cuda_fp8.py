"""test_cuda_fp8.py — fp8 KV caches on the CUDA backend (torch CUDA tensors):
append_kv writes the bytes the CPU writes (every format and granularity,
contiguous and paged) and replays from a captured CUDA graph at new kv_len
values; decode on an fp8 cache matches the float64 oracle on the dequantized
cache (the tensor-core kernel widens fp8 to the q dtype). Skipped without
torch.cuda.
"""
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available", allow_module_level=True)

import flashdecode  # noqa: E402
from attention_ref import assert_out_close, attention_f64  # noqa: E402

DEV = torch.device("cuda")
F8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
SSHAPE = {"none": None, "tensor": lambda c: (1,), "head": lambda c: (c[2],),
          "token": lambda c: c[:3]}


def _scales(gran, cache_shape, value):
    if gran == "none":
        return None
    return torch.full(SSHAPE[gran](cache_shape), value, dtype=torch.float32)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("gran", ["none", "tensor", "head", "token"])
@pytest.mark.parametrize("paged", [False, True])
def test_cuda_append_matches_cpu_bytes(fmt, gran, paged):
    g = torch.Generator().manual_seed(5)
    shape = (8, 16, 2, 128) if paged else (2, 64, 2, 128)
    bt = torch.tensor([[7, 5, 3, 1], [0, 2, 4, 6]], dtype=torch.int32) if paged else None
    kn = (torch.randn(2, 9, 2, 128, generator=g) * 3).bfloat16()
    kn[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), -1e30])
    kv_len = torch.tensor([3, 40], dtype=torch.int32)
    results = []
    for dev in ("cpu", DEV):
        kc = torch.zeros(shape, dtype=F8[fmt], device=dev)
        vc = torch.zeros_like(kc)
        ks, vs = _scales(gran, shape, 0.02), _scales(gran, shape, 0.03)
        ks = None if ks is None else ks.to(dev)
        vs = None if vs is None else vs.to(dev)
        flashdecode.append_kv(kn.to(dev), kn.to(dev), kc, vc, kv_len.to(dev),
                              block_table=None if bt is None else bt.to(dev), k_scale=ks,
                              v_scale=vs)
        torch.cuda.synchronize()
        results.append([x.cpu() for x in (kc.view(torch.uint8), vc.view(torch.uint8))] +
                       ([] if ks is None else [ks.cpu(), vs.cpu()]))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_cuda_append_graph_replay():
    shape = (2, 32, 2, 64)
    kc = torch.zeros(shape, dtype=torch.float8_e4m3fn, device=DEV)
    vc = torch.zeros_like(kc)
    ks = torch.zeros(shape[:3], device=DEV)
    vs = torch.zeros_like(ks)
    kn = torch.randn(2, 1, 2, 64, device=DEV, dtype=torch.float16)
    kv_len = torch.zeros(2, dtype=torch.int32, device=DEV)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        flashdecode.append_kv(kn, kn, kc, vc, kv_len, k_scale=ks, v_scale=vs)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        flashdecode.append_kv(kn, kn, kc, vc, kv_len, k_scale=ks, v_scale=vs)
    for step in (5, 6):
        kv_len.fill_(step)
        graph.replay()
    torch.cuda.synchronize()
    written = (kc.view(torch.uint8) != 0).any(-1).any(-1).cpu()
    assert written[:, [0, 5, 6]].all() and written.sum() == 2 * 3


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("gran", ["tensor", "head", "token"])
def test_cuda_decode_fp8(fmt, gran):
    g = torch.Generator().manual_seed(7)
    shape = (2, 300, 2, 128)
    kf = torch.randn(shape, generator=g)
    vf = torch.randn(shape, generator=g)
    ks, vs = _scales(gran, shape, 0.02), _scales(gran, shape, 0.03)
    div_k = ks.view(ks.shape + (1,) * (4 - ks.dim())) if gran == "token" else (
        ks.view(1, 1, -1, 1) if gran == "head" else ks)
    div_v = vs.view(vs.shape + (1,) * (4 - vs.dim())) if gran == "token" else (
        vs.view(1, 1, -1, 1) if gran == "head" else vs)
    k8, v8 = (kf / div_k).to(F8[fmt]), (vf / div_v).to(F8[fmt])
    q = torch.randn(2, 2, 8, 128, generator=g).bfloat16()
    kv_len = torch.tensor([300, 77], dtype=torch.int32)
    out = flashdecode.decode(q.to(DEV), k8.to(DEV), v8.to(DEV), kv_len.to(DEV),
                             k_scale=ks.to(DEV), v_scale=vs.to(DEV))
    ref, _ = attention_f64(q.float().numpy(), (k8.double() * div_k.double()).numpy(),
                           (v8.double() * div_v.double()).numpy(), kv_len.numpy())
    assert_out_close(out.float().cpu().numpy(), ref, "bfloat16")
