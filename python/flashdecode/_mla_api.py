"""_mla_api.py — flashdecode.mla_decode: MLA decode in one call, planned from the shapes."""
import numpy as np

from . import _arrays, _core
from ._api import (Fp8Args, _numpy_workspace, _ops_for, _writable, as_index_array,
                   as_numpy_scale, resolve_out_dtype)
from ._mla import mla_lse_shape, required_scale, run_mla
from ._tensors import describe


def mla_decode(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, *, block_table=None, softmax_scale,
               num_splits=0, return_lse=False, out=None, out_dtype=None, kv_dtype=None,
               k_scale=None, deterministic=False, pdl=True):
    """Multi-head latent attention (MLA) decode, absorbed form, by flash decoding.

    DeepSeek-V2/V3/R1, Kimi-K2 and GLM-5 attention with ``W_UK`` folded into
    the query and ``W_UV`` into the output projection ("DeepSeek-V2",
    DeepSeek-AI 2024, section 2.1): one kv head whose key is the latent
    ``c_kv`` (``D`` = 512 columns; 448 in the DeepSeek-V4 style) followed by
    the rope part ``k_pe`` (``R`` = 64), and whose value is ``c_kv`` itself.
    For every sequence ``b``, query row ``t`` and query head ``h``, with the
    keys ``j`` row ``t`` sees causally (``0 <= j <= kv_len[b] - q_len + t``,
    as in :func:`decode`)::

        x_j = softmax_scale * (q_nope[b,t,h,:] . ckv[b,j,:] + q_pe[b,t,h,:] . kpe[b,j,:])
        lse[b, h, t] = log(sum_j exp(x_j))                       (natural log)
        out[b, t, h, :] = sum_j exp(x_j - lse) * ckv[b, j, :]     (D columns)

    A row that sees no key gets ``out = 0`` and ``lse = -inf``.

    Parameters
    ----------
    q_nope : torch.Tensor or numpy.ndarray, [batch, q_len, num_heads_q, D]
        float32, float16 or bfloat16: the absorbed query (``q_nope @ W_UK``).
        ``q_len`` is 1..16 (multi-token prediction, speculative verify; the
        q_len new tokens are already in the cache). A 3-D ``[batch,
        num_heads_q, D]`` is q_len 1 (FlashInfer's layout); out and lse then
        drop the q_len dimension too.
    q_pe : like q_nope, [batch, q_len, num_heads_q, R] (or [batch, num_heads_q, R])
        The rope part of the query; q_nope's dtype and rank.
    ckv_cache : the latent cache, [batch, kv_capacity, D]
        Or paged (``block_table`` given) [num_pages, page_size, D], page_size
        1..256; a size-1 kv-head dimension before D is accepted ([.., .., 1,
        D]). Of q_nope's dtype, or fp8: torch.float8_e4m3fn / float8_e5m2
        (ml_dtypes float8 numpy arrays; uint8 with ``kv_dtype``). Strided
        views are read in place: vLLM's and FlashMLA's one 576-wide row per
        token is ``kv[..., :512]`` and ``kv[..., 512:]`` (no copy).
    kpe_cache : the rope cache, like ckv_cache with R columns
        Same first two dimensions as ckv_cache; its own strides. Of q_nope's
        dtype (also beside an fp8 ckv_cache: FlashMLA's fp8 layout keeps the
        rope part bf16) or of ckv_cache's fp8 type.
    kv_len : int32 tensor/array [batch]; or an int or a list of ints
        Keys in the cache per sequence, the q_len new tokens included;
        ``0 <= kv_len[b] <= kv_capacity`` (converted as in :func:`decode`).
    block_table : int32 [batch, max_pages_per_seq], optional
        Paged caches: key ``j`` of sequence ``b`` is in page
        ``block_table[b, j // page_size]`` at row ``j % page_size``.
    softmax_scale : float, required (keyword)
        Scale of the scores; finite and nonzero. MLA has no default: the
        model's is the scale of the head dim *before* absorption
        (DeepSeek-V3: ``1 / sqrt(128 + 64)``, times its YaRN mscale² when the
        context is extended).
    num_splits : int
        Splits of each sequence's keys: 0 = automatic, 1 = none, N = N
        (clamped to the 64-key chunks of kv_capacity).
    return_lse : bool
        Also return lse, float32 [batch, num_heads_q, q_len] ([batch,
        num_heads_q] for a 3-D q_nope), for :func:`merge_states`.
    out : like q_nope, optional
        Written in place and returned (strided allowed, the last dimension
        unit-stride); q_nope's dtype or float32. Must not overlap an input.
    out_dtype : dtype, optional
        Of the allocated out: q_nope's (default) or float32.
    kv_dtype : 'e4m3' or 'e5m2' (or a float8 dtype), optional
        Only for uint8 caches holding fp8 codes.
    k_scale : float or float32 tensor/array, optional
        fp8 caches only: the attention reads ``ckv_cache * k_scale`` (and
        ``kpe_cache * k_scale`` when it is fp8). A float or shape () / (1,):
        one scale; shape [batch, kv_capacity] (paged: [num_pages,
        page_size]; a trailing 1 accepted): one per token, as
        :func:`mla_append_kv` writes them. Values finite and > 0. Not given:
        scale 1. On CUDA pass a device tensor for a capturable call.
    deterministic : bool
        Batch-invariant results, as in :func:`decode` (num_splits must be 0).
    pdl : bool
        CUDA 9.0+: programmatic dependent launch (see :func:`decode`).

    Returns
    -------
    out : like q_nope, [batch, q_len, num_heads_q, D] (or [batch, num_heads_q, D])
        out_dtype (q_nope's by default): the attention in latent space; the
        model multiplies it by ``W_UV`` per head, then ``W_O``.
    lse : float32 [batch, num_heads_q, q_len] (or [batch, num_heads_q])
        Only with ``return_lse``.

    Raises
    ------
    TypeError
        A dtype that is not float32/float16/bfloat16 for q_nope, q_pe or out
        (int32 for kv_len and block_table, float32 for k_scale), q_pe of
        another dtype than q_nope, a cache of neither q_nope's dtype nor fp8,
        an fp8 kpe_cache beside a 16-bit ckv_cache, a missing softmax_scale
        (Python's TypeError for a missing keyword).
    ValueError
        The message names the argument: shapes that disagree (q_pe's rows
        against q_nope's, D or R against the caches, kpe_cache's first two
        dimensions against ckv_cache's, a kv-head dimension other than 1),
        softmax_scale None or 0, tensors on different devices, a last
        dimension that is not unit-stride, a broadcast or negative output
        stride, k_scale on a 16-bit cache or of another shape; and the C
        library's :class:`~flashdecode.errors.InvalidArgumentError` /
        :class:`~flashdecode.errors.UnsupportedError` (e.g. q_len above 16,
        D above 512 or R above 64 on the CPU, (D, R) other than (512, 64) and
        (448, 64) or float32 q on CUDA, a kv_len or page id out of range on
        the CPU). Nothing is written when an error is raised.
    MemoryError, RuntimeError
        FD_STATUS_OUT_OF_MEMORY, FD_STATUS_BACKEND_ERROR (a CUDA failure).

    Notes
    -----
    Flash-Decoding (Dao, Haziza, Massa, Sizov, 2023) over the one latent kv
    head: each split of a sequence's keys serves all ``q_len * num_heads_q``
    query rows from one read of the cache; a combine step merges the splits
    (accumulation in fp32). Sources: the MLA section of flashdecode.h; the
    absorbed form, DeepSeek-V2 (arXiv:2405.04434) section 2.1.

    For torch tensors this is the custom op ``torch.ops.flashdecode.mla_decode``
    (``flashdecode::mla_decode_out`` with ``out``), with a fake implementation:
    ``torch.compile(fullgraph=True)`` traces it. To plan once and reuse a
    workspace (per layer, CUDA graphs), use :class:`MLADecodePlan`. CUDA work
    is enqueued on ``torch.cuda.current_stream()``; nothing syncs the host.

    Examples
    --------
    >>> import numpy as np, flashdecode
    >>> q_nope = np.random.randn(2, 16, 512).astype(np.float32)
    >>> q_pe = np.random.randn(2, 16, 64).astype(np.float32)
    >>> kv = np.random.randn(2, 100, 576).astype(np.float32)   # one buffer
    >>> out = flashdecode.mla_decode(q_nope, q_pe, kv[..., :512], kv[..., 512:],
    ...                              [100, 37], softmax_scale=192 ** -0.5)
    >>> out.shape
    (2, 16, 512)
    """
    variants = _core.Variants(-1, 0.0, False, deterministic, pdl)
    fp8 = Fp8Args(kv_dtype, k_scale, None)
    scale = required_scale(softmax_scale)
    ops = _ops_for(q_nope)
    if ops is not None:
        return ops.mla_decode(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, scale,
                              num_splits, return_lse, out, variants, out_dtype, fp8)
    if isinstance(q_nope, np.ndarray):
        return _mla_decode_numpy(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, scale,
                                 num_splits, return_lse, out, variants, out_dtype, fp8)
    device = _arrays.foreign_device(q_nope)
    if device is None:
        raise TypeError("q_nope: expected a torch.Tensor or a numpy.ndarray (or an object with "
                        "__dlpack__), got %s" % type(q_nope).__name__)
    conv = [_arrays.from_foreign(x, device) for x in (q_nope, q_pe, ckv_cache, kpe_cache, kv_len,
                                                        block_table, out, fp8.k_scale)]
    result = mla_decode(*conv[:5], block_table=conv[5], softmax_scale=scale,
                        num_splits=num_splits, return_lse=return_lse, out=conv[6],
                        out_dtype=out_dtype, kv_dtype=kv_dtype, k_scale=conv[7],
                        deterministic=variants.deterministic, pdl=variants.pdl)
    if return_lse:
        res_out, lse = result
        res_out = out if out is not None else _arrays.to_framework_of(res_out, q_nope)
        return res_out, _arrays.to_framework_of(lse, q_nope)
    return out if out is not None else _arrays.to_framework_of(result, q_nope)


def _mla_decode_numpy(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, scale, num_splits,
                      return_lse, out, variants, out_dtype, fp8, backend=None):
    batch = q_nope.shape[0] if q_nope.ndim >= 1 else None
    kv_len = as_index_array(kv_len, "kv_len", batch)
    if block_table is not None:
        block_table = as_index_array(block_table, "block_table", None)
    out_name = resolve_out_dtype(out_dtype, describe(q_nope, "q_nope").dtype, out)
    if out is None:
        out = np.empty(q_nope.shape, dtype=np.float32 if out_name == "float32" else q_nope.dtype)
    _writable(out, "out")
    lse = None
    if return_lse and q_nope.ndim in (3, 4):
        lse = np.empty(mla_lse_shape(q_nope.shape), dtype=np.float32)
    ks = as_numpy_scale(fp8.k_scale, "k_scale")
    run_mla(describe(q_nope, "q_nope"), describe(q_pe, "q_pe"), describe(ckv_cache, "ckv_cache"),
            describe(kpe_cache, "kpe_cache"), describe(kv_len, "kv_len"),
            None if block_table is None else describe(block_table, "block_table"),
            describe(out, "out"), None if lse is None else describe(lse, "lse"), scale,
            num_splits, _numpy_workspace, None, variants, fp8.kv_dtype,
            None if ks is None else describe(ks, "k_scale"), backend)
    return (out, lse) if return_lse else out
