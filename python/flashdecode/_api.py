"""_api.py — flashdecode.decode: one call, planned from the tensors' shapes."""
import numpy as np

from . import _arrays, _core
from ._tree import describe_tree_mask
from ._tensors import FD_DTYPE, check_out_dtype, describe, is_torch_tensor, resolve_kv_dtype

_torch_ops = None  # flashdecode._torch_ops once loaded


def load_torch_ops():
    """Import flashdecode._torch_ops (registers the torch custom ops); idempotent."""
    global _torch_ops
    if _torch_ops is None:
        from . import _torch_ops as ops

        if ops.torch.compiler.is_compiling():
            return ops  # (a global set under a trace would fail the guard made on it)
        _torch_ops = ops
    return _torch_ops


def _ops_for(x):
    """flashdecode._torch_ops when x is a torch.Tensor, else None (never imports torch
    for a numpy caller)."""
    ops = _torch_ops
    if ops is not None:
        return ops if isinstance(x, ops.Tensor_) else None
    return load_torch_ops() if is_torch_tensor(x) else None


def decode(q, k_cache, v_cache, kv_len, *, block_table=None, softmax_scale=None, num_splits=0,
           return_lse=False, out=None, window_left=-1, logits_soft_cap=0.0, sinks=None,
           non_causal=False, out_dtype=None, k_scale=None, v_scale=None, kv_dtype=None,
           deterministic=False, pdl=True, tree_mask=None):
    """Decode-phase attention over a KV cache, by flash decoding (split-KV).

    For every sequence ``b``, query row ``t`` and query head ``h``, with
    ``g = num_heads_q // num_heads_kv`` and kv head ``h // g`` (MHA, GQA,
    MQA), row ``t`` sits at position ``p_t = kv_len[b] - q_len + t`` and sees
    the keys ``lo_t <= j <= p_t`` (the causal mask of the last ``q_len``
    positions), ``lo_t = 0``, or ``max(0, p_t - window_left)`` with a sliding
    window; with ``non_causal=True`` every row sees keys ``0 .. kv_len[b]-1``::

        x_j = softmax_scale * q[b, t, h, :] . k[b, j, h // g, :]
        s_j = x_j, or cap * tanh(x_j / cap) with logits_soft_cap = cap > 0
        Z   = sum_j exp(s_j)  (+ exp(sinks[h]) with sinks)
        lse[b, h, t] = log(Z)                                       (natural log)
        out[b, t, h, :] = sum_j exp(s_j - lse) * v[b, j, h // g, :]

    A row that sees no key gets ``out = 0`` and ``lse = -inf`` (``lse =
    sinks[h]`` with sinks); a NaN sink gives NaN rows for its head. The
    layouts are those of FlashAttention's ``flash_attn_with_kvcache``.

    Parameters
    ----------
    q : torch.Tensor or numpy.ndarray, shape [batch, q_len, num_heads_q, head_dim]
        float32, float16 or bfloat16. ``q_len`` is 1 for plain decoding, up
        to 16 for a speculative-decoding verify step (the K/V of those q_len
        tokens are already in the cache); up to 128 with ``non_causal``.
    k_cache, v_cache : same kind and dtype as q
        Contiguous cache: shape [batch, kv_capacity, num_heads_kv, head_dim]
        (a [batch, num_heads_kv, kv_capacity, head_dim] buffer works too:
        pass ``k.transpose(1, 2)``). Paged cache (``block_table`` given):
        shape [num_pages, page_size, num_heads_kv, head_dim], page_size
        1..256. Broadcast views (stride 0, e.g. one cache every sequence
        shares, ``k[:1].expand(batch, -1, -1, -1)``) are read as they are,
        without a copy; q may be broadcast too.
    kv_len : int32 tensor/array, shape [batch]; or an int or a list of ints
        Keys in the cache per sequence (``cache_seqlens``), the q_len new
        tokens included; ``0 <= kv_len[b] <= kv_capacity``. Other integer
        dtypes, host lists and a tensor on another device are converted (a
        copy); values outside the int32 range raise ValueError on the host
        and saturate to the int32 limits in a CUDA (int64) tensor, never wrap.
    block_table : int32 tensor/array, shape [batch, max_pages_per_seq], optional
        Paged caches only: key ``j`` of sequence ``b`` lives in page
        ``block_table[b, j // page_size]`` at position ``j % page_size``.
    softmax_scale : float, optional
        Scale of the scores; default ``1 / sqrt(head_dim)``. Must be finite
        and nonzero.
    num_splits : int
        Splits of the keys per (sequence, kv head): 0 = automatic (a wave-
        quantisation heuristic), 1 = no split, N = N splits (clamped to the
        64-key chunks of kv_capacity).
    return_lse : bool
        Also return the log-sum-exp of the scores (the sink included).
    out : tensor/array like q, optional
        Written in place and returned (may be strided; head_dim unit-stride).
        Its dtype is q's, or float32 whatever q's is (the fp32 out of
        ``out_dtype``). It must not share memory with an input (the C
        library compares the address ranges: ValueError naming both).
    window_left : int
        Sliding window: -1 (default) = none; ``W >= 0``: the row at position
        ``p`` sees keys ``p - W .. p`` (FlashInfer's ``window_left``;
        flash-attn's ``window_size=(W, 0)``; a model's ``sliding_window`` of
        ``N`` keys is ``window_left = N - 1``). Keys before the first row's
        window are never read, so a windowed call costs what the window
        costs. Not with ``non_causal``.
    logits_soft_cap : float
        0.0 (default) = off; ``cap > 0``: scores become ``cap * tanh(score /
        cap)`` (Gemma 2, Grok), after ``softmax_scale``.
    sinks : tensor/array [num_heads_q], optional
        One extra logit per query head that joins the softmax denominator and
        carries no value (gpt-oss). float32 on q's device; ``decode`` also
        converts another float dtype (torch: on its device, e.g. a bf16
        parameter; numpy: any real array or list, on the host). In cascade
        decoding give it to one of the merged calls only.
    non_causal : bool
        Every query row sees all ``kv_len[b]`` keys, and ``q_len`` may be up
        to 128: the shared prefix of cascade decoding, with the rows of
        several sequences packed as the q_len rows of one (see
        :func:`merge_states`).
    out_dtype : dtype, optional
        Of the allocated ``out``: q's dtype (default) or float32 (torch.float32,
        numpy.float32, 'f32'), e.g. for states merged later by
        :func:`merge_states`, which then lose nothing to 16-bit rounding. With
        ``out`` given it must agree with out's dtype.
    k_scale, v_scale : float or float32 tensor/array, optional
        fp8 caches only: the attention reads ``k = k_cache * k_scale`` and
        ``v = v_cache * v_scale``. A float (or shape () / (1,)): one scale per
        tensor; shape [num_heads_kv]: one per kv head; the cache's shape
        without head_dim ([batch, kv_capacity, num_heads_kv], or paged
        [num_pages, page_size, num_heads_kv]): one per (position, kv head).
        Give both or neither (neither: scale 1). Values must be finite and
        > 0 (a float is checked here, host arrays by the CPU backend; CUDA
        device values are not checked). On CUDA pass device tensors for a
        capturable call (a float becomes a small host-to-device copy).
    kv_dtype : str or dtype, optional
        An fp8 cache: k_cache / v_cache of torch.float8_e4m3fn /
        torch.float8_e5m2 (or ml_dtypes' float8_e4m3fn / float8_e5m2 numpy
        arrays) need nothing; uint8 arrays holding the codes need
        ``kv_dtype='e4m3'`` or ``'e5m2'``. q is then float16 or bfloat16; K
        and V are widened exactly and the sums are those of a 16-bit cache
        (see :func:`append_kv` for writing an fp8 cache).
    deterministic : bool
        Batch-invariant results (default False: fastest). With True the out
        and lse of a sequence are bitwise identical whatever the batch
        around it (the other sequences and their lengths), the cache's
        kv_capacity, the CPU thread count and, on CUDA, the multiprocessor
        count a plan is sized for and CUDA-graph replay versus eager calls
        (e.g. RL rollouts that must match a training forward). The keys are cut
        into fixed splits of :data:`DETERMINISTIC_SPLIT_LEN` (2048) keys, so
        ``num_splits`` must be 0. Cost: short batches get fewer splits
        (batch 1 at 16k keys: 8 splits instead of ~32, so less of a GPU
        busy); batches that fill the GPU run as fast. Limit: a sequence may
        read at most :data:`DETERMINISTIC_MAX_KEYS` (2048 * 1024) keys
        (kv_capacity; with a window the smaller of that and ``window_left +
        q_len + 63``). Results still differ between backends and from
        ``deterministic=False`` (other summation orders, within the same
        accuracy).
    pdl : bool
        CUDA, compute capability 9.0+: launch the kernels with programmatic
        dependent launch (True, the default), so a call's first kernel is
        scheduled while the previous kernel in the stream ends (faster for
        calls back to back); False: the call's first kernel is launched
        plainly (fd_problem.no_pdl; its combine kernel, when the call
        splits, still starts early behind it), measured slightly faster
        inside a model, between PyTorch's and cuBLAS's kernels (the
        transformers integration uses False). Same results either way; no
        effect on the CPU or older GPUs.
    tree_mask : tensor/array, optional
        Speculative-decoding tree verify (EAGLE, Medusa): q_len up to 64
        draft rows; row t sees every prefix key ``0 .. kv_len[b]-q_len-1``
        and draft key j (key ``kv_len[b]-q_len+j``) when ``tree_mask[b, t,
        j]`` (bool [batch, q_len, q_len], packed here) or bit j of
        ``tree_mask[b, t]`` (int64 / uint64 [batch, q_len]) is set. Each row
        must see itself; bits at or past q_len are refused (on the CPU;
        CUDA reads the mask on the GPU unchecked: bits past q_len are
        ignored). On q's device. Not with window_left or non_causal. CUDA:
        fp16/bf16 with a cache of q's dtype, head_dim 64 or 128
        (UnsupportedError otherwise). See :func:`flashdecode.pack_tree_mask`.

    Returns
    -------
    out : same kind and device as q, shape [batch, q_len, num_heads_q, head_dim]
        dtype out_dtype (q's by default).
    lse : float32, shape [batch, num_heads_q, q_len]
        Only when ``return_lse`` is True; natural log.

    Raises
    ------
    TypeError
        A dtype that is not float32/float16/bfloat16 (int32 for kv_len and
        block_table), dtypes that differ between q, k_cache, v_cache and out,
        an argument that is not an array, or non_causal / deterministic /
        pdl not a bool (or 0 / 1).
    ValueError
        Shapes that disagree, tensors on different devices, a head_dim
        dimension that is not unit-stride, a negative or broadcast output
        stride, sinks not of shape [num_heads_q] or on another device, a
        cache that looks like transformers' [batch, num_heads_kv, capacity,
        head_dim] layout (dimension 2 does not divide num_heads_q and
        dimension 1 does: the message says to pass ``k.transpose(1, 2)``;
        where both divide, decode cannot tell the layouts apart, a plan
        can); and every FD_STATUS_INVALID_ARGUMENT / FD_STATUS_UNSUPPORTED from the C
        library (e.g. q_len > 16, or > 128 with non_causal, num_heads_q not a
        multiple of num_heads_kv, a kv_len or page id out of range on the
        CPU, window_left < -1 or with non_causal, a negative or non-finite
        logits_soft_cap, head_dim not 64/80/96/128/256 on CUDA, num_splits
        other than 0 with deterministic, a kv_capacity above
        DETERMINISTIC_MAX_KEYS with deterministic), raised as
        :class:`flashdecode.errors.
        InvalidArgumentError` / :class:`~flashdecode.errors.UnsupportedError`
        with the library's message.
    MemoryError, RuntimeError
        FD_STATUS_OUT_OF_MEMORY, FD_STATUS_BACKEND_ERROR (a CUDA failure).

    Notes
    -----
    The keys of each (sequence, kv head) are cut into ``num_splits`` splits;
    each runs the online softmax of FlashAttention-2 (Dao, 2023) over its
    slice for all the query heads of the group and writes an unnormalised
    fp32 partial with its running max and sum; a combine step merges them.
    This is Flash-Decoding (Dao, Haziza, Massa, Sizov, 2023, "Flash-Decoding
    for long-context inference"). Accumulation is in fp32.

    CPU arrays run on the CPU backend (threads, synchronous). CUDA tensors run
    on the CUDA backend (GPUs of compute capability 8.0+) and are enqueued on
    ``torch.cuda.current_stream()``; nothing synchronises with the host. On
    CUDA, kv_len values are clamped to [0, kv_capacity] and out-of-range
    page ids are skipped on the device; checking them is the caller's job.

    For torch tensors this is the custom op ``torch.ops.flashdecode.decode``
    (``flashdecode::decode_out`` when ``out`` is given), with a fake
    implementation: ``torch.compile(fullgraph=True)`` traces it. Each call
    plans from the shapes (plans are cached) and takes its workspace from
    torch's caching allocator; to plan once per step and reuse a workspace
    (CUDA graphs), use :class:`DecodePlan`.

    Arrays of other frameworks (CuPy, JAX) are taken through DLPack without
    a copy (CUDA ones through torch) and the results handed back to them.

    Examples
    --------
    >>> import numpy as np, flashdecode
    >>> q = np.random.randn(2, 1, 8, 64).astype(np.float32)
    >>> k = np.random.randn(2, 100, 2, 64).astype(np.float32)
    >>> v = np.random.randn(2, 100, 2, 64).astype(np.float32)
    >>> out = flashdecode.decode(q, k, v, np.array([100, 37], dtype=np.int32))
    >>> out.shape
    (2, 1, 8, 64)

    A gpt-oss layer (sliding window of 128 keys, sinks) and a Gemma 2 layer
    (soft-cap 50, window of 4096 keys):

    >>> out = flashdecode.decode(q, k, v, kv_len, window_left=127,
    ...                          sinks=sinks)                        # doctest: +SKIP
    >>> out = flashdecode.decode(q, k, v, kv_len, window_left=4095,
    ...                          logits_soft_cap=50.0)               # doctest: +SKIP
    """
    variants = _core.Variants(window_left, logits_soft_cap, non_causal, deterministic, pdl)
    fp8 = Fp8Args(kv_dtype, k_scale, v_scale)
    ops = _ops_for(q)
    if ops is not None:
        return ops.decode(q, k_cache, v_cache, kv_len, block_table, softmax_scale, num_splits,
                          return_lse, out, sinks, variants, out_dtype, fp8, tree_mask=tree_mask)
    if isinstance(q, np.ndarray):
        return _decode_numpy(q, k_cache, v_cache, kv_len, block_table, softmax_scale,
                             num_splits, return_lse, out, sinks, variants, out_dtype, fp8,
                             tree_mask=tree_mask)
    device = _arrays.foreign_device(q)
    if device is None:
        raise TypeError("q: expected a torch.Tensor or a numpy.ndarray (or an object with "
                        "__dlpack__), got %s" % type(q).__name__)
    conv = [_arrays.from_foreign(x, device) for x in (q, k_cache, v_cache, kv_len, block_table,
                                                        out, sinks, k_scale, v_scale,
                                                        tree_mask)]
    result = decode(*conv[:4], block_table=conv[4], softmax_scale=softmax_scale,
                    num_splits=num_splits, return_lse=return_lse, out=conv[5],
                    window_left=variants.window_left,
                    logits_soft_cap=variants.logits_soft_cap, sinks=conv[6],
                    non_causal=variants.non_causal, out_dtype=out_dtype, k_scale=conv[7],
                    v_scale=conv[8], kv_dtype=kv_dtype, deterministic=variants.deterministic,
                    pdl=variants.pdl, tree_mask=conv[9])
    if return_lse:
        res_out, lse = result
        res_out = out if out is not None else _arrays.to_framework_of(res_out, q)
        return res_out, _arrays.to_framework_of(lse, q)
    return out if out is not None else _arrays.to_framework_of(result, q)


def as_index_array(x, name, batch):
    """kv_len / block_table as an int32 numpy array (a copy only if needed)."""
    if isinstance(x, int) and not isinstance(x, bool) and batch is not None:
        return np.full((batch,), _core.index_array(x, name), dtype=np.int32)
    if is_torch_tensor(x):
        return x  # describe() reports its dtype/device if wrong
    return np.ascontiguousarray(_core.index_array(x, name))


def _writable(x, name):
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise ValueError("%s: the array is read-only" % name)


def _numpy_workspace(nbytes):
    buf = np.empty(nbytes, dtype=np.uint8)
    return buf, buf.ctypes.data


def resolve_out_dtype(out_dtype, q_dtype, out):
    """The out dtype name decode() allocates, or checks out against: q's or float32."""
    if out_dtype is None:
        return None
    name = _arrays.dtype_name(out_dtype, "out_dtype")
    if q_dtype in FD_DTYPE:  # (else check_call names q's dtype)
        check_out_dtype(name, q_dtype, "out_dtype")
    if out is not None:
        got = describe(out, "out").dtype
        if got != name:
            raise TypeError("out: dtype %s, but out_dtype is %s" % (got, name))
    return name


def as_numpy_sinks(sinks):
    """numpy sinks: any real float (or integer) array or sequence, as contiguous float32
    (a copy only if needed)."""
    if sinks is None or is_torch_tensor(sinks):
        return sinks  # (a torch tensor: describe() reports it if wrong)
    try:
        arr = np.asarray(sinks)
    except (TypeError, ValueError) as exc:
        raise TypeError("sinks: expected float32 values, got %s (%s)"
                        % (type(sinks).__name__, exc)) from None
    if arr.dtype.kind not in "fiu":
        raise TypeError("sinks: dtype %s, expected float32" % arr.dtype)
    return np.ascontiguousarray(arr, dtype=np.float32)


class Fp8Args:
    """decode()'s fp8 arguments: kv_dtype resolved to an fp8 name (or None); the scales
    as given (floats are checked here: finite and > 0)."""

    __slots__ = ("kv_dtype", "k_scale", "v_scale")

    def __init__(self, kv_dtype=None, k_scale=None, v_scale=None):
        self.kv_dtype = resolve_kv_dtype(kv_dtype)
        self.k_scale = check_scale_value(k_scale, "k_scale")
        self.v_scale = check_scale_value(v_scale, "v_scale")



def check_scale_value(x, name):
    """A Python / numpy scalar scale as a float (finite and > 0, float32-representable);
    arrays and tensors as they are."""
    if x is None or is_torch_tensor(x) or (isinstance(x, np.ndarray) and x.ndim > 0):
        return x
    if isinstance(x, (list, tuple)):
        return x
    value = _core._float32_value(name, x)  # (not a bool or str; overflow refused)
    if not (np.isfinite(value) and value > 0.0) or not np.float32(value) > 0.0:
        raise ValueError("%s: %r, must be finite and > 0 (in float32)" % (name, value))
    return value


def as_numpy_scale(x, name):
    """A numpy scale: a float -> float32 array (1,); arrays / lists -> float32 (a copy
    only when another dtype)."""
    if x is None or is_torch_tensor(x):
        return x
    if isinstance(x, float):
        return np.array([x], dtype=np.float32)
    arr = np.asarray(x)
    if arr.dtype.kind not in "fiu":
        raise TypeError("%s: dtype %s, expected float32" % (name, arr.dtype))
    if arr.dtype != np.float32:
        arr = arr.astype(np.float32)
    return arr


NO_FP8 = Fp8Args()


def _decode_numpy(q, k_cache, v_cache, kv_len, block_table, softmax_scale, num_splits,
                  return_lse, out, sinks=None, variants=_core.PLAIN, out_dtype=None,
                  fp8=NO_FP8, tree_mask=None):
    batch = q.shape[0] if q.ndim >= 1 else None
    kv_len = as_index_array(kv_len, "kv_len", batch)
    if block_table is not None:
        block_table = as_index_array(block_table, "block_table", None)
    scale = _core.resolve_scale(softmax_scale)
    out_name = resolve_out_dtype(out_dtype, describe(q, "q").dtype, out)
    sinks = as_numpy_sinks(sinks)
    if out is None:
        out = np.empty(q.shape, dtype=np.float32 if out_name == "float32" else q.dtype)
    _writable(out, "out")
    lse = None
    if return_lse and q.ndim == 4:
        lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=np.float32)
    _core.run_decode(describe(q, "q"), describe(k_cache, "k_cache"),
                     describe(v_cache, "v_cache"), describe(kv_len, "kv_len"),
                     None if block_table is None else describe(block_table, "block_table"),
                     describe(out, "out"), None if lse is None else describe(lse, "lse"),
                     scale, num_splits, _numpy_workspace, None,
                     None if sinks is None else describe(sinks, "sinks"), variants, fp8.kv_dtype,
                     _describe_opt(as_numpy_scale(fp8.k_scale, "k_scale"), "k_scale"),
                     _describe_opt(as_numpy_scale(fp8.v_scale, "v_scale"), "v_scale"),
                     describe_tree_mask(tree_mask))
    return (out, lse) if return_lse else out


def _describe_opt(x, name):
    return None if x is None else describe(x, name)
