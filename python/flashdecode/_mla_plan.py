"""_mla_plan.py — MLADecodePlan: an MLA decode plan made once, run for every layer."""
import sys

import numpy as np

from . import _arrays, _core
from ._mla import check_mla_call, fill_mla_tensors, required_scale
from ._plan import (_CACHE_SIZE, _HOST_INDEX_TYPES, _NOT_CACHED, DecodePlan, _address_getter,
                    _output_signature, _signature)
from ._lib import FdTensors
from ._tensors import FD_DTYPE, KV_SCALES, describe, is_torch_tensor, resolve_kv_dtype

# fd_tensors' address fields, in the order of run()'s arguments
_FIELDS = ("q", "q_pe", "k_cache", "k_pe_cache", "kv_len", "block_table", "out", "lse",
           "k_scale")


def _rope_dtype_name(rope_dtype, dtype, kv_dtype):
    """The name of kpe_cache's element type for a plan: dtype's or kv_dtype's."""
    if rope_dtype is None:
        return kv_dtype or dtype
    try:
        name = _arrays.dtype_name(rope_dtype, "rope_dtype")
    except TypeError:
        name = resolve_kv_dtype(rope_dtype) if kv_dtype is not None else None
        if name is None:
            raise TypeError("rope_dtype: %r, expected the plan's dtype %s%s" % (
                rope_dtype, dtype, "" if kv_dtype is None else " or kv_dtype %s" % kv_dtype))
    if name not in (dtype, kv_dtype):
        raise TypeError("rope_dtype: %s, expected the plan's dtype %s%s" % (
            name, dtype, "" if kv_dtype is None else " or kv_dtype %s" % kv_dtype))
    return name


class MLADecodePlan(DecodePlan):
    """A plan for MLA decode (:func:`flashdecode.mla_decode`), made once, run per layer.

    The MLA counterpart of :class:`DecodePlan` (whose attributes, workspace
    handling and CUDA-graph behaviour it shares): plan once per decode step
    (or once for a CUDA graph, for ``kv_capacity``) and call :meth:`run` for
    every layer. One kv head (the latent), so there is no num_heads_kv.

    Parameters (keyword only)
    -------------------------
    batch : int
        Sequences, >= 1.
    q_len : int
        Query rows per sequence, 1..16 (default 1).
    num_heads_q : int
        Query heads (16 for DeepSeek-V3 over 8 GPUs, 128 on one; 1..128).
    head_dim : int
        The latent width D (default 512; 448 in the DeepSeek-V4 style). CPU:
        1..512; CUDA: 512 or 448.
    rope_dim : int
        The rope width R (default 64). CPU: 1..64; CUDA: 64.
    dtype : torch.dtype, numpy dtype or str
        Of q_nope, q_pe (and out unless out_dtype says float32).
    softmax_scale : float, required
        The model's score scale (DeepSeek-V3: ``1 / sqrt(192)``); finite,
        nonzero.
    kv_capacity, page_size, max_pages_per_seq, num_pages, num_splits, device,
    kv_len_hint, num_threads, workspace, out_dtype, deterministic, pdl
        As in :class:`DecodePlan`.
    kv_dtype : 'e4m3' or 'e5m2' (or a float8 dtype), optional
        An fp8 latent cache (dtype float16 or bfloat16).
    rope_dtype : dtype, optional
        Of kpe_cache: None (default) = the latent cache's (kv_dtype, else
        dtype); ``dtype`` beside an fp8 kv_dtype keeps the rope part 16-bit
        (FlashMLA's fp8 layout).
    kv_scale : 'none', 'tensor' or 'token', optional
        The granularity of run()'s k_scale (fp8 plans).

    Attributes
    ----------
    As :class:`DecodePlan` (num_splits, workspace_size, workspace, backend,
    device, dtype, out_dtype, kv_dtype, softmax_scale, kv_capacity,
    chunk_len, deterministic, pdl), plus head_dim, rope_dim and rope_dtype.

    Raises
    ------
    As :class:`DecodePlan`; TypeError for a rope_dtype that is neither dtype
    nor kv_dtype; ValueError for softmax_scale None; the C library's
    InvalidArgumentError / UnsupportedError (e.g. head_dim or rope_dim a
    backend lacks, kv_scale 'head').

    Examples
    --------
    >>> plan = flashdecode.MLADecodePlan(batch=16, num_heads_q=16, dtype=torch.bfloat16,
    ...                                  page_size=64, max_pages_per_seq=128,
    ...                                  softmax_scale=192 ** -0.5, device="cuda")
    >>> for layer in range(61):                                     # doctest: +SKIP
    ...     plan.run(q_nope[layer], q_pe[layer], kv[layer][..., :512],
    ...              kv[layer][..., 512:], kv_len, block_table, out=out[layer])
    """

    def __init__(self, *, batch, q_len=1, num_heads_q, head_dim=512, rope_dim=64, dtype,
                 softmax_scale, kv_capacity=None, page_size=0, max_pages_per_seq=0,
                 num_pages=0, num_splits=0, device=None, kv_len_hint=None, num_threads=0,
                 workspace=None, out_dtype=None, kv_dtype=None, rope_dtype=None, kv_scale=None,
                 deterministic=False, pdl=True):
        dtype_name = _arrays.dtype_name(dtype)
        kv_name = resolve_kv_dtype(kv_dtype)
        self._rope_dtype = _rope_dtype_name(rope_dtype, dtype_name, kv_name)
        self._rope_dim = _core._int32("rope_dim", rope_dim)
        code = 0 if self._rope_dtype == (kv_name or dtype_name) else FD_DTYPE[self._rope_dtype]
        self._rope_fields = {"rope_dim": self._rope_dim, "rope_dtype": code}
        super().__init__(batch=batch, q_len=q_len, num_heads_q=num_heads_q, num_heads_kv=1,
                         head_dim=head_dim, dtype=dtype, kv_capacity=kv_capacity,
                         page_size=page_size, max_pages_per_seq=max_pages_per_seq,
                         num_pages=num_pages, num_splits=num_splits,
                         softmax_scale=required_scale(softmax_scale), device=device,
                         kv_len_hint=kv_len_hint, num_threads=num_threads, workspace=workspace,
                         out_dtype=out_dtype, kv_dtype=kv_dtype, kv_scale=kv_scale,
                         deterministic=deterministic, pdl=pdl)

    def _problem_fields(self):
        return self._rope_fields

    @property
    def head_dim(self):
        """The latent width D."""
        return int(self._problem.head_dim)

    @property
    def rope_dim(self):
        """The rope width R."""
        return int(self._problem.rope_dim)

    @property
    def rope_dtype(self):
        """kpe_cache's element type: the plan's dtype or kv_dtype (a name)."""
        return self._rope_dtype

    def __repr__(self):
        p = self._problem
        extra = ""
        if self._out_dtype != self._dtype:
            extra += ", out_dtype=%r" % self._out_dtype
        if self._kv_dtype is not None:
            extra += ", kv_dtype=%r, rope_dtype=%r" % (self._kv_dtype, self._rope_dtype)
        if self.deterministic:
            extra += ", deterministic=True"
        if not self.pdl:
            extra += ", pdl=False"
        return ("MLADecodePlan(backend=%r, device=%r, dtype=%r, batch=%d, q_len=%d, "
                "num_heads_q=%d, head_dim=%d, rope_dim=%d, kv_capacity=%d, page_size=%d, "
                "num_splits=%d, workspace_size=%d%s)"
                % (self.backend, self._device, self._dtype, p.batch, p.q_len, p.num_heads_q,
                   p.head_dim, p.rope_dim, self.kv_capacity, p.page_size, self.num_splits,
                   self.workspace_size, extra))

    def _check_mla_geometry(self, g, k):
        p = self._problem
        if g.dtype != self._dtype:
            raise TypeError("q_nope: dtype %s, the plan was made for %s" % (g.dtype, self._dtype))
        if g.out_dtype != self._out_dtype:
            raise TypeError("out: dtype %s, the plan was made for out_dtype %s"
                            % (g.out_dtype, self._out_dtype))
        if g.device != self._device:
            raise ValueError("q_nope: on %s, the plan runs on %s" % (g.device, self._device))
        want = (p.batch, p.q_len, p.num_heads_q, p.head_dim)
        if (g.batch, g.q_len, g.num_heads_q, g.head_dim) != want:
            raise ValueError("q_nope: [batch, q_len, num_heads_q, D] = (%d, %d, %d, %d), the plan "
                             "was made for %r" % (g.batch, g.q_len, g.num_heads_q, g.head_dim,
                                                  want))
        if g.rope_dim != p.rope_dim:
            raise ValueError("q_pe: R = %d, the plan was made for rope_dim %d"
                             % (g.rope_dim, p.rope_dim))
        if g.kv_dtype != self._kv_dtype:
            raise TypeError("ckv_cache: dtype %s, the plan was made for kv_dtype %s"
                            % (k.dtype, self._kv_dtype or self._dtype))
        if g.rope_dtype != self._rope_dtype:
            raise TypeError("kpe_cache: element type %s, the plan was made for rope_dtype %s"
                            % (g.rope_dtype, self._rope_dtype))
        if g.kv_scale != self._kv_scale:
            names = {v: n for n, v in KV_SCALES.items()}
            raise ValueError("k_scale: %s scales, the plan was made for kv_scale=%r"
                             % (names[g.kv_scale], names[self._kv_scale]))
        self._check_cache_layout(g, k, "ckv_cache")

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table=None, out=None,
            lse=None, k_scale=None):
        """Run MLA decode with this plan.

        Parameters
        ----------
        q_nope : [batch, q_len, num_heads_q, head_dim] (or [batch, num_heads_q, head_dim]
            for q_len 1), the plan's dtype and device
        q_pe : [batch, q_len, num_heads_q, rope_dim], q_nope's rank and dtype
        ckv_cache, kpe_cache : the latent and rope caches, as in
            :func:`flashdecode.mla_decode`: contiguous [batch, >= kv_capacity,
            (1,) head_dim / rope_dim] or paged [>= num_pages, page_size, (1,) ..];
            strided views of one buffer are fine
        kv_len : int32 [batch] on the plan's device (or ints: on CUDA a host-to-device
            copy, so not inside a CUDA graph)
        block_table : int32 [batch, >= max_pages_per_seq], paged plans only
        out : like q_nope, of the plan's out_dtype, optional (allocated when None)
        lse : float32 [batch, num_heads_q, q_len] ([batch, num_heads_q] for a 3-D
            q_nope), optional
        k_scale : fp8 plans, of the plan's kv_scale granularity ('tensor': a float or
            (1,); 'token': [batch or pages, kv_capacity or page_size]); float32 on the
            plan's device for a capturable call

        Returns
        -------
        out

        Notes
        -----
        As :meth:`DecodePlan.run`: on CUDA, enqueued on the current stream, no
        host synchronisation, no allocation when out is given (capturable in a
        CUDA graph, replayed after kv_len / block_table change); on the CPU,
        synchronous, kv_len and page ids checked first. Every call checks its
        arguments' metadata; the plan remembers the outcome for the last few
        combinations of types, shapes, strides, dtypes and devices (numpy arrays
        and torch tensors), so that a repeated call only reads the addresses.

        Raises
        ------
        TypeError, ValueError
            As :func:`flashdecode.mla_decode`, plus tensors that do not match the
            plan (dtype, device, shapes, kv_dtype, rope_dtype, scale granularity).
        """
        if type(kv_len) in _HOST_INDEX_TYPES:
            kv_len = self._host_index(kv_len, "kv_len", self._problem.batch)
        if type(block_table) in _HOST_INDEX_TYPES:
            block_table = self._host_index(block_table, "block_table", None)
        args = (q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, out, lse, k_scale)
        try:
            sig = tuple(None if x is None else
                        (_output_signature(x) if i in (6, 7) else _signature(x))
                        for i, x in enumerate(args))
            checked = self._checked.get(sig)
        except Exception:  # metadata that cannot be read: the full path names the argument
            sig = checked = None
        if checked is not None:  # the same signature passed every check before
            template, getters, plan = checked
            if out is None:
                out = self._new_out(q_nope)
                args = args[:6] + (out,) + args[7:]
            tensors = FdTensors.from_buffer_copy(template)
            for field, get, x in zip(_FIELDS, getters, args):
                if get is not None:
                    setattr(tensors, field, get(x))
            self._fd_run(plan, tensors, q_nope)
            return out
        return self._run_and_check_mla(sig, *args)

    def _new_out(self, q_nope):
        f32 = self._out_dtype != self._dtype
        if is_torch_tensor(q_nope):
            torch = sys.modules["torch"]
            return q_nope.new_empty(q_nope.shape, dtype=torch.float32 if f32 else None)
        if isinstance(q_nope, np.ndarray):
            return np.empty(q_nope.shape, dtype=np.float32 if f32 else q_nope.dtype)
        return None

    def _fd_run(self, plan, tensors, q_nope):
        stream = None
        if self._on_cuda:  # (the C library switches to the plan's device itself)
            stream = sys.modules["torch"].cuda.current_stream(q_nope.device).cuda_stream
        if self._cpu_lock is None:
            _core.fd_run(plan, tensors, self._ws_addr, self._ws_size, stream)
        else:
            with self._cpu_lock:
                _core.fd_run(plan, tensors, self._ws_addr, self._ws_size, stream)

    def _run_and_check_mla(self, sig, q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table,
                           out, lse, k_scale):
        """run() with every check made; remembers the outcome under ``sig``."""
        foreign = None
        if not _arrays.is_native(q_nope):
            dev = _arrays.foreign_device(q_nope)
            if dev is not None:
                foreign, given_out = q_nope, out
                q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, out, lse, k_scale = (
                    _arrays.from_foreign(x, dev) for x in (q_nope, q_pe, ckv_cache, kpe_cache,
                                                           kv_len, block_table, out, lse,
                                                           k_scale))
        if out is None:
            out = self._new_out(q_nope)
        qi, pi = describe(q_nope, "q_nope"), describe(q_pe, "q_pe")
        ki, kpi = describe(ckv_cache, "ckv_cache"), describe(kpe_cache, "kpe_cache")
        li = describe(kv_len, "kv_len")
        bi = None if block_table is None else describe(block_table, "block_table")
        oi = describe(out, "out")
        ei = None if lse is None else describe(lse, "lse")
        for arr, name in ((out, "out"), (lse, "lse")):
            if isinstance(arr, np.ndarray) and not arr.flags.writeable:
                raise ValueError("%s: the array is read-only" % name)
        keep = self._scale_infos(q_nope, (k_scale, None))  # (keeps a converted scale alive)
        g, infos = check_mla_call(qi, pi, ki, kpi, li, bi, oi, ei, self._kv_dtype, keep[0][1])
        self._check_mla_geometry(g, infos["ckv"])
        tensors = fill_mla_tensors(infos, li, bi)
        plan = self._run_plan(g)
        # remember the outcome (native arguments only; a scale converted here is new each call)
        if (foreign is None and sig is not None and _NOT_CACHED not in sig
                and keep[0][0] is k_scale):
            self._remember_mla(sig, tensors, plan, (q_nope, q_pe, ckv_cache, kpe_cache, kv_len,
                                                    block_table, out, lse, k_scale),
                               (qi, pi, ki, kpi, li, bi, oi, ei, keep[0][1]))
        self._fd_run(plan, tensors, q_nope)
        del keep
        if foreign is not None:
            return given_out if given_out is not None else _arrays.to_framework_of(out, foreign)
        return out

    def _remember_mla(self, sig, tensors, plan, args, infos):
        """Cache a checked call: fd_tensors with its strides (addresses cleared), how to
        read each argument's address, the FdPlan it ran with."""
        template = FdTensors.from_buffer_copy(tensors)
        for field in _FIELDS:
            setattr(template, field, None)
        getters = tuple(_address_getter(x, info) for x, info in zip(args, infos))
        cache = self._checked
        while len(cache) >= _CACHE_SIZE:
            try:
                del cache[next(iter(cache))]
            except (KeyError, RuntimeError, StopIteration):  # another thread got there first
                break
        cache[sig] = (template, getters, plan)
