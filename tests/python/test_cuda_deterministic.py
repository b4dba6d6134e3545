"""test_cuda_deterministic.py — deterministic=True on the CUDA backend: one sequence decoded
alone and inside a batch of other sequences of other lengths, with another kv_capacity,
gives bitwise-identical out and lse through flashdecode.decode, DecodePlan, and a CUDA
graph's replay of a batched plan; without the flag the bits differ (so the comparisons
can fail). Skipped when torch.cuda is unavailable."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available", allow_module_level=True)

import flashdecode  # noqa: E402

DEV = torch.device("cuda")
HQ, HKV, D = 8, 2, 128
TARGET_LEN = 5000                  # 3 splits of 2048 keys
OTHER_LENS = [20000, 7, 0, 12345]
INDEX = 2
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def batch_of(seed, q_len, lens, capacity, dtype, target=None, index=INDEX):
    g = torch.Generator(device="cpu").manual_seed(seed)
    batch = len(lens)
    q = torch.randn(batch, q_len, HQ, D, generator=g)
    k = torch.randn(batch, capacity, HKV, D, generator=g)
    v = torch.randn(batch, capacity, HKV, D, generator=g)
    if target is not None:
        tq, tk, tv = (t.float().cpu() for t in target)
        q[index] = tq[0]
        k[index, :tk.shape[1]] = tk[0]
        v[index, :tv.shape[1]] = tv[0]
    conv = [t.to(device=DEV, dtype=dtype) for t in (q, k, v)]
    return conv + [torch.tensor(lens, dtype=torch.int32, device=DEV)]


def alone_and_batched(dtype, q_len=1):
    alone = batch_of(1, q_len, [TARGET_LEN], TARGET_LEN, dtype)
    lens = OTHER_LENS[:INDEX] + [TARGET_LEN] + OTHER_LENS[INDEX:]
    batched = batch_of(2, q_len, lens, 24000, dtype, target=alone[:3])
    return alone, batched


def assert_flag_matters(*args, **kw):
    """deterministic=True changes the bits (fp32 out): the flag reached the library."""
    plain = flashdecode.decode(*args, out_dtype=torch.float32, **kw)
    det = flashdecode.decode(*args, out_dtype=torch.float32, deterministic=True, **kw)
    assert not torch.equal(plain, det), "deterministic=True changed nothing"


@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_cuda_decode_alone_equals_batched(dtype, q_len):
    alone, batched = alone_and_batched(DTYPES[dtype], q_len)
    out1, lse1 = flashdecode.decode(*alone, return_lse=True, deterministic=True)
    outb, lseb = flashdecode.decode(*batched, return_lse=True, deterministic=True)
    torch.cuda.synchronize()
    assert torch.equal(outb[INDEX], out1[0]), (outb[INDEX] - out1[0]).abs().max()
    assert torch.equal(lseb[INDEX], lse1[0]), (lseb[INDEX] - lse1[0]).abs().max()
    # a larger cache (kv_capacity 9000) around the same sequence
    big = batch_of(3, q_len, [TARGET_LEN], 9000, DTYPES[dtype], target=alone[:3], index=0)
    outc, lsec = flashdecode.decode(*big, return_lse=True, deterministic=True)
    assert torch.equal(outc, out1) and torch.equal(lsec, lse1)
    assert_flag_matters(*batched)


def test_cuda_decode_paged_alone_equals_batched():
    ps = 16
    alone, batched = alone_and_batched(torch.bfloat16, q_len=2)

    def paged(q, k, v, kv_len, seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        batch, capacity = k.shape[0], k.shape[1]
        per_seq = (capacity + ps - 1) // ps
        num_pages = batch * per_seq + 5
        table = torch.randperm(num_pages, generator=g)[:batch * per_seq].view(batch, per_seq)
        table = table.to(device=DEV, dtype=torch.int32)
        pad = per_seq * ps - capacity
        kp = torch.randn(num_pages, ps, HKV, D, generator=g).to(device=DEV, dtype=k.dtype)
        vp = torch.randn(num_pages, ps, HKV, D, generator=g).to(device=DEV, dtype=v.dtype)
        kpad = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).view(batch, per_seq, ps, HKV, D)
        vpad = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).view(batch, per_seq, ps, HKV, D)
        kp[table.long()] = kpad
        vp[table.long()] = vpad
        return q, kp, vp, kv_len, table

    q, k, v, kv_len, bt = paged(*alone, seed=4)
    out1, lse1 = flashdecode.decode(q, k, v, kv_len, block_table=bt, return_lse=True,
                                    deterministic=True)
    q, k, v, kv_len, bt = paged(*batched, seed=5)
    outb, lseb = flashdecode.decode(q, k, v, kv_len, block_table=bt, return_lse=True,
                                    deterministic=True)
    torch.cuda.synchronize()
    assert torch.equal(outb[INDEX], out1[0]) and torch.equal(lseb[INDEX], lse1[0])
    assert_flag_matters(q, k, v, kv_len, block_table=bt)


def test_cuda_graph_replay_equals_eager_alone():
    """A batched deterministic plan captured in a CUDA graph, replayed with new kv_len
    values, gives the bits of an eager batch-1 plan of another capacity."""
    alone, batched = alone_and_batched(torch.bfloat16, q_len=2)
    plan1 = flashdecode.DecodePlan(batch=1, q_len=2, num_heads_q=HQ, num_heads_kv=HKV,
                                   head_dim=D, dtype=torch.bfloat16, kv_capacity=TARGET_LEN,
                                   device="cuda", deterministic=True)
    planb = flashdecode.DecodePlan(batch=5, q_len=2, num_heads_q=HQ, num_heads_kv=HKV,
                                   head_dim=D, dtype=torch.bfloat16, kv_capacity=24000,
                                   device="cuda", kv_len_hint=[64] * 5, deterministic=True)
    assert planb.deterministic and "deterministic=True" in repr(planb)
    q, k, v, kv_len = batched
    out = torch.empty_like(q)
    lse = torch.empty(5, HQ, 2, device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        planb.run(q, k, v, kv_len, out=out, lse=lse)  # warm up (the checked-call cache)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        planb.run(q, k, v, kv_len, out=out, lse=lse)
    tq, tk, tv, _ = alone
    for n in (TARGET_LEN, 2049, 2048, 77):
        lens = OTHER_LENS[:INDEX] + [n] + OTHER_LENS[INDEX:]
        kv_len.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        lse1 = torch.empty(1, HQ, 2, device=DEV)
        out1 = plan1.run(tq, tk, tv, torch.tensor([n], dtype=torch.int32, device=DEV),
                         lse=lse1)
        torch.cuda.synchronize()
        assert torch.equal(out[INDEX], out1[0]), n
        assert torch.equal(lse[INDEX], lse1[0]), n


def test_cuda_num_splits_with_deterministic_is_refused():
    alone, _ = alone_and_batched(torch.float16)
    with pytest.raises(flashdecode.InvalidArgumentError, match=r"num_splits: 4 with "
                                                               r"deterministic"):
        flashdecode.decode(*alone, num_splits=4, deterministic=True)
    with pytest.raises(ValueError, match=r"num_splits: 4 with deterministic"):
        flashdecode.DecodePlan(batch=1, num_heads_q=HQ, num_heads_kv=HKV, head_dim=D,
                               dtype="f16", kv_capacity=64, device="cuda", num_splits=4,
                               deterministic=True)
    assert np.isfinite(flashdecode.decode(*alone, deterministic=True).float().cpu().numpy()).all()


@pytest.mark.parametrize("d", [80, 128, 256])
def test_cuda_combine_warps_do_not_change_bits(d):
    """The combine merges a row with 1, 2 or 4 warps, chosen from the split count and the
    rows of the call (combine_kernel.cu); its sums must not depend on it. One sequence of
    30000 keys, q_len 16: alone in a 30000-key cache (15 splits: one warp a row), alone in a
    40000-key cache (20 splits, 128 rows: four warps), and third of 8 sequences in a
    40000-key cache (20 splits, 1024 rows: two warps)."""
    hq, hkv, q_len, n = 8, 2, 16, 30000
    g = torch.Generator(device=DEV).manual_seed(7)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=DEV).to(torch.bfloat16)

    q, k, v = rnd(1, q_len, hq, d), rnd(1, n, hkv, d), rnd(1, n, hkv, d)
    one = torch.tensor([n], dtype=torch.int32, device=DEV)
    out1, lse1 = flashdecode.decode(q, k, v, one, return_lse=True, deterministic=True)
    cap = 40000
    kb, vb = rnd(1, cap, hkv, d), rnd(1, cap, hkv, d)
    kb[:, :n], vb[:, :n] = k, v
    out4, lse4 = flashdecode.decode(q, kb, vb, one, return_lse=True, deterministic=True)
    lens = [cap, 1, n, 17000, 0, 39999, 2048, 5]
    qb, kb8, vb8 = rnd(8, q_len, hq, d), rnd(8, cap, hkv, d), rnd(8, cap, hkv, d)
    qb[2], kb8[2, :n], vb8[2, :n] = q[0], k[0], v[0]
    kvb = torch.tensor(lens, dtype=torch.int32, device=DEV)
    out2, lse2 = flashdecode.decode(qb, kb8, vb8, kvb, return_lse=True, deterministic=True)
    torch.cuda.synchronize()
    assert torch.isfinite(out1).all() and torch.isfinite(lse1).all()
    assert torch.equal(out4, out1), (out4.float() - out1.float()).abs().max()
    assert torch.equal(lse4, lse1)
    assert torch.equal(out2[2], out1[0]), (out2[2].float() - out1[0].float()).abs().max()
    assert torch.equal(lse2[2], lse1[0])
