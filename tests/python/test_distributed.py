"""test_distributed.py — flashdecode.distributed.decode over a gloo process group
of 2-4 CPU processes, against a single-process decode of the whole cache.

Each case starts `world` processes from a forkserver that has imported torch
and flashdecode once (so a case costs well under a second after the first;
plain fork is not safe here: earlier tests have run OpenMP in this process,
and a forked child entering a parallel region can hang), joined through a
FileStore in the test's tmp folder (gloo on the loopback interface); each
builds the same seeded cache and decodes its shard through the group; rank 0
also decodes the whole cache alone. The parent checks every rank's out and lse against that, and the ranks
bitwise against each other. Skipped only when torch is missing (the
distributed API is torch's); gloo ships with every torch build.
"""
import os
import traceback
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")  # the only reason to skip: no torch
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import flashdecode  # noqa: E402
import flashdecode.distributed  # noqa: E402

# The ranks' processes come from a forkserver that imports these once (the
# first call of a torch custom op imports torch._dynamo: seconds).
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "flashdecode", "flashdecode.distributed",
           __name__]

HQ, HKV, D = 8, 2, 64
DEADLINE_S = 120  # a hung group fails the test instead of hanging it

# ---------------------------------------------------------------------------
# The cases: each returns what rank `rank` saves (its result and, on rank 0,
# the whole-cache reference).


def _cache(seed, batch, cap, dtype, q_len=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_len, HQ, D, generator=g).to(dtype)
    k = torch.randn(batch, cap, HKV, D, generator=g).to(dtype)
    v = torch.randn(batch, cap, HKV, D, generator=g).to(dtype)
    return q, k, v


def _contiguous_shard(k, v, kv_len, cuts, rank):
    """Rank `rank`'s keys: positions [cuts[b][rank], cuts[b][rank + 1]) of each sequence."""
    batch = k.shape[0]
    n = [cuts[b][rank + 1] - cuts[b][rank] for b in range(batch)]
    cap = max(1, max(n))
    ks = torch.zeros(batch, cap, HKV, D, dtype=k.dtype)
    vs = torch.zeros_like(ks)
    for b in range(batch):
        lo, hi = cuts[b][rank], cuts[b][rank + 1]
        ks[b, :hi - lo] = k[b, lo:hi]
        vs[b, :hi - lo] = v[b, lo:hi]
    return ks, vs, torch.tensor(n, dtype=torch.int32)


def _reference(q, k, v, kv_len, **kw):
    return flashdecode.decode(q, k, v, kv_len, return_lse=True, out_dtype=torch.float32, **kw)


def case_contiguous_f32(rank, world):
    # Ranges of positions; sequence 1's second half is empty on rank 1.. and
    # sequence 2 has no key at all (every rank's state empty).
    kv_len = [300, 37, 0]
    q, k, v = _cache(1, 3, 300, torch.float32)
    cuts = [[0, 120, 300], [0, 37, 37], [0, 0, 0]]
    ks, vs, n = _contiguous_shard(k, v, kv_len, cuts, rank)
    out, lse = flashdecode.distributed.decode(q, ks, vs, n, return_lse=True)
    res = {"out": out, "lse": lse}
    if rank == 0:
        res["ref_out"], res["ref_lse"] = _reference(q, k, v, torch.tensor(kv_len, dtype=torch.int32))
    return res


def case_deterministic_f32(rank, world):
    # deterministic=True on every rank: sequence 0 decoded alone through the
    # group is bitwise its row of the batched call (the batch's other
    # sequences are longer, so the automatic plans would differ).
    kv_len = [6000, 300, 5000]
    q, k, v = _cache(7, 3, 6000, torch.float32)
    cuts = [[0, 3000, 6000], [0, 100, 300], [0, 2500, 5000]]
    ks, vs, n = _contiguous_shard(k, v, kv_len, cuts, rank)
    out, lse = flashdecode.distributed.decode(q, ks, vs, n, return_lse=True, deterministic=True)
    plain, _ = flashdecode.distributed.decode(q, ks, vs, n, return_lse=True)
    # sequence 0 alone, its shard cut to its own keys (another capacity)
    cap0 = int(n[0]) if int(n[0]) > 0 else 1
    one, one_lse = flashdecode.distributed.decode(
        q[:1].contiguous(), ks[:1, :cap0].contiguous(), vs[:1, :cap0].contiguous(), n[:1].clone(),
        return_lse=True, deterministic=True)
    res = {"out": out, "lse": lse,
           "alone_equal": bool(torch.equal(one[0], out[0]) and torch.equal(one_lse[0], lse[0])),
           # the flag reached the kernels: 2048-key splits sum in another order
           "flag_changes_bits": not bool(torch.equal(plain[0], out[0]))}
    if rank == 0:
        res["ref_out"], res["ref_lse"] = _reference(q, k, v, torch.tensor(kv_len, dtype=torch.int32))
    return res


def case_paged_bf16_empty_rank(rank, world):
    # A paged pool; every sequence's pages dealt round-robin to ranks 0 and 1;
    # rank 2 holds nothing at all (kv_len_shard 0 everywhere: lse -inf).
    page, max_pages, batch = 16, 12, 2
    kv_len = [181, 40]
    g = torch.Generator().manual_seed(2)
    pool = batch * max_pages
    q = torch.randn(batch, 1, HQ, D, generator=g).to(torch.bfloat16)
    k = torch.randn(pool, page, HKV, D, generator=g).to(torch.bfloat16)
    v = torch.randn(pool, page, HKV, D, generator=g).to(torch.bfloat16)
    table = torch.randperm(pool, generator=g).view(batch, max_pages).to(torch.int32)
    shard_table = torch.zeros(batch, max_pages, dtype=torch.int32)
    n = [0] * batch
    for b in range(batch):
        pages = (kv_len[b] + page - 1) // page
        mine = [i for i in range(pages) if i % 2 == rank] if rank < 2 else []
        for j, i in enumerate(mine):
            shard_table[b, j] = table[b, i]
            n[b] += min(page, kv_len[b] - page * i)
    out, lse = flashdecode.distributed.decode(q, k, v, torch.tensor(n, dtype=torch.int32),
                                              block_table=shard_table, return_lse=True)
    res = {"out": out, "lse": lse}
    if rank == 0:
        res["ref_out"], res["ref_lse"] = _reference(q, k, v, torch.tensor(kv_len, dtype=torch.int32),
                                                    block_table=table)
    return res


def case_verify_f16_tail(rank, world):
    # q_len 3 (speculative verify), causal: the last rank holds each
    # sequence's newest keys (non_causal False), the others non_causal True.
    # Sinks (used once, on rank 0) and a soft-cap too.
    kv_len = [200, 9]
    q, k, v = _cache(3, 2, 200, torch.float16, q_len=3)
    cuts = [[0, 50, 51, 130, 200], [0, 0, 3, 3, 9]]  # ranks 0 and 2 hold nothing of sequence 1
    ks, vs, n = _contiguous_shard(k, v, kv_len, cuts, rank)
    sinks = torch.linspace(-1.0, 2.0, HQ)
    out, lse = flashdecode.distributed.decode(q, ks, vs, n, return_lse=True, sinks=sinks,
                                              logits_soft_cap=8.0,
                                              non_causal=rank != world - 1)
    res = {"out": out, "lse": lse}
    if rank == 0:
        res["ref_out"], res["ref_lse"] = _reference(q, k, v, torch.tensor(kv_len, dtype=torch.int32),
                                                    sinks=sinks, logits_soft_cap=8.0)
    return res


def case_out_given_gloo_f32(rank, world):
    # out= given (bf16 from fp32 states), check_shapes on agreeing ranks.
    kv_len = [64, 65]
    q, k, v = _cache(4, 2, 65, torch.float32)
    cuts = [[0, 64, 64], [0, 1, 65]]
    ks, vs, n = _contiguous_shard(k, v, kv_len, cuts, rank)
    out = torch.full((2, 1, HQ, D), float("nan"), dtype=torch.bfloat16)
    got = flashdecode.distributed.decode(q, ks, vs, n, out=out, check_shapes=True)
    assert got is out
    _, lse = flashdecode.distributed.decode(q, ks, vs, n, return_lse=True)
    res = {"out": out, "lse": lse}
    if rank == 0:
        res["ref_out"], res["ref_lse"] = _reference(q, k, v, torch.tensor(kv_len, dtype=torch.int32))
    return res


def case_errors(rank, world):
    # check_shapes: rank 1 has another batch -> ValueError on every rank.
    # window_left on a group of 2 -> ValueError (no communication).
    q, k, v = _cache(5, 3 if rank == 0 else 2, 16, torch.float32)
    kv = torch.full((q.shape[0],), 16, dtype=torch.int32)
    res = {}
    try:
        flashdecode.distributed.decode(q, k, v, kv, check_shapes=True)
        res["check_shapes"] = "no error"
    except ValueError as e:
        res["check_shapes"] = str(e)
    try:
        flashdecode.distributed.decode(q, k, v, kv, window_left=4)
        res["window"] = "no error"
    except ValueError as e:
        res["window"] = str(e)
    return res


CASES = {f.__name__: f for f in (case_contiguous_f32, case_paged_bf16_empty_rank,
                                 case_verify_f16_tail, case_out_given_gloo_f32, case_errors,
                                 case_deterministic_f32)}


def _worker(rank, world, case, tmp):
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "store"),
                                rank=rank, world_size=world, timeout=timedelta(seconds=60))
        try:
            res = CASES[case](rank, world)
        finally:
            dist.destroy_process_group()
    except Exception:
        res = {"error": traceback.format_exc()}
    torch.save(res, os.path.join(tmp, "rank%d.pt" % rank))


def run_group(case, world, tmp_path):
    import time

    tmp = str(tmp_path)
    import multiprocessing

    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    ctx = mp.start_processes(_worker, args=(world, case, tmp), nprocs=world, join=False,
                             start_method="forkserver")
    start = time.monotonic()
    while not ctx.join(timeout=1):
        if time.monotonic() - start > DEADLINE_S:
            for p in ctx.processes:
                p.kill()
            pytest.fail("%s: the group of %d did not finish in %d s" % (case, world, DEADLINE_S))
    results = [torch.load(os.path.join(tmp, "rank%d.pt" % r)) for r in range(world)]
    for r, res in enumerate(results):
        assert "error" not in res, "rank %d:\n%s" % (r, res["error"])
    return results


def _tol(dtype):
    # the distributed out is rounded to its dtype once; the states are fp32
    return {torch.float32: 0.0, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -10}[dtype]


@pytest.mark.parametrize("case,world", [
    ("case_contiguous_f32", 2),
    ("case_paged_bf16_empty_rank", 3),
    ("case_verify_f16_tail", 4),
    ("case_out_given_gloo_f32", 2),
    ("case_deterministic_f32", 2),
])
def test_distributed_decode_matches_whole_cache(case, world, tmp_path):
    results = run_group(case, world, tmp_path)
    ref_out, ref_lse = results[0]["ref_out"], results[0]["ref_lse"]
    for r, res in enumerate(results):
        out, lse = res["out"], res["lse"]
        assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
        err = (out.double() - ref_out.double()).abs()
        tol = 2e-6 + _tol(out.dtype) * ref_out.double().abs()
        assert bool((err <= tol).all()), "rank %d: max error %g" % (r, float(err.max()))
        empty = torch.isinf(ref_lse) & (ref_lse < 0)
        assert bool((torch.isinf(lse[empty]) & (lse[empty] < 0)).all())
        assert torch.allclose(lse[~empty], ref_lse[~empty], rtol=1e-5, atol=1e-5), "rank %d lse" % r
        # every rank merges the same gathered states: bitwise the same result
        assert torch.equal(out, results[0]["out"]) and torch.equal(lse, results[0]["lse"])
    if case == "case_deterministic_f32":  # alone = its row of the batch, bit for bit
        assert all(res["alone_equal"] for res in results)
        assert any(res["flag_changes_bits"] for res in results)
    if case == "case_contiguous_f32":  # sequence 2 has no key: out 0, lse -inf
        assert bool((results[0]["out"][2] == 0).all()) and bool(torch.isinf(results[0]["lse"][2]).all())


def test_distributed_errors(tmp_path):
    results = run_group("case_errors", 2, tmp_path)
    for r, res in enumerate(results):
        assert "check_shapes: rank" in res["check_shapes"], res["check_shapes"]
        assert "window_left: 4" in res["window"], res["window"]


def test_distributed_needs_init():
    q = torch.zeros(1, 1, HQ, D)
    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    with pytest.raises(RuntimeError, match="not initialised"):
        flashdecode.distributed.decode(q, q, q, torch.tensor([1], dtype=torch.int32))
    with pytest.raises(TypeError, match="torch tensors"):
        flashdecode.distributed.decode(q.numpy(), q, q, torch.tensor([1], dtype=torch.int32))
