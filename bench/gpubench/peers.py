"""The implementations a row times, besides FlashInfer (flashinfer_peers.py): flashdecode
itself (plan + run, the variants, the three-call cascade), PyTorch SDPA with its flash and
cuDNN backends, and FlexAttention under torch.compile. Each builder returns a call(i) that
runs buffer set i and returns the output to check, or raises Unavailable(reason)."""
import os
import sys

from benchutil import REPO

from .common import SETTINGS, exc_text, short
from .data import page_layout, prefix_pages, torch_dtype


class Unavailable(Exception):
    """This implementation cannot run this row; the message says why (recorded as n/a)."""


def import_flashdecode():
    """(module, '') or (None, why). Falls back to ./python and ./build/libflashdecode.so
    when PYTHONPATH / FLASHDECODE_LIBRARY are not set."""
    lib = os.path.join(REPO, "build", "libflashdecode.so")
    if "FLASHDECODE_LIBRARY" not in os.environ and os.path.exists(lib):
        os.environ["FLASHDECODE_LIBRARY"] = lib
    pkg = os.path.join(REPO, "python")
    if os.path.isdir(pkg) and pkg not in sys.path:
        sys.path.append(pkg)  # after PYTHONPATH's entries, which win
    try:
        import flashdecode
        return flashdecode, ""
    except Exception as exc:
        return None, f"import flashdecode failed: {exc_text(exc)}"


# ---------------------------------------------------------------------------
# flashdecode
# ---------------------------------------------------------------------------

def variant_plan_kwargs(shape):
    """DecodePlan's variant keywords for shape; only the ones that are not the default, so
    a plain row runs with a library that predates the variants."""
    kw = {}
    if shape.window_left >= 0:
        kw["window_left"] = shape.window_left
    if shape.softcap:
        kw["logits_soft_cap"] = float(shape.softcap)
    if shape.deterministic:
        kw["deterministic"] = True
    if shape.kv_dtype:
        kw["kv_dtype"] = shape.kv_dtype
        kw["kv_scale"] = shape.kv_scale or "tensor"
    return kw


def _plan(fd, torch, kw, hint):
    try:
        return fd.DecodePlan(kv_len_hint=list(hint), **kw)
    except TypeError as exc:
        if "kv_len_hint" not in str(exc):
            raise
        return fd.DecodePlan(kv_len_hint=torch.tensor(hint, dtype=torch.int32), **kw)


def make_plan(fd, torch, shape, num_splits, **extra):
    """A DecodePlan for shape (its own layout); TypeError from a keyword the library does not
    take becomes Unavailable."""
    ps = shape.page_size
    num_pages, pps = page_layout(shape, ps) if ps else (0, [0])
    kw = dict(batch=shape.batch, q_len=1, num_heads_q=shape.hq, num_heads_kv=shape.hkv,
              head_dim=shape.d, dtype=torch_dtype(torch, shape.dtype),
              kv_capacity=shape.capacity, page_size=ps,
              max_pages_per_seq=max(pps) if ps else 0, num_pages=num_pages if ps else 0,
              num_splits=num_splits, softmax_scale=None, device=SETTINGS.device)
    kw.update(variant_plan_kwargs(shape))
    kw.update(extra)
    try:
        return _plan(fd, torch, kw, shape.lens)
    except TypeError as exc:
        raise Unavailable(f"unavailable: flashdecode.DecodePlan does not take "
                          f"{sorted(set(kw) - BASE_PLAN_KW)} ({exc_text(exc, 120)})") from exc


BASE_PLAN_KW = {"batch", "q_len", "num_heads_q", "num_heads_kv", "head_dim", "dtype",
                "kv_capacity", "page_size", "max_pages_per_seq", "num_pages", "num_splits",
                "softmax_scale", "device", "kv_len_hint"}


def ours_call(plan, sets, kv_len, sinks=False):
    """call(i): plan.run over set i (sinks passed only when the row has them; an fp8 set's
    k_scale / v_scale, device float32 tensors, whenever it has them)."""
    def call(i):
        s = sets[i]
        kw = {}
        if sinks:
            kw["sinks"] = s.sinks
        if getattr(s, "k_scale", None) is not None:
            kw["k_scale"], kw["v_scale"] = s.k_scale, s.v_scale
        plan.run(s.q, s.k, s.v, kv_len, block_table=s.block_table, out=s.out, **kw)
        return s.out
    return call


def check_sinks_supported(plan, sets, kv_len):
    """One eager call with sinks=: TypeError (the keyword is unknown) -> Unavailable."""
    s = sets[0]
    try:
        plan.run(s.q, s.k, s.v, kv_len, block_table=s.block_table, out=s.out, sinks=s.sinks)
    except TypeError as exc:
        raise Unavailable(f"unavailable: DecodePlan.run does not take sinks= "
                          f"({exc_text(exc, 120)})") from exc


class Cascade:
    """flashdecode's shared-prefix cascade for a prefix row: (1) one non-causal call over
    the prefix pages with the B sequences' query rows packed as q_len = B rows of one
    sequence (q [1, B, Hq, D]), (2) one decode of each sequence's own pages (its suffix),
    both writing out and lse into one [2, ...] state buffer (fp32 states; the q dtype if the
    library takes no fp32 out), (3) merge_states."""

    def __init__(self, fd, torch, shape, sets):
        if not hasattr(fd, "merge_states"):
            raise Unavailable("unavailable: flashdecode.merge_states is missing")
        self.fd, self.torch, self.shape, self.sets = fd, torch, shape, sets
        dev = SETTINGS.device
        b, ps = shape.batch, shape.page_size
        self.p0 = p0 = prefix_pages(shape, ps)
        self.num_pages, self.pps = page_layout(shape, ps)
        self.suffix = suffix = shape.lens[0] - shape.prefix_len
        if any(n - shape.prefix_len != suffix for n in shape.lens):
            raise Unavailable("cascade rows need one suffix length")
        self.dt = torch_dtype(torch, shape.dtype)
        self.kv_prefix = torch.tensor([shape.prefix_len], dtype=torch.int32, device=dev)
        self.kv_suffix = torch.full((b,), suffix, dtype=torch.int32, device=dev)
        self.tables = [(s.block_table[:1, :p0].contiguous(), s.block_table[:, p0:].contiguous())
                       for s in sets]
        self.lse_strided = True  # the prefix lse written straight into the state buffer
        self.merge_out_kw = True
        self.state_dtype = None
        try:
            self._setup(torch.float32)
        except Unavailable:
            pass  # settle() tries fp32 again, then the q dtype, and says why neither runs

    def _setup(self, state_dtype):
        """Plans and state buffers for states of state_dtype."""
        torch, shape, dev = self.torch, self.shape, SETTINGS.device
        b, hq, d = shape.batch, shape.hq, shape.d
        common = dict(num_heads_q=hq, num_heads_kv=shape.hkv, head_dim=d, dtype=self.dt,
                      page_size=shape.page_size, num_pages=self.num_pages, softmax_scale=None,
                      device=dev, num_splits=0)
        if state_dtype != self.dt:
            common["out_dtype"] = state_dtype
        try:
            self.prefix_plan = _plan(self.fd, torch, dict(common, batch=1, q_len=b,
                                                          kv_capacity=shape.prefix_len,
                                                          max_pages_per_seq=self.p0,
                                                          non_causal=True), [shape.prefix_len])
            self.suffix_plan = _plan(self.fd, torch, dict(common, batch=b, q_len=1,
                                                          kv_capacity=self.suffix,
                                                          max_pages_per_seq=max(self.pps) - self.p0),
                                     [self.suffix] * b)
        except TypeError as exc:
            raise Unavailable(f"unavailable: DecodePlan lacks "
                              f"{'non_causal/out_dtype' if 'out_dtype' in common else 'non_causal'}"
                              f" ({exc_text(exc, 120)})") from exc
        self.state_dtype = state_dtype
        self.num_splits = (getattr(self.prefix_plan, "num_splits", None),
                           getattr(self.suffix_plan, "num_splits", None))
        f32, n = torch.float32, len(self.sets)
        # states: out [2, B, 1, Hq, D], lse [2, B, Hq, 1] fp32 (merge_states' layout)
        self.st_out = [torch.empty(2, b, 1, hq, d, dtype=state_dtype, device=dev) for _ in range(n)]
        self.st_lse = [torch.empty(2, b, hq, 1, dtype=f32, device=dev) for _ in range(n)]
        self.merged = [torch.empty(b, 1, hq, d, dtype=self.dt, device=dev) for _ in range(n)]
        self.lse_tmp = [torch.empty(1, hq, b, dtype=f32, device=dev) for _ in range(n)]

    def _prefix_lse(self, i):
        b, hq = self.shape.batch, self.shape.hq
        if self.lse_strided:  # [1, Hq, B] view with strides (., 1, Hq) of lse[0] = [B, Hq, 1]
            return self.st_lse[i][0].view(b, hq).t().unsqueeze(0)
        return self.lse_tmp[i]

    def _merge(self, i):
        if self.merge_out_kw:
            return self.fd.merge_states(self.st_out[i], self.st_lse[i], out=self.merged[i])
        return self.fd.merge_states(self.st_out[i], self.st_lse[i])

    def run(self, i):
        s, (tp, ts) = self.sets[i], self.tables[i]
        b, hq, d = self.shape.batch, self.shape.hq, self.shape.d
        self.prefix_plan.run(s.q.view(1, b, hq, d), s.k, s.v, self.kv_prefix, block_table=tp,
                             out=self.st_out[i][0].view(1, b, hq, d), lse=self._prefix_lse(i))
        if not self.lse_strided:
            self.st_lse[i][0].copy_(self.lse_tmp[i][0].t().unsqueeze(-1))
        self.suffix_plan.run(s.q, s.k, s.v, self.kv_suffix, block_table=ts, out=self.st_out[i][1],
                             lse=self.st_lse[i][1])
        res = self._merge(i)
        out = res[0] if isinstance(res, (tuple, list)) else res
        return out

    def settle(self):
        """Eager calls to pick the forms this library takes: fp32 states (else the q dtype's),
        the prefix lse written in place through a strided view (else a contiguous buffer and a
        copy), merge_states with out= (else allocating)."""
        last = None
        for state_dtype in (self.torch.float32, self.dt):
            if state_dtype != self.state_dtype:
                try:
                    self._setup(state_dtype)
                except Unavailable as exc:
                    last = exc
                    continue
            for strided in (True, False):
                for merge_out in (True, False):
                    self.lse_strided, self.merge_out_kw = strided, merge_out
                    try:
                        self.run(0)
                        self.torch.cuda.synchronize()
                        return
                    except (TypeError, ValueError) as exc:
                        last = exc
        raise Unavailable(f"cascade failed: {exc_text(last, 160)}")

    def describe(self):
        return (f"prefix splits {self.num_splits[0]}, suffix splits {self.num_splits[1]}; "
                f"states {str(self.state_dtype).replace('torch.', '')}; "
                f"prefix lse {'written in place (strided)' if self.lse_strided else 'copied'}; "
                f"merge_states {'out=' if self.merge_out_kw else 'allocating'}")


# ---------------------------------------------------------------------------
# PyTorch SDPA and FlexAttention (contiguous [B, Hkv, N, D] peers)
# ---------------------------------------------------------------------------

DET_NA = ("n/a: a flashdecode mode, costed against its own automatic plan (the peers are "
          "on the grid rows)")


FP8_BASE_NA = ("n/a: the fp8 rows' bf16 base row, ours only (FlashInfer runs the fp8 rows; all "
               "peers run the grid rows)")


def ours_only_reason(shape):
    """Why no peer runs an ours-only row ('' for others)."""
    if not shape.peerless:
        return ""
    return FP8_BASE_NA if shape.family == "fp8" else DET_NA


FP8_NA = ("takes no fp8 KV cache (it would read a bf16 copy: not the fp8 call; the bf16 call "
          "is the base row)")


MLA_NA = ("has no MLA form here (one latent kv head read as K [576] and V [512]; the peers "
          "are FlashInfer's MLA paths)")


def sdpa_reason(shape):
    """Why SDPA is no peer for this row ('' when it is)."""
    if shape.rope_dim:
        return "n/a: SDPA " + MLA_NA
    if shape.kv_dtype:
        return "n/a: SDPA " + FP8_NA
    if shape.peerless:
        return ours_only_reason(shape)
    if shape.prefix_len:
        return ("n/a: SDPA takes no paged cache; a shared prefix copied out per sequence is "
                "not what it is compared for")
    if shape.window_left >= 0:
        return ("n/a: SDPA has a window only as an explicit mask over every key (it reads them "
                "all): not a fair peer")
    if shape.softcap:
        return "n/a: SDPA has no logit soft-cap"
    if shape.sinks:
        return "n/a: SDPA has no sinks"
    return ""


def flex_reason(shape):
    if shape.rope_dim:
        return "n/a: FlexAttention " + MLA_NA
    if shape.kv_dtype:
        return "n/a: FlexAttention " + FP8_NA
    if shape.peerless:
        return ours_only_reason(shape)
    if shape.prefix_len:
        return "n/a: FlexAttention takes no paged / shared-prefix cache here"
    if shape.sinks:
        return "n/a: FlexAttention has no sink term in its softmax denominator"
    return ""


def sdpa_calls(torch, shape, psets, mask):
    """[(impl, call)] for the SDPA backends over the contiguous peer sets."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for impl, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                          ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
        def call(i, backend=backend, mask=mask):
            q, k, v = psets[i]
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        out.append((impl, call))
    return out


def sdpa_additive_call(torch, psets, mask):
    """cuDNN with an additive mask in q's dtype (some versions take no bool mask)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    bias = torch.zeros(mask.shape, dtype=psets[0][0].dtype, device=SETTINGS.device)
    bias.masked_fill_(~mask, float("-inf"))

    def call(i):
        q, k, v = psets[i]
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    return call


class Flex:
    """FlexAttention under torch.compile, compiled once per process."""

    def __init__(self, torch):
        self.torch = torch
        self.fn = None
        self.error = ""
        self.failures = 0

    def get(self):
        if self.fn is None and not self.error:
            try:
                import torch._dynamo as dynamo
                from torch.nn.attention.flex_attention import flex_attention

                cfg = dynamo.config
                for name in ("recompile_limit", "cache_size_limit"):
                    if hasattr(cfg, name):
                        setattr(cfg, name, 1024)
                for name in ("accumulated_recompile_limit", "accumulated_cache_size_limit"):
                    if hasattr(cfg, name):
                        setattr(cfg, name, 8192)
                self.fn = self.torch.compile(flex_attention, dynamic=False)
            except Exception as exc:
                self.error = f"flex_attention unavailable: {short(exc, 120)}"
        return self.fn

    def call(self, shape, psets, lens_t):
        """call(i) for shape: a kv_len mask for ragged rows, the window as a mask_mod (its
        block mask skips the blocks outside the window, so this one is a fair peer), the
        soft-cap as a score_mod."""
        from torch.nn.attention.flex_attention import create_block_mask

        flex = self.get()
        if flex is None:
            raise Unavailable(self.error)
        block_mask = None
        w = shape.window_left
        if shape.ragged or w >= 0:
            def mask_mod(b, h, q_idx, kv_idx):
                inside = kv_idx < lens_t[b]
                if w >= 0:
                    inside = inside & (kv_idx >= lens_t[b] - 1 - w)
                return inside
            block_mask = create_block_mask(mask_mod, shape.batch, None, 1, shape.capacity,
                                           device=SETTINGS.device)
        score_mod = None
        if shape.softcap:
            cap = float(shape.softcap)
            tanh = self.torch.tanh

            def capped(score, b, h, q_idx, kv_idx):
                return cap * tanh(score / cap)
            score_mod = capped

        def call(i):
            q, k, v = psets[i]
            return flex(q, k, v, block_mask=block_mask, score_mod=score_mod, enable_gqa=True)
        return call
