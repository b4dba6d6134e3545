"""_merge.py — flashdecode.merge_states: fd_merge_states for any array kind.

``merge_states`` dispatches like ``decode``: torch tensors go through the
custom ops in _torch_ops (``flashdecode::merge_states`` /
``merge_states_out``), numpy arrays run here on the CPU backend, other
frameworks come in through DLPack. ``check_merge`` reads metadata only (the
torch fake implementations run it too); ``run_merge`` calls the C library.
"""
import ctypes

import numpy as np

from . import _arrays, _core, _lib
from ._tensors import F32, FD_DTYPE, _check_device, _shape_str, describe, is_torch_tensor


class MergeGeometry:
    __slots__ = ("num_states", "batch", "q_len", "num_heads", "head_dim", "dtype", "out_dtype",
                 "device")


def _dense_strides(shape):
    strides, n = [], 1
    for s in reversed(tuple(shape)):
        strides.append(n)
        n *= int(s)
    return tuple(reversed(strides))


def _check_dense(t, name):
    """The C API takes dense (contiguous) tensors only."""
    if 0 in tuple(t.shape):
        return  # nothing to read; the C library names a zero dimension
    dense = _dense_strides(t.shape)
    if any(int(n) > 1 and int(s) != d for n, s, d in zip(t.shape, t.strides, dense)):
        raise ValueError("%s: must be contiguous (strides %s for shape %s)"
                         % (name, tuple(int(s) for s in t.strides), _shape_str(t.shape)))


def check_merge(states_out, states_lse, out, lse):
    """Validate the TensorInfos of one merge (out and lse may be None); its MergeGeometry."""
    so, sl = states_out, states_lse
    if len(so.shape) != 5:
        raise ValueError("states_out: expected 5 dimensions [num_states, batch, q_len, "
                         "num_heads, head_dim], got shape %s" % _shape_str(so.shape))
    if so.dtype not in FD_DTYPE:
        raise TypeError("states_out: dtype %s is not supported (float32, float16 or bfloat16)"
                        % so.dtype)
    g = MergeGeometry()
    g.num_states, g.batch, g.q_len, g.num_heads, g.head_dim = (int(s) for s in so.shape)
    g.dtype, g.out_dtype, g.device = so.dtype, so.dtype, so.device
    if len(sl.shape) != 4:
        raise ValueError("states_lse: expected 4 dimensions [num_states, batch, num_heads, "
                         "q_len], got shape %s" % _shape_str(sl.shape))
    if sl.dtype != F32:
        raise TypeError("states_lse: dtype %s, expected float32" % sl.dtype)
    want = (g.num_states, g.batch, g.num_heads, g.q_len)
    if tuple(int(s) for s in sl.shape) != want:
        raise ValueError("states_lse: shape %s, expected %s ([num_states, batch, num_heads, "
                         "q_len] of states_out)" % (_shape_str(sl.shape), _shape_str(want)))
    _check_device(sl, "states_lse", g.device)
    _check_dense(so, "states_out")
    _check_dense(sl, "states_lse")
    if out is not None:
        want = (g.batch, g.q_len, g.num_heads, g.head_dim)
        if tuple(int(s) for s in out.shape) != want:
            raise ValueError("out: shape %s, expected %s ([batch, q_len, num_heads, head_dim] "
                             "of states_out)" % (_shape_str(out.shape), _shape_str(want)))
        if out.dtype not in FD_DTYPE:
            raise TypeError("out: dtype %s is not supported (float32, float16 or bfloat16)"
                            % out.dtype)
        g.out_dtype = out.dtype
        _check_device(out, "out", g.device)
        _check_dense(out, "out")
    if lse is not None:
        want = (g.batch, g.num_heads, g.q_len)
        if tuple(int(s) for s in lse.shape) != want:
            raise ValueError("lse: shape %s, expected %s ([batch, num_heads, q_len] of "
                             "states_lse)" % (_shape_str(lse.shape), _shape_str(want)))
        if lse.dtype != F32:
            raise TypeError("lse: dtype %s, expected float32" % lse.dtype)
        _check_device(lse, "lse", g.device)
        _check_dense(lse, "lse")
    return g


def run_merge(states_out, states_lse, out, lse, stream):
    """fd_merge_states on TensorInfos (out given; lse may be None)."""
    g = check_merge(states_out, states_lse, out, lse)
    p = _lib.FdMergeProblem()
    kind, index = _core.parse_device(g.device, "states_out")
    p.backend = _lib.FD_BACKEND_CPU if kind == "cpu" else _lib.FD_BACKEND_CUDA
    p.device = index or 0
    p.dtype = FD_DTYPE[g.dtype]
    p.out_dtype = FD_DTYPE[g.out_dtype]
    for name, value in (("num_states", g.num_states), ("batch", g.batch), ("q_len", g.q_len),
                        ("num_heads", g.num_heads), ("head_dim", g.head_dim)):
        setattr(p, name, _core._int32(name, value))
    err = _lib.FdError()
    status = _lib.lib.fd_merge_states(ctypes.byref(p), states_out.ptr, states_lse.ptr, out.ptr,
                                      None if lse is None else lse.ptr, stream,
                                      ctypes.byref(err))
    _lib.check(status, err)
    return g


def _stack(states, name):
    """A list/tuple of per-state arrays stacked into one (a copy)."""
    if not isinstance(states, (list, tuple)):
        return states
    if not states:
        raise ValueError("%s: an empty list (num_states must be >= 1)" % name)
    if is_torch_tensor(states[0]):
        import torch

        return torch.stack(list(states))
    return np.stack([np.asarray(s) for s in states])


def merge_states(states_out, states_lse, *, out=None, lse=None, out_dtype=None):
    """Merge attention states computed over disjoint key sets of the same queries.

    Each state ``s`` is an ``(out_s, lse_s)`` pair as :func:`decode` returns
    it with ``return_lse=True``, over its own keys (a part of the cache, a
    shared prefix, another device's keys). Per query row::

        m = max_s lse_s,   w_s = exp(lse_s - m),   L = sum_s w_s
        out = sum_s w_s * out_s / L,    lse = m + log(L)

    which is the attention over the union of the keys (the flash-decoding
    combine, public: cascade / shared-prefix decoding, KV split between
    devices). A state with ``lse_s = -inf`` (it saw no key) is the neutral
    element (its out_s is not read); all states empty gives ``out = 0``,
    ``lse = -inf``. A NaN lse_s gives a NaN row.

    Parameters
    ----------
    states_out : tensor/array [num_states, batch, q_len, num_heads, head_dim]
        float32, float16 or bfloat16; or a list of num_states arrays
        [batch, q_len, num_heads, head_dim] (stacked: one copy). A
        non-contiguous array is copied.
    states_lse : float32 tensor/array [num_states, batch, num_heads, q_len]
        Natural log; or a list of [batch, num_heads, q_len] arrays. Same
        device as states_out.
    out : tensor/array [batch, q_len, num_heads, head_dim], optional
        Written in place (contiguous); float32, float16 or bfloat16, whatever
        states_out's dtype (e.g. float32 states merged into a bf16 out).
    lse : float32 tensor/array [batch, num_heads, q_len], optional
        Written in place (contiguous).
    out_dtype : dtype, optional
        Of the allocated out: states_out's (default), or float32 / float16 /
        bfloat16 (torch; numpy has no bfloat16).

    Returns
    -------
    (out, lse)
        out [batch, q_len, num_heads, head_dim] (dtype out_dtype), lse
        float32 [batch, num_heads, q_len]; same kind and device as
        states_out.

    Notes
    -----
    numpy arrays run on the CPU backend (sums in double), torch tensors on
    their device (CUDA: fp32 sums, enqueued on the current stream, no
    allocation when out and lse are given, no host sync: CUDA-graph
    capturable); for torch this is the custom op
    ``torch.ops.flashdecode.merge_states`` (``merge_states_out`` with out),
    traced by torch.compile without a graph break.

    Examples
    --------
    Keys of one sequence in two parts (here of one cache: the first part seen
    by every query row, the second causally):

    >>> o1, l1 = flashdecode.decode(q, k[:, :n1], v[:, :n1], n1, non_causal=True,
    ...                             return_lse=True)             # doctest: +SKIP
    >>> o2, l2 = flashdecode.decode(q, k[:, n1:], v[:, n1:], kv_len - n1,
    ...                             return_lse=True)             # doctest: +SKIP
    >>> out, lse = flashdecode.merge_states([o1, o2], [l1, l2])  # doctest: +SKIP
    """
    states_out = _stack(states_out, "states_out")
    states_lse = _stack(states_lse, "states_lse")
    if is_torch_tensor(states_out):
        from ._api import load_torch_ops

        return load_torch_ops().merge_states(states_out, states_lse, out, lse, out_dtype)
    if isinstance(states_out, np.ndarray):
        return _merge_numpy(states_out, states_lse, out, lse, out_dtype)
    device = _arrays.foreign_device(states_out)
    if device is None:
        raise TypeError("states_out: expected a torch.Tensor or a numpy.ndarray (or an object "
                        "with __dlpack__), got %s" % type(states_out).__name__)
    conv = [_arrays.from_foreign(x, device) for x in (states_out, states_lse, out, lse)]
    res_out, res_lse = merge_states(conv[0], conv[1], out=conv[2], lse=conv[3],
                                    out_dtype=out_dtype)
    res_out = out if out is not None else _arrays.to_framework_of(res_out, states_out)
    res_lse = lse if lse is not None else _arrays.to_framework_of(res_lse, states_out)
    return res_out, res_lse


def out_dtype_of(out_dtype, out):
    """The out dtype name merge_states allocates (or checks out against)."""
    if out_dtype is None:
        return None
    name = _arrays.dtype_name(out_dtype, "out_dtype")
    if out is not None and describe(out, "out").dtype != name:
        raise TypeError("out: dtype %s, but out_dtype is %s" % (describe(out, "out").dtype, name))
    return name


def _merge_numpy(states_out, states_lse, out, lse, out_dtype):
    states_lse = np.asarray(states_lse) if not is_torch_tensor(states_lse) else states_lse
    name = out_dtype_of(out_dtype, out)
    if isinstance(states_out, np.ndarray) and not states_out.flags.c_contiguous:
        states_out = np.ascontiguousarray(states_out)
    if isinstance(states_lse, np.ndarray) and not states_lse.flags.c_contiguous:
        states_lse = np.ascontiguousarray(states_lse)
    shape = tuple(states_out.shape)
    if out is None and len(shape) == 5:
        out = np.empty(shape[1:], dtype=states_out.dtype if name is None else name)
    if lse is None and len(shape) == 5:
        lse = np.empty((shape[1], shape[3], shape[2]), dtype=np.float32)
    for arr, what in ((out, "out"), (lse, "lse")):
        if isinstance(arr, np.ndarray) and not arr.flags.writeable:
            raise ValueError("%s: the array is read-only" % what)
    run_merge(describe(states_out, "states_out"), describe(states_lse, "states_lse"),
              describe(out, "out") if out is not None else None,
              describe(lse, "lse") if lse is not None else None, None)
    return out, lse
