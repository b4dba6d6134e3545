"""_append.py — flashdecode.append_kv: new tokens into a KV cache (fd_append_kv)."""
import ctypes

import numpy as np

from . import _arrays, _core, _lib
from ._tensors import (FD_DTYPE, FD_KV_DTYPE, TensorInfo, _check_rows, c_strides, check_call,
                       describe, heads_layout_error, is_torch_tensor)


def _one_row(info):
    """k_new's TensorInfo with one new token instead of none (for the checks alone)."""
    b, _, h, d = (int(n) for n in info.shape)
    return TensorInfo(info.obj, info.kind, (b, 1, h, d), (h * d, h * d, d, 1), info.dtype,
                      info.device)


def append_kv(k_new, v_new, k_cache, v_cache, kv_len, *, block_table=None, k_scale=None,
              v_scale=None, kv_dtype=None):
    """Write new tokens' keys and values into a KV cache, in place.

    Token ``i`` of sequence ``b`` (``k_new[b, i]``, ``v_new[b, i]``, every kv
    head) goes to position ``kv_len[b] + i`` of the cache, contiguous or
    through ``block_table``. ``kv_len`` holds the lengths *before* the append
    and is not changed: add ``num_new`` afterwards (append, bump kv_len,
    then :func:`decode` with the new kv_len; a speculative verify step
    appends its q_len tokens, then decodes q_len rows). Only those positions
    (and their per-token scales) are written.

    Parameters
    ----------
    k_new, v_new : tensor/array [batch, num_new, num_heads_kv, head_dim]
        float32, float16 or bfloat16 (the q dtype of the decode that follows).
    k_cache, v_cache : the caches :func:`decode` reads
        Of k_new's dtype (an exact copy), or fp8: torch.float8_e4m3fn /
        float8_e5m2, ml_dtypes float8 numpy arrays, or uint8 with
        ``kv_dtype='e4m3'`` / ``'e5m2'``. Contiguous [batch, kv_capacity,
        num_heads_kv, head_dim] or paged [num_pages, page_size, num_heads_kv,
        head_dim] with ``block_table``.
    kv_len : int32 [batch] (or ints), lengths before the append
    block_table : int32 [batch, max_pages_per_seq], paged caches only
    k_scale, v_scale : fp8 caches, optional (neither: scale 1)
        A float or a [num_heads_kv] float32 array: each value x is stored as
        fp8(x / scale), rounded to nearest even and saturated to the format's
        finite range (never inf or NaN; a NaN stays NaN, its sign kept). The
        cache's shape without head_dim ([batch, kv_capacity, num_heads_kv] or
        [num_pages, page_size, num_heads_kv]): per-token scales, *written* here as the
        row's largest finite |x| / 448 (e4m3) or / 57344 (e5m2), at least
        2^-126, 1 for an all-zero row; decode then reads them.
    kv_dtype : 'e4m3' or 'e5m2', optional
        For uint8 caches.

    Raises
    ------
    TypeError, ValueError
        As :func:`decode` for the cache, kv_len, block_table and scales
        (shapes, dtypes, devices); k_new and v_new of different shapes or not
        [batch, num_new, num_heads_kv, head_dim]; and the C library's
        InvalidArgumentError on the CPU: ``kv_len[b] + num_new`` beyond
        kv_capacity, a page id the new tokens need outside the pool, a scale
        that is zero, negative, NaN or infinite (nothing is written then).
        On CUDA those rows are skipped on the device (nothing else written)
        and scale values are not checked.

    Notes
    -----
    CUDA tensors: enqueued on ``torch.cuda.current_stream()``; no allocation
    (pass device tensors for the scales), no host synchronisation, so it can
    be captured in a CUDA graph together with decode. Not a torch custom op:
    under torch.compile it is a graph break.
    """
    from ._api import Fp8Args, as_index_array, as_numpy_scale

    fp8 = Fp8Args(kv_dtype, k_scale, v_scale)
    if not (_arrays.is_native(k_new)):
        dev = _arrays.foreign_device(k_new)
        if dev is None:
            raise TypeError("k_new: expected a torch.Tensor or a numpy.ndarray (or an object "
                            "with __dlpack__), got %s" % type(k_new).__name__)
        k_new, v_new, k_cache, v_cache, kv_len, block_table, k_scale, v_scale = (
            _arrays.from_foreign(x, dev) for x in (k_new, v_new, k_cache, v_cache, kv_len,
                                                   block_table, fp8.k_scale, fp8.v_scale))
        fp8.k_scale, fp8.v_scale = k_scale, v_scale
    torch_mode = is_torch_tensor(k_new)
    if torch_mode:
        from . import _torch_ops as ops

        kv_len = ops._as_index_tensor(kv_len, "kv_len", k_new, True)
        if block_table is not None:
            block_table = ops._as_index_tensor(block_table, "block_table", k_new, False)
        ks = ops.as_scale_tensor(fp8.k_scale, "k_scale", k_new)
        vs = ops.as_scale_tensor(fp8.v_scale, "v_scale", k_new)
    else:
        batch = k_new.shape[0] if getattr(k_new, "ndim", 0) >= 1 else None
        kv_len = as_index_array(kv_len, "kv_len", batch)
        if block_table is not None:
            block_table = as_index_array(block_table, "block_table", None)
        ks, vs = as_numpy_scale(fp8.k_scale, "k_scale"), as_numpy_scale(fp8.v_scale, "v_scale")
        for x, name in ((k_cache, "k_cache"), (v_cache, "v_cache"), (ks, "k_scale"),
                        (vs, "v_scale")):
            if isinstance(x, np.ndarray) and not x.flags.writeable:
                raise ValueError("%s: the array is read-only" % name)
    kn, vn = describe(k_new, "k_new"), describe(v_new, "v_new")
    if kn.shape != vn.shape:
        raise ValueError("v_new: shape %s differs from k_new's %s" % (vn.shape, kn.shape))
    if vn.dtype != kn.dtype or vn.device != kn.device:
        raise TypeError("v_new: dtype %s on %s, k_new is %s on %s"
                        % (vn.dtype, vn.device, kn.dtype, kn.device))
    ki, vi = describe(k_cache, "k_cache"), describe(v_cache, "v_cache")
    # fd_append_kv takes no broadcast (stride 0) view, the new tokens' neither: refused as
    # an output's, by name
    for info, name in ((kn, "k_new"), (vn, "v_new"), (ki, "k_cache"), (vi, "v_cache")):
        _check_rows(info, name, output=True)
    li = describe(kv_len, "kv_len")
    bi = None if block_table is None else describe(block_table, "block_table")
    ksi = None if ks is None else describe(ks, "k_scale")
    vsi = None if vs is None else describe(vs, "v_scale")
    # the cache side is decode's: check it with k_new as the "q" of num_new rows
    # nothing to append (num_new 0): every argument is still checked, here with one row,
    # then by fd_append_kv with num_new 0 (which writes nothing)
    empty = len(kn.shape) == 4 and int(kn.shape[1]) == 0
    if empty:
        kn, vn = _one_row(kn), _one_row(vn)
    g = check_call(kn, ki, vi, li, bi, None, None, None, fp8.kv_dtype, ksi, vsi)
    if g.num_heads_q != g.num_heads_kv:
        swapped = heads_layout_error(ki, "k_cache", g.paged, g.num_heads_q, g.num_heads_q)
        if swapped is not None:
            raise swapped
        raise ValueError("k_new: %d heads, the cache has num_heads_kv = %d"
                         % (g.num_heads_q, g.num_heads_kv))
    backend, device = _core._backend_of(g.device)
    key = (("backend", backend), ("device", device), ("dtype", FD_DTYPE[g.dtype]),
           ("batch", g.batch), ("q_len", 1), ("num_heads_q", g.num_heads_kv),
           ("num_heads_kv", g.num_heads_kv), ("head_dim", g.head_dim),
           ("kv_capacity", g.kv_capacity), ("page_size", g.page_size),
           ("max_pages_per_seq", g.max_pages_per_seq), ("num_pages", g.num_pages),
           ("num_splits", 1), ("softmax_scale", 0.0), ("hint_max", None),
           ("window_left", -1), ("logits_soft_cap", 0.0), ("non_causal", False),
           ("out_dtype", 0), ("kv_dtype", FD_KV_DTYPE.get(g.kv_dtype, 0)),
           ("kv_scale", g.kv_scale))
    plan = _core.cached_plan(key)
    t = _lib.FdAppendTensors()
    t.k_new, t.v_new = kn.ptr, vn.ptr
    if empty:  # a tensor of no element may have no address; num_new 0 reads none
        t.k_new, t.v_new = kn.ptr or ki.ptr, vn.ptr or vi.ptr
    t.k_new_strides[:] = c_strides(kn, 3)
    t.v_new_strides[:] = c_strides(vn, 3)
    t.k_cache, t.v_cache = ki.ptr, vi.ptr
    t.k_strides[:] = c_strides(ki, 3)
    t.v_strides[:] = c_strides(vi, 3)
    t.kv_len = li.ptr
    if bi is not None:
        t.block_table = bi.ptr
        t.block_table_stride = c_strides(bi, 1)[0]
    if ksi is not None:
        t.k_scale, t.v_scale = ksi.ptr, vsi.ptr
        if len(ksi.shape) == 3:
            t.scale_strides[:] = c_strides(ksi, 3)
    stream = None
    if torch_mode and k_new.device.type == "cuda":
        stream = sys_torch().cuda.current_stream(k_new.device).cuda_stream
    err = _lib.FdError()
    status = _lib.lib.fd_append_kv(ctypes.byref(plan), ctypes.byref(t), 0 if empty else g.q_len,
                                   stream, ctypes.byref(err))
    _lib.check(status, err)
    return None


def sys_torch():
    import sys

    return sys.modules["torch"]
