"""test_tree.py — speculative-decoding tree masks from Python (CPU and CUDA): decode(tree_mask=...)
with packed and bool masks, numpy and torch, DecodePlan(tree_mask=True), the torch ops
under torch.compile, against float64 attention computed one path at a time; packing;
refusals (bad masks named, nothing written; shapes CUDA does not take named); on a GPU,
the CUDA backend against the same paths, and CUDA-graph replays that see new masks."""
import numpy as np
import pytest

import flashdecode

torch = pytest.importorskip("torch")


def random_tree(n, gen, shuffle=False):
    """bool [n, n]: row t sees t and its ancestors (EAGLE-shaped; shuffled: nodes renumbered
    so the mask is not lower-triangular)."""
    m = torch.zeros(n, n, dtype=torch.bool)
    for t in range(n):
        m[t, t] = True
        if t:
            lo = max(0, t - 6)
            m[t] |= m[lo + int(torch.randint(t - lo, (1,), generator=gen))]
    if shuffle:
        perm = torch.randperm(n, generator=gen)
        out = torch.zeros_like(m)
        out[perm[:, None], perm[None, :]] = m
        m = out
    return m


def ref_rows(q, k, v, kv_len, mask, scale=None):
    """float64 attention, each row over its prefix and the draft keys its mask row holds."""
    B, T, Hq, D = q.shape
    group = Hq // k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros(B, T, Hq, D, dtype=torch.float64)
    lse = torch.full((B, Hq, T), float("-inf"), dtype=torch.float64)
    for b in range(B):
        L = int(kv_len[b])
        for t in range(T):
            keys = [j for j in range(L) if j < L - T or bool(mask[b, t, j - (L - T)])]
            if not keys:
                continue
            kk, vv = k[b, keys].double(), v[b, keys].double()
            for h in range(Hq):
                s = (kk[:, h // group] @ q[b, t, h].double()) * scale
                out[b, t, h] = torch.softmax(s, 0) @ vv[:, h // group]
                lse[b, h, t] = torch.logsumexp(s, 0)
    return out, lse


def make(B, T, Hq, Hkv, D, kv_len, dtype=torch.float32, seed=0, shuffle=False):
    gen = torch.Generator().manual_seed(seed)
    cap = max(kv_len)
    q = (2 * torch.randn(B, T, Hq, D, generator=gen)).to(dtype)
    k = torch.randn(B, cap, Hkv, D, generator=gen).to(dtype)
    v = torch.randn(B, cap, Hkv, D, generator=gen).to(dtype)
    mask = torch.stack([random_tree(T, gen, shuffle) for _ in range(B)])
    return q, k, v, torch.tensor(kv_len, dtype=torch.int32), mask


TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("T,kv_len,dtype,shuffle", [
    (1, [50, 1], torch.float32, False),
    (17, [300, 17, 9], torch.float16, True),   # no prefix; kv_len < q_len
    (64, [1000, 64], torch.bfloat16, False),
    (64, [200, 130], torch.float32, True),
])
def test_decode_matches_paths(T, kv_len, dtype, shuffle):
    q, k, v, kvl, mask = make(len(kv_len), T, 8, 2, 64, kv_len, dtype, seed=T, shuffle=shuffle)
    out, lse = flashdecode.decode(q, k, v, kvl, tree_mask=mask, return_lse=True)
    ref, ref_lse = ref_rows(q, k, v, kvl, mask)
    assert not torch.isnan(out).any()
    err = (out.double() - ref).abs().max().item()
    assert err <= TOL[dtype], err
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max().item() < 1e-4


def test_packed_bool_numpy_plan_and_compile_agree():
    q, k, v, kvl, mask = make(3, 40, 4, 4, 32, [500, 40, 77], seed=3, shuffle=True)
    out = flashdecode.decode(q, k, v, kvl, tree_mask=mask, num_splits=5)
    packed = flashdecode.pack_tree_mask(mask)
    assert packed.dtype == torch.int64 and packed.shape == (3, 40)
    for t in range(40):
        for j in range(40):
            assert bool((int(packed[1, t]) >> j) & 1) == bool(mask[1, t, j])
    assert torch.equal(flashdecode.decode(q, k, v, kvl, tree_mask=packed, num_splits=5), out)
    npk = flashdecode.pack_tree_mask(mask.numpy())
    assert npk.dtype == np.uint64 and np.array_equal(npk.view(np.int64), packed.numpy())
    out_np = flashdecode.decode(q.numpy(), k.numpy(), v.numpy(), kvl.numpy(),
                                tree_mask=mask.numpy(), num_splits=5)
    assert np.array_equal(out_np, out.numpy())
    plan = flashdecode.DecodePlan(batch=3, q_len=40, num_heads_q=4, num_heads_kv=4,
                                  head_dim=32, dtype=torch.float32, kv_capacity=500,
                                  num_splits=5, device="cpu", tree_mask=True)
    assert plan.tree_mask
    assert torch.equal(plan.run(q, k, v, kvl, tree_mask=packed), out)
    o2 = torch.full_like(out, float("nan"))
    plan.run(q, k, v, kvl, out=o2, tree_mask=mask)
    assert torch.equal(o2, out)
    compiled = torch.compile(
        lambda *a: flashdecode.decode(*a, tree_mask=packed, num_splits=5), fullgraph=True)
    assert torch.equal(compiled(q, k, v, kvl), out)


def test_bit_63_and_broadcast():
    q, k, v, kvl, mask = make(2, 64, 2, 1, 16, [100, 90], seed=5)
    mask[1] = mask[0]
    mask[:, 63, :] = True  # the last row sees every draft: bit 63 set (int64 sign bit)
    packed = flashdecode.pack_tree_mask(mask)
    assert int(packed[0, 63]) == -1
    out = flashdecode.decode(q, k, v, kvl, tree_mask=packed)
    ref, _ = ref_rows(q, k, v, kvl, mask)
    assert (out.double() - ref).abs().max().item() < 2e-5
    one = packed[:1].expand(2, 64)  # batch stride 0: one tree for both sequences
    assert torch.equal(flashdecode.decode(q, k, v, kvl, tree_mask=one), out)


def test_chain_is_causal():
    q, k, v, kvl, _ = make(2, 16, 8, 2, 64, [400, 16], seed=7)
    chain = torch.ones(16, 16, dtype=torch.bool).tril().expand(2, 16, 16)
    for splits in (0, 1, 3):
        a = flashdecode.decode(q, k, v, kvl, tree_mask=chain, num_splits=splits)
        b = flashdecode.decode(q, k, v, kvl, num_splits=splits)
        assert torch.equal(a, b)


def test_refusals():
    q, k, v, kvl, mask = make(2, 8, 4, 2, 32, [50, 20], seed=9)
    packed = flashdecode.pack_tree_mask(mask)
    bad = packed.clone()
    bad[1, 3] &= ~(1 << 3)
    out = torch.full_like(q, float("nan"))
    with pytest.raises(flashdecode.InvalidArgumentError, match=r"tree_mask\[1\]\[3\]"):
        flashdecode.decode(q, k, v, kvl, tree_mask=bad, out=out)
    assert torch.isnan(out).all()
    bad = packed.clone()
    bad[0, 2] |= 1 << 8
    with pytest.raises(flashdecode.InvalidArgumentError, match=r"tree_mask\[0\]\[2\]"):
        flashdecode.decode(q, k, v, kvl, tree_mask=bad, out=out)
    assert torch.isnan(out).all()
    with pytest.raises(ValueError, match="tree_mask: shape"):
        flashdecode.decode(q, k, v, kvl, tree_mask=packed[:, :7])
    with pytest.raises(TypeError, match="tree_mask: dtype"):
        flashdecode.decode(q, k, v, kvl, tree_mask=packed.to(torch.int32))
    with pytest.raises(ValueError, match="q_len, q_len"):
        flashdecode.decode(q, k, v, kvl, tree_mask=mask[:, :, :7])
    with pytest.raises(flashdecode.InvalidArgumentError, match="window_left"):
        flashdecode.decode(q, k, v, kvl, tree_mask=packed, window_left=4)
    with pytest.raises(flashdecode.InvalidArgumentError, match="non_causal"):
        flashdecode.decode(q, k, v, kvl, tree_mask=packed, non_causal=True)
    if torch.cuda.is_available():  # CUDA takes fp16/bf16 trees at head_dim 64 or 128
        with pytest.raises(flashdecode.UnsupportedError, match="dtype: .* with tree_mask"):
            flashdecode.DecodePlan(batch=2, q_len=8, num_heads_q=4, num_heads_kv=2,
                                   head_dim=32, dtype=torch.float32, kv_capacity=50,
                                   device="cuda", tree_mask=True)
    plan = flashdecode.DecodePlan(batch=2, q_len=8, num_heads_q=4, num_heads_kv=2,
                                  head_dim=32, dtype=torch.float32, kv_capacity=50,
                                  device="cpu", tree_mask=True)
    with pytest.raises(ValueError, match="tree_mask: required"):
        plan.run(q, k, v, kvl)
    plain = flashdecode.DecodePlan(batch=2, q_len=8, num_heads_q=4, num_heads_kv=2,
                                   head_dim=32, dtype=torch.float32, kv_capacity=50,
                                   device="cpu")
    with pytest.raises(ValueError, match="without tree_mask=True"):
        plain.run(q, k, v, kvl, tree_mask=packed)


def test_mask_on_another_device():
    from flashdecode._tensors import Geometry, describe
    from flashdecode._tree import check_tree_mask

    g = Geometry()
    g.device, g.batch, g.q_len = "cuda:0", 1, 4
    with pytest.raises(ValueError, match="tree_mask: on cpu, expected cuda:0"):
        check_tree_mask(describe(torch.zeros(1, 4, dtype=torch.int64), "tree_mask"), g)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.cuda is not available")


@needs_cuda
@pytest.mark.parametrize("T,kv_len,Hq,Hkv,D,dtype,shuffle", [
    (8, [700, 8, 5], 32, 8, 128, torch.bfloat16, False),   # Llama-8B heads; kv_len < q_len
    (64, [3000, 64], 64, 8, 64, torch.float16, True),      # gpt-oss heads, 64 drafts
    (16, [1500], 4, 4, 128, torch.bfloat16, True),         # MHA
])
def test_cuda_matches_paths(T, kv_len, Hq, Hkv, D, dtype, shuffle):
    q, k, v, kvl, mask = make(len(kv_len), T, Hq, Hkv, D, kv_len, dtype, seed=T,
                              shuffle=shuffle)
    ref, ref_lse = ref_rows(q, k, v, kvl, mask)
    for splits in (0, 1, 5):
        out, lse = flashdecode.decode(q.cuda(), k.cuda(), v.cuda(), kvl.cuda(),
                                      tree_mask=mask.cuda(), return_lse=True,
                                      num_splits=splits)
        out, lse = out.cpu(), lse.cpu()
        assert not torch.isnan(out).any()
        err = (out.double() - ref).abs().max().item()
        assert err <= TOL[dtype], (splits, err)
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite)
        assert (lse.double()[finite] - ref_lse[finite]).abs().max().item() < 1e-3


@needs_cuda
def test_cuda_graph_replays_new_masks():
    """A captured plan.run reads the mask's current contents at each replay."""
    q, k, v, kvl, mask = make(2, 32, 32, 8, 128, [900, 400], torch.bfloat16, seed=11)
    _, _, _, _, mask2 = make(2, 32, 32, 8, 128, [900, 400], torch.bfloat16, seed=12,
                             shuffle=True)
    q, k, v, kvl = q.cuda(), k.cuda(), v.cuda(), kvl.cuda()
    packed = flashdecode.pack_tree_mask(mask.cuda())
    plan = flashdecode.DecodePlan(batch=2, q_len=32, num_heads_q=32, num_heads_kv=8,
                                  head_dim=128, dtype=torch.bfloat16, kv_capacity=900,
                                  device="cuda", tree_mask=True)
    out = torch.empty_like(q)
    plan.run(q, k, v, kvl, out=out, tree_mask=packed)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k, v, kvl, out=out, tree_mask=packed)
    for m in (mask, mask2):
        packed.copy_(flashdecode.pack_tree_mask(m.cuda()))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = ref_rows(q.cpu(), k.cpu(), v.cpu(), kvl.cpu(), m)
        assert (out.cpu().double() - ref).abs().max().item() <= TOL[torch.bfloat16]
