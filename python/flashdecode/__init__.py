"""flashdecode — decode-phase attention by flash decoding (split-KV).

A thin ctypes binding over libflashdecode's C API (include/flashdecode.h):
no compiled extension, no torch headers, so one package serves every torch
version (and numpy alone).

    out = flashdecode.decode(q, k_cache, v_cache, kv_len)            # one call
    plan = flashdecode.DecodePlan(batch=..., num_heads_q=..., ...)    # plan once,
    plan.run(q, k_cache, v_cache, kv_len, out=out)                    # run per layer
    out, lse = flashdecode.merge_states(states_out, states_lse)       # merge partial states
    flashdecode.append_kv(k_new, v_new, k_cache, v_cache, kv_len)     # new tokens into a cache

    # MLA (DeepSeek-V3/R1, Kimi-K2, GLM-5; absorbed form): one latent kv head
    out = flashdecode.mla_decode(q_nope, q_pe, ckv_cache, kpe_cache, kv_len,
                                 softmax_scale=192 ** -0.5)
    plan = flashdecode.MLADecodePlan(batch=..., num_heads_q=..., dtype=..., softmax_scale=...)
    flashdecode.mla_append_kv(ckv_new, kpe_new, ckv_cache, kpe_cache, kv_len)

    import flashdecode.distributed                                    # KV across ranks (torch)
    out = flashdecode.distributed.decode(q, k_shard, v_shard, kv_len_shard, group=group)

Attention variants: sliding window (window_left), logit soft-cap
(logits_soft_cap), attention sinks (sinks), non-causal rows (non_causal, for
the shared prefix of cascade decoding) and fp32 out (out_dtype). fp8 KV
caches (e4m3 / e5m2, with k_scale / v_scale per tensor, kv head or token).
deterministic=True: batch-invariant results (a sequence's bits do not depend
on the batch around it).

Tensors: torch (CPU or CUDA; custom ops ``torch.ops.flashdecode.decode`` and
``torch.ops.flashdecode.mla_decode`` for torch.compile, capturable in CUDA
graphs through DecodePlan / MLADecodePlan), numpy on the CPU, other
frameworks through DLPack.

Algorithm: Flash-Decoding (Dao, Haziza, Massa, Sizov, 2023, "Flash-Decoding
for long-context inference"), the online softmax of FlashAttention-2 (Dao,
2023).

The shared library is looked up in $FLASHDECODE_LIBRARY, then in this
package's folder (where ``pip install`` puts it).
"""
import sys as _sys

from . import _core, _lib
from ._api import decode
from ._append import append_kv
from ._merge import merge_states
from ._mla_api import mla_decode
from ._mla_append import mla_append_kv
from ._mla_plan import MLADecodePlan
from ._plan import DecodePlan
from ._tree import pack_tree_mask
from .errors import (BackendError, FlashDecodeError, InvalidArgumentError, OutOfMemoryError,
                     UnsupportedError, WorkspaceTooSmallError)

__version__ = _lib.VERSION_STRING
library_path = _lib.library_path
MAX_SPLITS = _lib.FD_MAX_SPLITS
MAX_Q_LEN = _lib.FD_MAX_Q_LEN                          # query rows per sequence (causal)
MAX_Q_LEN_NON_CAUSAL = _lib.FD_MAX_Q_LEN_NON_CAUSAL    # ... with non_causal=True
MAX_Q_LEN_TREE = _lib.FD_MAX_Q_LEN_TREE                # ... with a tree_mask
DETERMINISTIC_SPLIT_LEN = _lib.FD_DETERMINISTIC_SPLIT_LEN  # keys per split, deterministic=True
DETERMINISTIC_MAX_KEYS = _lib.FD_DETERMINISTIC_MAX_KEYS    # most keys a sequence reads then

__all__ = [
    "decode", "DecodePlan", "merge_states", "append_kv", "mla_decode", "MLADecodePlan",
    "mla_append_kv", "version", "backend_available", "num_splits_heuristic",
    "library_path", "FlashDecodeError", "InvalidArgumentError", "UnsupportedError",
    "WorkspaceTooSmallError", "OutOfMemoryError", "BackendError", "MAX_SPLITS", "MAX_Q_LEN",
    "MAX_Q_LEN_NON_CAUSAL", "MAX_Q_LEN_TREE", "pack_tree_mask", "DETERMINISTIC_SPLIT_LEN", "DETERMINISTIC_MAX_KEYS",
]

_BACKENDS = {"auto": _lib.FD_BACKEND_AUTO, "cpu": _lib.FD_BACKEND_CPU,
             "cuda": _lib.FD_BACKEND_CUDA, "reference": _lib.FD_BACKEND_REFERENCE}


def version():
    """The loaded C library's version string (fd_version), e.g. '0.1.0'."""
    return _lib.lib.fd_version().decode()


def backend_available(backend):
    """True when ``backend`` ('cpu', 'cuda', 'reference', 'auto') can run here.

    'cuda' needs a library built with CUDA and a visible GPU of compute
    capability 8.0 or newer (device 0) that the build holds code for.
    """
    try:
        value = _BACKENDS[backend]
    except KeyError:
        raise ValueError("backend: %r is not one of %s" % (backend, sorted(_BACKENDS))) from None
    return bool(_lib.lib.fd_backend_available(value))


def num_splits_heuristic(work_items, max_chunks, sm_count, blocks_per_sm):
    """The automatic split count (fd_num_splits_heuristic), as a pure function.

    Parameters
    ----------
    work_items : int
        batch * num_heads_kv (blocks per split).
    max_chunks : int
        ceil(longest kv_len / chunk_len).
    sm_count : int
        Multiprocessors (CPU: threads).
    blocks_per_sm : int
        Blocks of the split kernel resident per multiprocessor.

    Returns
    -------
    int
        In [1, min(max_chunks, MAX_SPLITS)]: the smallest count whose wave
        efficiency (the work over the slots' time, counting the chunks each
        split gets) is within 95 % of the best (after FlashAttention-2's
        num_splits_heuristic, which uses 85 % and whole splits; the rule is
        spelled out in flashdecode.h).
    """
    return int(_lib.lib.fd_num_splits_heuristic(
        _core._int_of("work_items", work_items, 64), _core._int_of("max_chunks", max_chunks, 64),
        _core._int_of("sm_count", sm_count), _core._int_of("blocks_per_sm", blocks_per_sm)))


# torch already imported: register the custom ops now, so that the first call
# inside torch.compile finds them (otherwise they register on first use).
if _sys.modules.get("torch") is not None:
    from ._api import load_torch_ops as _load_torch_ops

    try:
        _load_torch_ops()
    except ImportError:  # torch too old: the numpy path still works; torch use says why
        pass
