"""flashdecode.distributed — decode attention with the KV cache spread across
the ranks of a torch.distributed process group.

Each rank holds part of every sequence's keys (its shard: pages spread across
GPUs, a range of positions, or nothing) and calls :func:`decode` with the same
query. Each rank decodes its shard with ``return_lse`` and an fp32 out, the
ranks all-gather their (out, lse) states, and each merges them with
:func:`flashdecode.merge_states`: every rank returns the attention over the
union of the shards, which equals a single-process decode of the whole cache
(up to fp32 summation order)::

    m = max_r lse_r,  w_r = exp(lse_r - m),
    out = sum_r w_r out_r / sum_r w_r,   lse = m + log(sum_r w_r)

The process group's backend moves the states: NCCL on GPUs, gloo on CPUs.
C programs do the same with libflashdecode_nccl (include/flashdecode_nccl.h).
"""
import torch
import torch.distributed as dist

from . import _api
from ._merge import merge_states

__all__ = ["decode"]


def _all_gather(gathered, local, group):
    """gathered [world * n] <- every rank's local [n], in rank order (flat tensors: gloo's
    all_gather_into_tensor takes those, NCCL's any)."""
    dist.all_gather_into_tensor(gathered, local, group=group)


def _check_shapes(q, group, world, rank):
    """Raise ValueError on every rank when the ranks' query shapes differ."""
    mine = torch.tensor(list(q.shape), dtype=torch.int64, device=q.device)
    everyone = torch.empty(world * mine.numel(), dtype=torch.int64, device=q.device)
    _all_gather(everyone, mine, group)
    shapes = [tuple(s) for s in everyone.view(world, -1).tolist()]
    for r, shape in enumerate(shapes):
        if shape != shapes[rank]:
            raise ValueError("check_shapes: rank %d has q of shape %s, this rank (%d) %s: every "
                             "rank must decode the same queries" % (r, list(shape), rank,
                                                                    list(shapes[rank])))


def decode(q, k_shard, v_shard, kv_len_shard, *, block_table=None, softmax_scale=None,
           num_splits=0, window_left=-1, logits_soft_cap=0.0, sinks=None, non_causal=False,
           return_lse=False, out=None, out_dtype=None, group=None, check_shapes=False,
           deterministic=False, pdl=True):
    """Decode attention over a KV cache spread across the ranks of ``group``.

    Collective: every rank of the group calls it, with the same ``q`` (same
    shape, dtype and values) and its own shard of the cache. Each rank
    decodes its shard with :func:`flashdecode.decode` (``return_lse=True``,
    fp32 out), the ranks all-gather the states (one collective of
    ``world x batch x q_len x num_heads_q x (head_dim + 1)`` floats), and
    every rank merges them with :func:`flashdecode.merge_states`. The result
    equals :func:`flashdecode.decode` over the union of the shards.

    Parameters
    ----------
    q : torch.Tensor [batch, q_len, num_heads_q, head_dim]
        On the rank's device (CUDA with an NCCL group, CPU with gloo).
    k_shard, v_shard, kv_len_shard, block_table
        This rank's part of the cache, as :func:`flashdecode.decode` takes a
        cache: its keys of every sequence (``kv_len_shard[b]`` of them, 0
        when it holds none of sequence b: its state is then empty, lse
        -inf, which the merge ignores). Which keys a rank holds does not
        matter (any split of each sequence's keys into disjoint sets), with
        the masks below.
    softmax_scale, num_splits, logits_soft_cap
        As in :func:`flashdecode.decode` (the same on every rank).
    window_left : int
        -1 (default). A sliding window needs every key's global position,
        which a shard does not know: ValueError on a group of more than one
        rank (hold each sequence's window on one rank instead).
    sinks : tensor [num_heads_q], optional
        Attention sinks join the softmax denominator once: pass them on every
        rank; only group rank 0 uses them.
    non_causal : bool
        q_len = 1 (plain decoding): any split works, leave False. q_len > 1
        (speculative verify, causal): the rank whose shard holds the q_len
        newest keys of every sequence passes False and every other rank
        True (its keys all precede the queries). Shared-prefix rows: True
        everywhere.
    deterministic : bool
        Each rank decodes its shard with ``deterministic=True`` (see
        :func:`flashdecode.decode`); the merge sums the ranks in rank order,
        so a sequence's result does not depend on the batch around it.
    pdl : bool
        The local decode's launches (see :func:`flashdecode.decode`).
    return_lse : bool
        Also return the merged lse (float32 [batch, num_heads_q, q_len]).
    out : tensor [batch, q_len, num_heads_q, head_dim], optional
        Written in place (contiguous), any of float32 / float16 / bfloat16.
    out_dtype : dtype, optional
        Of the allocated out: q's dtype (default) or float32.
    group : ProcessGroup, optional
        Default: the default (world) group.
    check_shapes : bool
        First all-gather every rank's q shape and raise ValueError on every
        rank when they differ (one small collective and a host sync; not
        for CUDA graphs). Without it, ranks that disagree make the gather
        fail or hang, as any collective of mismatched sizes does.

    Returns
    -------
    out, or (out, lse) with ``return_lse``; the same on every rank.

    Notes
    -----
    On CUDA with an NCCL group nothing synchronises with the host (unless
    check_shapes), but the gathered buffer is allocated per call.
    """
    if not isinstance(q, torch.Tensor):
        raise TypeError("q: flashdecode.distributed.decode takes torch tensors, got %s"
                        % type(q).__name__)
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flashdecode.distributed.decode: torch.distributed is not initialised "
                           "(torch.distributed.init_process_group first)")
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if window_left != -1 and world > 1:
        raise ValueError("window_left: %r, but a sliding window over keys spread across %d ranks "
                         "needs their global positions, which a shard does not have (hold each "
                         "sequence's window on one rank)" % (window_left, world))
    if check_shapes:
        _check_shapes(q, group, world, rank)

    batch, q_len, heads, head_dim = (int(s) for s in q.shape)
    rows = batch * q_len * heads
    # This rank's state, packed: out [rows * head_dim] then lse [rows], fp32,
    # so that one collective moves both.
    packed = torch.empty(rows * (head_dim + 1), dtype=torch.float32, device=q.device)
    local_out = packed[:rows * head_dim].view(batch, q_len, heads, head_dim)
    _, local_lse = _api.decode(q, k_shard, v_shard, kv_len_shard, block_table=block_table,
                               softmax_scale=softmax_scale, num_splits=num_splits,
                               return_lse=True, out=local_out, window_left=window_left,
                               logits_soft_cap=logits_soft_cap,
                               sinks=sinks if rank == 0 else None, non_causal=non_causal,
                               deterministic=deterministic, pdl=pdl)
    packed[rows * head_dim:].view(batch, heads, q_len).copy_(local_lse)

    gathered = torch.empty(world * packed.numel(), dtype=torch.float32, device=q.device)
    _all_gather(gathered, packed, group)
    gathered = gathered.view(world, -1)
    states_out = gathered[:, :rows * head_dim].reshape(world, batch, q_len, heads, head_dim)
    states_lse = gathered[:, rows * head_dim:].reshape(world, batch, heads, q_len)
    if out is None and out_dtype is None:
        out_dtype = q.dtype
    out, lse = merge_states(states_out, states_lse, out=out, out_dtype=out_dtype)
    return (out, lse) if return_lse else out
