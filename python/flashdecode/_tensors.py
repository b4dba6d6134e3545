"""_tensors.py — what the binding needs to know about an array, and the checks.

``describe`` turns a torch.Tensor (real or fake) or a numpy.ndarray into a
``TensorInfo``: shape, strides in elements, dtype name, device and (only when
asked) the data pointer. ``check_call`` validates the tensors of one call
against each other and returns their ``Geometry``; it reads metadata only, so
torch.compile's fake implementation runs it too.

The checks here are the ones the C library cannot make (it sees pointers and
strides, not shapes or dtypes): dtype and device agreement, shapes that agree
between tensors, unit-stride head_dim, strides the C API cannot express.
Value checks on the scalars (q_len range, head counts, head_dim, capacities)
are left to the C library so that its message is the one raised.
"""

import numpy as np

from . import _lib

# dtype names used throughout the binding
F32, F16, BF16, I32 = "float32", "float16", "bfloat16", "int32"
E4M3, E5M2, U8 = "float8_e4m3fn", "float8_e5m2", "uint8"  # fp8 caches (torch, ml_dtypes names)
FD_DTYPE = {F32: _lib.FD_DTYPE_F32, F16: _lib.FD_DTYPE_F16, BF16: _lib.FD_DTYPE_BF16}
FD_KV_DTYPE = {E4M3: _lib.FD_DTYPE_E4M3, E5M2: _lib.FD_DTYPE_E5M2}
KV_SCALES = {"none": _lib.FD_KV_SCALE_NONE, "tensor": _lib.FD_KV_SCALE_TENSOR,
             "head": _lib.FD_KV_SCALE_HEAD, "token": _lib.FD_KV_SCALE_TOKEN}
_KV_SCALE_NAMES = {v: k for k, v in KV_SCALES.items()}
_ITEMSIZE = {F32: 4, F16: 2, BF16: 2, I32: 4, E4M3: 1, E5M2: 1, U8: 1}

_KV_DTYPE_ALIASES = {"e4m3": E4M3, "float8_e4m3fn": E4M3, "torch.float8_e4m3fn": E4M3,
                     "fp8": E4M3, "e5m2": E5M2, "float8_e5m2": E5M2, "torch.float8_e5m2": E5M2}


def resolve_kv_dtype(kv_dtype):
    """None, or the fp8 name ('float8_e4m3fn', 'float8_e5m2') of kv_dtype: a string
    ('e4m3', 'e5m2', ...), a torch float8 dtype or an ml_dtypes numpy dtype."""
    if kv_dtype is None:
        return None
    key = kv_dtype if isinstance(kv_dtype, str) else str(kv_dtype)
    name = _KV_DTYPE_ALIASES.get(key.lower())
    if name is None and not isinstance(kv_dtype, str):
        try:
            name = _KV_DTYPE_ALIASES.get(np.dtype(kv_dtype).name)
        except TypeError:
            name = None
    if name is None:
        raise TypeError("kv_dtype: %r is not an fp8 type ('e4m3' = float8_e4m3fn, 'e5m2' = "
                        "float8_e5m2, or their torch / ml_dtypes dtypes)" % (kv_dtype,))
    return name


def kv_scale_code(kv_scale):
    """FD_KV_SCALE_* of 'none' | 'tensor' | 'head' | 'token' (or None = 'none')."""
    if kv_scale is None:
        return _lib.FD_KV_SCALE_NONE
    code = KV_SCALES.get(str(kv_scale).lower())
    if code is None:
        raise ValueError("kv_scale: %r is not 'none', 'tensor', 'head' or 'token'" % (kv_scale,))
    return code


class TensorInfo:
    """Metadata of one array argument.

    Attributes
    ----------
    obj : torch.Tensor or numpy.ndarray
    kind : {'torch', 'numpy'}
    shape : tuple of int
    strides : tuple of int
        In elements (not bytes).
    dtype : str
        'float32', 'float16', 'bfloat16', 'int32', or another dtype's name.
    device : str
        'cpu', 'cuda:N', or another device's name.
    """

    __slots__ = ("obj", "kind", "shape", "strides", "dtype", "device")

    def __init__(self, obj, kind, shape, strides, dtype, device):
        self.obj, self.kind, self.shape, self.strides = obj, kind, shape, strides
        self.dtype, self.device = dtype, device

    @property
    def ptr(self):
        """Address of element [0, ...] (a host or device address)."""
        if self.kind == "torch":
            return self.obj.data_ptr()
        return self.obj.__array_interface__["data"][0]


# torch, once seen, and the names of its dtypes. Both are set together, once, by bind_torch
# (from _torch_ops' import, or the first eager call with torch imported) and only read
# afterwards: code that torch.compile traces (decode's describe) must neither read
# sys.modules (Dynamo would wrap that process-wide dict and iterate it; an import on another
# thread meanwhile, e.g. one of inductor's compile workers, fails the compile with
# "dictionary changed size during iteration") nor fill a cache (a fake implementation
# running for real under tracing would change a dict Dynamo has guarded on).
_torch_module = None
_TORCH_DTYPE_NAMES = {}


def _under_trace(torch):
    """True inside torch.compile's tracing, also in code it runs for real meanwhile (an
    import the traced code makes: is_compiling() is False there, but the trace's context
    is set, and a global changed then fails the guards made on it)."""
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)  # (torch 2.3+)
    if compiling is not None and compiling():
        return True
    context = getattr(getattr(getattr(torch, "_guards", None), "TracingContext", None),
                      "try_get", None)
    return context is not None and context() is not None


def bind_torch(torch):
    """Remember the torch module and name all its dtypes (idempotent; nothing under a
    trace: a global or dict changed there would fail the guards made on it)."""
    global _torch_module
    if _torch_module is torch or _under_trace(torch):
        return
    # (over a copy, taken in one C call: another thread's import may add to torch's namespace)
    names = {v: str(v).replace("torch.", "") for v in list(vars(torch).values())
             if isinstance(v, torch.dtype)}
    _TORCH_DTYPE_NAMES.update(names)
    _torch_module = torch


def is_torch_tensor(x):
    """True for a torch.Tensor (never imports torch for another object)."""
    torch = _torch_module
    if torch is None:
        # torch not bound yet (flashdecode imported first, no eager call since): only an
        # object of torch's own classes can be a tensor, and then torch is imported; it is
        # taken by an import statement, which a trace may run, not from sys.modules, which
        # it must not read (Dynamo guards on the module found there, and iterates the dict)
        if not type(x).__module__.startswith("torch"):
            return False
        import torch
        bind_torch(torch)
    return isinstance(x, torch.Tensor)


# the numpy dtype -> name cache is a dict of its own (names are costly to build): Dynamo
# (torch 2.11) cannot hash a numpy dtype met as a key of a dict it traces
_NUMPY_DTYPE_NAMES = {}


def _torch_dtype_name(dtype):
    name = _TORCH_DTYPE_NAMES.get(dtype)
    if name is None:  # (a dtype made after bind_torch: named, not cached)
        name = str(dtype).replace("torch.", "")
    return name


def _numpy_dtype_name(dtype):
    name = _NUMPY_DTYPE_NAMES.get(dtype)
    if name is None:
        if not dtype.isnative:
            name = "non-native byte order " + dtype.str
        else:
            name = dtype.name  # 'bfloat16': ml_dtypes' numpy extension type (used by JAX)
        _NUMPY_DTYPE_NAMES[dtype] = name
    return name


def describe(x, name):
    """The TensorInfo of ``x``; TypeError for anything but a torch.Tensor or ndarray."""
    if is_torch_tensor(x):
        dev = x.device
        device = dev.type if dev.index is None or dev.type == "cpu" else "%s:%d" % (dev.type,
                                                                                  dev.index)
        return TensorInfo(x, "torch", tuple(x.shape), tuple(x.stride()),
                          _torch_dtype_name(x.dtype), device)
    if isinstance(x, np.ndarray):
        itemsize = x.dtype.itemsize
        strides = []
        for s in x.strides:
            if s % itemsize:
                raise ValueError("%s: byte stride %d is not a multiple of the element size %d "
                                 "(an unaligned view); pass a copy" % (name, s, itemsize))
            strides.append(s // itemsize)
        if not x.flags.aligned:
            raise ValueError("%s: the array's address is not a multiple of its element size %d "
                             "(an unaligned view); pass a copy" % (name, itemsize))
        return TensorInfo(x, "numpy", tuple(x.shape), tuple(strides),
                          _numpy_dtype_name(x.dtype), "cpu")
    raise TypeError("%s: expected a torch.Tensor or a numpy.ndarray (or an object with "
                    "__dlpack__), got %s" % (name, type(x).__name__))


class Geometry:
    """The problem one call's tensors describe (all sizes in elements)."""

    __slots__ = ("batch", "q_len", "num_heads_q", "num_heads_kv", "head_dim", "dtype",
                 "out_dtype", "device", "paged", "kv_capacity", "page_size", "num_pages",
                 "max_pages_per_seq", "kv_dtype", "kv_scale", "rope_dim", "rope_dtype")

    def __repr__(self):
        return "Geometry(%s)" % ", ".join("%s=%r" % (k, getattr(self, k)) for k in self.__slots__)


def _shape_str(shape):
    return str(tuple(int(s) for s in shape))


def _check_float(t, name, dtype=None):
    if dtype is None:
        if t.dtype not in FD_DTYPE:
            raise TypeError("%s: dtype %s is not supported (float32, float16 or bfloat16)"
                            % (name, t.dtype))
    elif t.dtype != dtype:
        hint = ""
        if str(t.dtype) in ("uint8", "torch.uint8"):
            hint = "; a uint8 cache holds fp8 only with kv_dtype='e4m3' or 'e5m2'"
        raise TypeError("%s: dtype %s, expected %s (the dtype of q, or of k_new in append_kv)%s"
                        % (name, t.dtype, dtype, hint))


def _check_rank(t, name, ndim, layout):
    if len(t.shape) != ndim:
        raise ValueError("%s: expected %d dimensions %s, got shape %s"
                         % (name, ndim, layout, _shape_str(t.shape)))


def _check_device(t, name, device, first="q"):
    if t.device != device:
        raise ValueError("%s: on device %s, but %s is on %s (all tensors must be on one device)"
                         % (name, t.device, first, device))


def _check_rows(t, name, output):
    """head_dim unit-stride; strides the C API can take for dims 0..2."""
    shape, strides = t.shape, t.strides
    if 0 in tuple(shape):
        return  # nothing to read (numpy may report 0 strides): the C library names the 0 size
    if shape[3] > 1 and strides[3] != 1:
        raise ValueError("%s: the head_dim dimension must be unit-stride (its stride is %d); "
                         "pass a contiguous tensor" % (name, strides[3]))
    for i in range(3):
        if strides[i] < 0:
            raise ValueError("%s: stride %d of dimension %d is negative; pass a copy"
                             % (name, strides[i], i))
        if output and strides[i] == 0 and shape[i] > 1:
            raise ValueError("%s: a broadcast (stride 0) dimension, %d, where rows must be "
                             "distinct; pass a tensor that owns its memory" % (name, i))


# fd_tensors' FD_STRIDE_BROADCAST (INT64_MIN): an input broadcast along a dimension. The C
# API reads all-zero strides as 'contiguous' and refuses a literal 0 beside nonzero strides
# on a dimension of extent > 1, so a broadcast view's 0 strides are passed as this.
STRIDE_BROADCAST = -(1 << 63)


def c_strides(t, dims):
    """Strides of dims 0..dims-1 for the C API: size-1 dimensions get the
    contiguous value, so that a real tensor never passes all-zero strides
    (which the C API reads as 'contiguous'); a stride-0 (broadcast) dimension
    of size > 1 gets STRIDE_BROADCAST (only inputs get here: _check_rows and
    check_call refuse broadcast outputs first)."""
    shape, strides = t.shape, t.strides
    out = list(strides[:dims])
    for i in range(dims):
        if shape[i] == 1:
            n = 1
            for s in shape[i + 1:]:
                n *= s
            out[i] = n or 1
        elif strides[i] == 0:
            out[i] = STRIDE_BROADCAST
    return out


def _check_index_vector(t, name, batch, device):
    _check_rank(t, name, 1, "[batch]")
    if t.dtype != I32:
        raise TypeError("%s: dtype %s, expected int32" % (name, t.dtype))
    if t.shape[0] != batch:
        raise ValueError("%s: shape %s, expected (%d,) (batch of q)"
                         % (name, _shape_str(t.shape), int(batch)))
    if batch > 1 and t.strides[0] != 1:
        raise ValueError("%s: must be contiguous (stride %d)" % (name, t.strides[0]))
    _check_device(t, name, device)


def check_out_dtype(dtype, q_dtype, name="out"):
    """out's dtype: q's, or float32 whatever q's is (fd_problem.out_dtype)."""
    if dtype != q_dtype and dtype != F32:
        raise TypeError("%s: dtype %s, expected %s" % (
            name, dtype, F32 if q_dtype == F32 else "%s (the dtype of q) or float32" % q_dtype))


def check_sinks(sinks, num_heads_q, device):
    """sinks: float32 [num_heads_q], contiguous, on q's device."""
    if len(sinks.shape) != 1 or int(sinks.shape[0]) != num_heads_q:
        raise ValueError("sinks: shape %s, expected (%d,) (num_heads_q of q)"
                         % (_shape_str(sinks.shape), int(num_heads_q)))
    _check_device(sinks, "sinks", device)
    if sinks.dtype != F32:
        raise TypeError("sinks: dtype %s, expected float32" % sinks.dtype)
    if num_heads_q > 1 and sinks.strides[0] != 1:
        raise ValueError("sinks: must be contiguous (stride %d)" % sinks.strides[0])


def _cache_dtype(t, name, q_dtype, kv_dtype):
    """The fp8 name of a cache's elements (None for a cache of q's dtype): a float8
    dtype, or uint8 with kv_dtype given."""
    if t.dtype in FD_KV_DTYPE or (t.dtype == U8 and kv_dtype is not None):
        fp8 = t.dtype if t.dtype in FD_KV_DTYPE else kv_dtype
        if kv_dtype is not None and fp8 != kv_dtype:
            raise TypeError("%s: dtype %s, but kv_dtype is %s" % (name, t.dtype, kv_dtype))
        if q_dtype not in (F16, BF16):
            raise TypeError("%s: an fp8 cache (%s) needs q of float16 or bfloat16, not %s"
                            % (name, fp8, q_dtype))
        return fp8
    if kv_dtype is not None:
        raise TypeError("%s: dtype %s with kv_dtype=%s: expected %s, or uint8 holding its "
                        "codes" % (name, t.dtype, kv_dtype, kv_dtype))
    _check_float(t, name, q_dtype)
    return None


def check_scales(k_scale, v_scale, g, cache_shape):
    """The FD_KV_SCALE_* granularity of k_scale / v_scale (TensorInfos or None): float32
    of shape () or (1,) (per tensor), (num_heads_kv,) (per kv head) or the cache's shape
    without head_dim (per token), on q's device; both given or neither; fp8 caches only."""
    if g.kv_dtype is None:
        for t, name in ((k_scale, "k_scale"), (v_scale, "v_scale")):
            if t is not None:
                raise ValueError("%s: scales apply to an fp8 cache only (k_cache has q's "
                                 "dtype %s)" % (name, g.dtype))
        return _lib.FD_KV_SCALE_NONE
    if (k_scale is None) != (v_scale is None):
        raise ValueError("%s: None, but %s is given (give both scales, or neither)"
                         % (("k_scale", "v_scale") if k_scale is None else ("v_scale", "k_scale")))
    if k_scale is None:
        return _lib.FD_KV_SCALE_NONE
    token = tuple(int(s) for s in cache_shape[:3])
    codes = []
    for t, name in ((k_scale, "k_scale"), (v_scale, "v_scale")):
        if t.dtype != F32:
            raise TypeError("%s: dtype %s, expected float32" % (name, t.dtype))
        _check_device(t, name, g.device)
        shape = tuple(int(s) for s in t.shape)
        if len(shape) == 3 and shape == token:
            if any(s < 0 for s in t.strides):
                raise ValueError("%s: a negative stride; pass a copy" % name)
            codes.append(_lib.FD_KV_SCALE_TOKEN)
        elif len(shape) <= 1 and int(np.prod(shape)) == 1:
            codes.append(_lib.FD_KV_SCALE_TENSOR)
        elif shape == (g.num_heads_kv,):
            if t.strides[0] != 1:
                raise ValueError("%s: must be contiguous (stride %d)" % (name, t.strides[0]))
            codes.append(_lib.FD_KV_SCALE_HEAD)
        else:
            raise ValueError("%s: shape %s, expected () or (1,) (per tensor), (%d,) (per kv "
                             "head) or %s (per token: the cache's shape without head_dim)"
                             % (name, _shape_str(shape), g.num_heads_kv, _shape_str(token)))
    if codes[0] != codes[1]:
        raise ValueError("v_scale: per %s, but k_scale is per %s (one granularity for both)"
                         % (_KV_SCALE_NAMES[codes[1]], _KV_SCALE_NAMES[codes[0]]))
    if codes[0] == _lib.FD_KV_SCALE_TOKEN and c_strides(k_scale, 3) != c_strides(v_scale, 3):
        raise ValueError("v_scale: strides %r differ from k_scale's %r (the C API takes one "
                         "layout for both)" % (tuple(v_scale.strides), tuple(k_scale.strides)))
    return codes[0]


def heads_layout_error(k, name, paged, num_heads_q, num_heads_kv=None):
    """A ValueError naming a cache given in the head-major layout (transformers' [batch,
    num_heads_kv, capacity, head_dim]; paged: [num_pages, num_heads_kv, page_size,
    head_dim]) where flashdecode reads the heads from dimension 2, or None.

    With num_heads_kv known (a plan): dimension 1 holds it and dimension 2 does not.
    Without (decode): dimension 2 cannot be the kv heads (it does not divide num_heads_q)
    while dimension 1 can (the library would otherwise name num_heads_q and a 'head'
    count that is the capacity)."""
    d1, d2 = int(k.shape[1]), int(k.shape[2])
    if num_heads_kv is not None:
        swapped = d1 == num_heads_kv and d2 != num_heads_kv
    else:
        swapped = (d1 != d2 and 0 < d1 <= num_heads_q and num_heads_q % d1 == 0
                   and (d2 == 0 or num_heads_q % d2 != 0))
    if not swapped:
        return None
    if paged:
        layout, want = ("[num_pages, num_heads_kv, page_size, head_dim]",
                        "[num_pages, page_size, num_heads_kv, head_dim]")
    else:
        layout, want = ("[batch, num_heads_kv, capacity, head_dim] (transformers' layout)",
                        "[batch, capacity, num_heads_kv, head_dim]")
    return ValueError("%s: shape %s looks like %s: pass k.transpose(1, 2) and v.transpose(1, 2) "
                      "(views, no copy); flashdecode reads %s" % (name, _shape_str(k.shape),
                                                                  layout, want))


def check_block_table(block_table, batch, device, first="q"):
    """block_table: int32 [batch, max_pages_per_seq >= 1], rows contiguous, on the device."""
    _check_rank(block_table, "block_table", 2, "[batch, max_pages_per_seq]")
    if block_table.dtype != I32:
        raise TypeError("block_table: dtype %s, expected int32" % block_table.dtype)
    if int(block_table.shape[0]) != batch:
        raise ValueError("block_table: shape %s, expected batch %d rows"
                         % (_shape_str(block_table.shape), batch))
    if block_table.shape[1] == 0:
        raise ValueError("block_table: shape %s has no page columns (max_pages_per_seq 0)"
                         % _shape_str(block_table.shape))
    if block_table.shape[1] > 1 and block_table.strides[1] != 1:
        raise ValueError("block_table: its rows must be contiguous (column stride %d)"
                         % block_table.strides[1])
    if block_table.strides[0] < 0:
        raise ValueError("block_table: negative row stride")
    if batch > 1 and block_table.strides[0] == 0:
        raise ValueError("block_table: row stride 0 (a broadcast table); pass a copy")
    _check_device(block_table, "block_table", device, first)


def check_lse(lse, want, device, first="q"):
    """lse: float32 of shape ``want`` ([batch, num_heads_q, q_len]), owning its memory."""
    _check_rank(lse, "lse", 3, "[batch, num_heads_q, q_len]")
    if lse.dtype != F32:
        raise TypeError("lse: dtype %s, expected float32" % lse.dtype)
    if tuple(int(s) for s in lse.shape) != want:
        raise ValueError("lse: shape %s, expected %s" % (_shape_str(lse.shape),
                                                        _shape_str(want)))
    _check_device(lse, "lse", device, first)
    for i in range(3):
        if lse.strides[i] < 0 or (lse.strides[i] == 0 and lse.shape[i] > 1):
            raise ValueError("lse: stride %d of dimension %d; lse must own its memory"
                             % (lse.strides[i], i))


def check_call(q, k, v, kv_len, block_table, out, lse, sinks=None, kv_dtype=None, k_scale=None,
               v_scale=None):
    """Validate one call's TensorInfos (out, lse, sinks and the scales may be None) and
    return its Geometry (out_dtype: out's dtype, q's when out is None; kv_dtype: the fp8
    name of the cache or None; kv_scale: FD_KV_SCALE_*). ``kv_dtype`` (an fp8 name or
    None) reads uint8 caches as that fp8 type.

    Raises TypeError for a wrong dtype or argument type and ValueError for a
    wrong shape, device or stride.
    """
    _check_rank(q, "q", 4, "[batch, q_len, num_heads_q, head_dim]")
    _check_float(q, "q")
    g = Geometry()
    g.batch, g.q_len, g.num_heads_q, g.head_dim = (int(s) for s in q.shape)
    g.dtype, g.device = q.dtype, q.device
    g.out_dtype = q.dtype
    g.rope_dim, g.rope_dtype = 0, None
    if g.q_len == 0:
        raise ValueError("q: q_len (dimension 1) is 0")
    _check_rows(q, "q", output=False)
    g.paged = block_table is not None
    layout = ("[num_pages, page_size, num_heads_kv, head_dim]" if g.paged
              else "[batch, kv_capacity, num_heads_kv, head_dim]")
    g.kv_dtype = None
    for t, name in ((k, "k_cache"), (v, "v_cache")):
        _check_rank(t, name, 4, layout)
        fp8 = _cache_dtype(t, name, g.dtype, kv_dtype)
        if name == "k_cache":
            g.kv_dtype = fp8
        elif fp8 != g.kv_dtype:
            raise TypeError("v_cache: dtype %s differs from k_cache's %s" % (v.dtype, k.dtype))
        _check_device(t, name, g.device)
        _check_rows(t, name, output=False)
    if k.shape != v.shape:
        raise ValueError("v_cache: shape %s differs from k_cache's %s"
                         % (_shape_str(v.shape), _shape_str(k.shape)))
    if int(k.shape[3]) != g.head_dim:
        raise ValueError("k_cache: head_dim %d differs from q's %d" % (int(k.shape[3]), g.head_dim))
    g.num_heads_kv = int(k.shape[2])
    swapped = heads_layout_error(k, "k_cache", block_table is not None, g.num_heads_q)
    if swapped is not None:
        raise swapped
    _check_index_vector(kv_len, "kv_len", g.batch, g.device)
    if g.paged:
        check_block_table(block_table, g.batch, g.device)
        g.num_pages, g.page_size = int(k.shape[0]), int(k.shape[1])
        g.max_pages_per_seq = int(block_table.shape[1])
        if g.num_pages == 0:
            raise ValueError("k_cache: a paged cache with 0 pages")
        if g.page_size == 0:
            raise ValueError("k_cache: page_size (dimension 1) is 0 (the C API would read a "
                             "contiguous cache)")
        g.kv_capacity = 0  # = max_pages_per_seq * page_size
    else:
        if int(k.shape[0]) != g.batch:
            raise ValueError("k_cache: batch dimension %d differs from q's %d (for a paged "
                             "cache pass block_table)" % (int(k.shape[0]), g.batch))
        g.num_pages = g.page_size = g.max_pages_per_seq = 0
        g.kv_capacity = int(k.shape[1])
    if out is not None:
        _check_rank(out, "out", 4, "[batch, q_len, num_heads_q, head_dim]")
        check_out_dtype(out.dtype, g.dtype)
        g.out_dtype = out.dtype
        if tuple(out.shape) != tuple(q.shape):
            raise ValueError("out: shape %s, expected %s (the shape of q)"
                             % (_shape_str(out.shape), _shape_str(q.shape)))
        _check_device(out, "out", g.device)
        _check_rows(out, "out", output=True)
    if lse is not None:
        check_lse(lse, (g.batch, g.num_heads_q, g.q_len), g.device)
    if sinks is not None:
        check_sinks(sinks, g.num_heads_q, g.device)
    g.kv_scale = check_scales(k_scale, v_scale, g, k.shape)
    return g


def fill_tensors(q, k, v, kv_len, block_table, out, lse, sinks=None, k_scale=None,
                 v_scale=None):
    """The FdTensors struct of one call (TensorInfos; block_table, lse, sinks and the
    scales may be None; scales as check_call accepted them)."""
    t = _lib.FdTensors()
    t.q = q.ptr
    t.q_strides[:] = c_strides(q, 3)
    t.k_cache = k.ptr
    t.k_strides[:] = c_strides(k, 3)
    t.v_cache = v.ptr
    t.v_strides[:] = c_strides(v, 3)
    t.kv_len = kv_len.ptr
    if block_table is not None:
        t.block_table = block_table.ptr
        t.block_table_stride = c_strides(block_table, 1)[0]
    t.out = out.ptr
    t.out_strides[:] = c_strides(out, 3)
    if lse is not None:
        t.lse = lse.ptr
        t.lse_strides[:] = c_strides(lse, 3)
    if sinks is not None:
        t.sinks = sinks.ptr
    if k_scale is not None:
        t.k_scale, t.v_scale = k_scale.ptr, v_scale.ptr
        if len(k_scale.shape) == 3:
            t.scale_strides[:] = c_strides(k_scale, 3)
    return t
