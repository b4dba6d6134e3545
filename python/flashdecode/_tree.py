"""Speculative-decoding tree masks (flashdecode.h, TREE MASKS): packing and checks.

A tree mask says which of the q_len draft keys each query row sees (the committed prefix,
keys 0 .. kv_len[b] - q_len - 1, is every row's). The C library takes it bit-packed: one
64-bit word a row, bit j set = the row sees draft key j (key kv_len[b] - q_len + j). Here
it may also come as a bool tensor [batch, q_len, q_len] (mask[b, t, j] = row t sees draft
key j), packed for the caller. The CPU and reference backends take any shape; CUDA takes
fp16/bf16 with a cache of the same dtype at head_dim 64 or 128 (the C plan refuses the rest
with UnsupportedError).
"""
import numpy as np

from . import _lib
from ._tensors import STRIDE_BROADCAST, describe, is_torch_tensor

_PACKED = ("int64", "uint64")


def pack_tree_mask(mask):
    """A tree mask as packed 64-bit rows [batch, q_len].

    ``mask`` is a torch tensor or numpy array: already packed (int64 or uint64, [batch,
    q_len]; returned as is), or bool [batch, q_len, q_len] (row t sees draft key j where
    mask[b, t, j] is True), packed into int64 (torch) or uint64 (numpy) on the same device.
    Raises TypeError for another dtype and ValueError for a bool mask that is not square in
    its last two dimensions or has more than 64 columns.
    """
    if is_torch_tensor(mask):
        import torch

        if mask.dtype != torch.bool:
            return mask
        _check_square(tuple(mask.shape))
        q_len = int(mask.shape[-1])
        bits = mask.to(torch.int64)
        packed = torch.zeros(mask.shape[:-1], dtype=torch.int64, device=mask.device)
        for j in range(q_len):  # (1 << 63 wraps to INT64_MIN: the bit pattern we want)
            packed |= bits[..., j] << j
        return packed
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        return mask
    _check_square(arr.shape)
    packed = np.packbits(arr, axis=-1, bitorder="little")  # [batch, q_len, ceil(q_len / 8)]
    wide = np.zeros(arr.shape[:-1] + (8,), dtype=np.uint8)
    wide[..., :packed.shape[-1]] = packed
    return np.ascontiguousarray(wide).view("<u8").reshape(arr.shape[:-1])


def _check_square(shape):
    if len(shape) != 3 or shape[1] != shape[2]:
        raise ValueError("tree_mask: a bool mask has shape [batch, q_len, q_len], got %s"
                         % (list(shape),))
    if shape[2] > _lib.FD_MAX_Q_LEN_TREE:
        raise ValueError("tree_mask: q_len %d, at most %d draft tokens"
                         % (shape[2], _lib.FD_MAX_Q_LEN_TREE))


def describe_tree_mask(mask):
    """The TensorInfo of a (packed or bool) tree mask, or None."""
    if mask is None:
        return None
    return describe(pack_tree_mask(mask), "tree_mask")


def check_tree_mask(info, g):
    """Check a packed mask's TensorInfo against the call's Geometry; returns the C batch
    stride (FD_STRIDE_BROADCAST for a mask expanded over the batch).

    Raises TypeError for a dtype other than int64 / uint64, ValueError for a wrong shape,
    device (the mask lives with q: host memory for the CPU, the GPU for CUDA) or row stride.
    """
    if info.dtype not in _PACKED:
        raise TypeError("tree_mask: dtype %s, expected int64 or uint64 rows [batch, q_len] "
                        "(or bool [batch, q_len, q_len])" % info.dtype)
    if tuple(int(s) for s in info.shape) != (g.batch, g.q_len):
        raise ValueError("tree_mask: shape %s, expected [%d, %d] (batch, q_len of q)"
                         % (list(info.shape), g.batch, g.q_len))
    if info.device != g.device:
        raise ValueError("tree_mask: on %s, expected %s (q's device)" % (info.device, g.device))
    if g.q_len > 1 and info.strides[1] != 1:
        raise ValueError("tree_mask: rows must be contiguous (stride %d)" % info.strides[1])
    stride = int(info.strides[0])
    if stride == 0 and g.batch > 1:
        return STRIDE_BROADCAST
    if stride < 0:
        raise ValueError("tree_mask: negative batch stride %d" % stride)
    return stride
