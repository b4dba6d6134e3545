"""_arrays.py — dtype names, array kinds and DLPack hand-over.

decode() and DecodePlan.run() accept torch tensors and numpy arrays
directly. Arrays of other frameworks come in through DLPack, without a copy:
on the CPU as numpy arrays (np.from_dlpack), on a GPU as torch tensors
(torch.from_dlpack, so torch must be installed), and results go back to the
caller's framework (cupy.from_dlpack, jax.dlpack.from_dlpack) when it is
CuPy or JAX.
"""
import importlib

import numpy as np

from ._tensors import BF16, F16, F32, is_torch_tensor

# DLPack device types (dlpack.h)
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3

_DTYPE_ALIASES = {
    "bf16": BF16, "bfloat16": BF16, "torch.bfloat16": BF16,
    "f16": F16, "fp16": F16, "float16": F16, "half": F16, "torch.float16": F16,
    "torch.half": F16,
    "f32": F32, "fp32": F32, "float32": F32, "float": F32, "torch.float32": F32,
    "torch.float": F32,
}


def dtype_name(dtype, what="dtype"):
    """'float32' | 'float16' | 'bfloat16' from a torch dtype, numpy dtype or string
    (``what`` names the argument in the error)."""
    if isinstance(dtype, str):
        name = _DTYPE_ALIASES.get(dtype.lower())
    elif type(dtype).__module__.startswith("torch"):
        name = _DTYPE_ALIASES.get(str(dtype))
    else:
        try:
            name = _DTYPE_ALIASES.get(np.dtype(dtype).name)
        except TypeError:
            name = None
    if name is None:
        raise TypeError("%s: %r is not supported (torch.float32/float16/bfloat16, a numpy "
                        "float32/float16 dtype, or 'f32', 'f16', 'bf16')" % (what, dtype))
    return name


def import_torch(why):
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise ImportError("flashdecode: %s needs torch, which is not installed" % why) from None


def is_native(x):
    return isinstance(x, np.ndarray) or is_torch_tensor(x)


def foreign_device(x):
    """'cpu' or 'cuda' for an object with __dlpack_device__, else None."""
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None or not hasattr(x, "__dlpack__"):
        return None
    kind = int(dev()[0])
    if kind in (_DL_CPU, _DL_CUDA_HOST):
        return "cpu"
    if kind == _DL_CUDA:
        return "cuda"
    raise TypeError("%s: DLPack device type %d is not supported (CPU or CUDA)"
                    % (type(x).__name__, kind))


def from_foreign(x, device):
    """A numpy array (cpu) or torch tensor (cuda) viewing a DLPack object's memory."""
    if x is None or is_native(x) or not hasattr(x, "__dlpack__"):
        return x
    if device == "cpu":
        try:
            return np.from_dlpack(x)
        except (TypeError, ValueError, BufferError, RuntimeError) as exc:
            # e.g. bfloat16, which numpy cannot hold: view it through torch
            try:
                torch = import_torch("a %s array numpy cannot view (%s)" % (type(x).__name__, exc))
            except ImportError as missing:
                raise TypeError(str(missing)) from None
            return torch.from_dlpack(x)
    return import_torch("a CUDA array from %s" % type(x).__name__).from_dlpack(x)


def to_framework_of(result, like):
    """Hand ``result`` back in the framework of ``like`` (CuPy, JAX), else as is."""
    root = type(like).__module__.split(".")[0]
    if root == "cupy":
        return importlib.import_module("cupy").from_dlpack(result)
    if root in ("jax", "jaxlib"):
        return importlib.import_module("jax.dlpack").from_dlpack(result)
    return result
