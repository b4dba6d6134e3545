"""test_mla.py — MLA decode from Python (mla_decode, MLADecodePlan, mla_append_kv, the
flashdecode::mla_decode ops) against mla_attention_f64, the float64 oracle written
from flashdecode.h's definition (attention_ref.py).

Backends: the CPU backend (numpy arrays and torch CPU tensors), the float64
reference backend (the binding's private backend override), CUDA (torch tensors,
skipped without a usable GPU). Layouts: contiguous and paged (page 1, 16, 64), two
buffers and the one 576-wide buffer of vLLM / FlashMLA sliced into two views; q_len
1..16 (and the 3-D q of q_len 1); forced split counts; fp8 latent caches (per-tensor
and per-token scales, the rope part fp8 or 16-bit); lse, out= and out_dtype; bad
arguments (the message names the argument, out is left as it was); torch.compile;
plan reuse; merge_states on MLA states; append_kv for the latent cache.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import flashdecode
from flashdecode import _core, _lib
from flashdecode._api import Fp8Args
from flashdecode._mla import required_scale
from flashdecode._mla_api import _mla_decode_numpy
from attention_ref import (assert_lse_close, assert_out_close, merge_states_f64,
                           mla_attention_f64)

try:
    import torch
except ImportError:
    torch = None
else:
    flashdecode._api.load_torch_ops()  # torch.ops.flashdecode.* before any eager call

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")
SCALE = 192 ** -0.5  # DeepSeek-V3: 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)
HAS_CUDA = (torch is not None and torch.cuda.is_available()
            and flashdecode.backend_available("cuda"))
BACKENDS = ["reference", "cpu"]


# ---- cases ---------------------------------------------------------------------------------------
class Case:
    """Random MLA inputs (numpy, float32 unless dtype says) and their layout.

    page 0: contiguous caches [batch, cap, D] / [batch, cap, R]; else paged, the pages of
    the sequences shuffled in a pool with spare pages. combined: one [.., D + R] buffer
    (vLLM / FlashMLA) sliced into the two caches; else two buffers."""

    def __init__(self, *, batch=3, q_len=1, hq=16, d=512, r=64, kv_len=(100, 37, 1), cap=112,
                 page=0, combined=False, dtype=np.float32, seed=0):
        rng = np.random.default_rng(seed)
        self.kv_len = np.array(kv_len[:batch], dtype=np.int32)
        self.q_nope = rng.standard_normal((batch, q_len, hq, d)).astype(dtype)
        self.q_pe = rng.standard_normal((batch, q_len, hq, r)).astype(dtype)
        if page:
            per = -(-cap // page)
            num_pages = batch * per + 3
            order = rng.permutation(num_pages)[:batch * per]
            self.block_table = order.reshape(batch, per).astype(np.int32)
            lead = (num_pages, page)
        else:
            self.block_table = None
            lead = (batch, cap)
        if combined:
            self.kv = rng.standard_normal(lead + (d + r,)).astype(dtype)
            self.ckv, self.kpe = self.kv[..., :d], self.kv[..., d:]
        else:
            self.ckv = rng.standard_normal(lead + (d,)).astype(dtype)
            self.kpe = rng.standard_normal(lead + (r,)).astype(dtype)

    def poison_unused(self):
        """NaN in every cache row no query may read (past kv_len, spare pages): a row that
        reads one turns NaN, which the oracle never has."""
        for cache in (self.ckv, self.kpe):
            if self.block_table is None:
                for b, n in enumerate(self.kv_len):
                    cache[b, n:] = np.nan
                continue
            page = cache.shape[1]
            used = np.zeros(cache.shape[:2], dtype=bool)
            for b, n in enumerate(self.kv_len):
                for j in range(int(n)):
                    used[self.block_table[b, j // page], j % page] = True
            cache[~used] = np.nan
        return self

    def args(self):
        return self.q_nope, self.q_pe, self.ckv, self.kpe, self.kv_len

    def want(self, ckv=None, kpe=None):
        return mla_attention_f64(self.q_nope, self.q_pe, self.ckv if ckv is None else ckv,
                                 self.kpe if kpe is None else kpe, self.kv_len, self.block_table,
                                 SCALE)


def run_numpy(backend, q_nope, q_pe, ckv, kpe, kv_len, *, block_table=None, num_splits=0,
              return_lse=True, out=None, out_dtype=None, kv_dtype=None, k_scale=None,
              deterministic=False, softmax_scale=SCALE):
    """mla_decode on numpy arrays, on the CPU backend or the float64 reference backend."""
    if backend == "cpu":
        return flashdecode.mla_decode(q_nope, q_pe, ckv, kpe, kv_len, block_table=block_table,
                                      softmax_scale=softmax_scale, num_splits=num_splits,
                                      return_lse=return_lse, out=out, out_dtype=out_dtype,
                                      kv_dtype=kv_dtype, k_scale=k_scale,
                                      deterministic=deterministic)
    return _mla_decode_numpy(q_nope, q_pe, ckv, kpe, kv_len, block_table,
                             required_scale(softmax_scale), num_splits, return_lse, out,
                             _core.Variants(deterministic=deterministic), out_dtype,
                             Fp8Args(kv_dtype, k_scale, None), backend=_lib.FD_BACKEND_REFERENCE)


def poisoned(shape, dtype=np.float32):
    return np.full(shape, np.nan, dtype=dtype)


# ---- against the oracle --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page", [0, 1, 16, 64])
@pytest.mark.parametrize("combined", [False, True], ids=["two-buffers", "one-576-buffer"])
@pytest.mark.parametrize("q_len", [1, 3, 16])
def test_matches_reference(backend, page, combined, q_len):
    c = Case(q_len=q_len, page=page, combined=combined, kv_len=(100, 37, q_len),
             seed=page + q_len).poison_unused()
    out = poisoned(c.q_nope.shape)
    got, lse = run_numpy(backend, *c.args(), block_table=c.block_table, out=out)
    assert got is out
    want, want_lse = c.want()
    assert_out_close(got, want, "float32")
    assert_lse_close(lse, want_lse)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_splits", [1, 2, 7, 100])
def test_forced_splits(backend, num_splits):
    c = Case(q_len=2, hq=8, kv_len=(300, 129, 2), cap=320, page=16, seed=num_splits)
    c.poison_unused()
    got, lse = run_numpy(backend, *c.args(), block_table=c.block_table, num_splits=num_splits)
    want, want_lse = c.want()
    assert_out_close(got, want, "float32")
    assert_lse_close(lse, want_lse)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d,r,hq", [(448, 64, 16), (64, 16, 1), (40, 8, 128), (512, 64, 3)])
def test_other_widths_and_head_counts(backend, d, r, hq):
    c = Case(q_len=2, hq=hq, d=d, r=r, kv_len=(70, 2, 9), cap=80, seed=d + r + hq)
    got, lse = run_numpy(backend, *c.args())
    want, want_lse = c.want()
    assert_out_close(got, want, "float32")
    assert_lse_close(lse, want_lse)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float16_and_float32_out(backend):
    c = Case(q_len=4, dtype=np.float16, page=16, kv_len=(90, 17, 4), seed=5)
    got = run_numpy(backend, *c.args(), block_table=c.block_table, return_lse=False)
    want, _ = c.want()
    assert got.dtype == np.float16
    assert_out_close(got, want, "float16")
    got32 = run_numpy(backend, *c.args(), block_table=c.block_table, return_lse=False,
                      out_dtype="float32")
    assert got32.dtype == np.float32
    assert_out_close(got32, want, "float32")


@pytest.mark.parametrize("backend", BACKENDS)
def test_three_dimensional_q_and_lse(backend):
    c = Case(q_len=1, seed=11)
    q3, p3 = c.q_nope[:, 0], c.q_pe[:, 0]
    out = poisoned(q3.shape)
    got, lse = run_numpy(backend, q3, p3, c.ckv[:, :, None], c.kpe, c.kv_len, out=out)
    assert got.shape == q3.shape and lse.shape == (3, 16)
    want, want_lse = c.want()
    assert_out_close(got, want[:, 0], "float32")
    assert_lse_close(lse, want_lse[:, :, 0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_q_and_out_and_empty_rows(backend):
    """q_nope / q_pe as views of one [.., 576] projection, out a view of a wider buffer
    (guards around it stay NaN), a sequence with kv_len 0 (out 0, lse -inf)."""
    c = Case(q_len=2, hq=4, kv_len=(50, 0, 2), cap=64, seed=3)
    rng = np.random.default_rng(9)
    q = rng.standard_normal((3, 2, 4, 576)).astype(np.float32)
    c.q_nope, c.q_pe = q[..., :512], q[..., 512:]
    big = poisoned((3, 2, 4, 600))
    got, lse = run_numpy(backend, *c.args(), out=big[..., 8:520])
    want, want_lse = c.want()
    assert_out_close(got, want, "float32")
    assert_lse_close(lse, want_lse)
    assert np.isnan(big[..., :8]).all() and np.isnan(big[..., 520:]).all()
    assert (got[1] == 0).all() and np.isneginf(lse[1]).all()


def test_cpu_and_reference_agree_and_are_reproducible():
    c = Case(q_len=5, page=64, combined=True, kv_len=(200, 65, 5), cap=256, seed=21)
    a, la = run_numpy("cpu", *c.args(), block_table=c.block_table)
    b, lb = run_numpy("cpu", *c.args(), block_table=c.block_table)
    assert np.array_equal(a, b) and np.array_equal(la, lb)
    r, lr = run_numpy("reference", *c.args(), block_table=c.block_table)
    assert_out_close(a, r.astype(np.float64), "float32")
    assert_lse_close(la, lr.astype(np.float64))


def test_deterministic_is_batch_invariant():
    c = Case(q_len=2, hq=8, kv_len=(2500, 700, 2), cap=2600, page=64, seed=4)
    full, lse = run_numpy("cpu", *c.args(), block_table=c.block_table, deterministic=True)
    one, lse1 = run_numpy("cpu", c.q_nope[1:2], c.q_pe[1:2], c.ckv, c.kpe, c.kv_len[1:2],
                          block_table=c.block_table[1:2], deterministic=True)
    assert np.array_equal(full[1:2], one) and np.array_equal(lse[1:2], lse1)
    with pytest.raises(ValueError, match="num_splits"):
        run_numpy("cpu", *c.args(), block_table=c.block_table, deterministic=True, num_splits=2)


class _Foreign:
    """An array known only through DLPack (stands in for another framework's arrays)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_foreign_arrays():
    c = Case(q_len=2, hq=4, page=16, combined=True, kv_len=(50, 2, 17), cap=64, seed=15)
    args = [_Foreign(np.ascontiguousarray(x)) for x in c.args()]
    bt = _Foreign(c.block_table)
    out, lse = flashdecode.mla_decode(*args, block_table=bt, softmax_scale=SCALE,
                                      return_lse=True)
    want, want_lse = c.want()
    assert_out_close(out, want, "float32")
    assert_lse_close(lse, want_lse)
    plan = flashdecode.MLADecodePlan(batch=3, q_len=2, num_heads_q=4, dtype="f32",
                                     softmax_scale=SCALE, device="cpu", page_size=16,
                                     max_pages_per_seq=c.block_table.shape[1])
    out2 = poisoned(out.shape)
    assert plan.run(*args, bt, out=out2) is out2
    assert_out_close(out2, want, "float32")


# ---- fp8 -----------------------------------------------------------------------------------------
def fp8_cache(x, scale_shape, rng, fp8=None):
    """x quantized to e4m3 (through torch) with random scales of scale_shape (() = none);
    returns (codes as uint8 numpy, scales float32 or None, the dequantized float64)."""
    if scale_shape == ():
        s = None
        q = torch.from_numpy(np.ascontiguousarray(np.clip(x, -448, 448))).to(torch.float8_e4m3fn)
        return q.view(torch.uint8).numpy(), None, q.double().numpy()
    s = (rng.uniform(0.5, 2.0, scale_shape) * np.abs(x).max() / 448).astype(np.float32)
    sx = s if s.ndim == 0 or s.shape == (1,) else s[..., None]
    q = torch.from_numpy(np.ascontiguousarray(np.clip(x / sx, -448, 448))).to(torch.float8_e4m3fn)
    return q.view(torch.uint8).numpy(), s, q.double().numpy() * sx.astype(np.float64)


@needs_torch
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gran", ["none", "tensor", "token"])
@pytest.mark.parametrize("rope", ["fp8", "16-bit"])
@pytest.mark.parametrize("page", [0, 16])
def test_fp8_latent(backend, gran, rope, page):
    c = Case(q_len=2, dtype=np.float16, page=page, kv_len=(100, 37, 2), seed=7)
    rng = np.random.default_rng(8)
    lead = c.ckv.shape[:2]
    shape = {"none": (), "tensor": (1,), "token": lead}[gran]
    ckv, scale, ckv_d = fp8_cache(c.ckv.astype(np.float64), shape, rng)
    if rope == "fp8":
        sx = 1.0 if scale is None else (scale if gran == "tensor" else scale[..., None])
        x = np.clip(c.kpe / sx, -448, 448)
        q = torch.from_numpy(np.ascontiguousarray(x)).to(torch.float8_e4m3fn)
        kpe, kpe_d = q.view(torch.uint8).numpy(), q.double().numpy() * sx
    else:
        kpe, kpe_d = c.kpe, c.kpe.astype(np.float64)
    got, lse = run_numpy(backend, *c.args()[:2], ckv, kpe, c.kv_len, block_table=c.block_table,
                         kv_dtype="e4m3", k_scale=scale)
    want, want_lse = c.want(ckv_d, kpe_d)
    assert_out_close(got, want, "float16")
    assert_lse_close(lse, want_lse, atol=2e-3)


@needs_torch
def test_fp8_torch_float8_with_head_dim_scales():
    """torch.float8_e4m3fn caches (no kv_dtype), per-token scales given as [.., pos, 1],
    the 16-bit rope part beside them (FlashMLA's layout)."""
    c = Case(q_len=1, dtype=np.float32, seed=12)
    rng = np.random.default_rng(1)
    ckv, scale, ckv_d = fp8_cache(c.ckv.astype(np.float64), c.ckv.shape[:2], rng)
    q_nope = torch.from_numpy(c.q_nope).bfloat16()
    q_pe = torch.from_numpy(c.q_pe).bfloat16()
    kpe = torch.from_numpy(c.kpe).bfloat16()
    got = flashdecode.mla_decode(q_nope, q_pe,
                                 torch.from_numpy(ckv).view(torch.float8_e4m3fn)[:, :, None],
                                 kpe, torch.from_numpy(c.kv_len), softmax_scale=SCALE,
                                 k_scale=torch.from_numpy(scale)[..., None])
    want, _ = mla_attention_f64(q_nope.double().numpy(), q_pe.double().numpy(), ckv_d,
                                kpe.double().numpy(), c.kv_len, None, SCALE)
    assert_out_close(got.double().numpy(), want, "bfloat16")


# ---- errors --------------------------------------------------------------------------------------
BAD = [
    ("q_pe dtype", lambda a: {"q_pe": a["q_pe"].astype(np.float16)}, TypeError, r"^q_pe: dtype"),
    ("q_pe rows", lambda a: {"q_pe": a["q_pe"][:, :, :8]}, ValueError, r"^q_pe: shape"),
    ("q_pe rank", lambda a: {"q_pe": a["q_pe"][:, 0]}, ValueError, r"^q_pe: expected 4"),
    ("q_nope rank", lambda a: {"q_nope": a["q_nope"][0, 0, 0]}, ValueError, r"^q_nope: expected"),
    ("q_nope int", lambda a: {"q_nope": a["q_nope"].astype(np.int32)}, TypeError,
     r"^q_nope: dtype int32"),
    ("ckv width", lambda a: {"ckv_cache": a["ckv_cache"][..., :256]}, ValueError,
     r"^ckv_cache: D = 256"),
    ("kpe width", lambda a: {"kpe_cache": a["kpe_cache"][..., :32]}, ValueError,
     r"^kpe_cache: R = 32"),
    ("kpe capacity", lambda a: {"kpe_cache": a["kpe_cache"][:, :50]}, ValueError,
     r"^kpe_cache: shape"),
    ("two kv heads", lambda a: {"ckv_cache": np.stack([a["ckv_cache"]] * 2, axis=2)},
     ValueError, r"^ckv_cache: dimension 2 is 2"),
    ("ckv dtype", lambda a: {"ckv_cache": a["ckv_cache"].astype(np.float16)}, TypeError,
     r"^ckv_cache: dtype float16"),
    ("kpe dtype", lambda a: {"kpe_cache": a["kpe_cache"].astype(np.float16)}, TypeError,
     r"^kpe_cache: dtype float16"),
    ("ckv batch", lambda a: {"ckv_cache": a["ckv_cache"][:2], "kpe_cache": a["kpe_cache"][:2]},
     ValueError, r"^ckv_cache: batch dimension 2"),
    ("column stride", lambda a: {"ckv_cache": a["ckv_cache"][..., ::2],
                                 "q_nope": a["q_nope"][..., ::2]}, ValueError,
     r"^q_nope: the head_dim dimension must be unit-stride"),
    ("kv_len shape", lambda a: {"kv_len": a["kv_len"][:2]}, ValueError, r"^kv_len: shape"),
    ("kv_len float", lambda a: {"kv_len": a["kv_len"].astype(np.float32)}, TypeError,
     r"^kv_len: dtype"),
    ("out shape", lambda a: {"out": a["out"][:, :, :8]}, ValueError, r"^out: shape"),
    ("out dtype", lambda a: {"out": a["out"].astype(np.float16)}, TypeError, r"^out: dtype"),
    ("no scale", lambda a: {"softmax_scale": None}, ValueError, r"^softmax_scale: required"),
    ("zero scale", lambda a: {"softmax_scale": 0.0}, ValueError, r"^softmax_scale: 0 is not supported; MLA needs the scale"),
    ("k_scale 16-bit", lambda a: {"k_scale": 0.5}, ValueError,
     r"^k_scale: scales apply to an fp8 cache"),
    ("block_table dtype", lambda a: {"block_table": np.zeros((3, 7), np.float32)}, TypeError,
     r"^block_table: dtype"),
    ("kv_len too long", lambda a: {"kv_len": np.array([113, 1, 1], np.int32)}, ValueError,
     r"kv_len\[0\]: 113"),
    ("q_len 17", lambda a: {"q_nope": np.repeat(a["q_nope"], 17, 1),
                            "q_pe": np.repeat(a["q_pe"], 17, 1),
                            "out": np.repeat(a["out"], 17, 1),
                            "kv_len": np.array([100, 37, 17], np.int32)},
     ValueError, r"q_len"),
]


@pytest.mark.parametrize("label,mutate,exc,pattern", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_are_named_and_nothing_is_written(label, mutate, exc, pattern):
    c = Case(seed=2)
    kw = dict(q_nope=c.q_nope, q_pe=c.q_pe, ckv=c.ckv, kpe=c.kpe, kv_len=c.kv_len,
              out=poisoned(c.q_nope.shape), softmax_scale=SCALE)
    kw.update({{"ckv_cache": "ckv", "kpe_cache": "kpe"}.get(k, k): v
               for k, v in mutate(dict(kw, ckv_cache=c.ckv, kpe_cache=c.kpe)).items()})
    out = kw["out"]
    with pytest.raises(exc, match=pattern):
        run_numpy("cpu", **kw)
    assert np.isnan(out).all()


def test_softmax_scale_is_keyword_and_required():
    c = Case(batch=1, hq=1, d=8, r=4, kv_len=(3,), cap=4)
    with pytest.raises(TypeError, match="softmax_scale"):
        flashdecode.mla_decode(*c.args())
    with pytest.raises(TypeError):
        flashdecode.mla_decode(*c.args(), None, SCALE)


def test_paged_errors():
    c = Case(page=16, seed=6)
    out = poisoned(c.q_nope.shape)
    bad = c.block_table.copy()
    bad[0, 0] = 10_000
    with pytest.raises(ValueError, match=r"block_table"):
        run_numpy("cpu", *c.args(), block_table=bad, out=out)
    with pytest.raises(ValueError, match=r"^ckv_cache: batch dimension"):
        run_numpy("reference", *c.args(), out=out)  # paged caches without block_table
    assert np.isnan(out).all()


# ---- merge_states on MLA states ------------------------------------------------------------------
def test_merge_states_of_two_key_ranges():
    """Keys 0..n1-1 and n1..kv_len-1 of one sequence decoded apart, then merged: the
    states are [.., 512] wide (MLA's head_dim)."""
    backend = "cpu"
    c = Case(batch=2, q_len=1, kv_len=(100, 60), cap=112, seed=14)
    n1 = 40
    o1, l1 = run_numpy(backend, c.q_nope, c.q_pe, c.ckv[:, :n1], c.kpe[:, :n1],
                       np.full(2, n1, np.int32))
    o2, l2 = run_numpy(backend, c.q_nope, c.q_pe, c.ckv[:, n1:], c.kpe[:, n1:], c.kv_len - n1)
    out, lse = flashdecode.merge_states(np.stack([o1, o2]), np.stack([l1, l2]))
    want, want_lse = c.want()
    assert_out_close(out, want, "float32")
    assert_lse_close(lse, want_lse)
    ref_out, ref_lse = merge_states_f64(np.stack([o1, o2]), np.stack([l1, l2]))
    assert_out_close(out, ref_out, "float32")


# ---- plan ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", [0, 64])
def test_plan_reuse_over_layers(page):
    layers = [Case(q_len=2, page=page, combined=True, kv_len=(150, 2, 77), cap=160, seed=30 + i)
              for i in range(3)]
    c0 = layers[0]
    plan = flashdecode.MLADecodePlan(
        batch=3, q_len=2, num_heads_q=16, dtype="f32", softmax_scale=SCALE, device="cpu",
        kv_capacity=None if page else 160, page_size=page,
        max_pages_per_seq=0 if not page else c0.block_table.shape[1])
    assert plan.head_dim == 512 and plan.rope_dim == 64 and plan.rope_dtype == "float32"
    assert "MLADecodePlan(" in repr(plan)
    for c in layers:
        c.block_table = None if not page else c0.block_table
        out = poisoned(c.q_nope.shape)
        lse = np.full((3, 16, 2), np.nan, np.float32)
        got = plan.run(*c.args(), c.block_table, out=out, lse=lse)
        assert got is out
        want, want_lse = c.want()
        assert_out_close(out, want, "float32")
        assert_lse_close(lse, want_lse)
        again = flashdecode.mla_decode(*c.args(), block_table=c.block_table,
                                       softmax_scale=SCALE, num_splits=plan.num_splits)
        assert_out_close(again, want, "float32")


def test_plan_refuses_what_it_was_not_made_for():
    c = Case(q_len=1, seed=40)
    plan = flashdecode.MLADecodePlan(batch=3, num_heads_q=16, dtype=np.float32,
                                     softmax_scale=SCALE, device="cpu", kv_capacity=112)
    out = poisoned(c.q_nope.shape)
    with pytest.raises(ValueError, match=r"^q_nope: \[batch"):
        plan.run(c.q_nope[:2], c.q_pe[:2], c.ckv[:2], c.kpe[:2], c.kv_len[:2])
    with pytest.raises(ValueError, match=r"^ckv_cache: capacity 50"):
        plan.run(*c.args()[:2], c.ckv[:, :50], c.kpe[:, :50], np.minimum(c.kv_len, 50), out=out)
    with pytest.raises(ValueError, match=r"^block_table: given"):
        plan.run(*c.args(), np.zeros((3, 2), np.int32), out=out)
    assert np.isnan(out).all()
    with pytest.raises(ValueError, match=r"^softmax_scale: required"):
        flashdecode.MLADecodePlan(batch=1, num_heads_q=16, dtype="bf16", softmax_scale=None,
                                  device="cpu", kv_capacity=64)
    with pytest.raises(TypeError, match=r"^rope_dtype"):
        flashdecode.MLADecodePlan(batch=1, num_heads_q=16, dtype="bf16", softmax_scale=SCALE,
                                  device="cpu", kv_capacity=64, rope_dtype="f16")


@needs_torch
@pytest.mark.parametrize("rope", ["fp8", "16-bit"])
def test_plan_fp8_token_scales_over_layers(rope):
    """An fp8 plan (per-token scales, the rope part fp8 or bf16) run for two layers of the
    same signature (the second through the plan's checked-call cache): each layer's caches
    and scales are the ones read."""
    rng = np.random.default_rng(90)
    plan = flashdecode.MLADecodePlan(batch=3, q_len=2, num_heads_q=16, dtype=torch.bfloat16,
                                     softmax_scale=SCALE, device="cpu", page_size=16,
                                     max_pages_per_seq=7, kv_dtype="e4m3", kv_scale="token",
                                     rope_dtype=None if rope == "fp8" else torch.bfloat16)
    assert plan.rope_dtype == ("float8_e4m3fn" if rope == "fp8" else "bfloat16")
    for layer in range(2):
        c = Case(q_len=2, page=16, kv_len=(100, 37, 2), seed=91 + layer)
        ckv, scale, ckv_d = fp8_cache(c.ckv.astype(np.float64), c.ckv.shape[:2], rng)
        ckv = torch.from_numpy(ckv).view(torch.float8_e4m3fn)
        if rope == "fp8":
            x = np.clip(c.kpe / scale[..., None], -448, 448)
            kpe = torch.from_numpy(np.ascontiguousarray(x)).to(torch.float8_e4m3fn)
            kpe_d = kpe.double().numpy() * scale[..., None]
        else:
            kpe = torch.from_numpy(c.kpe).bfloat16()
            kpe_d = kpe.double().numpy()
        q, p = torch.from_numpy(c.q_nope).bfloat16(), torch.from_numpy(c.q_pe).bfloat16()
        out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16)
        plan.run(q, p, ckv, kpe, torch.from_numpy(c.kv_len), torch.from_numpy(c.block_table),
                 out=out, k_scale=torch.from_numpy(scale))
        want, _ = mla_attention_f64(q.double().numpy(), p.double().numpy(), ckv_d, kpe_d,
                                    c.kv_len, c.block_table, SCALE)
        assert_out_close(out.double().numpy(), want, "bfloat16")
    assert len(plan._checked) == 1
    with pytest.raises(TypeError, match=r"^kpe_cache: element type"):
        plan.run(q, p, ckv, kpe.to(torch.float8_e4m3fn) if rope == "16-bit" else kpe.bfloat16(),
                 torch.from_numpy(c.kv_len), torch.from_numpy(c.block_table), out=out,
                 k_scale=torch.from_numpy(scale))


# ---- torch -------------------------------------------------------------------------------------
def torch_case(c, dtype):
    t = lambda x: None if x is None else torch.from_numpy(np.ascontiguousarray(x))
    kv = t(c.kv).to(dtype) if hasattr(c, "kv") else None
    if kv is not None:
        d = c.ckv.shape[-1]
        ckv, kpe = kv[..., :d], kv[..., d:]
    else:
        ckv, kpe = t(c.ckv).to(dtype), t(c.kpe).to(dtype)
    return (t(c.q_nope).to(dtype), t(c.q_pe).to(dtype), ckv, kpe, t(c.kv_len),
            t(c.block_table))


def want_of(tensors):
    q, p, ckv, kpe, kv_len, bt = (None if x is None else x.cpu() for x in tensors)
    return mla_attention_f64(q.double().numpy(), p.double().numpy(), ckv.double().numpy(),
                             kpe.double().numpy(), kv_len.numpy(),
                             None if bt is None else bt.numpy(), SCALE)


@needs_torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_torch_cpu(dtype):
    c = Case(q_len=3, page=16, combined=True, kv_len=(90, 3, 40), seed=50)
    q, p, ckv, kpe, kv_len, bt = torch_case(c, getattr(torch, dtype))
    assert not ckv.is_contiguous()
    out, lse = flashdecode.mla_decode(q, p, ckv, kpe, kv_len, block_table=bt,
                                      softmax_scale=SCALE, return_lse=True)
    want, want_lse = want_of((q, p, ckv, kpe, kv_len, bt))
    assert out.dtype == q.dtype and lse.shape == (3, 16, 3)
    assert_out_close(out.double().numpy(), want, dtype)
    assert_lse_close(lse.numpy(), want_lse)


@needs_torch
def test_torch_compile_and_opcheck():
    c = Case(q_len=2, hq=8, page=16, combined=True, kv_len=(60, 2, 33), cap=64, seed=51)
    q, p, ckv, kpe, kv_len, bt = torch_case(c, torch.float32)
    want, want_lse = flashdecode.mla_decode(q, p, ckv, kpe, kv_len, block_table=bt,
                                            softmax_scale=SCALE, return_lse=True)

    def step(q, p, kv, kv_len, bt, out):
        o, lse = flashdecode.mla_decode(q * 1.0, p, kv[..., :512], kv[..., 512:], kv_len,
                                        block_table=bt, softmax_scale=SCALE, return_lse=True)
        flashdecode.mla_decode(q, p, kv[..., :512], kv[..., 512:], kv_len, block_table=bt,
                               softmax_scale=SCALE, out=out)
        return o + 0.0, lse

    out = torch.empty_like(q)
    kv = torch.from_numpy(c.kv)
    assert torch.equal(kv[..., :512], ckv) and torch.equal(kv[..., 512:], kpe)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got, got_lse = compiled(q, p, kv, kv_len, bt, out)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(got_lse, want_lse, rtol=0, atol=0)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.library.opcheck(torch.ops.flashdecode.mla_decode.default,
                          (q, p, ckv, kpe, kv_len, bt, SCALE, 0, True))
    lse = torch.empty(3, 8, 2)
    torch.library.opcheck(torch.ops.flashdecode.mla_decode_out.default,
                          (q, p, ckv, kpe, kv_len, bt, torch.empty_like(q), lse, SCALE, 0))


@needs_torch
def test_torch_three_dimensional_q_compiled():
    """FlashInfer's [B, Hq, D] queries (q_len 1) through the op, eager and compiled."""
    c = Case(q_len=1, hq=8, seed=52)
    q, p = torch.from_numpy(c.q_nope[:, 0]), torch.from_numpy(c.q_pe[:, 0])
    ckv, kpe, kv_len = torch.from_numpy(c.ckv), torch.from_numpy(c.kpe), torch.from_numpy(c.kv_len)

    def step(q, p, ckv, kpe, kv_len):
        return flashdecode.mla_decode(q, p, ckv, kpe, kv_len, softmax_scale=SCALE,
                                      return_lse=True)

    out, lse = step(q, p, ckv, kpe, kv_len)
    assert out.shape == (3, 8, 512) and lse.shape == (3, 8)
    want, want_lse = c.want()
    assert_out_close(out.numpy(), want[:, 0], "float32")
    assert_lse_close(lse.numpy(), want_lse[:, :, 0])
    got, got_lse = torch.compile(step, fullgraph=True, backend="aot_eager")(q, p, ckv, kpe,
                                                                            kv_len)
    assert torch.equal(got, out) and torch.equal(got_lse, lse)


@needs_torch
def test_torch_compile_as_the_first_call():
    """A fresh process whose first flashdecode call is a compiled mla_decode (flashdecode
    imported before torch: the ops register on that first, traced, call)."""
    code = ("import flashdecode, torch\n"
            "q = torch.randn(2, 1, 4, 32).bfloat16(); p = torch.randn(2, 1, 4, 8).bfloat16()\n"
            "kv = torch.randn(2, 16, 40).bfloat16(); n = torch.tensor([3, 16], dtype=torch.int32)\n"
            "f = lambda q, p, kv, n: flashdecode.mla_decode(q, p, kv[..., :32], kv[..., 32:], n,\n"
            "                                               softmax_scale=0.1)\n"
            "step = torch.compile(f, fullgraph=True, backend='eager')\n"
            "for _ in range(2):\n"
            "    assert torch.equal(step(q, p, kv, n), f(q, p, kv, n))\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in sys.path if x)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]


@needs_torch
def test_torch_errors_name_the_argument():
    c = Case(q_len=1, hq=4, seed=53)
    q, p, ckv, kpe, kv_len, _ = torch_case(c, torch.float32)
    out = torch.full_like(q, float("nan"))
    for bad, pattern in (((q[0, 0], p[0, 0]), r"^q_nope: expected"),
                         ((q, p.double()), r"^q_pe: dtype float64"),
                         ((q, p[:, :, :2]), r"^q_pe: shape")):
        with pytest.raises((TypeError, ValueError), match=pattern):
            flashdecode.mla_decode(*bad, ckv, kpe, kv_len, softmax_scale=SCALE,
                                   return_lse=True)
        with pytest.raises((TypeError, ValueError), match=pattern):
            flashdecode.mla_decode(*bad, ckv, kpe, kv_len, softmax_scale=SCALE,
                                   return_lse=True, out=out)
    with pytest.raises(TypeError, match=r"^kpe_cache: expected a torch.Tensor"):
        flashdecode.mla_decode(q, p, ckv, kpe.numpy(), kv_len, softmax_scale=SCALE)
    assert torch.isnan(out).all()


@needs_torch
def test_torch_fake_checks_name_the_argument():
    """The fake implementation (what torch.compile runs) refuses what the real one does."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 1, 16, 512, dtype=torch.bfloat16)
        p = torch.empty(2, 1, 16, 64, dtype=torch.bfloat16)
        kv = torch.empty(2, 32, 1, 576, dtype=torch.bfloat16)
        n = torch.empty(2, dtype=torch.int32)
        out, lse = torch.ops.flashdecode.mla_decode(q, p, kv[..., :512], kv[..., 512:], n, None,
                                                    SCALE, 0, True)
        assert out.shape == q.shape and lse.shape == (2, 16, 1)
        with pytest.raises(ValueError, match=r"^kpe_cache: R = 32"):
            torch.ops.flashdecode.mla_decode(q, p, kv[..., :512], kv[..., 512:544], n, None,
                                             SCALE, 0, False)


@pytest.mark.skipif(not HAS_CUDA, reason="no usable CUDA device")
@pytest.mark.parametrize("page", [0, 1, 64])
@pytest.mark.parametrize("q_len", [1, 2, 16])
@pytest.mark.parametrize("hq", [16, 128])
def test_cuda_bf16(page, q_len, hq):
    c = Case(q_len=q_len, hq=hq, page=page, combined=True, kv_len=(300, q_len, 77), cap=320,
             seed=page + q_len + hq)
    tensors = [None if x is None else x.cuda() for x in torch_case(c, torch.bfloat16)]
    q, p, ckv, kpe, kv_len, bt = tensors
    out = torch.full_like(q, float("nan"))
    got, lse = flashdecode.mla_decode(q, p, ckv, kpe, kv_len, block_table=bt,
                                      softmax_scale=SCALE, return_lse=True, out=out)
    want, want_lse = want_of(tensors)
    assert_out_close(got.double().cpu().numpy(), want, "bfloat16")
    assert_lse_close(lse.cpu().numpy(), want_lse, atol=2e-3)
    plan = flashdecode.MLADecodePlan(batch=3, q_len=q_len, num_heads_q=hq, dtype=torch.bfloat16,
                                     softmax_scale=SCALE, device="cuda",
                                     kv_capacity=None if page else 320, page_size=page,
                                     max_pages_per_seq=0 if bt is None else bt.shape[1])
    out2 = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    plan.run(q, p, ckv, kpe, kv_len, bt, out=out2)  # warm-up outside the capture
    with torch.cuda.graph(graph):
        plan.run(q, p, ckv, kpe, kv_len, bt, out=out2)
    out2.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_out_close(out2.double().cpu().numpy(), want, "bfloat16")


def _fp8_caches(device, rope, gran, rng):
    """e4m3 latent caches (rope part fp8 or bf16) of 3 paged sequences, written by
    mla_append_kv on ``device`` from the same bf16 rows; (ckv, kpe, scales, kv_len, bt)."""
    B, page, per = 3, 64, 5
    kv_len = torch.tensor([300, 2, 129], dtype=torch.int32)
    bt = torch.from_numpy(rng.permutation(B * per + 2)[:B * per].reshape(B, per)).int()
    pool = (B * per + 2, page)
    ckv = torch.zeros(*pool, 512, dtype=torch.float8_e4m3fn)
    kpe = torch.zeros(*pool, 64, dtype=torch.float8_e4m3fn if rope == "fp8" else torch.bfloat16)
    scales = torch.ones(*pool) if gran == "token" else torch.tensor([0.02])
    L = int(kv_len.max())
    new_c = torch.from_numpy(rng.standard_normal((B, L, 512))).bfloat16()
    new_p = torch.from_numpy(rng.standard_normal((B, L, 64))).bfloat16()
    ckv, kpe, scales, bt, new_c, new_p = (x.to(device) for x in (ckv, kpe, scales, bt, new_c,
                                                                 new_p))
    for b in range(B):  # every sequence's keys, one append a sequence
        n = int(kv_len[b])
        flashdecode.mla_append_kv(new_c[b:b + 1, :n], new_p[b:b + 1, :n], ckv, kpe,
                                  torch.zeros(1, dtype=torch.int32, device=device),
                                  block_table=bt[b:b + 1], k_scale=scales)
    return ckv, kpe, scales, kv_len.to(device), bt


@pytest.mark.skipif(not HAS_CUDA, reason="no usable CUDA device")
@pytest.mark.parametrize("rope", ["fp8", "16-bit"])
@pytest.mark.parametrize("gran", ["tensor", "token"])
def test_cuda_fp8_decode(rope, gran):
    """An e4m3 latent cache (written by mla_append_kv on the CPU) decoded on the GPU; the
    oracle reads the dequantized cache."""
    ckv, kpe, scales, kv_len, bt = (x.cuda() for x in _fp8_caches("cpu", rope, gran,
                                                                  np.random.default_rng(100)))
    q = torch.randn(3, 2, 16, 512, device="cuda").bfloat16()
    p = torch.randn(3, 2, 16, 64, device="cuda").bfloat16()
    out, lse = flashdecode.mla_decode(q, p, ckv, kpe, kv_len, block_table=bt,
                                      softmax_scale=SCALE, k_scale=scales, return_lse=True)
    s = scales.double().cpu()
    s_tok = s[..., None] if gran == "token" else s
    ckv_d = ckv.double().cpu() * s_tok
    kpe_d = kpe.double().cpu() * (s_tok if rope == "fp8" else 1.0)
    want, want_lse = mla_attention_f64(q.double().cpu().numpy(), p.double().cpu().numpy(),
                                       ckv_d.numpy(), kpe_d.numpy(), kv_len.cpu().numpy(),
                                       bt.cpu().numpy(), SCALE)
    assert_out_close(out.double().cpu().numpy(), want, "bfloat16")
    assert_lse_close(lse.cpu().numpy(), want_lse, atol=2e-3)


@pytest.mark.skipif(not HAS_CUDA, reason="no usable CUDA device")
@pytest.mark.parametrize("rope", ["fp8", "16-bit"])
@pytest.mark.parametrize("gran", ["tensor", "token"])
def test_cuda_append_matches_cpu(rope, gran):
    """mla_append_kv on the GPU writes the bits (codes and per-token scales) the CPU does."""
    want = _fp8_caches("cpu", rope, gran, np.random.default_rng(101))
    try:
        got = _fp8_caches("cuda", rope, gran, np.random.default_rng(101))
    except flashdecode.UnsupportedError as exc:
        pytest.xfail("this build's CUDA append refuses MLA caches: %s" % exc)
    torch.cuda.synchronize()
    for g, w in zip(got[:3], want[:3]):
        assert torch.equal(g.cpu().view(torch.uint8) if g.dtype == torch.float8_e4m3fn
                           else g.cpu(), w.view(torch.uint8) if w.dtype == torch.float8_e4m3fn
                           else w)


@pytest.mark.skipif(not HAS_CUDA, reason="no usable CUDA device")
def test_cuda_compile():
    c = Case(q_len=2, page=64, combined=True, kv_len=(300, 2, 77), cap=320, seed=101)
    q, p, ckv, kpe, kv_len, bt = [None if x is None else x.cuda()
                                  for x in torch_case(c, torch.bfloat16)]
    want = flashdecode.mla_decode(q, p, ckv, kpe, kv_len, block_table=bt, softmax_scale=SCALE)
    step = torch.compile(lambda *a: flashdecode.mla_decode(*a, block_table=bt,
                                                           softmax_scale=SCALE),
                         fullgraph=True)
    assert torch.equal(step(q, p, ckv, kpe, kv_len), want)


# ---- append --------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", [0, 16])
def test_append_copies_then_decode_reads(page):
    c = Case(q_len=3, page=page, combined=True, kv_len=(60, 10, 3), cap=64, seed=60)
    rng = np.random.default_rng(61)
    new_c = rng.standard_normal((3, 3, 512)).astype(np.float32)
    new_p = rng.standard_normal((3, 3, 64)).astype(np.float32)
    before = c.kv.copy()
    flashdecode.mla_append_kv(new_c, new_p, c.ckv, c.kpe, c.kv_len - 3,
                              block_table=c.block_table)
    for b in range(3):
        for i in range(3):
            pos = int(c.kv_len[b]) - 3 + i
            if page:
                where = (c.block_table[b, pos // page], pos % page)
            else:
                where = (b, pos)
            assert np.array_equal(c.ckv[where], new_c[b, i])
            assert np.array_equal(c.kpe[where], new_p[b, i])
            before[where] = c.kv[where]
    assert np.array_equal(before, c.kv)  # nothing else written
    got, lse = run_numpy("cpu", *c.args(),
                         block_table=c.block_table)
    want, want_lse = c.want()
    assert_out_close(got, want, "float32")


@needs_torch
@pytest.mark.parametrize("rope", ["fp8", "16-bit"])
def test_append_fp8_token_scales(rope):
    rng = np.random.default_rng(70)
    new_c = torch.from_numpy(rng.standard_normal((2, 4, 512)) * 3).to(torch.bfloat16)
    new_p = torch.from_numpy(rng.standard_normal((2, 4, 64)) * 5).to(torch.bfloat16)
    kv = torch.full((2, 16, 1, 576), 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)
    ckv = kv[..., :512]
    kpe = kv[..., 512:] if rope == "fp8" else torch.zeros(2, 16, 1, 64, dtype=torch.bfloat16)
    scales = torch.full((2, 16), float("nan"))
    kv_len = torch.tensor([5, 0], dtype=torch.int32)
    flashdecode.mla_append_kv(new_c, new_p, ckv, kpe, kv_len, k_scale=scales)
    for b in range(2):
        n = int(kv_len[b])
        rows = new_c[b].double()
        if rope == "fp8":
            rows = torch.cat([rows, new_p[b].double()], -1)
        amax = rows.abs().amax(-1)
        want = (amax.float() / 448).clamp_min(2.0 ** -126)
        torch.testing.assert_close(scales[b, n:n + 4], want, rtol=1e-6, atol=0)
        assert torch.isnan(scales[b, :n]).all() and torch.isnan(scales[b, n + 4:]).all()
        deq = ckv[b, n:n + 4, 0].double() * scales[b, n:n + 4, None].double()
        torch.testing.assert_close(deq, new_c[b].double(), rtol=2 ** -3, atol=1e-4)
        if rope == "16-bit":
            assert torch.equal(kpe[b, n:n + 4, 0], new_p[b])
    codes = kv.view(torch.uint8)
    assert (codes[0, :5] == 0x7F).all() and (codes[0, 9:] == 0x7F).all()


def test_append_errors_write_nothing():
    c = Case(batch=2, kv_len=(60, 10), cap=64, combined=True, seed=80)
    before = c.kv.copy()
    new_c = np.ones((2, 2, 512), np.float32)
    new_p = np.ones((2, 2, 64), np.float32)
    with pytest.raises(ValueError, match=r"kv_len"):
        flashdecode.mla_append_kv(new_c, new_p, c.ckv, c.kpe, np.array([63, 0], np.int32))
    with pytest.raises(ValueError, match=r"^kpe_new: shape"):
        flashdecode.mla_append_kv(new_c, new_p[:, :1], c.ckv, c.kpe, c.kv_len)
    with pytest.raises(TypeError, match=r"^kpe_new: dtype"):
        flashdecode.mla_append_kv(new_c, new_p.astype(np.float16), c.ckv, c.kpe, c.kv_len)
    with pytest.raises(ValueError, match=r"^ckv_cache: D = 512 .* ckv_new's 256"):
        flashdecode.mla_append_kv(new_c[..., :256], new_p, c.ckv, c.kpe, c.kv_len)
    assert np.array_equal(before, c.kv)
