"""flashdecode.hf — flashdecode as a Hugging Face transformers attention implementation.

    import flashdecode.hf
    flashdecode.hf.register()                        # returns "fdecode"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="fdecode")

``register()`` adds an attention function and its mask function to transformers' public
registries (``transformers.AttentionInterface`` and ``transformers.masking_utils.
AttentionMaskInterface``) under the name ``"fdecode"``. Why not ``"flashdecode"``:
transformers (5.x) takes every attn_implementation whose name contains "flash" for a
FlashAttention kernel and tries to load one (``is_flash_attention_requested`` is a
substring test), so a registered function of that name cannot be selected.

What runs where
---------------
Decode steps (1 to 16 new tokens per sequence, so also a short prompt's prefill; a causal
or sliding-window-causal mask; no padding) run ``flashdecode.decode`` on the model's KV cache in place: transformers' cache
is [batch, kv_heads, capacity, head_dim] and flashdecode reads it through strides
(``key.transpose(1, 2)``; no copy, no transposition). Everything else goes to PyTorch SDPA
exactly as ``attn_implementation="sdpa"`` would run it (the mask of the sdpa mask
function): steps of more than 16 new tokens (prefill), padded batches, packed sequences, chunked
or custom masks, dropout/training, dtypes other than float32/float16/bfloat16, a head_dim
the backend lacks, a device flashdecode has no backend for. Steps with a logit soft-cap or
attention sinks that the installed flashdecode cannot compute go to the model's own eager
attention (SDPA has neither). The model's softmax scale (``scaling``), sliding window
(``window_left = sliding_window - 1``), soft-cap (``logits_soft_cap``) and sinks (float32
``sinks``) are passed to flashdecode when it accepts those keywords (the window's size
comes from the model's ``sliding_window`` argument; a step whose mask has a window while
the layer passes none, or the reverse, falls back).

kv_len
------
transformers builds one mask per forward with the mask function registered under the
attn_implementation's name; ``register()`` registers one that, for an eligible decode
step, returns a small int32 tensor instead of a boolean mask: ``[1, batch, 1, 1]`` holding
kv_len for every sequence, ``[2, batch, 1, 1]`` with the window size in the second row
for a sliding-window mask. It is 4-D so that transformers passes it through untouched
(``generate`` precomputes masks for static caches). kv_len is the number of keys of the
cache tensor the layer gets that the last query row sees:

    kv_len = q_offset + q_len - kv_offset

where q_offset is the position of the first new token (``cache_position[0]`` in
transformers up to 5.3) and kv_offset the absolute position of the cache tensor's first key
(non-zero only for sliding-window caches that dropped old keys), both as transformers'
mask functions receive them. Assumption: no padding, so every sequence of the batch has
that same length and sees the keys 0 .. kv_len - 1 of its row. A 2-D padding mask that is
not all ones (left padding) makes the step fall back to SDPA; under torch.compile the
mask's values cannot be read, so there any 2-D padding mask falls back (call a compiled
model with ``attention_mask=None``; ``generate`` with a static cache builds its masks
outside the compiled forward, so it is not affected). For a static cache
the position is a device tensor, so kv_len is computed on the device: the decode step
can be captured in a CUDA graph and replayed as the cache grows.

Deterministic mode
------------------
Set ``model.config.fdecode_deterministic = True`` for one model, or
``flashdecode.hf.deterministic = True`` for every model of the process (both read at
every call; for a compiled model set them before compiling), and every call that runs
flashdecode passes
``deterministic=True``: a decode step's attention output for a sequence is then bitwise
the same whatever the batch around it and the cache's capacity (see
``flashdecode.decode``; the cache may hold at most ``flashdecode.DETERMINISTIC_MAX_KEYS``
keys, else the call raises). It covers flashdecode's attention only: the steps that fall
back to SDPA or eager attention (prefill of more than 16 tokens, padded batches, ...) and
the model's other layers (matmuls, norms) are as batch-invariant as PyTorch makes them.

Launches
--------
Decode steps pass ``pdl=False`` (the call's first kernel launched plainly, after the
model's previous kernel; see ``flashdecode.decode``): in a Llama-3.1-8B-shaped model under
CUDA graphs on an H200 the steps ran up to 0.7 % faster so, most at batch 1
(dev/NOTES.md).
``flashdecode.hf.pdl = True`` restores the library's default; read at every call (for a
compiled model or a captured CUDA graph, set it before compiling or capturing).

Paged / continuous batching: transformers' continuous-batching manager accepts only
"sdpa", "paged|eager" and FlashAttention implementations (it refuses other registered
names), so it cannot run through this function.

``stats`` counts the attention calls by route (Python calls: a replayed CUDA graph or a
compiled region does not count again); ``reset_stats()`` clears it.
"""
import collections
import inspect
import sys

import torch

import flashdecode

NAME = "fdecode"
MAX_Q_LEN = 16
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

stats = collections.Counter()

# True: decode steps run flashdecode.decode(..., deterministic=True) (see "Deterministic
# mode" above); read at every call.
deterministic = False

# False: decode steps launch without programmatic dependent launch (see "Launches"); read at
# every call.
pdl = False

_state = {}  # filled by register(): the transformers functions and the decode features


def reset_stats():
    """Clear ``stats``."""
    stats.clear()


def _decode_features():
    """The optional keyword arguments the installed flashdecode.decode accepts."""
    try:
        params = inspect.signature(flashdecode.decode).parameters
    except (TypeError, ValueError):
        return frozenset()
    return frozenset(k for k in ("window_left", "logits_soft_cap", "sinks") if k in params)


def _cuda_head_dims():
    """head_dims the CUDA backend plans (empty without a usable GPU)."""
    if not flashdecode.backend_available("cuda"):
        return frozenset()
    dims = set()
    for d in (64, 80, 96, 128, 256):
        try:
            flashdecode.DecodePlan(batch=1, num_heads_q=1, num_heads_kv=1, head_dim=d,
                                   dtype=torch.bfloat16, kv_capacity=64, device="cuda")
            dims.add(d)
        except (flashdecode.UnsupportedError, flashdecode.InvalidArgumentError):
            pass
    return frozenset(dims)


def _treated_as_flash_attention(name):
    """True when the installed transformers would take ``name`` for a FlashAttention kernel."""
    try:
        from transformers.utils.generic import is_flash_attention_requested
    except ImportError:
        return False
    try:
        return bool(is_flash_attention_requested(requested_attention_implementation=name))
    except TypeError:
        return False


def register(name=NAME):
    """Register flashdecode with transformers under ``name``; returns the name.

    Then ``from_pretrained(..., attn_implementation=name)`` (or
    ``model.set_attn_implementation(name)``) decodes through flashdecode. Idempotent.
    Needs transformers with ``AttentionInterface`` and ``masking_utils.
    AttentionMaskInterface`` (4.53 or later).
    """
    try:
        from transformers import AttentionInterface
        from transformers import masking_utils
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
    except ImportError as e:
        raise ImportError("flashdecode.hf needs transformers >= 4.53 (AttentionInterface and "
                          "masking_utils.AttentionMaskInterface): %s" % e) from e
    if not hasattr(masking_utils, "AttentionMaskInterface"):
        raise ImportError("flashdecode.hf needs transformers >= 4.53 "
                          "(masking_utils.AttentionMaskInterface)")
    if _treated_as_flash_attention(name):
        raise ValueError("register: the installed transformers takes an attn_implementation "
                         "named %r for a FlashAttention kernel (its name contains 'flash'); "
                         "pick another name" % name)
    if not _state:
        sdpa_mask = masking_utils.AttentionMaskInterface._global_mapping["sdpa"]
        _state.update(
            sdpa_mask=sdpa_mask,
            sdpa=sdpa_attention_forward,
            causal=masking_utils.causal_mask_function,
            sliding=getattr(masking_utils, "sliding_window_causal_mask_function", None),
            sliding_code=None,
            features=_decode_features(),
            cuda_head_dims=_cuda_head_dims(),
        )
        if _state["sliding"] is not None:
            _state["sliding_code"] = getattr(_state["sliding"](1), "__code__", None)
    AttentionInterface.register(name, attention_forward)
    masking_utils.AttentionMaskInterface.register(name, mask_function)
    return name


# ---- the mask function ---------------------------------------------------------------------

def _same_function(a, b, depth=0):
    """a and b are the same closure: one code object and equal captured values (functions
    compared the same way, plain Python scalars by value; anything else, such as a tensor,
    makes them differ)."""
    if a is b:
        return True
    code = getattr(a, "__code__", None)
    if code is None or code is not getattr(b, "__code__", None) or depth > 4:
        return False
    cells_a, cells_b = a.__closure__ or (), b.__closure__ or ()
    if len(cells_a) != len(cells_b):
        return False
    for ca, cb in zip(cells_a, cells_b):
        if not _same_value(ca.cell_contents, cb.cell_contents, depth):
            return False
    return True


def _same_value(x, y, depth):
    if isinstance(x, tuple):
        return (isinstance(y, tuple) and len(x) == len(y)
                and all(_same_value(u, v, depth) for u, v in zip(x, y)))
    if isinstance(x, (bool, int, float, str)) or x is None:
        return type(x) is type(y) and x == y
    if callable(x):
        return callable(y) and _same_function(x, y, depth + 1)
    return False


def _window_of(mask_function, local_size):
    """0 for transformers' causal mask function, W for its sliding-window causal mask
    function of W keys (W == local_size), None for any other mask function."""
    if mask_function is _state["causal"]:
        return 0
    sliding = _state["sliding"]
    if (sliding is None or not isinstance(local_size, int) or isinstance(local_size, bool)
            or local_size < 1):
        return None
    if _tracing():
        # a trace may not read closures (torch 2.11 cannot): the sliding mask function's
        # code, with the local_size transformers passes beside it
        code = getattr(mask_function, "__code__", None)
        return local_size if code is not None and code is _state["sliding_code"] else None
    return local_size if _same_function(mask_function, sliding(local_size)) else None


def _tracing():
    compiler = getattr(torch, "compiler", None)
    compiling = getattr(compiler, "is_compiling", None) if compiler is not None else None
    return bool((compiling is not None and compiling()) or torch.jit.is_tracing())


def _no_padding(padding, q_offset, q_len):
    """The 2-D padding mask keeps every position up to the last new token."""
    if padding is None:
        return True
    if not isinstance(padding, torch.Tensor) or padding.dim() != 2 or _tracing():
        return False
    end = int(q_offset) + q_len
    if padding.shape[-1] < end:
        return False
    return bool(padding[:, :end].bool().all())


def _decode_marker(kwargs):
    """The kv_len marker for an eligible decode step, else None."""
    batch = kwargs.get("batch_size")
    kv_offset = kwargs.get("kv_offset", 0)
    if "q_length" in kwargs:                      # transformers 5.x
        q_len, q_offset = kwargs["q_length"], kwargs.get("q_offset", 0)
    elif isinstance(kwargs.get("cache_position"), torch.Tensor):   # transformers 4.x
        position = kwargs["cache_position"]
        if position.dim() != 1:
            return None
        q_len, q_offset = position.shape[0], position[0]
    else:
        return None
    if not isinstance(batch, int) or not isinstance(q_len, int) or not isinstance(kv_offset, int):
        return None
    if not 1 <= q_len <= MAX_Q_LEN or batch < 1:
        return None
    window = _window_of(kwargs.get("mask_function", _state["causal"]), kwargs.get("local_size"))
    if window is None:
        return None
    if not _no_padding(kwargs.get("attention_mask"), q_offset, q_len):
        return None
    device = kwargs.get("device")
    if device is None:
        device = q_offset.device if isinstance(q_offset, torch.Tensor) else "cpu"
    rows = 2 if window else 1
    if isinstance(q_offset, torch.Tensor):
        # one kernel a step: the sum cast into the int32 marker as it is written
        marker = torch.empty((rows, batch, 1, 1), dtype=torch.int32, device=device)
        torch.add(q_offset.to(device=device).reshape(1, 1, 1, 1).expand(rows, batch, 1, 1),
                  q_len - kv_offset, out=marker)
    else:
        marker = torch.full((rows, batch, 1, 1), int(q_offset) + q_len - kv_offset,
                            dtype=torch.int32, device=device)
    if window:
        marker[1] = window
    return marker


def mask_function(*args, **kwargs):
    """The mask function registered with ``register()``: the kv_len marker for an eligible
    decode step (see the module's documentation), else the sdpa mask function's result."""
    marker = None if args else _decode_marker(kwargs)
    if marker is None:
        return _state["sdpa_mask"](*args, **kwargs)
    return marker


def is_marker(mask):
    """True when ``mask`` is the kv_len marker of ``mask_function``."""
    return (isinstance(mask, torch.Tensor) and mask.dtype == torch.int32 and mask.dim() == 4
            and mask.shape[0] in (1, 2) and mask.shape[2] == 1 and mask.shape[3] == 1)


def marker_kv_len(marker):
    """kv_len [batch] int32 of a marker."""
    return marker[0].reshape(marker.shape[1])


def marker_mask(marker, q_len, num_keys):
    """The boolean [batch, 1, q_len, num_keys] mask (True = attend) a marker stands for:
    row t sees keys j with j <= kv_len - q_len + t (and j > that - W with a window W)."""
    batch = marker.shape[1]
    device = marker.device
    pos = marker[0].reshape(batch, 1, 1).long() - q_len + torch.arange(q_len, device=device).view(1, q_len, 1)
    keys = torch.arange(num_keys, device=device).view(1, 1, num_keys)
    allowed = keys <= pos
    if marker.shape[0] == 2:
        allowed = allowed & (keys > pos - marker[1].reshape(batch, 1, 1).long())
    return allowed[:, None]


# ---- the attention function ----------------------------------------------------------------

def _active(value):
    """A soft-cap / window argument that is set (None, 0 and False are off)."""
    return value is not None and not (isinstance(value, (int, float)) and value == 0)


def _unsupported(module, query, key, value, marker, dropout, sliding_window, softcap, s_aux,
                 kwargs):
    """Why flashdecode cannot run this call (a short reason), or None when it can."""
    features = _state["features"]
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "rank"
    batch, heads_q, q_len, head_dim = query.shape
    if key.shape[0] != batch or value.shape[0] != batch or marker.shape[1] != batch:
        return "batch"
    if key.shape != value.shape or key.shape[-1] != head_dim:
        return "head_dim"
    if heads_q % key.shape[1] != 0:
        return "heads"
    if q_len > MAX_Q_LEN:
        return "q_len"
    if query.dtype not in _DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return "dtype"
    if query.device.type == "cpu":
        if not 1 <= head_dim <= 256:
            return "head_dim"
    elif query.device.type == "cuda":
        if head_dim not in _state["cuda_head_dims"]:
            return "head_dim" if _state["cuda_head_dims"] else "no CUDA backend"
        align = 16 // query.element_size()
        for t in (query, key, value):
            if t.stride(-1) != 1 or any(s % align for s in t.stride()[:-1]):
                return "strides"
    else:
        return "device"
    if key.device != query.device or value.device != query.device:
        return "device"
    if query.stride(-1) != 1 or key.stride(-1) != 1 or value.stride(-1) != 1:
        return "strides"
    if dropout and getattr(module, "training", False):
        return "dropout"
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad
                                    or value.requires_grad):
        return "grad"
    if kwargs.get("position_bias") is not None:
        return "position_bias"
    mask_window = marker.shape[0] == 2
    if mask_window != _active(sliding_window):
        return "window mismatch"
    if mask_window and "window_left" not in features:
        return "window"
    if _active(softcap) and "logits_soft_cap" not in features:
        return "soft-cap"
    if s_aux is not None and "sinks" not in features:
        return "sinks"
    return None


# module name of an attention class -> that module's eager_attention_forward: filled by eager
# calls (see _note_eager_function), so that a traced fallback reads this dict (string keys:
# Dynamo guards only the key it reads), not sys.modules (Dynamo would wrap and iterate that
# process-wide dict, which another thread's import may change meanwhile: "dictionary changed
# size during iteration")
_eager_functions = {}


def _note_eager_function(module):
    """Remember the eager attention of ``module``'s module (eager calls only)."""
    name = type(module).__module__
    if name not in _eager_functions and not _tracing():
        _eager_functions[name] = getattr(sys.modules.get(name), "eager_attention_forward", None)


def _eager_function(module):
    name = type(module).__module__
    fn = _eager_functions.get(name)
    if fn is None:  # (not called eagerly yet)
        fn = getattr(sys.modules.get(name), "eager_attention_forward", None)
    if fn is None:
        raise NotImplementedError(
            "flashdecode.hf: this attention call has a logit soft-cap or sinks, which SDPA cannot "
            "compute and the installed flashdecode does not support, and %s's module has no "
            "eager_attention_forward to fall back to" % type(module).__name__)
    return fn


def _fallback(module, query, key, value, mask, dropout, scaling, sliding_window, softcap, s_aux,
              kwargs, reason):
    """SDPA as attn_implementation="sdpa" runs it, or the model's eager attention when the
    call has a soft-cap or sinks."""
    if _active(softcap) or s_aux is not None:
        stats["eager"] += 1
        stats["eager: " + reason] += 1
        fn = _eager_function(module)
        q_len, num_keys = query.shape[2], key.shape[2]
        if mask is None and q_len > 1:  # SDPA's is_causal (top-left aligned)
            mask = (torch.arange(num_keys, device=query.device)[None, :]
                    <= torch.arange(q_len, device=query.device)[:, None])[None, None]
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.where(mask, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
        return fn(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                  sliding_window=sliding_window, softcap=softcap, s_aux=s_aux, **kwargs)
    stats["sdpa"] += 1
    stats["sdpa: " + reason] += 1
    return _state["sdpa"](module, query, key, value, mask, dropout=dropout, scaling=scaling,
                          sliding_window=sliding_window, **kwargs)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, s_aux=None, **kwargs):
    """The attention function registered with ``register()`` (transformers' attention
    interface: query [B, Hq, q_len, D], key/value [B, Hkv, S, D] as the cache returns them;
    returns (out [B, q_len, Hq, D], None))."""
    _note_eager_function(module)
    if not is_marker(attention_mask):
        return _fallback(module, query, key, value, attention_mask, dropout, scaling,
                         sliding_window, softcap, s_aux, kwargs, "not a decode step")
    if attention_mask.device != query.device:   # layers spread over devices
        attention_mask = attention_mask.to(query.device)
    reason = _unsupported(module, query, key, value, attention_mask, dropout, sliding_window,
                          softcap, s_aux, kwargs)
    if reason is not None:
        mask = marker_mask(attention_mask, query.shape[2], key.shape[2])
        return _fallback(module, query, key, value, mask, dropout, scaling, sliding_window,
                         softcap, s_aux, kwargs, reason)
    extra = {}
    if attention_mask.shape[0] == 2:
        extra["window_left"] = int(sliding_window) - 1
    if _active(softcap):
        extra["logits_soft_cap"] = float(softcap)
    if s_aux is not None:
        extra["sinks"] = s_aux.to(device=query.device, dtype=torch.float32).contiguous()
    if deterministic or getattr(getattr(module, "config", None), "fdecode_deterministic", False):
        extra["deterministic"] = True
    if not pdl:
        extra["pdl"] = False
    stats["flashdecode"] += 1
    out = flashdecode.decode(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                             marker_kv_len(attention_mask), softmax_scale=scaling, **extra)
    return out, None
