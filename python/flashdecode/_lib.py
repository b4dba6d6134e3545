"""_lib.py — loads libflashdecode with ctypes and mirrors its C API.

Mirrors ``include/flashdecode.h`` field for field: the structs fd_problem,
fd_plan, fd_tensors, fd_error, fd_merge_problem and fd_append_tensors, the enums, and the
prototypes of the exported functions. At import it checks that the mirror agrees with the
loaded library (struct sizes against the LP64 layout computed from the
header, a plan made by the library read back through the mirror, and the
deterministic mode planned at FD_DETERMINISTIC_MAX_KEYS and one key more), so a
header/binding mismatch fails loudly instead of corrupting memory.

Library lookup order:
  1. the environment variable FLASHDECODE_LIBRARY (a path to libflashdecode.so),
  2. the package folder (where ``pip install`` puts it).
"""
import ctypes
import glob
import math
import os

__all__ = [
    "FD_STATUS_OK", "FD_STATUS_INVALID_ARGUMENT", "FD_STATUS_UNSUPPORTED",
    "FD_STATUS_WORKSPACE_TOO_SMALL", "FD_STATUS_OUT_OF_MEMORY", "FD_STATUS_BACKEND_ERROR",
    "FD_DTYPE_F32", "FD_DTYPE_F16", "FD_DTYPE_BF16", "FD_DTYPE_E4M3", "FD_DTYPE_E5M2",
    "FD_KV_SCALE_NONE", "FD_KV_SCALE_TENSOR", "FD_KV_SCALE_HEAD", "FD_KV_SCALE_TOKEN",
    "FdAppendTensors",
    "FD_BACKEND_AUTO", "FD_BACKEND_CPU", "FD_BACKEND_CUDA", "FD_BACKEND_REFERENCE",
    "FD_MAX_SPLITS", "FD_MAX_Q_LEN", "FD_MAX_Q_LEN_NON_CAUSAL", "FD_MAX_MERGE_STATES",
    "FD_DETERMINISTIC_SPLIT_LEN", "FD_DETERMINISTIC_MAX_KEYS",
    "FdProblem", "FdPlan", "FdTensors", "FdError", "FdMergeProblem", "lib", "library_path",
    "check",
]

# The C library version this binding mirrors (FD_VERSION_* in flashdecode.h).
VERSION_MAJOR, VERSION_MINOR, VERSION_PATCH = 0, 1, 0
VERSION_STRING = "0.1.0"
VERSION_NUMBER = VERSION_MAJOR * 10000 + VERSION_MINOR * 100 + VERSION_PATCH

# enum fd_status
FD_STATUS_OK = 0
FD_STATUS_INVALID_ARGUMENT = 1
FD_STATUS_UNSUPPORTED = 2
FD_STATUS_WORKSPACE_TOO_SMALL = 3
FD_STATUS_OUT_OF_MEMORY = 4
FD_STATUS_BACKEND_ERROR = 5

# enum fd_dtype
FD_DTYPE_F32 = 1
FD_DTYPE_F16 = 2
FD_DTYPE_BF16 = 3
FD_DTYPE_E4M3 = 4  # float8 e4m3fn: kv_dtype only
FD_DTYPE_E5M2 = 5  # float8 e5m2: kv_dtype only

# enum fd_kv_scale
FD_KV_SCALE_NONE = 0
FD_KV_SCALE_TENSOR = 1
FD_KV_SCALE_HEAD = 2
FD_KV_SCALE_TOKEN = 3

# enum fd_backend
FD_BACKEND_AUTO = 0
FD_BACKEND_CPU = 1
FD_BACKEND_CUDA = 2
FD_BACKEND_REFERENCE = 3

FD_MAX_SPLITS = 1024
FD_MAX_Q_LEN = 16              # query rows per sequence, causal
FD_MAX_Q_LEN_NON_CAUSAL = 128  # ... in non-causal mode (fd_problem.non_causal)
FD_MAX_Q_LEN_TREE = 64         # ... with a tree mask (fd_problem.tree_mask)
FD_MAX_MERGE_STATES = 65536
# fd_problem.deterministic: the fixed split length, and the most keys a sequence may read
FD_DETERMINISTIC_SPLIT_LEN = 2048
FD_DETERMINISTIC_MAX_KEYS = FD_DETERMINISTIC_SPLIT_LEN * 1024
# fd_plan.magic of a plan made by fd_plan_init (src/internal.h); read only by
# the import-time layout check.
_FD_PLAN_MAGIC = 0x66645031

_c_enum = ctypes.c_int  # C enums here are int-sized (all values fit an int)


class FdProblem(ctypes.Structure):
    """Mirror of ``fd_problem``: the shapes a plan is made for."""

    _fields_ = [
        ("backend", _c_enum),
        ("dtype", _c_enum),
        ("batch", ctypes.c_int32),
        ("q_len", ctypes.c_int32),
        ("num_heads_q", ctypes.c_int32),
        ("num_heads_kv", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("kv_capacity", ctypes.c_int32),
        ("page_size", ctypes.c_int32),
        ("max_pages_per_seq", ctypes.c_int32),
        ("num_pages", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("num_threads", ctypes.c_int32),
        ("device", ctypes.c_int32),
        ("sm_count", ctypes.c_int32),
        ("kv_len_hint", ctypes.POINTER(ctypes.c_int32)),  # host int32 [batch] or NULL
        # attention variants (zero = off)
        ("has_window", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("logits_soft_cap", ctypes.c_float),
        ("non_causal", ctypes.c_int32),
        ("out_dtype", _c_enum),                # 0 = dtype, or FD_DTYPE_F32
        ("deterministic", ctypes.c_int32),     # 1: batch-invariant results
        # fp8 KV cache
        ("kv_dtype", _c_enum),                 # 0 = dtype, or FD_DTYPE_E4M3 / E5M2
        ("kv_scale", _c_enum),                 # FD_KV_SCALE_*
        # launch
        ("no_pdl", ctypes.c_int32),            # 1: the first kernel launched plainly
        # multi-head latent attention (MLA)
        ("rope_dim", ctypes.c_int32),          # 0 = standard attention
        ("rope_dtype", _c_enum),               # k_pe_cache's type: 0 = kv_dtype
        # speculative-decoding trees
        ("tree_mask", ctypes.c_int32),         # 1: fd_tensors.tree_mask gives the draft keys
    ]


class FdPlan(ctypes.Structure):
    """Mirror of ``fd_plan``: plain data, copied freely; no destroy function."""

    _fields_ = [
        ("problem", FdProblem),
        ("backend", _c_enum),
        ("softmax_scale", ctypes.c_float),
        ("kv_capacity", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
        ("chunk_len", ctypes.c_int32),
        ("sm_count", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("kernel", _c_enum),                   # fd_kernel: what fd_run runs (read-only)
        ("workspace_size", ctypes.c_size_t),
        ("magic", ctypes.c_uint32),
        ("split_keys", ctypes.c_int32),
        ("ws_partial_o", ctypes.c_size_t),
        ("ws_partial_ml", ctypes.c_size_t),
        ("ws_counters", ctypes.c_size_t),
        ("cpu_isa", ctypes.c_int32),           # CPU: the instruction set fd_run runs
    ]


_Strides3 = ctypes.c_int64 * 3


class FdTensors(ctypes.Structure):
    """Mirror of ``fd_tensors``: pointers and strides (in elements) of one call."""

    _fields_ = [
        ("q", ctypes.c_void_p),                 # [batch, q_len, num_heads_q, head_dim]
        ("q_strides", _Strides3),
        ("k_cache", ctypes.c_void_p),           # [batch, kv_capacity, num_heads_kv, head_dim]
        ("k_strides", _Strides3),               #  or [num_pages, page_size, num_heads_kv, head_dim]
        ("v_cache", ctypes.c_void_p),
        ("v_strides", _Strides3),
        ("kv_len", ctypes.c_void_p),            # int32 [batch]
        ("block_table", ctypes.c_void_p),       # int32 [batch, max_pages_per_seq]
        ("block_table_stride", ctypes.c_int64),
        ("out", ctypes.c_void_p),               # [batch, q_len, num_heads_q, head_dim]
        ("out_strides", _Strides3),
        ("lse", ctypes.c_void_p),               # float32 [batch, num_heads_q, q_len]
        ("lse_strides", _Strides3),
        ("sinks", ctypes.c_void_p),             # float32 [num_heads_q] or NULL
        ("k_scale", ctypes.c_void_p),           # float32 fp8 scales (by kv_scale) or NULL
        ("v_scale", ctypes.c_void_p),
        ("scale_strides", _Strides3),           # per-token scales: {batch or page, pos, head}
        # MLA only (rope_dim > 0)
        ("q_pe", ctypes.c_void_p),              # [batch, q_len, num_heads_q, rope_dim]
        ("q_pe_strides", _Strides3),
        ("k_pe_cache", ctypes.c_void_p),        # like k_cache, rope_dim columns
        ("k_pe_strides", _Strides3),
        # tree masks only (fd_problem.tree_mask = 1)
        ("tree_mask", ctypes.c_void_p),         # uint64 [batch, q_len]
        ("tree_mask_stride", ctypes.c_int64),   # 0 = q_len; FD_STRIDE_BROADCAST
    ]


class FdAppendTensors(ctypes.Structure):
    """Mirror of ``fd_append_tensors``: the tensors of an fd_append_kv call."""

    _fields_ = [
        ("k_new", ctypes.c_void_p),             # [batch, num_new, num_heads_kv, head_dim]
        ("k_new_strides", _Strides3),
        ("v_new", ctypes.c_void_p),
        ("v_new_strides", _Strides3),
        ("k_cache", ctypes.c_void_p),
        ("k_strides", _Strides3),
        ("v_cache", ctypes.c_void_p),
        ("v_strides", _Strides3),
        ("kv_len", ctypes.c_void_p),            # int32 [batch], before the append
        ("block_table", ctypes.c_void_p),
        ("block_table_stride", ctypes.c_int64),
        ("k_scale", ctypes.c_void_p),
        ("v_scale", ctypes.c_void_p),
        ("scale_strides", _Strides3),
        # MLA only (rope_dim > 0)
        ("k_pe_new", ctypes.c_void_p),          # [batch, num_new, 1, rope_dim]
        ("k_pe_new_strides", _Strides3),
        ("k_pe_cache", ctypes.c_void_p),
        ("k_pe_strides", _Strides3),
    ]


class FdMergeProblem(ctypes.Structure):
    """Mirror of ``fd_merge_problem``: the shapes of an fd_merge_states call."""

    _fields_ = [
        ("backend", _c_enum),
        ("dtype", _c_enum),
        ("out_dtype", _c_enum),
        ("num_states", ctypes.c_int32),
        ("batch", ctypes.c_int32),
        ("q_len", ctypes.c_int32),
        ("num_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("device", ctypes.c_int32),
    ]


class FdError(ctypes.Structure):
    """Mirror of ``fd_error``: status and a NUL-terminated one-line message."""

    _fields_ = [("status", _c_enum), ("message", ctypes.c_char * 256)]


def _c_layout(fields):
    """Size and field offsets of a C struct on an LP64 ABI (x86-64, aarch64).

    ``fields`` is a list of (name, size, align). Computed independently of
    ctypes from the header's declarations, so comparing it with ctypes checks
    the mirror's field list, not ctypes' own arithmetic.
    """
    offsets, off, max_align = {}, 0, 1
    for name, size, align in fields:
        off = (off + align - 1) // align * align
        offsets[name] = off
        off += size
        max_align = max(max_align, align)
    return (off + max_align - 1) // max_align * max_align, offsets


_I32 = (4, 4)
_PTR = (8, 8)
_I64 = (8, 8)
_PROBLEM_DECL = [("backend",) + _I32, ("dtype",) + _I32] + [
    (n,) + _I32 for n in ("batch", "q_len", "num_heads_q", "num_heads_kv", "head_dim",
                          "kv_capacity", "page_size", "max_pages_per_seq", "num_pages",
                          "num_splits", "softmax_scale", "num_threads", "device", "sm_count")
] + [("kv_len_hint",) + _PTR] + [
    (n,) + _I32 for n in ("has_window", "window_left", "logits_soft_cap", "non_causal",
                          "out_dtype", "deterministic", "kv_dtype", "kv_scale", "no_pdl",
                          "rope_dim", "rope_dtype", "tree_mask")]
_PROBLEM_SIZE = _c_layout(_PROBLEM_DECL)[0]
_PLAN_DECL = [("problem", _PROBLEM_SIZE, 8)] + [
    (n,) + _I32 for n in ("backend", "softmax_scale", "kv_capacity", "num_splits", "chunk_len",
                          "sm_count", "num_threads", "kernel")
] + [("workspace_size",) + _I64, ("magic",) + _I32, ("split_keys",) + _I32,
     ("ws_partial_o",) + _I64,
     ("ws_partial_ml",) + _I64, ("ws_counters",) + _I64, ("cpu_isa",) + _I32]
_TENSORS_DECL = []
for _n in ("q", "k", "v"):
    _TENSORS_DECL += [({"q": "q"}.get(_n, _n + "_cache"),) + _PTR, (_n + "_strides", 24, 8)]
_TENSORS_DECL += [("kv_len",) + _PTR, ("block_table",) + _PTR, ("block_table_stride",) + _I64,
                  ("out",) + _PTR, ("out_strides", 24, 8), ("lse",) + _PTR,
                  ("lse_strides", 24, 8), ("sinks",) + _PTR, ("k_scale",) + _PTR,
                  ("v_scale",) + _PTR, ("scale_strides", 24, 8),
                  ("q_pe",) + _PTR, ("q_pe_strides", 24, 8),
                  ("k_pe_cache",) + _PTR, ("k_pe_strides", 24, 8),
                  ("tree_mask",) + _PTR, ("tree_mask_stride",) + _I64]
_APPEND_DECL = []
for _n in ("k_new", "v_new", "k_cache", "v_cache"):
    _APPEND_DECL += [(_n,) + _PTR, ({"k_cache": "k", "v_cache": "v"}.get(_n, _n) + "_strides", 24, 8)]
_APPEND_DECL += [("kv_len",) + _PTR, ("block_table",) + _PTR, ("block_table_stride",) + _I64,
                 ("k_scale",) + _PTR, ("v_scale",) + _PTR, ("scale_strides", 24, 8),
                 ("k_pe_new",) + _PTR, ("k_pe_new_strides", 24, 8),
                 ("k_pe_cache",) + _PTR, ("k_pe_strides", 24, 8)]
_MERGE_PROBLEM_DECL = [(n,) + _I32 for n in ("backend", "dtype", "out_dtype", "num_states",
                                             "batch", "q_len", "num_heads", "head_dim",
                                             "device")]
_ERROR_DECL = [("status",) + _I32, ("message", 256, 1)]


def _check_struct_layouts():
    """Raise ImportError when a ctypes mirror disagrees with the header's layout."""
    if ctypes.sizeof(ctypes.c_void_p) != 8 or ctypes.sizeof(ctypes.c_size_t) != 8:
        return  # not LP64: the computed layout does not apply; the runtime check remains
    for cls, decl in ((FdProblem, _PROBLEM_DECL), (FdPlan, _PLAN_DECL),
                      (FdTensors, _TENSORS_DECL), (FdError, _ERROR_DECL),
                      (FdMergeProblem, _MERGE_PROBLEM_DECL), (FdAppendTensors, _APPEND_DECL)):
        size, offsets = _c_layout(decl)
        got = {name: getattr(cls, name).offset for name, _ in cls._fields_}
        if ctypes.sizeof(cls) != size or got != offsets:
            raise ImportError(
                "flashdecode: the ctypes mirror of %s does not match flashdecode.h (size %d, "
                "expected %d; offsets %r, expected %r)"
                % (cls.__name__, ctypes.sizeof(cls), size, got, offsets))


def _candidate_paths():
    env = os.environ.get("FLASHDECODE_LIBRARY")
    if env:
        return [env], "FLASHDECODE_LIBRARY=%s" % env
    here = os.path.dirname(os.path.abspath(__file__))
    found = []
    for name in ("libflashdecode.so", "libflashdecode.dylib", "flashdecode.dll"):
        path = os.path.join(here, name)
        if os.path.exists(path):
            found.append(path)
    # a versioned name only (libflashdecode.so.0, libflashdecode.so.0.1.0)
    found += sorted(glob.glob(os.path.join(here, "libflashdecode.so.*")), key=len)
    return found, "the package folder %s" % here


def _load():
    paths, where = _candidate_paths()
    if not paths:
        raise ImportError(
            "flashdecode: libflashdecode.so not found in %s. Install the package with "
            "`pip install .` from the repository (it builds the library with CMake), or set "
            "FLASHDECODE_LIBRARY to the path of a built libflashdecode.so." % where)
    errors = []
    for path in paths:
        if not os.path.isfile(path):
            errors.append("%s: no such file" % path)
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as exc:
            errors.append("%s: %s" % (path, exc))
    raise ImportError("flashdecode: cannot load libflashdecode from %s (%s)"
                      % (where, "; ".join(errors)))


def _declare(lib):
    P = ctypes.POINTER
    protos = {
        "fd_version": (ctypes.c_char_p, []),
        "fd_version_number": (ctypes.c_int, []),
        "fd_status_name": (ctypes.c_char_p, [_c_enum]),
        "fd_dtype_size": (ctypes.c_size_t, [_c_enum]),
        "fd_backend_name": (ctypes.c_char_p, [_c_enum]),
        "fd_backend_available": (ctypes.c_int, [_c_enum]),
        "fd_plan_init": (_c_enum, [P(FdPlan), P(FdProblem), P(FdError)]),
        "fd_run": (_c_enum, [P(FdPlan), P(FdTensors), ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_void_p, P(FdError)]),
        "fd_decode": (_c_enum, [P(FdProblem), P(FdTensors), ctypes.c_void_p, P(FdError)]),
        "fd_num_splits_heuristic": (ctypes.c_int32, [ctypes.c_int64, ctypes.c_int64,
                                                     ctypes.c_int32, ctypes.c_int32]),
        "fd_merge_states": (_c_enum, [P(FdMergeProblem), ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                      P(FdError)]),
        "fd_append_kv": (_c_enum, [P(FdPlan), P(FdAppendTensors), ctypes.c_int32,
                                   ctypes.c_void_p, P(FdError)]),
    }
    for name, (restype, argtypes) in protos.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ImportError("flashdecode: %s does not export %s (an incomplete or foreign "
                              "build?)" % (library_path, name)) from None
        fn.restype = restype
        fn.argtypes = argtypes


def _check_library():
    """Version match, struct sizes (when the library reports them), and a plan made
    by the library read back through the mirror."""
    number = lib.fd_version_number()
    if number // 100 != VERSION_NUMBER // 100:
        raise ImportError("flashdecode: %s is version %s, this package binds %s"
                          % (library_path, lib.fd_version().decode(), VERSION_STRING))
    struct_size = lib.fd_struct_size
    struct_size.restype, struct_size.argtypes = ctypes.c_size_t, [ctypes.c_char_p]
    for name, cls in (("fd_problem", FdProblem), ("fd_plan", FdPlan),
                      ("fd_tensors", FdTensors), ("fd_error", FdError),
                      ("fd_merge_problem", FdMergeProblem),
                      ("fd_append_tensors", FdAppendTensors)):
        if struct_size(name.encode()) != ctypes.sizeof(cls):
            raise ImportError("flashdecode: sizeof(%s) is %d in %s, %d in this binding"
                              % (name, struct_size(name.encode()), library_path,
                                 ctypes.sizeof(cls)))
    problem = FdProblem()
    problem.backend = FD_BACKEND_CPU
    problem.dtype = FD_DTYPE_F16
    problem.batch, problem.q_len = 3, 2
    problem.num_heads_q, problem.num_heads_kv, problem.head_dim = 6, 2, 40
    problem.page_size, problem.max_pages_per_seq, problem.num_pages = 16, 50, 70
    problem.num_splits, problem.num_threads = 2, 3
    problem.has_window, problem.window_left, problem.logits_soft_cap = 1, 100, 30.0
    problem.out_dtype = FD_DTYPE_F32
    problem.kv_dtype, problem.kv_scale = FD_DTYPE_E4M3, FD_KV_SCALE_TOKEN
    problem.no_pdl = 1
    plan, err = FdPlan(), FdError()
    status = lib.fd_plan_init(ctypes.byref(plan), ctypes.byref(problem), ctypes.byref(err))
    p = plan.problem
    ok = (status == FD_STATUS_OK and plan.magic == _FD_PLAN_MAGIC
          and plan.backend == FD_BACKEND_CPU and p.backend == FD_BACKEND_CPU
          and p.dtype == FD_DTYPE_F16 and (p.batch, p.q_len) == (3, 2)
          and (p.num_heads_q, p.num_heads_kv, p.head_dim) == (6, 2, 40)
          and (p.page_size, p.max_pages_per_seq, p.num_pages) == (16, 50, 70)
          and plan.kv_capacity == 800 and p.kv_capacity == 800
          and plan.num_threads == 3 and p.num_threads == 3 and 1 <= plan.num_splits <= 2
          and math.isclose(plan.softmax_scale, 1.0 / math.sqrt(40), rel_tol=1e-6)
          and not p.kv_len_hint
          and (p.has_window, p.window_left, p.logits_soft_cap) == (1, 100, 30.0)
          and p.non_causal == 0 and p.out_dtype == FD_DTYPE_F32 and p.deterministic == 0
          and (p.kv_dtype, p.kv_scale) == (FD_DTYPE_E4M3, FD_KV_SCALE_TOKEN) and p.no_pdl == 1
          and (plan.num_splits == 1 or max(plan.ws_partial_o, plan.ws_partial_ml,
                                           plan.ws_counters) < plan.workspace_size))
    if not ok:
        raise ImportError(
            "flashdecode: a plan made by %s does not read back through the ctypes mirror of "
            "fd_plan (status %d: %s); the library and this package disagree on the struct "
            "layout" % (library_path, status, err.message.decode(errors="replace")))
    # the deterministic mode's constants: a plan of FD_DETERMINISTIC_MAX_KEYS keys takes
    # FD_DETERMINISTIC_SPLIT_LEN-key splits, one more key is refused
    problem = FdProblem()
    problem.backend, problem.dtype = FD_BACKEND_CPU, FD_DTYPE_F32
    problem.batch = problem.q_len = problem.num_heads_q = problem.num_heads_kv = 1
    problem.head_dim, problem.num_threads, problem.deterministic = 8, 1, 1
    problem.kv_capacity = FD_DETERMINISTIC_MAX_KEYS
    status = lib.fd_plan_init(ctypes.byref(plan), ctypes.byref(problem), ctypes.byref(err))
    ok = (status == FD_STATUS_OK and plan.problem.deterministic == 1
          and plan.num_splits == FD_DETERMINISTIC_MAX_KEYS // FD_DETERMINISTIC_SPLIT_LEN)
    problem.kv_capacity = FD_DETERMINISTIC_MAX_KEYS + 1
    status_over = lib.fd_plan_init(ctypes.byref(plan), ctypes.byref(problem), None)
    if not ok or status_over != FD_STATUS_INVALID_ARGUMENT:
        raise ImportError(
            "flashdecode: %s does not plan the deterministic mode as FD_DETERMINISTIC_SPLIT_LEN "
            "= %d and FD_DETERMINISTIC_MAX_KEYS = %d of this binding say (status %d, %d splits; "
            "one key more: status %d)" % (library_path, FD_DETERMINISTIC_SPLIT_LEN,
                                         FD_DETERMINISTIC_MAX_KEYS, status, plan.num_splits,
                                         status_over))


_check_struct_layouts()
lib, library_path = _load()
_declare(lib)
_check_library()


def status_name(status):
    """The C name of an fd_status value, e.g. ``'FD_STATUS_UNSUPPORTED'``."""
    return lib.fd_status_name(status).decode()


def check(status, err):
    """Raise the exception matching a failed fd_status, with the C library's message."""
    if status == FD_STATUS_OK:
        return
    from .errors import error_for_status

    raise error_for_status(status, err.message.decode(errors="replace"), status_name(status))
