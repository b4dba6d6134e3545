"""_mla.py — the checks and the C call of MLA decode (multi-head latent attention).

``check_mla_call`` validates one call's TensorInfos from their metadata only (the
torch fake implementations run it too) and returns its Geometry (rope_dim > 0,
num_heads_kv 1); ``fill_mla_tensors`` makes the fd_tensors; ``run_mla`` checks,
plans (cached) and calls fd_run. The public functions are in _mla_api.py
(mla_decode, mla_append_kv) and _mla_plan.py (MLADecodePlan).

Shapes as the caller gives them, then as the C API reads them (flashdecode.h,
MULTI-HEAD LATENT ATTENTION): a size-1 dimension is added where the caller
left it out, as a view of the TensorInfo only (no copy, no tensor op):

    q_nope [B, q_len, Hq, D] or [B, Hq, D] (q_len 1)   -> q    [B, q_len, Hq, D]
    q_pe   [B, q_len, Hq, R] or [B, Hq, R]             -> q_pe [B, q_len, Hq, R]
    ckv_cache [B, cap, D] or [B, cap, 1, D]; paged [pages, page_size, (1,) D]
                                                       -> k_cache [.., .., 1, D]
    kpe_cache likewise with R columns                  -> k_pe_cache [.., .., 1, R]
    out like q_nope; lse [B, Hq, q_len] or [B, Hq]     -> [B, Hq, q_len]
    k_scale () / (1,) per tensor; [B or pages, cap or page_size] or [.., .., 1] per token
"""
from . import _core, _lib
from ._tensors import (F32, FD_DTYPE, U8, Geometry, TensorInfo,
                       _cache_dtype, _check_device, _check_index_vector, _check_rows,
                       _shape_str, c_strides, check_block_table, check_lse, check_out_dtype)

Q_LAYOUT = "[batch, q_len, num_heads_q, %s] or [batch, num_heads_q, %s]"
CACHE_LAYOUT = {False: "[batch, kv_capacity, %s] or [batch, kv_capacity, 1, %s]",
                True: "[num_pages, page_size, %s] or [num_pages, page_size, 1, %s]"}


def with_unit_dim(t, axis):
    """TensorInfo t with a size-1 dimension inserted at ``axis`` (its stride is never
    used: c_strides gives size-1 dimensions the contiguous value)."""
    shape = tuple(t.shape[:axis]) + (1,) + tuple(t.shape[axis:])
    strides = tuple(t.strides[:axis]) + (1,) + tuple(t.strides[axis:])
    return TensorInfo(t.obj, t.kind, shape, strides, t.dtype, t.device)


def _q4(t, name, rank, width):
    """q_nope / q_pe / out as [batch, q_len, num_heads_q, width] (rank: q_nope's, 3 or 4)."""
    if len(t.shape) != rank or rank not in (3, 4):
        layout = Q_LAYOUT % (width, width)
        if name == "q_nope":
            raise ValueError("q_nope: expected %s, got shape %s" % (layout, _shape_str(t.shape)))
        raise ValueError("%s: expected %d dimensions as q_nope has (%s), got shape %s"
                         % (name, rank, layout, _shape_str(t.shape)))
    return with_unit_dim(t, 1) if rank == 3 else t


def _cache4(t, name, paged, width):
    """A latent / rope cache as [.., .., 1, width] (one kv head)."""
    layout = CACHE_LAYOUT[paged] % (width, width)
    if len(t.shape) == 3:
        return with_unit_dim(t, 2)
    if len(t.shape) != 4:
        raise ValueError("%s: expected %s, got shape %s" % (name, layout, _shape_str(t.shape)))
    if int(t.shape[2]) != 1:
        raise ValueError("%s: dimension 2 is %d, but MLA has one kv head (expected %s)"
                         % (name, int(t.shape[2]), layout))
    return t


def _check_q_side(t, name, q, width_name):
    """q_pe (or out) against q_nope: rows, device."""
    if tuple(int(s) for s in t.shape[:3]) != tuple(int(s) for s in q.shape[:3]):
        raise ValueError("%s: shape %s, expected [batch, q_len, num_heads_q] = %s of q_nope "
                         "followed by %s" % (name, _shape_str(t.shape), _shape_str(q.shape[:3]),
                                             width_name))
    _check_device(t, name, q.device, "q_nope")


def _rope_dtype(t, q_dtype, kv_dtype, latent_fp8):
    """The element type of kpe_cache: q's (16-bit rope part; beside an fp8 latent too)
    or the latent's fp8 type."""
    if t.dtype == q_dtype:
        return q_dtype
    if latent_fp8 is None:
        raise TypeError("kpe_cache: dtype %s, expected %s (the dtype of q_nope; an fp8 rope "
                        "part needs an fp8 ckv_cache)" % (t.dtype, q_dtype))
    if t.dtype == latent_fp8 or (t.dtype == U8 and kv_dtype is not None):
        return latent_fp8
    raise TypeError("kpe_cache: dtype %s, expected %s (the ckv_cache's fp8 type) or %s (the "
                    "dtype of q_nope)" % (t.dtype, latent_fp8, q_dtype))


def check_mla_scale(k_scale, g, cache_shape, first="q_nope"):
    """FD_KV_SCALE_* of k_scale (a TensorInfo or None) and its TensorInfo as the C API
    reads it: float32 () / (1,) (per tensor) or the cache's [.., position] (per token,
    a trailing size-1 head dimension accepted); fp8 caches only."""
    if k_scale is None:
        return _lib.FD_KV_SCALE_NONE, None
    if g.kv_dtype is None:
        raise ValueError("k_scale: scales apply to an fp8 cache only (ckv_cache has %s's "
                         "dtype %s)" % (first, g.dtype))
    if k_scale.dtype != F32:
        raise TypeError("k_scale: dtype %s, expected float32" % k_scale.dtype)
    _check_device(k_scale, "k_scale", g.device, first)
    shape = tuple(int(s) for s in k_scale.shape)
    token = tuple(int(s) for s in cache_shape[:2])
    if len(shape) <= 1 and (shape == () or shape == (1,)):
        return _lib.FD_KV_SCALE_TENSOR, k_scale
    if shape == token or shape == token + (1,):
        if any(s < 0 for s in k_scale.strides):
            raise ValueError("k_scale: a negative stride; pass a copy")
        info = with_unit_dim(k_scale, 2) if len(shape) == 2 else k_scale
        return _lib.FD_KV_SCALE_TOKEN, info
    raise ValueError("k_scale: shape %s, expected () or (1,) (per tensor) or %s (per token: "
                     "the latent cache's shape without D, a trailing 1 allowed)"
                     % (_shape_str(shape), _shape_str(token)))


def check_mla_call(q_nope, q_pe, ckv, kpe, kv_len, block_table, out, lse, kv_dtype=None,
                   k_scale=None, first="q_nope"):
    """Validate one MLA call's TensorInfos (block_table, out, lse, k_scale may be None).

    Returns (g, infos): the Geometry (rope_dim > 0, num_heads_kv 1, rope_dtype the name
    of kpe_cache's element type, kv_scale FD_KV_SCALE_*) and a dict of the TensorInfos
    as the C API reads them (4-D q_nope / q_pe / caches / out, 3-D lse and per-token
    scales) under the keys 'q_nope', 'q_pe', 'ckv', 'kpe', 'out', 'lse', 'k_scale'.
    ``kv_dtype`` (an fp8 name or None) reads uint8 caches as that fp8 type. ``first``
    names q_nope in the messages about the caches (mla_append_kv: 'ckv_new').

    Raises TypeError for a wrong dtype and ValueError for a wrong shape, device or
    stride, naming the argument.
    """
    rank = len(q_nope.shape)
    q = _q4(q_nope, "q_nope", rank, "D")
    if q.dtype not in FD_DTYPE:
        raise TypeError("q_nope: dtype %s is not supported (float32, float16 or bfloat16)"
                        % q.dtype)
    g = Geometry()
    g.batch, g.q_len, g.num_heads_q, g.head_dim = (int(s) for s in q.shape)
    g.dtype, g.device, g.out_dtype = q.dtype, q.device, q.dtype
    g.num_heads_kv = 1
    if g.q_len == 0:
        raise ValueError("q_nope: q_len (dimension 1) is 0")
    _check_rows(q, "q_nope", output=False)
    qp = _q4(q_pe, "q_pe", rank, "R")
    if qp.dtype != g.dtype:
        raise TypeError("q_pe: dtype %s, expected %s (the dtype of q_nope)" % (qp.dtype, g.dtype))
    _check_q_side(qp, "q_pe", q, "R")
    _check_rows(qp, "q_pe", output=False)
    g.rope_dim = int(qp.shape[3])
    if g.rope_dim == 0:
        raise ValueError("q_pe: rope_dim (its last dimension) is 0; MLA needs the rope part")
    g.paged = block_table is not None
    k = _cache4(ckv, "ckv_cache", g.paged, "D")
    g.kv_dtype = _cache_dtype(k, "ckv_cache", g.dtype, kv_dtype)
    _check_device(k, "ckv_cache", g.device, first)
    _check_rows(k, "ckv_cache", output=False)
    if int(k.shape[3]) != g.head_dim:
        raise ValueError("ckv_cache: D = %d (last dimension) differs from %s's %d"
                         % (int(k.shape[3]), first, g.head_dim))
    kp = _cache4(kpe, "kpe_cache", g.paged, "R")
    g.rope_dtype = _rope_dtype(kp, g.dtype, kv_dtype, g.kv_dtype)
    _check_device(kp, "kpe_cache", g.device, first)
    _check_rows(kp, "kpe_cache", output=False)
    if int(kp.shape[3]) != g.rope_dim:
        raise ValueError("kpe_cache: R = %d (last dimension) differs from q_pe's %d"
                         % (int(kp.shape[3]), g.rope_dim))
    if tuple(kp.shape[:2]) != tuple(k.shape[:2]):
        raise ValueError("kpe_cache: shape %s, its first two dimensions differ from "
                         "ckv_cache's %s" % (_shape_str(kpe.shape), _shape_str(ckv.shape)))
    _check_index_vector(kv_len, "kv_len", g.batch, g.device)
    if g.paged:
        check_block_table(block_table, g.batch, g.device, first)
        g.num_pages, g.page_size = int(k.shape[0]), int(k.shape[1])
        g.max_pages_per_seq = int(block_table.shape[1])
        if g.num_pages == 0:
            raise ValueError("ckv_cache: a paged cache with 0 pages")
        if g.page_size == 0:
            raise ValueError("ckv_cache: page_size (dimension 1) is 0 (the C API would read a "
                             "contiguous cache)")
        g.kv_capacity = 0
    else:
        if int(k.shape[0]) != g.batch:
            raise ValueError("ckv_cache: batch dimension %d differs from %s's %d (for a "
                             "paged cache pass block_table)" % (int(k.shape[0]), first, g.batch))
        g.num_pages = g.page_size = g.max_pages_per_seq = 0
        g.kv_capacity = int(k.shape[1])
    o = None
    if out is not None:
        o = _q4(out, "out", rank, "D")
        check_out_dtype(o.dtype, g.dtype)
        g.out_dtype = o.dtype
        if tuple(int(s) for s in out.shape) != tuple(int(s) for s in q_nope.shape):
            raise ValueError("out: shape %s, expected %s (the shape of q_nope)"
                             % (_shape_str(out.shape), _shape_str(q_nope.shape)))
        _check_device(o, "out", g.device, first)
        _check_rows(o, "out", output=True)
    e = None
    if lse is not None:
        want = (g.batch, g.num_heads_q) if rank == 3 else (g.batch, g.num_heads_q, g.q_len)
        if tuple(int(s) for s in lse.shape) != want:
            raise ValueError("lse: shape %s, expected %s ([batch, num_heads_q%s])"
                             % (_shape_str(lse.shape), _shape_str(want),
                                "" if rank == 3 else ", q_len"))
        e = with_unit_dim(lse, 2) if rank == 3 else lse
        check_lse(e, (g.batch, g.num_heads_q, g.q_len), g.device, first)
    g.kv_scale, ks = check_mla_scale(k_scale, g, k.shape, first)
    return g, {"q_nope": q, "q_pe": qp, "ckv": k, "kpe": kp, "out": o, "lse": e, "k_scale": ks}


def fill_mla_tensors(infos, kv_len, block_table):
    """The FdTensors of one MLA call (the infos dict of check_mla_call, with 'out' set;
    kv_len and block_table TensorInfos, block_table None for a contiguous cache)."""
    t = _lib.FdTensors()
    q, qp, k, kp = infos["q_nope"], infos["q_pe"], infos["ckv"], infos["kpe"]
    t.q = q.ptr
    t.q_strides[:] = c_strides(q, 3)
    t.q_pe = qp.ptr
    t.q_pe_strides[:] = c_strides(qp, 3)
    t.k_cache = k.ptr
    t.k_strides[:] = c_strides(k, 3)
    t.k_pe_cache = kp.ptr
    t.k_pe_strides[:] = c_strides(kp, 3)
    t.kv_len = kv_len.ptr
    if block_table is not None:
        t.block_table = block_table.ptr
        t.block_table_stride = c_strides(block_table, 1)[0]
    out = infos["out"]
    t.out = out.ptr
    t.out_strides[:] = c_strides(out, 3)
    lse = infos["lse"]
    if lse is not None:
        t.lse = lse.ptr
        t.lse_strides[:] = c_strides(lse, 3)
    ks = infos["k_scale"]
    if ks is not None:
        t.k_scale = ks.ptr
        if len(ks.shape) == 3:
            t.scale_strides[:] = c_strides(ks, 3)
    return t


def run_mla(q_nope, q_pe, ckv, kpe, kv_len, block_table, out, lse, softmax_scale, num_splits,
            alloc_workspace, stream, variants=_core.PLAIN, kv_dtype=None, k_scale=None,
            backend=None):
    """One mla_decode() call on TensorInfos: check, plan (cached), run.

    out must be given (lse and k_scale may be None); softmax_scale a float (nonzero);
    ``alloc_workspace(nbytes)`` returns (buffer, address), kept alive until fd_run
    returns; ``stream`` a cudaStream_t as an int, or None; ``backend`` an FD_BACKEND_*
    overriding the device's (the tests run FD_BACKEND_REFERENCE on host arrays).
    """
    g, infos = check_mla_call(q_nope, q_pe, ckv, kpe, kv_len, block_table, out, lse, kv_dtype,
                              k_scale)
    plan = _core.plan_for_call(g, kv_len, softmax_scale, _core._int32("num_splits", num_splits),
                               variants, backend)
    tensors = fill_mla_tensors(infos, kv_len, block_table)
    buf, addr = (None, None)
    if plan.workspace_size:
        buf, addr = alloc_workspace(plan.workspace_size)
    _core.fd_run(plan, tensors, addr, plan.workspace_size, stream)
    del buf
    return g


def mla_lse_shape(q_nope_shape):
    """lse's shape for q_nope of this shape: [B, Hq, q_len], or [B, Hq] for a 3-D q_nope
    ((0,) for another rank, which check_mla_call then names)."""
    if len(q_nope_shape) == 3:
        return (q_nope_shape[0], q_nope_shape[1])
    if len(q_nope_shape) != 4:
        return (0,)
    return (q_nope_shape[0], q_nope_shape[2], q_nope_shape[1])


def required_scale(softmax_scale):
    """mla_decode's softmax_scale: required (None refused, with DeepSeek's value as the
    hint), then as decode's (finite, nonzero, float32)."""
    if softmax_scale is None:
        raise ValueError("softmax_scale: required for MLA (the scale of the head dim before "
                         "absorption; DeepSeek-V3: 1 / sqrt(192))")
    if isinstance(softmax_scale, (int, float)) and not isinstance(softmax_scale, bool) \
            and softmax_scale == 0:
        raise ValueError("softmax_scale: 0 is not supported; MLA needs the scale of the head "
                         "dim before absorption (DeepSeek-V3: 1 / sqrt(192))")
    return _core.resolve_scale(softmax_scale)

