"""_torch_ops.py — decode() for torch tensors, as torch custom ops.

Loaded on first use with a torch.Tensor (or at ``import flashdecode`` when
torch is already imported). Registers two ops with fake (meta)
implementations, so torch.compile traces decode() without a graph break:

  flashdecode::decode(q, k_cache, v_cache, kv_len, block_table?, softmax_scale,
                      num_splits, return_lse, sinks?=None, window_left=-1,
                      logits_soft_cap=0., non_causal=False, out_dtype?=None,
                      k_scale?=None, v_scale?=None, kv_dtype?=None,
                      deterministic=False, pdl=True, tree_mask?=None) -> (out, lse)
      allocates out [batch, q_len, num_heads_q, head_dim] (q's dtype, or
      out_dtype: float32) and lse [batch, num_heads_q, q_len] float32 (shape (0,)
      when return_lse is False).
  flashdecode::decode_out(q, k_cache, v_cache, kv_len, block_table?, out, lse?,
                          softmax_scale, num_splits, sinks?=None, window_left=-1,
                          logits_soft_cap=0., non_causal=False, k_scale?=None,
                          v_scale?=None, kv_dtype?=None, deterministic=False,
                          pdl=True, tree_mask?=None) -> ()
      writes the caller's out (q's dtype or float32) and lse; mutates_args =
      (out, lse).
  flashdecode::mla_decode(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table?,
                          softmax_scale, num_splits, return_lse, out_dtype?=None,
                          k_scale?=None, kv_dtype?=None, deterministic=False,
                          pdl=True) -> (out, lse)
  flashdecode::mla_decode_out(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table?,
                              out, lse?, softmax_scale, num_splits, k_scale?=None,
                              kv_dtype?=None, deterministic=False, pdl=True) -> ()
      multi-head latent attention (see flashdecode.mla_decode): out has q_nope's
      shape (3-D or 4-D), lse [batch, num_heads_q, q_len] ([batch, num_heads_q]
      for a 3-D q_nope; shape (0,) when return_lse is False).
  flashdecode::merge_states(states_out, states_lse, out_dtype?=None) -> (out, lse)
  flashdecode::merge_states_out(states_out, states_lse, out, lse?) -> ()
      fd_merge_states (see flashdecode.merge_states).

softmax_scale 0.0 means 1/sqrt(head_dim); window_left -1 no window;
logits_soft_cap 0.0 off; deterministic True the batch-invariant mode; pdl False
the first kernel launched plainly (see flashdecode.decode). The variant
arguments come last, with defaults, each added after the previous ones, so a
call written for an earlier schema still works. CUDA work is enqueued on
torch.cuda.current_stream() of the tensors' device; the workspace comes from
torch's caching allocator on that stream.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _core
from ._merge import check_merge, out_dtype_of, run_merge
from ._mla import check_mla_call, mla_lse_shape, run_mla
from ._tensors import bind_torch, check_call, check_out_dtype, describe

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError("flashdecode: the torch integration needs torch >= 2.4 "
                      "(torch.library.custom_op); found torch %s" % torch.__version__)

Tensor_ = Tensor  # for the dispatch check in flashdecode._api
bind_torch(torch)  # now, not while torch.compile traces decode (see _tensors.bind_torch)


def _lse_shape(q):
    return (q.shape[0], q.shape[2], q.shape[1])


def stream_of(device):
    """cudaStream_t (int) of torch's current stream on ``device``; None on CPU."""
    if device.type == "cuda":
        return torch.cuda.current_stream(device).cuda_stream
    return None


def alloc_workspace(device):
    """A workspace allocator for _core.run_decode on ``device``."""

    def alloc(nbytes):
        buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return buf, buf.data_ptr()

    return alloc


def _infos(q, k_cache, v_cache, kv_len, block_table, out, lse, sinks, k_scale=None,
           v_scale=None):
    return (describe(q, "q"), describe(k_cache, "k_cache"), describe(v_cache, "v_cache"),
            describe(kv_len, "kv_len"),
            None if block_table is None else describe(block_table, "block_table"),
            None if out is None else describe(out, "out"),
            None if lse is None else describe(lse, "lse"),
            None if sinks is None else describe(sinks, "sinks"),
            None if k_scale is None else describe(k_scale, "k_scale"),
            None if v_scale is None else describe(v_scale, "v_scale"))


def _check_meta(q, k_cache, v_cache, kv_len, block_table, out, lse, sinks, k_scale=None,
                v_scale=None, kv_dtype=None, tree_mask=None):
    infos = _infos(q, k_cache, v_cache, kv_len, block_table, out, lse, sinks, k_scale, v_scale)
    g = check_call(*infos[:8], kv_dtype, infos[8], infos[9])
    if tree_mask is not None:
        from ._tree import check_tree_mask

        check_tree_mask(describe(tree_mask, "tree_mask"), g)
    return g


def run_tensors(q, k_cache, v_cache, kv_len, block_table, out, lse, softmax_scale, num_splits,
                sinks=None, variants=_core.PLAIN, k_scale=None, v_scale=None, kv_dtype=None,
                tree_mask=None):
    """decode() on real torch tensors into out (and lse)."""
    infos = _infos(q, k_cache, v_cache, kv_len, block_table, out, lse, sinks, k_scale, v_scale)
    # the C library switches to the plan's device itself (and back)
    device = q.device
    _core.run_decode(*infos[:7], softmax_scale, num_splits, alloc_workspace(device),
                     stream_of(device), infos[7], variants, kv_dtype, infos[8], infos[9],
                     None if tree_mask is None else describe(tree_mask, "tree_mask"))


@torch.library.custom_op("flashdecode::decode", mutates_args=())
def decode_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, kv_len: Tensor,
              block_table: Optional[Tensor], softmax_scale: float, num_splits: int,
              return_lse: bool, sinks: Optional[Tensor] = None, window_left: int = -1,
              logits_soft_cap: float = 0.0, non_causal: bool = False,
              out_dtype: Optional[torch.dtype] = None, k_scale: Optional[Tensor] = None,
              v_scale: Optional[Tensor] = None, kv_dtype: Optional[str] = None,
              deterministic: bool = False, pdl: bool = True,
              tree_mask: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    out = torch.empty(q.shape, dtype=out_dtype or q.dtype, device=q.device)
    lse_shape = _lse_shape(q) if return_lse else (0,)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    run_tensors(q, k_cache, v_cache, kv_len, block_table, out, lse if return_lse else None,
                softmax_scale, num_splits, sinks,
                _core.Variants(window_left, logits_soft_cap, non_causal, deterministic, pdl),
                k_scale, v_scale, kv_dtype, tree_mask)
    return out, lse


@decode_op.register_fake
def _decode_fake(q, k_cache, v_cache, kv_len, block_table, softmax_scale, num_splits,
                 return_lse, sinks=None, window_left=-1, logits_soft_cap=0.0, non_causal=False,
                 out_dtype=None, k_scale=None, v_scale=None, kv_dtype=None, deterministic=False,
                 pdl=True, tree_mask=None):
    _check_meta(q, k_cache, v_cache, kv_len, block_table, None, None, sinks, k_scale, v_scale,
                kv_dtype, tree_mask)
    if out_dtype is not None:
        check_out_dtype(str(out_dtype).replace("torch.", ""), describe(q, "q").dtype,
                        "out_dtype")
    out = q.new_empty(q.shape, dtype=out_dtype or q.dtype)
    lse = q.new_empty(_lse_shape(q) if return_lse else (0,), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashdecode::decode_out", mutates_args=("out", "lse"))
def decode_out_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, kv_len: Tensor,
                  block_table: Optional[Tensor], out: Tensor, lse: Optional[Tensor],
                  softmax_scale: float, num_splits: int, sinks: Optional[Tensor] = None,
                  window_left: int = -1, logits_soft_cap: float = 0.0,
                  non_causal: bool = False, k_scale: Optional[Tensor] = None,
                  v_scale: Optional[Tensor] = None, kv_dtype: Optional[str] = None,
                  deterministic: bool = False, pdl: bool = True,
                  tree_mask: Optional[Tensor] = None) -> None:
    run_tensors(q, k_cache, v_cache, kv_len, block_table, out, lse, softmax_scale, num_splits,
                sinks, _core.Variants(window_left, logits_soft_cap, non_causal, deterministic,
                                      pdl),
                k_scale, v_scale, kv_dtype, tree_mask)


@decode_out_op.register_fake
def _decode_out_fake(q, k_cache, v_cache, kv_len, block_table, out, lse, softmax_scale,
                     num_splits, sinks=None, window_left=-1, logits_soft_cap=0.0,
                     non_causal=False, k_scale=None, v_scale=None, kv_dtype=None,
                     deterministic=False, pdl=True, tree_mask=None):
    _check_meta(q, k_cache, v_cache, kv_len, block_table, out, lse, sinks, k_scale, v_scale,
                kv_dtype, tree_mask)


def _compiling():
    """True while torch.compile traces (a host read of values would break the graph)."""
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and getattr(compiler, "is_compiling", lambda: False)())


def _as_index_tensor(x, name, q, batch_vector):
    """kv_len / block_table as an int32 tensor on q's device (a copy only if needed).

    Wider integers are never wrapped: host values outside the int32 range raise
    ValueError; a CUDA tensor's (and any int64 tensor's under torch.compile) are
    saturated to the int32 limits on the device (checking them would
    synchronise with the host), so they act as any other out-of-range kv_len or
    page id does there (clamped, or skipped).
    """
    if not isinstance(x, Tensor):
        if batch_vector and isinstance(x, int) and not isinstance(x, bool):
            return torch.full((q.shape[0],), int(_core.index_array(x, name)), dtype=torch.int32,
                              device=q.device)
        return torch.as_tensor(_core.index_array(x, name), device=q.device)
    if x.dtype != torch.int32:
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise TypeError("%s: dtype %s, expected int32" % (name, x.dtype))
        if x.device.type != "cuda" and not _compiling():
            if x.numel() and (int(x.min()) < _core.INT32_MIN or int(x.max()) > _core.INT32_MAX):
                raise ValueError("%s: values outside the int32 range" % name)
        elif x.dtype == torch.int64:
            x = x.clamp(_core.INT32_MIN, _core.INT32_MAX)
        elif x.dtype not in (torch.int8, torch.int16, torch.uint8):
            raise TypeError("%s: dtype %s on a CUDA device, expected int32 (or int64)"
                            % (name, x.dtype))
        x = x.to(torch.int32)
    if x.device != q.device:
        x = x.to(q.device)
    if x.dim() >= 1 and x.shape[-1] > 1 and x.stride(-1) != 1:
        x = x.contiguous()
    return x


def _as_sinks_tensor(sinks, q):
    """sinks as float32 on q's device: another float dtype is converted there (a small
    device op: traceable, capturable); host lists become a tensor on q's device; a
    tensor on another device is refused (a copy from the host could not be captured)."""
    if not isinstance(sinks, Tensor):
        if _compiling():
            raise TypeError("sinks: expected a torch.Tensor under torch.compile, got %s"
                            % type(sinks).__name__)
        from ._api import as_numpy_sinks

        return torch.as_tensor(as_numpy_sinks(sinks), device=q.device)
    if sinks.dtype != torch.float32:
        if not sinks.dtype.is_floating_point:
            raise TypeError("sinks: dtype %s, expected float32 (or another float dtype, "
                            "converted)" % str(sinks.dtype).replace("torch.", ""))
        if sinks.device == q.device:
            sinks = sinks.to(torch.float32)
    if sinks.dim() == 1 and sinks.shape[0] > 1 and sinks.stride(0) != 1 \
            and sinks.device == q.device:
        sinks = sinks.contiguous()
    return sinks  # (shape and device: check_call names them)


def as_scale_tensor(x, name, q):
    """A scale for q's device: a float -> float32 tensor (1,) there (a host-to-device
    copy on CUDA); a tensor of another float dtype converted on its device."""
    if x is None:
        return None
    if not isinstance(x, Tensor):
        if isinstance(x, float):
            return torch.tensor([x], dtype=torch.float32, device=q.device)
        from ._api import as_numpy_scale

        return torch.as_tensor(as_numpy_scale(x, name), device=q.device)
    if x.dtype != torch.float32:
        if not x.dtype.is_floating_point:
            raise TypeError("%s: dtype %s, expected float32" % (name,
                                                                str(x.dtype).replace("torch.", "")))
        x = x.to(torch.float32)
    return x


def decode(q, k_cache, v_cache, kv_len, block_table, softmax_scale, num_splits, return_lse,
           out, sinks=None, variants=_core.PLAIN, out_dtype=None, fp8=None, tree_mask=None):
    """flashdecode.decode for torch tensors (see flashdecode.decode)."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("out", out)):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError("%s: expected a torch.Tensor like q, got %s" % (name,
                                                                            type(t).__name__))
    kv_len = _as_index_tensor(kv_len, "kv_len", q, True)
    if block_table is not None:
        block_table = _as_index_tensor(block_table, "block_table", q, False)
    if sinks is not None:
        sinks = _as_sinks_tensor(sinks, q)
    if tree_mask is not None:
        from ._tree import pack_tree_mask

        if not isinstance(tree_mask, Tensor):
            tree_mask = torch.as_tensor(pack_tree_mask(tree_mask).astype("int64", copy=False)
                                        if hasattr(tree_mask, "dtype") else tree_mask)
        tree_mask = pack_tree_mask(tree_mask)
        if tree_mask.dtype == torch.uint64:
            tree_mask = tree_mask.view(torch.int64)  # (the same bits; the op schema's type)
    scale = _core.resolve_scale(softmax_scale)
    from ._api import resolve_out_dtype

    out_name = resolve_out_dtype(out_dtype, describe(q, "q").dtype, out)
    w, cap, nc = variants.window_left, variants.logits_soft_cap, variants.non_causal
    det, pdl = variants.deterministic, variants.pdl
    ks = vs = kvd = None
    if fp8 is not None:
        ks, vs = as_scale_tensor(fp8.k_scale, "k_scale", q), as_scale_tensor(fp8.v_scale,
                                                                             "v_scale", q)
        kvd = fp8.kv_dtype
    if out is None:
        out, lse = torch.ops.flashdecode.decode(q, k_cache, v_cache, kv_len, block_table, scale,
                                                _core._int32("num_splits", num_splits),
                                                bool(return_lse), sinks, w,
                                                cap, nc,
                                                None if out_name is None
                                                else getattr(torch, out_name), ks, vs, kvd,
                                                det, pdl, tree_mask)
        return (out, lse) if return_lse else out
    lse = None
    if return_lse:
        lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=q.device)
    torch.ops.flashdecode.decode_out(q, k_cache, v_cache, kv_len, block_table, out, lse, scale,
                                     _core._int32("num_splits", num_splits), sinks, w, cap, nc,
                                     ks, vs, kvd, det, pdl, tree_mask)
    return (out, lse) if return_lse else out


# ---- mla_decode -------------------------------------------------------------------------------
def _mla_infos(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, out, lse, k_scale):
    return (describe(q_nope, "q_nope"), describe(q_pe, "q_pe"), describe(ckv_cache, "ckv_cache"),
            describe(kpe_cache, "kpe_cache"), describe(kv_len, "kv_len"),
            None if block_table is None else describe(block_table, "block_table"),
            None if out is None else describe(out, "out"),
            None if lse is None else describe(lse, "lse"),
            None if k_scale is None else describe(k_scale, "k_scale"))


def _mla_check_meta(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, out, lse, k_scale,
                    kv_dtype):
    i = _mla_infos(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, out, lse, k_scale)
    return check_mla_call(*i[:8], kv_dtype, i[8])


def run_mla_tensors(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, out, lse,
                    softmax_scale, num_splits, variants=_core.PLAIN, k_scale=None, kv_dtype=None):
    """mla_decode() on real torch tensors into out (and lse)."""
    i = _mla_infos(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, out, lse, k_scale)
    device = q_nope.device
    run_mla(*i[:8], softmax_scale, num_splits, alloc_workspace(device), stream_of(device),
            variants, kv_dtype, i[8])


@torch.library.custom_op("flashdecode::mla_decode", mutates_args=())
def mla_decode_op(q_nope: Tensor, q_pe: Tensor, ckv_cache: Tensor, kpe_cache: Tensor,
                  kv_len: Tensor, block_table: Optional[Tensor], softmax_scale: float,
                  num_splits: int, return_lse: bool, out_dtype: Optional[torch.dtype] = None,
                  k_scale: Optional[Tensor] = None, kv_dtype: Optional[str] = None,
                  deterministic: bool = False, pdl: bool = True) -> Tuple[Tensor, Tensor]:
    out = torch.empty(q_nope.shape, dtype=out_dtype or q_nope.dtype, device=q_nope.device)
    lse_shape = mla_lse_shape(q_nope.shape) if return_lse else (0,)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q_nope.device)
    run_mla_tensors(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, out,
                    lse if return_lse else None, softmax_scale, num_splits,
                    _core.Variants(-1, 0.0, False, deterministic, pdl), k_scale, kv_dtype)
    return out, lse


@mla_decode_op.register_fake
def _mla_decode_fake(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, softmax_scale,
                     num_splits, return_lse, out_dtype=None, k_scale=None, kv_dtype=None,
                     deterministic=False, pdl=True):
    _mla_check_meta(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, None, None, k_scale,
                    kv_dtype)
    if out_dtype is not None:
        check_out_dtype(str(out_dtype).replace("torch.", ""), describe(q_nope, "q_nope").dtype,
                        "out_dtype")
    out = q_nope.new_empty(q_nope.shape, dtype=out_dtype or q_nope.dtype)
    lse = q_nope.new_empty(mla_lse_shape(q_nope.shape) if return_lse else (0,),
                           dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashdecode::mla_decode_out", mutates_args=("out", "lse"))
def mla_decode_out_op(q_nope: Tensor, q_pe: Tensor, ckv_cache: Tensor, kpe_cache: Tensor,
                      kv_len: Tensor, block_table: Optional[Tensor], out: Tensor,
                      lse: Optional[Tensor], softmax_scale: float, num_splits: int,
                      k_scale: Optional[Tensor] = None, kv_dtype: Optional[str] = None,
                      deterministic: bool = False, pdl: bool = True) -> None:
    run_mla_tensors(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, out, lse,
                    softmax_scale, num_splits, _core.Variants(-1, 0.0, False, deterministic, pdl),
                    k_scale, kv_dtype)


@mla_decode_out_op.register_fake
def _mla_decode_out_fake(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, out, lse,
                         softmax_scale, num_splits, k_scale=None, kv_dtype=None,
                         deterministic=False, pdl=True):
    _mla_check_meta(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, out, lse, k_scale,
                    kv_dtype)


def mla_decode(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, softmax_scale,
               num_splits, return_lse, out, variants, out_dtype, fp8):
    """flashdecode.mla_decode for torch tensors (softmax_scale resolved; see
    flashdecode.mla_decode)."""
    for name, t in (("q_pe", q_pe), ("ckv_cache", ckv_cache), ("kpe_cache", kpe_cache),
                    ("out", out)):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError("%s: expected a torch.Tensor like q_nope, got %s"
                            % (name, type(t).__name__))
    kv_len = _as_index_tensor(kv_len, "kv_len", q_nope, True)
    if block_table is not None:
        block_table = _as_index_tensor(block_table, "block_table", q_nope, False)
    from ._api import resolve_out_dtype

    out_name = resolve_out_dtype(out_dtype, describe(q_nope, "q_nope").dtype, out)
    ks = as_scale_tensor(fp8.k_scale, "k_scale", q_nope)
    det, pdl = variants.deterministic, variants.pdl
    splits = _core._int32("num_splits", num_splits)
    if out is None:
        out, lse = torch.ops.flashdecode.mla_decode(
            q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table, softmax_scale, splits,
            bool(return_lse), None if out_name is None else getattr(torch, out_name), ks,
            fp8.kv_dtype, det, pdl)
        return (out, lse) if return_lse else out
    lse = None
    if return_lse:
        lse = torch.empty(mla_lse_shape(q_nope.shape), dtype=torch.float32, device=q_nope.device)
    torch.ops.flashdecode.mla_decode_out(q_nope, q_pe, ckv_cache, kpe_cache, kv_len, block_table,
                                         out, lse, softmax_scale, splits, ks, fp8.kv_dtype, det,
                                         pdl)
    return (out, lse) if return_lse else out


# ---- merge_states -----------------------------------------------------------------------------
def _merge_infos(states_out, states_lse, out, lse):
    return (describe(states_out, "states_out"), describe(states_lse, "states_lse"),
            None if out is None else describe(out, "out"),
            None if lse is None else describe(lse, "lse"))


def _merged_shapes(states_out):
    s, b, t, h, d = states_out.shape
    return (b, t, h, d), (b, h, t)


@torch.library.custom_op("flashdecode::merge_states", mutates_args=())
def merge_states_op(states_out: Tensor, states_lse: Tensor,
                    out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    check_merge(*_merge_infos(states_out, states_lse, None, None))
    out_shape, lse_shape = _merged_shapes(states_out)
    out = torch.empty(out_shape, dtype=out_dtype or states_out.dtype, device=states_out.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=states_out.device)
    run_merge(*_merge_infos(states_out, states_lse, out, lse), stream_of(states_out.device))
    return out, lse


@merge_states_op.register_fake
def _merge_states_fake(states_out, states_lse, out_dtype=None):
    check_merge(*_merge_infos(states_out, states_lse, None, None))
    out_shape, lse_shape = _merged_shapes(states_out)
    return (states_out.new_empty(out_shape, dtype=out_dtype or states_out.dtype),
            states_out.new_empty(lse_shape, dtype=torch.float32))


@torch.library.custom_op("flashdecode::merge_states_out", mutates_args=("out", "lse"))
def merge_states_out_op(states_out: Tensor, states_lse: Tensor, out: Tensor,
                        lse: Optional[Tensor]) -> None:
    run_merge(*_merge_infos(states_out, states_lse, out, lse), stream_of(states_out.device))


@merge_states_out_op.register_fake
def _merge_states_out_fake(states_out, states_lse, out, lse):
    check_merge(*_merge_infos(states_out, states_lse, out, lse))


def merge_states(states_out, states_lse, out, lse, out_dtype):
    """flashdecode.merge_states for torch tensors (see flashdecode.merge_states)."""
    for name, t in (("states_lse", states_lse), ("out", out), ("lse", lse)):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError("%s: expected a torch.Tensor like states_out, got %s"
                            % (name, type(t).__name__))
    out_name = out_dtype_of(out_dtype, out)
    # the C API reads dense tensors: copy a strided one (a device op, traceable)
    if not states_out.is_contiguous():
        states_out = states_out.contiguous()
    if not states_lse.is_contiguous():
        states_lse = states_lse.contiguous()
    dtype = None if out_name is None else getattr(torch, out_name)
    if out is None and lse is None:
        return torch.ops.flashdecode.merge_states(states_out, states_lse, dtype)
    if states_out.dim() == 5:
        out_shape, lse_shape = _merged_shapes(states_out)
        if out is None:
            out = torch.empty(out_shape, device=states_out.device,
                              dtype=dtype or states_out.dtype)
        if lse is None:
            lse = torch.empty(lse_shape, dtype=torch.float32, device=states_out.device)
    torch.ops.flashdecode.merge_states_out(states_out, states_lse, out, lse)
    return out, lse
