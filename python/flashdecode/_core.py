"""_core.py — plans and runs through the C API, for any array kind.

``make_plan`` fills an fd_problem and calls fd_plan_init; ``cached_plan``
memoises it for decode(), which plans every call from the tensors' shapes
(fp8 caches: kv_dtype and the scales' granularity are part of the key).
``run_decode`` checks one call's tensors, plans it and calls fd_run; the
caller supplies the output buffers, a workspace allocator and the stream.
"""
import ctypes
import functools
import math

import numpy as np

from . import _lib
from ._tensors import FD_DTYPE, FD_KV_DTYPE, check_call, fill_tensors

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1  # (shared with _torch_ops)


def parse_device(device, what="device"):
    """('cpu', 0) or ('cuda', index) from 'cpu', 'cuda', 'cuda:N' (or torch.device)."""
    text = str(device)
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index:
        return "cpu", 0
    if kind == "cuda":
        if not index:
            return "cuda", None
        if index.isdigit():
            return "cuda", int(index)
    raise ValueError("%s: %r is not supported (expected 'cpu', 'cuda' or 'cuda:N')"
                     % (what, text))


def _int_of(name, value, bits=32):
    """value as a Python int that a C int<bits>_t holds (bool refused, __index__ taken)."""
    if isinstance(value, bool):
        raise TypeError("%s: expected an int, got bool" % name)
    if not isinstance(value, int):
        try:
            value = int(value.__index__())
        except AttributeError:
            raise TypeError("%s: expected an int, got %s" % (name, type(value).__name__)) from None
    if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
        raise ValueError("%s: %d does not fit int%d" % (name, value, bits))
    return value


def _int32(name, value):
    return _int_of(name, value, 32)


def index_array(x, name):
    """Host kv_len / block_table values (an int, list or array) as int32 numpy data:
    TypeError for a non-integer dtype, ValueError for values outside the int32
    range (they are never wrapped)."""
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:  # ragged lists, objects numpy cannot read
        raise TypeError("%s: expected int32 values, got %s (%s)"
                        % (name, type(x).__name__, exc)) from None
    if arr.size == 0 and not hasattr(x, "dtype"):
        arr = arr.astype(np.int32)  # an empty list has no element type: numpy says float64
    if arr.dtype != np.int32:
        if arr.dtype.kind not in "iu":
            raise TypeError("%s: dtype %s, expected int32" % (name, arr.dtype))
        if arr.size and (arr.min() < INT32_MIN or arr.max() > INT32_MAX):
            raise ValueError("%s: values outside the int32 range" % name)
        arr = arr.astype(np.int32)
    return arr


def resolve_scale(softmax_scale):
    """None -> 0.0 (the C default, 1/sqrt(head_dim)); explicit 0 is refused."""
    if softmax_scale is None:
        return 0.0
    scale = _float32_value("softmax_scale", softmax_scale)  # (refuses an overflowing value)
    if scale != 0.0 and float(np.float32(scale)) == 0.0:
        raise ValueError("softmax_scale: %r rounds to 0 in float32 (the C API would read it "
                         "as 0, i.e. the default)" % scale)
    if scale == 0.0:
        raise ValueError("softmax_scale: 0 is not supported (the C API reads 0 as 'default'); "
                         "pass None for 1/sqrt(head_dim)")
    return scale


def _float32_value(name, value):
    """A Python float that float32 holds without overflow (NaN and inf pass: the C
    library names them)."""
    if isinstance(value, (bool, np.bool_, str, bytes)):  # True is not a number here
        raise TypeError("%s: expected a float, got %s" % (name, type(value).__name__))
    if not isinstance(value, (int, float)):
        if str(getattr(value, "dtype", "")) in ("bool", "torch.bool"):
            raise TypeError("%s: expected a float, got a bool array" % name)
        try:
            value = float(value.__float__())
        except AttributeError:
            raise TypeError("%s: expected a float, got %s" % (name, type(value).__name__)) from None
    value = float(value)
    if math.isfinite(value) and abs(value) > float(np.finfo(np.float32).max):
        raise ValueError("%s: %r overflows float32 (the C API's type)" % (name, value))
    return value


def resolve_window(window_left):
    """window_left as an int: -1 (or None) = no window, >= 0 a window. Values below -1
    go to the C library as a window, which names them."""
    if window_left is None:
        return -1
    return _int32("window_left", window_left)


def resolve_soft_cap(logits_soft_cap):
    """logits_soft_cap as a float: 0.0 (or None) = off. Negative and non-finite values
    go to the C library, which names them; one that float32 cannot hold is refused
    here (it would overflow to inf, or round to 0 = off)."""
    if logits_soft_cap is None:
        return 0.0
    cap = _float32_value("logits_soft_cap", logits_soft_cap)
    if cap != 0.0 and float(np.float32(cap)) == 0.0:
        raise ValueError("logits_soft_cap: %r rounds to 0 in float32 (the C API would read it "
                         "as 0, i.e. off)" % cap)
    return cap


def resolve_flag(name, value):
    """A bool argument (bool, or int 0/1)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError("%s: expected a bool, got %r" % (name, value))


class Variants:
    """The attention variant of a call or plan, its deterministic mode and how its kernels
    are launched (hashable; part of the plan key).

    window_left: -1 = no window; logits_soft_cap: 0.0 = off; non_causal: bool;
    deterministic: bool (fd_problem.deterministic: batch-invariant results);
    pdl: bool (False: fd_problem.no_pdl = 1, the first kernel launched plainly);
    tree: bool (fd_problem.tree_mask: the rows' draft keys come from a tree mask).
    """

    __slots__ = ("window_left", "logits_soft_cap", "non_causal", "deterministic", "pdl", "tree")

    def __init__(self, window_left=-1, logits_soft_cap=0.0, non_causal=False,
                 deterministic=False, pdl=True, tree=False):
        self.window_left = resolve_window(window_left)
        self.logits_soft_cap = resolve_soft_cap(logits_soft_cap)
        self.non_causal = resolve_flag("non_causal", non_causal)
        self.deterministic = resolve_flag("deterministic", deterministic)
        self.pdl = resolve_flag("pdl", pdl)
        self.tree = resolve_flag("tree_mask", tree)

    def key(self):
        return (self.window_left, self.logits_soft_cap, self.non_causal, self.deterministic,
                self.pdl, self.tree)

    def with_tree(self):
        """These variants with a tree mask."""
        return Variants(self.window_left, self.logits_soft_cap, self.non_causal,
                        self.deterministic, self.pdl, True)

    def __eq__(self, other):
        return isinstance(other, Variants) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        return ("Variants(window_left=%d, logits_soft_cap=%r, non_causal=%r, deterministic=%r, "
                "pdl=%r, tree=%r)"
                % self.key())


PLAIN = Variants()


def make_plan(*, backend, device, dtype, batch, q_len, num_heads_q, num_heads_kv, head_dim,
              kv_capacity, page_size, max_pages_per_seq, num_pages, num_splits, softmax_scale,
              num_threads=0, kv_len_hint=None, window_left=-1, logits_soft_cap=0.0,
              non_causal=False, out_dtype=0, kv_dtype=0, kv_scale=0, deterministic=False,
              pdl=True, rope_dim=0, rope_dtype=0, tree_mask=False):
    """Call fd_plan_init; returns an FdPlan or raises the C library's error.

    softmax_scale is a float, 0.0 meaning 1/sqrt(head_dim); kv_len_hint a
    sequence of ints or None; window_left -1 = no window (else has_window = 1);
    logits_soft_cap 0.0 = off; out_dtype an FD_DTYPE_* (0 = dtype); kv_dtype 0 (the
    cache has dtype) or FD_DTYPE_E4M3 / E5M2, kv_scale an FD_KV_SCALE_*;
    deterministic a bool (fd_problem.deterministic; with num_splits != 0 the C
    library refuses it, naming num_splits); pdl a bool (False: fd_problem.no_pdl = 1);
    rope_dim 0 (standard attention) or the rope width of an MLA plan, rope_dtype 0
    (k_pe_cache has kv_dtype) or an FD_DTYPE_* (fd_problem.rope_dtype).
    """
    p = _lib.FdProblem()
    p.backend = backend
    p.dtype = dtype
    window_left = _int32("window_left", window_left)
    p.has_window = 0 if window_left == -1 else 1
    p.window_left = window_left  # (< -1: the C library names it)
    p.logits_soft_cap = logits_soft_cap  # (negative, NaN, inf: the C library names it)
    p.non_causal = 1 if non_causal else 0
    p.deterministic = 1 if resolve_flag("deterministic", deterministic) else 0
    p.no_pdl = 0 if resolve_flag("pdl", pdl) else 1
    p.out_dtype = out_dtype
    p.kv_dtype = kv_dtype
    p.kv_scale = kv_scale
    p.rope_dtype = rope_dtype
    p.tree_mask = 1 if resolve_flag("tree_mask", tree_mask) else 0
    for name, value in (("batch", batch), ("q_len", q_len), ("num_heads_q", num_heads_q),
                        ("num_heads_kv", num_heads_kv), ("head_dim", head_dim),
                        ("kv_capacity", kv_capacity), ("page_size", page_size),
                        ("max_pages_per_seq", max_pages_per_seq), ("num_pages", num_pages),
                        ("num_splits", num_splits), ("num_threads", num_threads),
                        ("device", device), ("rope_dim", rope_dim)):
        setattr(p, name, _int32(name, value))
    p.softmax_scale = softmax_scale  # the C library rejects a non-finite value
    hint = None
    if kv_len_hint is not None:
        values = [_int32("kv_len_hint", v) for v in kv_len_hint]
        if len(values) != batch:
            raise ValueError("kv_len_hint: %d values, expected batch = %d" % (len(values), batch))
        hint = (ctypes.c_int32 * len(values))(*values)
        p.kv_len_hint = ctypes.cast(hint, ctypes.POINTER(ctypes.c_int32))
    plan, err = _lib.FdPlan(), _lib.FdError()
    status = _lib.lib.fd_plan_init(ctypes.byref(plan), ctypes.byref(p), ctypes.byref(err))
    _lib.check(status, err)
    return plan


@functools.lru_cache(maxsize=256)
def cached_plan(key):
    """make_plan for a hashable key (see plan_key); the FdPlan returned is shared: read only."""
    fields = dict(key)
    hint_max = fields.pop("hint_max")
    if hint_max is not None:
        fields["kv_len_hint"] = [hint_max] * fields["batch"]
    return make_plan(**fields)


def _backend_of(device):
    kind, index = parse_device(device, "q")
    if kind == "cpu":
        return _lib.FD_BACKEND_CPU, 0
    return _lib.FD_BACKEND_CUDA, index or 0


def _host_kv_len_max(kv_len, batch, capacity):
    """Longest kv_len, read from host memory, clamped into [0, capacity]."""
    if batch < 1:
        return 0  # (the plan refuses the batch with the C library's message)
    values = (ctypes.c_int32 * batch).from_address(kv_len.ptr)
    return min(max(max(values), 0), capacity)


def plan_for_call(g, kv_len, softmax_scale, num_splits, variants=PLAIN, backend=None):
    """The (cached) plan decode() uses for a call of Geometry g and Variants (and
    mla_decode(), for a Geometry with rope_dim > 0). ``backend`` (an FD_BACKEND_*)
    overrides the one of g's device (the tests run FD_BACKEND_REFERENCE on host data)."""
    backend_of_device, device = _backend_of(g.device)
    backend = backend_of_device if backend is None else backend
    hint_max = None
    if backend != _lib.FD_BACKEND_CUDA:
        capacity = g.kv_capacity if not g.paged else g.max_pages_per_seq * g.page_size
        hint_max = _host_kv_len_max(kv_len, g.batch, capacity)
    key = (("backend", backend), ("device", device), ("dtype", FD_DTYPE[g.dtype]),
           ("batch", g.batch), ("q_len", g.q_len), ("num_heads_q", g.num_heads_q),
           ("num_heads_kv", g.num_heads_kv), ("head_dim", g.head_dim),
           ("kv_capacity", g.kv_capacity), ("page_size", g.page_size),
           ("max_pages_per_seq", g.max_pages_per_seq), ("num_pages", g.num_pages),
           ("num_splits", num_splits), ("softmax_scale", softmax_scale),
           ("hint_max", hint_max), ("window_left", variants.window_left),
           ("logits_soft_cap", variants.logits_soft_cap), ("non_causal", variants.non_causal),
           ("deterministic", variants.deterministic), ("pdl", variants.pdl),
           ("tree_mask", variants.tree),
           ("out_dtype", FD_DTYPE[g.out_dtype] if g.out_dtype != g.dtype else 0),
           ("kv_dtype", FD_KV_DTYPE.get(g.kv_dtype, 0)), ("kv_scale", g.kv_scale),
           ("rope_dim", g.rope_dim), ("rope_dtype", rope_dtype_code(g)))
    return cached_plan(key)


def rope_dtype_code(g):
    """fd_problem.rope_dtype of Geometry g: 0 (k_pe_cache of kv_dtype, or no MLA) or the
    16-bit FD_DTYPE_* of a rope part kept at q's dtype beside an fp8 latent."""
    if not g.rope_dim or g.rope_dtype is None or g.rope_dtype == (g.kv_dtype or g.dtype):
        return 0
    return FD_DTYPE[g.rope_dtype]


def fd_run(plan, tensors, workspace_ptr, workspace_size, stream):
    """Call fd_run; raise the C library's error on failure."""
    err = _lib.FdError()
    status = _lib.lib.fd_run(ctypes.byref(plan), ctypes.byref(tensors), workspace_ptr,
                             workspace_size, stream, ctypes.byref(err))
    _lib.check(status, err)


def run_decode(q, k, v, kv_len, block_table, out, lse, softmax_scale, num_splits,
               alloc_workspace, stream, sinks=None, variants=PLAIN, kv_dtype=None, k_scale=None,
               v_scale=None, tree_mask=None):
    """One decode() call on TensorInfos: check, plan, run.

    out must be given (lse and sinks may be None); its dtype (q's or float32)
    sets the plan's out_dtype. ``alloc_workspace(nbytes)`` returns
    (buffer, address); the buffer is kept alive until fd_run returns (the C
    call is stream-ordered on CUDA: torch's caching allocator keeps the
    memory safe for work queued on the current stream). ``stream`` is a
    cudaStream_t as an int, or None.
    """
    g = check_call(q, k, v, kv_len, block_table, out, lse, sinks, kv_dtype, k_scale, v_scale)
    tree_stride = None
    if tree_mask is not None:  # (a TensorInfo of packed masks: _tree.py)
        from ._tree import check_tree_mask
        tree_stride = check_tree_mask(tree_mask, g)
        variants = variants.with_tree()
    plan = plan_for_call(g, kv_len, softmax_scale, _int32("num_splits", num_splits), variants)
    tensors = fill_tensors(q, k, v, kv_len, block_table, out, lse, sinks, k_scale, v_scale)
    if tree_mask is not None:
        tensors.tree_mask, tensors.tree_mask_stride = tree_mask.ptr, tree_stride
    buf, addr = (None, None)
    if plan.workspace_size:
        buf, addr = alloc_workspace(plan.workspace_size)
    fd_run(plan, tensors, addr, plan.workspace_size, stream)
    del buf
    return g
