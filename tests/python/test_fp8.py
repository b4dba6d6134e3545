"""test_fp8.py — fp8 KV caches from Python, on the CPU: decode() and DecodePlan
on e4m3 / e5m2 caches (uint8 codes with kv_dtype, ml_dtypes float8 arrays,
torch float8 tensors) with every scale granularity against the float64
oracle on the dequantized cache; append_kv's quantization and placement;
bad scales, dtypes and shapes named, nothing written.

The fp8 formats are decoded here from their definition (OCP OFP8), not by
the library, and checked against ml_dtypes / torch when installed.
"""
import numpy as np
import pytest

import flashdecode
from attention_ref import assert_out_close, attention_f64

try:
    import ml_dtypes
except ImportError:  # optional
    ml_dtypes = None
try:
    import torch
except ImportError:
    torch = None

MAX = {"e4m3": 448.0, "e5m2": 57344.0}
MAN = {"e4m3": 3, "e5m2": 2}
BIAS = {"e4m3": 7, "e5m2": 15}


def fp8_values(codes, fmt):
    """float64 values of uint8 codes (NaN codes -> NaN, e5m2 inf -> inf)."""
    c = np.asarray(codes, dtype=np.int64)
    m_bits, bias = MAN[fmt], BIAS[fmt]
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp = (c >> m_bits) & ((1 << (7 - m_bits)) - 1)
    man = c & ((1 << m_bits) - 1)
    val = np.where(exp == 0, man * 2.0 ** (1 - bias - m_bits),
                   (1.0 + man / 2.0 ** m_bits) * 2.0 ** (exp - bias))
    if fmt == "e4m3":
        val = np.where((exp == 15) & (man == 7), np.nan, val)
    else:
        val = np.where(exp == 31, np.where(man == 0, np.inf, np.nan), val)
    return sign * val


def quantize(x, fmt):
    """uint8 codes of float64 x: nearest (ties to even), saturating (test-side model)."""
    vals = fp8_values(np.arange(128), fmt)
    finite = np.nonzero(np.isfinite(vals))[0]
    table = vals[finite]
    a = np.minimum(np.abs(x), MAX[fmt])
    idx = np.searchsorted(table, a)
    idx = np.clip(idx, 1, len(table) - 1)
    lo, hi = table[idx - 1], table[idx]
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & (finite[idx] % 2 == 0))
    code = np.where(pick_hi, finite[idx], finite[idx - 1]).astype(np.uint8)
    return np.where(x < 0, code | 0x80, code).astype(np.uint8)


def test_definition_matches_ml_dtypes_and_torch():
    codes = np.arange(256, dtype=np.uint8)
    for fmt, mname, tname in (("e4m3", "float8_e4m3fn", "float8_e4m3fn"),
                              ("e5m2", "float8_e5m2", "float8_e5m2")):
        want = fp8_values(codes, fmt)
        if ml_dtypes is not None:
            got = codes.view(getattr(ml_dtypes, mname)).astype(np.float64)
            np.testing.assert_array_equal(got, want)
        if torch is not None:
            got = torch.from_numpy(codes).view(getattr(torch, tname)).double().numpy()
            np.testing.assert_array_equal(got, want)


def make_case(fmt, gran, paged, *, batch=3, q_len=2, hq=8, hkv=2, d=64, cap=100, page=16,
              seed=0, q_dtype=np.float16):
    """uint8 fp8 caches quantized from random values, scales, and the dequantized caches."""
    rng = np.random.default_rng(seed)
    kv_len = np.array([cap, 37, 1][:batch], dtype=np.int32)
    q = rng.standard_normal((batch, q_len, hq, d)).astype(q_dtype)
    if paged:
        pages_per = (cap + page - 1) // page
        num_pages = batch * pages_per + 2
        shape = (num_pages, page, hkv, d)
        block_table = rng.permutation(num_pages)[:batch * pages_per].reshape(batch, pages_per)
        block_table = block_table.astype(np.int32)
    else:
        shape = (batch, cap, hkv, d)
        block_table = None
    sshape = {"none": None, "tensor": (1,), "head": (hkv,), "token": shape[:3]}[gran]
    k_scale = v_scale = None
    caches = []
    scales = []
    for _ in range(2):
        x = rng.standard_normal(shape)
        s = None if sshape is None else (2.0 ** rng.integers(-6, -2, size=sshape) *
                                         (1 + 0.5 * rng.random(sshape))).astype(np.float32)
        div = 1.0 if s is None else (s.reshape(s.shape + (1,) * (4 - s.ndim)) if gran == "token"
                                     else (s.reshape(1, 1, -1, 1) if gran == "head" else s[0]))
        codes = quantize(x / div, fmt)
        caches.append(codes)
        scales.append(s)
    k_scale, v_scale = scales
    return q, caches[0], caches[1], kv_len, block_table, k_scale, v_scale


def dequant(codes, fmt, scale, gran):
    x = fp8_values(codes, fmt)
    if gran == "none":
        return x
    s = scale.astype(np.float64)
    if gran == "tensor":
        return x * s[0]
    if gran == "head":
        return x * s.reshape(1, 1, -1, 1)
    return x * s[..., None]


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("gran", ["none", "tensor", "head", "token"])
@pytest.mark.parametrize("paged", [False, True])
def test_decode_uint8_codes(fmt, gran, paged):
    q, k8, v8, kv_len, bt, ks, vs = make_case(fmt, gran, paged, seed=hash((fmt, gran)) % 100)
    out, lse = flashdecode.decode(q, k8, v8, kv_len, block_table=bt, k_scale=ks, v_scale=vs,
                                  kv_dtype=fmt, return_lse=True)
    ref, ref_lse = attention_f64(q, dequant(k8, fmt, ks, gran), dequant(v8, fmt, vs, gran),
                                 kv_len, bt)
    assert_out_close(out, ref, "float16")
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes not installed")
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_decode_ml_dtypes_and_window(fmt):
    q, k8, v8, kv_len, bt, ks, vs = make_case(fmt, "head", True, q_len=4)
    mtype = getattr(ml_dtypes, "float8_e4m3fn" if fmt == "e4m3" else "float8_e5m2")
    out = flashdecode.decode(q, k8.view(mtype), v8.view(mtype), kv_len, block_table=bt,
                             k_scale=ks, v_scale=vs, window_left=20)
    ref, _ = attention_f64(q, dequant(k8, fmt, ks, "head"), dequant(v8, fmt, vs, "head"),
                           kv_len, bt, window_left=20)
    assert_out_close(out, ref, "float16")


def test_nan_codes_and_scales_past_kv_len_are_never_read():
    q, k8, v8, kv_len, bt, ks, vs = make_case("e4m3", "token", False)
    for b, n in enumerate(kv_len):
        k8[b, n:] = 0x7F  # the e4m3 NaN code
        v8[b, n:] = 0xFF
        ks[b, n:] = np.nan
        vs[b, n:] = np.nan
    out = flashdecode.decode(q, k8, v8, kv_len, k_scale=ks, v_scale=vs, kv_dtype="e4m3")
    assert np.isfinite(out.astype(np.float32)).all()


def test_decode_plan_fp8_matches_decode():
    q, k8, v8, kv_len, bt, ks, vs = make_case("e5m2", "token", True)
    plan = flashdecode.DecodePlan(batch=3, q_len=2, num_heads_q=8, num_heads_kv=2, head_dim=64,
                                  dtype="f16", page_size=16, max_pages_per_seq=bt.shape[1],
                                  device="cpu", kv_dtype="e5m2", kv_scale="token")
    assert plan.kv_dtype == "float8_e5m2"
    got = plan.run(q, k8, v8, kv_len, block_table=bt, k_scale=ks, v_scale=vs)
    want = flashdecode.decode(q, k8, v8, kv_len, block_table=bt, k_scale=ks, v_scale=vs,
                              kv_dtype="e5m2")
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="kv_scale='token'"):
        plan.run(q, k8, v8, kv_len, block_table=bt, k_scale=0.5, v_scale=0.5)


@pytest.mark.skipif(torch is None, reason="torch not installed")
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_torch_float8(fmt):
    q, k8, v8, kv_len, bt, ks, vs = make_case(fmt, "token", False, q_dtype=np.float32)
    tdtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    tq = torch.from_numpy(q).bfloat16()
    tk = torch.from_numpy(k8).view(tdtype)
    tv = torch.from_numpy(v8).view(tdtype)
    out = flashdecode.decode(tq, tk, tv, torch.from_numpy(kv_len),
                             k_scale=torch.from_numpy(ks), v_scale=torch.from_numpy(vs))
    ref, _ = attention_f64(tq.float().numpy(), dequant(k8, fmt, ks, "token"),
                           dequant(v8, fmt, vs, "token"), kv_len)
    assert_out_close(out.float().numpy(), ref, "bfloat16")
    # a float scale, and the same per-tensor scales as bf16 / float64 tensors (converted)
    out1 = flashdecode.decode(tq, tk, tv, torch.from_numpy(kv_len), k_scale=0.25, v_scale=0.5)
    out2 = flashdecode.decode(tq, tk, tv, torch.from_numpy(kv_len),
                              k_scale=torch.full((1,), 0.25, dtype=torch.bfloat16),
                              v_scale=torch.tensor([0.5], dtype=torch.float64))
    assert torch.equal(out1, out2)


# ---- bad arguments ---------------------------------------------------------------------------
def test_bad_scales_and_dtypes():
    q, k8, v8, kv_len, bt, ks, vs = make_case("e4m3", "head", False)
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-50, 1e40):
        with pytest.raises(ValueError, match="k_scale"):
            flashdecode.decode(q, k8, v8, kv_len, k_scale=bad, v_scale=1.0, kv_dtype="e4m3")
    with pytest.raises(ValueError, match="v_scale.*None"):
        flashdecode.decode(q, k8, v8, kv_len, k_scale=ks, kv_dtype="e4m3")
    with pytest.raises(ValueError, match="k_scale: shape"):
        flashdecode.decode(q, k8, v8, kv_len, k_scale=np.ones(3, np.float32),
                           v_scale=np.ones(3, np.float32), kv_dtype="e4m3")
    with pytest.raises(ValueError, match="v_scale: per tensor, but k_scale is per head"):
        flashdecode.decode(q, k8, v8, kv_len, k_scale=ks, v_scale=1.0, kv_dtype="e4m3")
    with pytest.raises(TypeError, match="kv_dtype"):
        flashdecode.decode(q, k8, v8, kv_len, kv_dtype="e3m4")
    with pytest.raises(TypeError, match="uint8"):
        flashdecode.decode(q, k8, v8, kv_len)  # codes without kv_dtype
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        flashdecode.decode(q.astype(np.float32), k8, v8, kv_len, kv_dtype="e4m3")
    k16 = fp8_values(k8, "e4m3").astype(np.float16)
    with pytest.raises(ValueError, match="fp8 cache only"):
        flashdecode.decode(q, k16, k16, kv_len, k_scale=1.0, v_scale=1.0)
    # a bad per-token value where a key is read: the C library names it, out untouched
    q, k8, v8, kv_len, bt, ks, vs = make_case("e4m3", "token", False)
    ks[1, 36, 1] = 0.0
    out = np.full(q.shape, 7.0, dtype=np.float16)
    with pytest.raises(flashdecode.InvalidArgumentError, match=r"k_scale\[.*position 36"):
        flashdecode.decode(q, k8, v8, kv_len, k_scale=ks, v_scale=vs, kv_dtype="e4m3", out=out)
    assert (out == 7.0).all()


# ---- append_kv -------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("gran", ["none", "tensor", "head", "token"])
def test_append_quantizes_and_places(fmt, gran):
    rng = np.random.default_rng(1)
    batch, hkv, d, page, pages = 2, 2, 32, 8, 12
    cache_k = np.full((pages, page, hkv, d), 0xA5, np.uint8)
    cache_v = cache_k.copy()
    bt = np.arange(pages, dtype=np.int32)[::-1].reshape(batch, pages // batch).copy()
    kv_len = np.array([3, 20], np.int32)
    kn = (rng.standard_normal((batch, 5, hkv, d)) * 4).astype(np.float16)
    vn = (rng.standard_normal((batch, 5, hkv, d)) * 4).astype(np.float16)
    kn[0, 0, 0, :3] = [np.nan, np.inf, -60000.0]
    sshape = {"none": None, "tensor": (1,), "head": (hkv,), "token": (pages, page, hkv)}[gran]
    ks = vs = None
    if sshape is not None:
        ks = np.full(sshape, -7.0 if gran == "token" else 0.03, np.float32)
        vs = np.full(sshape, -7.0 if gran == "token" else 0.05, np.float32)
    flashdecode.append_kv(kn, vn, cache_k, cache_v, kv_len, block_table=bt, k_scale=ks,
                          v_scale=vs, kv_dtype=fmt)
    written = np.zeros(cache_k.shape[:3], bool)
    for b in range(batch):
        for i in range(5):
            pos = kv_len[b] + i
            pg, at = bt[b, pos // page], pos % page
            written[pg, at] = True
            for cache, new, sc in ((cache_k, kn, ks), (cache_v, vn, vs)):
                x = new[b, i].astype(np.float64)
                if gran == "none":
                    s = np.ones((hkv, 1))
                elif gran == "token":
                    amax = np.where(np.isfinite(x), np.abs(x), 0).max(axis=1)
                    want = np.maximum((amax / MAX[fmt]).astype(np.float32), 2.0 ** -126)
                    np.testing.assert_array_equal(sc[pg, at], want)
                    s = sc[pg, at].astype(np.float64)[:, None]
                else:
                    s = np.broadcast_to(sc.astype(np.float64).reshape(-1, 1), (hkv, 1))
                y = (x.astype(np.float32) / s.astype(np.float32)).astype(np.float64)
                got = cache[pg, at]
                np.testing.assert_array_equal(np.isnan(fp8_values(got, fmt)), np.isnan(y))
                fin = ~np.isnan(y)
                np.testing.assert_array_equal(got[fin], quantize(y[fin], fmt))
    assert (cache_k[~written] == 0xA5).all() and (cache_v[~written] == 0xA5).all()
    if gran == "token":
        assert (ks[~written] == -7.0).all()


def test_append_copy_and_errors():
    rng = np.random.default_rng(2)
    k = np.zeros((2, 10, 2, 16), np.float16)
    v = np.zeros_like(k)
    kn = rng.standard_normal((2, 3, 2, 16)).astype(np.float16)
    flashdecode.append_kv(kn, kn, k, v, [0, 7])
    assert np.array_equal(k[0, :3], kn[0]) and np.array_equal(k[1, 7:], kn[1])
    assert not k[0, 3:].any() and not k[1, :7].any()
    before = k.copy()
    with pytest.raises(flashdecode.InvalidArgumentError, match=r"kv_len\[1\]"):
        flashdecode.append_kv(kn, kn, k, v, [0, 8])  # 8 + 3 > 10
    assert np.array_equal(k, before)
    k8 = np.zeros((2, 10, 2, 16), np.uint8)
    with pytest.raises(ValueError, match="k_scale"):
        flashdecode.append_kv(kn, kn, k8, k8.copy(), [0, 0], k_scale=0.0, v_scale=1.0,
                              kv_dtype="e4m3")
    with pytest.raises(flashdecode.InvalidArgumentError, match=r"v_scale\[1\]"):
        flashdecode.append_kv(kn, kn, k8, k8.copy(), [0, 0], k_scale=np.ones(2, np.float32),
                              v_scale=np.array([1.0, -2.0], np.float32), kv_dtype="e4m3")
    assert not k8.any()
    flashdecode.append_kv(kn[:, :0], kn[:, :0], k8, k8, [0, 0], kv_dtype="e4m3")  # nothing
    assert not k8.any()


def test_append_one_token_at_a_time_then_decode():
    """Append 12 tokens one by one (bumping kv_len) = one call of 12; then attend."""
    rng = np.random.default_rng(3)
    kn = rng.standard_normal((2, 12, 2, 64)).astype(np.float16)
    vn = rng.standard_normal((2, 12, 2, 64)).astype(np.float16)
    caches = []
    for step in (12, 1):
        k8 = np.zeros((2, 16, 2, 64), np.uint8)
        v8 = np.zeros_like(k8)
        ks = np.zeros((2, 16, 2), np.float32)
        vs = np.zeros_like(ks)
        kv_len = np.zeros(2, np.int32)
        for i in range(0, 12, step):
            flashdecode.append_kv(kn[:, i:i + step], vn[:, i:i + step], k8, v8, kv_len,
                                  k_scale=ks, v_scale=vs, kv_dtype="e5m2")
            kv_len += step
        caches.append((k8, v8, ks, vs, kv_len))
    for a, b in zip(caches[0][:4], caches[1][:4]):
        np.testing.assert_array_equal(a, b)
    k8, v8, ks, vs, kv_len = caches[0]
    q = rng.standard_normal((2, 1, 4, 64)).astype(np.float16)
    out = flashdecode.decode(q, k8, v8, kv_len, k_scale=ks, v_scale=vs, kv_dtype="e5m2")
    ref, _ = attention_f64(q, dequant(k8, "e5m2", ks, "token"), dequant(v8, "e5m2", vs, "token"),
                           kv_len)
    assert_out_close(out, ref, "float16")
    # and the fp8 cache stays near the float16 one (e5m2 rounds by up to 2^-3 relative)
    ref16, _ = attention_f64(q, kn, vn, kv_len)
    assert np.abs(out.astype(np.float64) - ref16).max() < 0.3


@pytest.mark.skipif(torch is None, reason="torch not installed")
def test_append_torch_float8_paged():
    kc = torch.zeros(6, 4, 2, 32, dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    bt = torch.tensor([[5, 3, 1], [0, 2, 4]], dtype=torch.int32)
    kn = torch.randn(2, 3, 2, 32, dtype=torch.bfloat16)
    flashdecode.append_kv(kn, kn, kc, vc, torch.tensor([2, 9], dtype=torch.int32), block_table=bt,
                          k_scale=torch.tensor([0.01, 0.02]), v_scale=torch.tensor([0.01, 0.02]))
    # sequence 0 positions 2..4: page 5 slots 2, 3 and page 3 slot 0
    got = kc[5, 2].float() * torch.tensor([0.01, 0.02]).view(2, 1)
    assert torch.allclose(got, kn[0, 0].float(), rtol=0.07, atol=0.01 * 2 ** -9)
    assert kc[5, :2].float().abs().sum() == 0 and kc[3, 1:].float().abs().sum() == 0


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("gran", ["none", "tensor", "token"])
def test_append_nan_keeps_its_sign(fmt, gran):
    # a NaN's code is S.1111111 with the NaN's sign: -NaN (torch's bfloat16 NaN is
    # 0xffff) -> 0xff, +NaN -> 0x7f, on the CPU as on CUDA (the GPU's division
    # returns the canonical +NaN, so the quantizer takes NaN apart before dividing)
    kn = np.ones((1, 1, 1, 8), np.float16)
    kn.view(np.uint16)[0, 0, 0, :2] = [0xFE00, 0x7E00]  # float16 -NaN, +NaN
    scale = {"none": None, "tensor": 0.5, "token": np.zeros((1, 4, 1), np.float32)}[gran]
    k = np.zeros((1, 4, 1, 8), np.uint8)
    v = k.copy()
    flashdecode.append_kv(kn, kn, k, v, [1], k_scale=scale,
                          v_scale=scale.copy() if gran == "token" else scale, kv_dtype=fmt)
    for cache in (k, v):
        assert cache[0, 1, 0, 0] == 0xFF and cache[0, 1, 0, 1] == 0x7F
        assert not cache[0, 0].any() and not cache[0, 2:].any()
