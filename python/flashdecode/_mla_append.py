"""_mla_append.py — flashdecode.mla_append_kv: new tokens into an MLA latent cache."""
import ctypes

import numpy as np

from . import _arrays, _core, _lib
from ._mla import check_mla_call, with_unit_dim
from ._tensors import (FD_DTYPE, FD_KV_DTYPE, TensorInfo, _check_device, _check_rows,
                       _shape_str, c_strides, describe, is_torch_tensor)


def _new4(t, name, width):
    """ckv_new / kpe_new as [batch, num_new, 1, width]."""
    if len(t.shape) == 3:
        return with_unit_dim(t, 2)
    if len(t.shape) != 4 or int(t.shape[2]) != 1:
        raise ValueError("%s: expected [batch, num_new, %s] or [batch, num_new, 1, %s], got "
                         "shape %s" % (name, width, width, _shape_str(t.shape)))
    return t


def _one_row(info):
    """A [batch, 0, 1, w] TensorInfo with one new token instead (for the checks alone)."""
    b, _, h, d = (int(n) for n in info.shape)
    return TensorInfo(info.obj, info.kind, (b, 1, h, d), (h * d, h * d, d, 1), info.dtype,
                      info.device)


def mla_append_kv(ckv_new, kpe_new, ckv_cache, kpe_cache, kv_len, *, block_table=None,
                  k_scale=None, kv_dtype=None):
    """Write new tokens' latent and rope parts into an MLA cache, in place.

    The MLA counterpart of :func:`append_kv`: token ``i`` of sequence ``b``
    (``ckv_new[b, i]``, ``kpe_new[b, i]``) goes to position ``kv_len[b] + i``
    of ``ckv_cache`` and ``kpe_cache`` (contiguous or through
    ``block_table``), which :func:`mla_decode` then reads. ``kv_len`` holds
    the lengths *before* the append and is not changed. Only those positions
    (and their per-token scales) are written.

    Parameters
    ----------
    ckv_new : tensor/array [batch, num_new, D] (or [batch, num_new, 1, D])
        float32, float16 or bfloat16: the new latent vectors (after the
        kv_a layernorm in DeepSeek-V3).
    kpe_new : like ckv_new, [batch, num_new, R]
        The new rope parts (rotary embedding applied), ckv_new's dtype.
    ckv_cache, kpe_cache : the caches :func:`mla_decode` reads
        [batch, kv_capacity, (1,) D / R] or paged [num_pages, page_size, (1,)
        D / R]; strided views of one buffer are fine. ckv_cache of ckv_new's
        dtype (an exact copy) or fp8 (torch.float8_e4m3fn / e5m2, ml_dtypes
        float8 arrays, uint8 with ``kv_dtype``); kpe_cache of ckv_new's dtype
        or of ckv_cache's fp8 type.
    kv_len : int32 [batch] (or ints), lengths before the append
    block_table : int32 [batch, max_pages_per_seq], paged caches only
    k_scale : fp8 caches, optional (none: scale 1)
        A float or float32 (1,): each value x is stored as fp8(x / k_scale)
        (round to nearest even, saturated to the finite range; NaN stays
        NaN). float32 [batch, kv_capacity] (paged: [num_pages, page_size]; a
        trailing 1 accepted): per-token scales, *written* here as the token's
        largest finite |x| / 448 (e4m3) or / 57344 (e5m2), at least 2^-126
        (1 for an all-zero row), over the latent and, when kpe_cache is fp8,
        the rope part together; a 16-bit kpe_cache is copied exactly.
    kv_dtype : 'e4m3' or 'e5m2', optional
        For uint8 caches.

    Raises
    ------
    TypeError, ValueError
        As :func:`mla_decode` for the caches, kv_len, block_table and k_scale,
        naming the argument; ckv_new / kpe_new of other shapes, dtypes or
        devices than each other or the caches; the C library's
        InvalidArgumentError on the CPU: ``kv_len[b] + num_new`` beyond
        kv_capacity, a page id outside the pool, a scale that is zero,
        negative, NaN or infinite (nothing is written then). On CUDA those
        rows are skipped on the device and scale values are not checked.

    Notes
    -----
    CUDA tensors: enqueued on ``torch.cuda.current_stream()``; no allocation
    (pass a device tensor for k_scale), no host synchronisation: capturable
    in a CUDA graph. Not a torch custom op (a graph break under
    torch.compile). Source: fd_append_kv in flashdecode.h.
    """
    from ._api import Fp8Args, as_index_array, as_numpy_scale

    fp8 = Fp8Args(kv_dtype, k_scale, None)
    if not _arrays.is_native(ckv_new):
        dev = _arrays.foreign_device(ckv_new)
        if dev is None:
            raise TypeError("ckv_new: expected a torch.Tensor or a numpy.ndarray (or an object "
                            "with __dlpack__), got %s" % type(ckv_new).__name__)
        ckv_new, kpe_new, ckv_cache, kpe_cache, kv_len, block_table, ks = (
            _arrays.from_foreign(x, dev) for x in (ckv_new, kpe_new, ckv_cache, kpe_cache,
                                                   kv_len, block_table, fp8.k_scale))
        fp8.k_scale = ks
    torch_mode = is_torch_tensor(ckv_new)
    if torch_mode:
        from . import _torch_ops as ops

        kv_len = ops._as_index_tensor(kv_len, "kv_len", ckv_new, True)
        if block_table is not None:
            block_table = ops._as_index_tensor(block_table, "block_table", ckv_new, False)
        ks = ops.as_scale_tensor(fp8.k_scale, "k_scale", ckv_new)
    else:
        batch = ckv_new.shape[0] if getattr(ckv_new, "ndim", 0) >= 1 else None
        kv_len = as_index_array(kv_len, "kv_len", batch)
        if block_table is not None:
            block_table = as_index_array(block_table, "block_table", None)
        ks = as_numpy_scale(fp8.k_scale, "k_scale")
        for x, name in ((ckv_cache, "ckv_cache"), (kpe_cache, "kpe_cache"), (ks, "k_scale")):
            if isinstance(x, np.ndarray) and not x.flags.writeable:
                raise ValueError("%s: the array is read-only" % name)
    cn = _new4(describe(ckv_new, "ckv_new"), "ckv_new", "D")
    pn = _new4(describe(kpe_new, "kpe_new"), "kpe_new", "R")
    if tuple(cn.shape[:2]) != tuple(pn.shape[:2]):
        raise ValueError("kpe_new: shape %s, its [batch, num_new] differ from ckv_new's %s"
                         % (_shape_str(kpe_new.shape), _shape_str(ckv_new.shape)))
    if pn.dtype != cn.dtype:
        raise TypeError("kpe_new: dtype %s, expected %s (the dtype of ckv_new)"
                        % (pn.dtype, cn.dtype))
    _check_device(pn, "kpe_new", cn.device, "ckv_new")
    ki, kpi = describe(ckv_cache, "ckv_cache"), describe(kpe_cache, "kpe_cache")
    # fd_append_kv takes no broadcast (stride 0) view: refused as an output's, by name
    for info, name in ((cn, "ckv_new"), (pn, "kpe_new")):
        _check_rows(info, name, output=True)
    for info, name in ((ki, "ckv_cache"), (kpi, "kpe_cache")):
        if len(info.shape) in (3, 4):
            _check_rows(info if len(info.shape) == 4 else with_unit_dim(info, 2), name,
                        output=True)
    li = describe(kv_len, "kv_len")
    bi = None if block_table is None else describe(block_table, "block_table")
    ksi = None if ks is None else describe(ks, "k_scale")
    empty = int(cn.shape[1]) == 0
    if empty:  # nothing to append: every argument is still checked, with one row
        cn, pn = _one_row(cn), _one_row(pn)
    # the cache side is mla_decode's: check it with ckv_new as a q of num_new rows, one head
    g, infos = check_mla_call(cn, pn, ki, kpi, li, bi, None, None, fp8.kv_dtype, ksi,
                              first="ckv_new")
    backend, device = _core._backend_of(g.device)
    key = (("backend", backend), ("device", device), ("dtype", FD_DTYPE[g.dtype]),
           ("batch", g.batch), ("q_len", 1), ("num_heads_q", 1), ("num_heads_kv", 1),
           ("head_dim", g.head_dim), ("kv_capacity", g.kv_capacity),
           ("page_size", g.page_size), ("max_pages_per_seq", g.max_pages_per_seq),
           ("num_pages", g.num_pages), ("num_splits", 1), ("softmax_scale", 1.0),
           ("hint_max", None), ("window_left", -1), ("logits_soft_cap", 0.0),
           ("non_causal", False), ("out_dtype", 0), ("kv_dtype", FD_KV_DTYPE.get(g.kv_dtype, 0)),
           ("kv_scale", g.kv_scale), ("rope_dim", g.rope_dim),
           ("rope_dtype", _core.rope_dtype_code(g)))
    plan = _core.cached_plan(key)
    t = _lib.FdAppendTensors()
    k, kp = infos["ckv"], infos["kpe"]
    t.k_new, t.k_pe_new = cn.ptr, pn.ptr
    if empty:  # a tensor of no element may have no address; num_new 0 reads none
        t.k_new, t.k_pe_new = cn.ptr or k.ptr, pn.ptr or kp.ptr
    t.k_new_strides[:] = c_strides(cn, 3)
    t.k_pe_new_strides[:] = c_strides(pn, 3)
    t.k_cache, t.k_pe_cache = k.ptr, kp.ptr
    t.k_strides[:] = c_strides(k, 3)
    t.k_pe_strides[:] = c_strides(kp, 3)
    t.kv_len = li.ptr
    if bi is not None:
        t.block_table = bi.ptr
        t.block_table_stride = c_strides(bi, 1)[0]
    s = infos["k_scale"]
    if s is not None:
        t.k_scale = s.ptr
        if len(s.shape) == 3:
            t.scale_strides[:] = c_strides(s, 3)
    stream = None
    if torch_mode and ckv_new.device.type == "cuda":
        import sys

        stream = sys.modules["torch"].cuda.current_stream(ckv_new.device).cuda_stream
    err = _lib.FdError()
    status = _lib.lib.fd_append_kv(ctypes.byref(plan), ctypes.byref(t), 0 if empty else g.q_len,
                                   stream, ctypes.byref(err))
    _lib.check(status, err)
    return None
