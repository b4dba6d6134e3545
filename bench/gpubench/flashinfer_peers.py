"""FlashInfer's decode paths as peers, on 16-key pages scattered over a pool (as our paged
rows), planned outside the timed region (as ours), timed like every row:

  fi-cudacore    BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=False)
  fi-tensorcore  BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True) (its fa2 prefill kernel)
  fi-xqa         flashinfer.decode.xqa_batch_decode_with_kv_cache (TensorRT-LLM's XQA; on sm_90 its
                 GMMA kernel mha_sm90.cu; block_tables + seq_lens like ours, bmm1_scale = softmax
                 scale, bmm2_scale = 1; its own zeroed workspace: 8 MiB of semaphores + scratch)
  fi-cudnn       flashinfer.decode.cudnn_batch_decode_with_kv_cache (cuDNN's paged SDPA through the
                 cudnn frontend; [pages, Hkv, 16, D] caches, bf16 only)
  fi-cascade     MultiLevelCascadeAttentionWrapper(2 levels) for the shared-prefix rows, on its fa2
                 prefill kernel (its sm_90a default, fa3, is too slow to JIT-compile in a device call)

Which path takes which variant (read in the 0.6.18.post1 sources): window_left all but cuDNN;
logits_soft_cap the two wrappers (XQA and cuDNN have none); sinks XQA only (the wrappers'
fa2 / CUDA-core kernels never receive the sinks argument on sm_90: trtllm-gen and cute-dsl,
which do, are Blackwell backends).

The JIT modules these need are compiled by fi_prebuild.py in a background process started at
the beginning of the run (fi_spec_list says which), so the compile overlaps our own rows."""
import json
import math
import os
import shutil
import subprocess
import sys
import time

from .common import SETTINGS, exc_text, short
from .data import fp8_torch_dtype, make_set, page_layout, prefix_pages, reference, torch_dtype
from .peers import Unavailable
from .shapes import FI_PAGE_SIZE

FI_VERSION_PINNED = "0.6.18.post1"
JIT_DIR_DEFAULT = "/tmp/fd-flashinfer-jit"
FLOAT_WS_BYTES = 256 << 20
XQA_WS_BYTES = (8 << 20) + (256 << 20)  # 8 MiB of semaphores (zeroed) + scratch
CUDNN_WS_BYTES = 128 << 20


def nvcc_root():
    nvcc = shutil.which("nvcc")
    if nvcc:
        return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    return "/usr/local/cuda" if os.path.isdir("/usr/local/cuda") else None


def setup_env():
    """FlashInfer's JIT settings (defaults only: device_run.sh sets them too). The prebuild
    process and this one must see the same values, or ninja rebuilds every module."""
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", JIT_DIR_DEFAULT)
    root = nvcc_root()
    if root and "CUDA_HOME" not in os.environ:
        os.environ["CUDA_HOME"] = root
    return {k: os.environ.get(k, "") for k in ("FLASHINFER_CUDA_ARCH_LIST",
                                                "FLASHINFER_WORKSPACE_BASE", "CUDA_HOME")}


def import_flashinfer():
    """(module, '') or (None, why)."""
    setup_env()
    try:
        import flashinfer  # noqa: F401
        import flashinfer.decode  # noqa: F401
        return flashinfer, ""
    except Exception as exc:
        return None, f"unavailable: import flashinfer failed: {exc_text(exc, 200)}"


# ---------------------------------------------------------------------------
# Which path runs which row, and the JIT modules that needs
# ---------------------------------------------------------------------------

def measured_by_fi(shape):
    """FlashInfer is timed on its own paged copy of every row except the paged rows (their
    contiguous base row's FlashInfer numbers are restated: FlashInfer always reads 16-key
    scattered pages)."""
    return shape.kind not in ("paged", "paged-inorder")


def fi_reason(shape, impl):
    """'' when impl runs shape, else why not (an n/a record)."""
    if shape.rope_dim:
        from .mla import fi_mla_reason
        return fi_mla_reason(shape, impl)
    if impl in ("fi-mla-fa2", "fi-mla-fa3"):
        return "n/a: MLA rows only"
    if shape.peerless:
        from .peers import ours_only_reason
        return ours_only_reason(shape)
    if shape.kv_dtype:
        return fi_fp8_reason(shape, impl)
    if shape.dtype == "fp32":
        return "n/a: FlashInfer decode takes fp16/bf16 (and fp8) only"
    if shape.cascade:
        return "" if impl == "fi-cascade" else "n/a: cascade row (fi-cascade is the peer)"
    if impl == "fi-cascade":
        return "n/a: no shared prefix"
    if shape.d % 16:
        return f"n/a: head_dim {shape.d} not a multiple of 16"
    if impl == "fi-tensorcore" and (shape.dtype != "bf16" or shape.hq // shape.hkv < 4):
        return ("n/a: tensor-core path timed on bf16 rows with >= 4 query heads per kv head "
                "(FlashInfer's advice for it; each other fa2 module costs ~8 CPU-minutes of JIT "
                "compile on the device)")
    if impl in ("fi-cudacore", "fi-tensorcore"):
        if shape.sinks:
            return ("n/a: on sm_90 the wrapper's fa2 / CUDA-core kernels never receive sinks "
                    "(FlashInfer 0.6.18 run() forwards them to trtllm-gen / cute-dsl only)")
        return ""
    if impl == "fi-xqa":
        if shape.softcap:
            return "n/a: XQA has no logit soft-cap"
        return ""
    if impl == "fi-cudnn":
        if shape.dtype != "bf16":
            return "n/a: FlashInfer's cuDNN decode graph is bf16 only"
        if shape.window_left >= 0 or shape.softcap or shape.sinks:
            return "n/a: cudnn_batch_decode_with_kv_cache takes no window / soft-cap / sinks"
        return ""
    return "n/a: unknown FlashInfer path"


def fi_fp8_reason(shape, impl):
    """fp8 rows (read in 0.6.18.post1): the decode wrapper takes kv_data_type float8 with one
    k_scale / v_scale float each in run() (k_scale folded into sm_scale; v_scale an
    `out *= v_scale` after the kernel); its tensor-core path runs fa2 (fa3 wants an fp8 q
    with an fp8 cache); XQA takes an e4m3 cache with one kv scale for K and V, so the K/V
    ratio goes into bmm1_scale (mha_sm90.cu's fp8 kernel on sm_90); cuDNN's decode graph is
    bf16 only. No path takes per-token (or per-head) scales."""
    if (shape.kv_scale or "tensor") != "tensor":
        return (f"n/a: FlashInfer has no per-{shape.kv_scale} fp8 scales (one k_scale / v_scale "
                f"float per call: decode wrappers' run(), XQA's bmm1/bmm2 scales)")
    if shape.kv_dtype != "e4m3" and impl == "fi-xqa":
        return "n/a: XQA's fp8 cache is e4m3 only"
    if impl == "fi-cudnn":
        return "n/a: FlashInfer's cuDNN decode graph is bf16 only (no fp8 cache)"
    if impl == "fi-cascade":
        return "n/a: no shared prefix"
    if impl == "fi-tensorcore" and shape.hq // shape.hkv < 4:
        return "n/a: tensor-core path timed with >= 4 query heads per kv head only"
    if impl in ("fi-cudacore", "fi-tensorcore", "fi-xqa"):
        if shape.window_left >= 0 or shape.softcap or shape.sinks or shape.prefix_len:
            return "n/a: fp8 rows are plain calls here"
        return ""
    return "n/a: unknown FlashInfer path"


def fi_impls_for(shape):
    """The FlashInfer records a row gets (measured or n/a)."""
    if shape.rope_dim:
        from .mla import MLA_PEERS
        return list(MLA_PEERS)
    if shape.cascade:
        return ["fi-cascade"]
    return ["fi-cudacore", "fi-tensorcore", "fi-xqa", "fi-cudnn"]


def fi_spec_list(shapes):
    """JSON-able descriptions of the JIT modules the FlashInfer peers of these rows load, as
    the 0.6.18.post1 wrappers derive them (decode.py plan(), xqa.py):
      ["decode", dtype, head_dim, use_sliding_window, use_logits_soft_cap]
      ["prefill", backend, dtype, head_dim, use_sliding_window, use_logits_soft_cap]
      ["xqa", dtype, page_size, head_dim, head_group_ratio, use_sliding_window]
      ["cascade"]  (merge_state_in_place, the cascade wrapper's merge)
      ["mla", backend, dtype, head_dim_ckv, head_dim_kpe]  (MLA rows: mla.fi_mla_specs)
    An fp8 cache appends its kv dtype ("e4m3" / "e5m2") to the decode, prefill and xqa specs
    (q and out stay `dtype`: the wrappers' get_batch_*_module(q, kv, o, ...) and
    get_xqa_module(q, kv, ..., o) arguments)."""
    from .mla import fi_mla_specs

    specs = fi_mla_specs(shapes)  # ["mla", backend, dtype, 512, 64] (+ "e4m3"): MLA rows
    for s in shapes:
        if not measured_by_fi(s) or s.dtype == "fp32" or s.rope_dim:
            continue
        swa, cap = s.window_left >= 0, bool(s.softcap)
        kv = [s.kv_dtype] if s.kv_dtype else []
        for impl in fi_impls_for(s):
            if fi_reason(s, impl):
                continue
            if impl == "fi-cudacore":
                specs.append(["decode", s.dtype, s.d, swa, cap] + kv)
            elif impl == "fi-tensorcore":
                specs.append(["prefill", "fa2", s.dtype, s.d, swa, cap] + kv)
            elif impl == "fi-xqa":
                specs.append(["xqa", s.dtype, FI_PAGE_SIZE, s.d, s.hq // s.hkv, swa] + kv)
            elif impl == "fi-cascade":
                # run with the fa2 prefill kernel (see FlashInferPeers._cascade)
                specs.append(["prefill", "fa2", s.dtype, s.d, False, False])
                specs.append(["cascade"])
    out = []
    for sp in specs:
        if sp not in out:
            out.append(sp)
    # the heaviest first (a prefill module is 10 translation units, ~50 s each), so the pool's
    # last wave holds small ones
    out.sort(key=lambda sp: {"prefill": 0, "xqa": 1}.get(sp[0], 2))
    return out


class Prebuild:
    """fi_prebuild.py in a background process (no GPU: CUDA_VISIBLE_DEVICES=''), compiling
    the listed modules into FlashInfer's JIT cache with a few compilers at once."""

    def __init__(self, specs, log_dir, jobs=None):
        self.specs = specs
        self.proc = None
        self.started = None
        self.log_path = os.path.join(log_dir, "fi-prebuild.log")
        self.jobs = jobs or max(2, (os.cpu_count() or 4) - 4)
        self.error = ""

    def start(self):
        if not self.specs:
            return
        setup_env()
        spec_path = os.path.join(os.path.dirname(self.log_path), "fi-prebuild-specs.json")
        try:
            os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
            with open(spec_path, "w") as fh:
                json.dump(self.specs, fh)
            env = dict(os.environ, CUDA_VISIBLE_DEVICES="", MAX_JOBS="4",
                       PYTHONUNBUFFERED="1")
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fi_prebuild.py")
            self.log = open(self.log_path, "w")
            self.proc = subprocess.Popen([sys.executable, script, spec_path, str(self.jobs)],
                                         stdout=self.log, stderr=subprocess.STDOUT, env=env)
            self.started = time.monotonic()
        except Exception as exc:
            self.error = f"prebuild not started: {exc_text(exc)}"

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout):
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        """Ends the process this run started (by its pid), if it still runs."""
        if self.running():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        try:
            self.log.close()
        except Exception:
            pass

    def summary(self):
        if self.error:
            return self.error
        if self.proc is None:
            return "no FlashInfer module to prebuild"
        try:
            with open(self.log_path) as fh:
                lines = [ln.strip() for ln in fh if ln.strip()]
        except OSError:
            lines = []
        done = [ln for ln in lines if ln.startswith("DONE")]
        return (f"FlashInfer JIT prebuild: {len(self.specs)} modules, exit "
                f"{self.proc.poll()}; " + (done[-1] if done else (lines[-1] if lines else "")))


# ---------------------------------------------------------------------------
# The adapters
# ---------------------------------------------------------------------------

def fi_page_indices(torch, shape, table_cpu, page_size=FI_PAGE_SIZE):
    """FlashInfer's paged-KV description of a block table: (indptr [B+1], indices
    [pages in use], last_page_len [B]) int32 CPU tensors; a shared prefix's pages repeat."""
    _, pps = page_layout(shape, page_size)
    indices = torch.cat([table_cpu[b, :pps[b]] for b in range(shape.batch)]).to(torch.int32)
    indptr = torch.zeros(shape.batch + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(pps, dtype=torch.int64), 0).to(torch.int32)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(shape.lens, pps)],
                        dtype=torch.int32)
    return indptr, indices, last


class FiPrep:
    """One row's FlashInfer inputs: R paged sets sharing one page table, and the indices the
    wrappers plan from."""

    def __init__(self, torch, shape, replicas):
        dev = SETTINGS.device
        ps = FI_PAGE_SIZE
        num_pages, pps = page_layout(shape, ps)
        perm = torch.randperm(num_pages)
        # fp8 rows: set i holds the same keys as our set i (seeded by row and index), paged
        self.sets = [make_set(torch, shape, dev, page_size=ps, perm=perm, index=i,
                              want_ref=(i == 0)) for i in range(replicas)]
        self.ref = (self.sets[0].ref if shape.kv_dtype
                    else reference(torch, shape, self.sets[0], page_size=ps))
        self.table = self.sets[0].block_table  # [B, max pages] int32, on the device
        self.pps = pps
        indptr, indices, last = fi_page_indices(torch, shape, self.table.cpu(), ps)
        self.indptr = indptr.to(dev)
        self.indices = indices.to(dev)
        self.last_page_len = last.to(dev)
        self.seq_lens = torch.tensor(shape.lens, dtype=torch.int32, device=dev)
        torch.cuda.synchronize()


class FlashInferPeers:
    def __init__(self, torch, fi):
        self.torch, self.fi = torch, fi
        dev = SETTINGS.device
        self.version = getattr(fi, "__version__", "?")
        # float workspace of the wrappers (zeroed for its first use, as FlashInfer asks)
        self.ws_float = torch.zeros(FLOAT_WS_BYTES, dtype=torch.uint8, device=dev)
        self.ws_xqa = None
        self.ws_cudnn = None

    def _xqa_ws(self):
        if self.ws_xqa is None:  # semaphores must be zero before the first call
            self.ws_xqa = self.torch.zeros(XQA_WS_BYTES, dtype=self.torch.uint8,
                                           device=SETTINGS.device)
        return self.ws_xqa

    def _cudnn_ws(self):
        if self.ws_cudnn is None:
            self.ws_cudnn = self.torch.empty(CUDNN_WS_BYTES, dtype=self.torch.int8,
                                             device=SETTINGS.device)
        return self.ws_cudnn

    def build(self, impl, shape, prep):
        """call(i) -> [B, Hq, D] output of set i, for impl on shape (plan() done here)."""
        why = fi_reason(shape, impl)
        if why:
            raise Unavailable(why)
        if impl == "fi-cudacore":
            return self._wrapper(shape, prep, use_tc=False)
        if impl == "fi-tensorcore":
            return self._wrapper(shape, prep, use_tc=True)
        if impl == "fi-xqa":
            return self._xqa(shape, prep)
        if impl == "fi-cudnn":
            return self._cudnn(shape, prep)
        if impl == "fi-cascade":
            return self._cascade(shape, prep)
        raise Unavailable(f"n/a: unknown impl {impl}")

    def _wrapper(self, shape, prep, use_tc):
        torch, fi = self.torch, self.fi
        dt = torch_dtype(torch, shape.dtype)
        kv_dt = fp8_torch_dtype(torch, shape.kv_dtype) if shape.kv_dtype else dt
        w = fi.BatchDecodeWithPagedKVCacheWrapper(self.ws_float, "NHD", use_tensor_cores=use_tc)
        kw = dict(pos_encoding_mode="NONE", q_data_type=dt, kv_data_type=kv_dt,
                  sm_scale=1.0 / math.sqrt(shape.d))
        if shape.window_left >= 0:
            kw["window_left"] = shape.window_left
        if shape.softcap:
            kw["logits_soft_cap"] = float(shape.softcap)
        w.plan(prep.indptr, prep.indices, prep.last_page_len, shape.hq, shape.hkv, shape.d,
               FI_PAGE_SIZE, **kw)
        sets = prep.sets

        def call(i):
            s = sets[i]
            o = s.out[:, 0]
            if shape.kv_dtype:  # per-tensor scales as floats (its only form)
                w.run(s.q[:, 0], (s.k, s.v), out=o, k_scale=s.k_scale_f, v_scale=s.v_scale_f)
            else:
                w.run(s.q[:, 0], (s.k, s.v), out=o)
            return o
        call.keep = w  # the wrapper lives as long as the call
        return call

    def _xqa(self, shape, prep):
        from flashinfer.decode import xqa_batch_decode_with_kv_cache

        ws = self._xqa_ws()
        scale = 1.0 / math.sqrt(shape.d)
        sets, table, lens = prep.sets, prep.table, prep.seq_lens
        cap = table.shape[1] * FI_PAGE_SIZE

        def call(i):
            s = sets[i]
            o = s.out[:, 0]
            # fp8: XQA has one kv scale (= bmm2_scale * o_scale) for K and V; bmm1_scale =
            # softmax scale * k_scale and bmm2_scale = v_scale give scores q.k * k_scale and
            # values v * v_scale (decode.py: q_scale = bmm1_scale / kv_scale * sqrt(d))
            b1, b2 = (scale * s.k_scale_f, s.v_scale_f) if shape.kv_dtype else (scale, 1.0)
            xqa_batch_decode_with_kv_cache(s.q[:, 0], (s.k, s.v), ws, table, lens, cap,
                                           bmm1_scale=b1, bmm2_scale=b2,
                                           window_left=shape.window_left, out=o,
                                           sinks=s.sinks if shape.sinks else None,
                                           kv_layout="NHD")
            return o
        return call

    def _cudnn(self, shape, prep):
        from flashinfer.decode import cudnn_batch_decode_with_kv_cache

        torch = self.torch
        ws = self._cudnn_ws()
        scale = 1.0 / math.sqrt(shape.d)
        # cuDNN's layout: [pages, Hkv, page_size, D], contiguous; the last FlashInfer path of a
        # row, so its copies replace the NHD pools (memory)
        for s in prep.sets:
            if getattr(s, "k_hnd", None) is None:
                s.k_hnd = s.k.transpose(1, 2).contiguous()
                s.v_hnd = s.v.transpose(1, 2).contiguous()
                s.k = s.v = None
        lens4 = prep.seq_lens.view(shape.batch, 1, 1, 1)
        table = prep.table
        sets = prep.sets

        def call(i):
            s = sets[i]
            o = s.out[:, 0]
            cudnn_batch_decode_with_kv_cache(s.q[:, 0], s.k_hnd, s.v_hnd, scale, ws,
                                             max_sequence_kv=shape.capacity,
                                             actual_seq_lens_kv=lens4, block_tables=table, out=o)
            return o
        torch.cuda.synchronize()
        return call

    def _cascade(self, shape, prep):
        torch, fi = self.torch, self.fi
        dev = SETTINGS.device
        dt = torch_dtype(torch, shape.dtype)
        ps = FI_PAGE_SIZE
        b = shape.batch
        p0 = prefix_pages(shape, ps)
        own = prep.pps[0] - p0
        if any(p - p0 != own for p in prep.pps):
            raise Unavailable("n/a: cascade rows need one suffix length")
        table = prep.table
        i32 = torch.int32
        qo = [torch.tensor([0, b], dtype=i32, device=dev), torch.arange(b + 1, dtype=i32, device=dev)]
        kv_indptr = [torch.tensor([0, p0], dtype=i32, device=dev),
                     torch.arange(b + 1, dtype=i32, device=dev) * own]
        kv_indices = [table[0, :p0].contiguous(), table[:, p0:p0 + own].reshape(-1).contiguous()]
        suffix = shape.lens[0] - shape.prefix_len
        last = [torch.tensor([shape.prefix_len - (p0 - 1) * ps], dtype=i32, device=dev),
                torch.full((b,), suffix - (own - 1) * ps, dtype=i32, device=dev)]
        w = fi.MultiLevelCascadeAttentionWrapper(2, self.ws_float, "NHD")
        # Its prefill wrappers would pick fa3 on sm_90a ("auto"): fa3's JIT module took over 10
        # CPU-minutes per translation unit here (8 of them), more than a device call has, so the
        # cascade runs FlashInfer's fa2 prefill kernel (the one its tensor-core decode uses).
        for inner in getattr(w, "_batch_prefill_wrappers", []):
            if getattr(inner, "_backend", None) == "auto":
                inner._backend = "fa2"
        w.plan(qo, kv_indptr, kv_indices, last, shape.hq, shape.hkv, shape.d, ps, causal=False,
               sm_scale=1.0 / math.sqrt(shape.d), q_data_type=dt, kv_data_type=dt)
        sets = prep.sets

        def call(i):
            s = sets[i]
            return w.run(s.q[:, 0], (s.k, s.v))
        call.keep = (w, qo, kv_indptr, kv_indices, last)
        torch.cuda.synchronize()
        return call


def first_call_seconds(torch, call):
    """Seconds one eager call takes the first time (JIT compile / graph build included)."""
    t = time.monotonic()
    call(0)
    torch.cuda.synchronize()
    return time.monotonic() - t


def describe_first(impl, secs):
    return f"{impl} first call {secs:.1f}s" + (" (compiled in this process)" if secs > 5 else "")


__all__ = ["FlashInferPeers", "FiPrep", "Prebuild", "fi_spec_list", "fi_reason", "fi_impls_for",
           "measured_by_fi", "import_flashinfer", "setup_env", "short"]


def api_check(fi, torch):
    """Binds every FlashInfer call the adapters make to the installed signatures (no GPU):
    [] or the problems. Run by --self-test where flashinfer imports."""
    import inspect

    problems = []
    t = torch.zeros(4, dtype=torch.int32)
    dt = torch.bfloat16

    def bind(label, fn, *a, **kw):
        try:
            inspect.signature(fn).bind(*a, **kw)
        except Exception as exc:
            problems.append(f"{label}: {exc_text(exc, 120)}")

    W = fi.BatchDecodeWithPagedKVCacheWrapper
    bind("decode wrapper __init__", W.__init__, None, t, "NHD", use_tensor_cores=True)
    bind("decode wrapper plan", W.plan, None, t, t, t, 32, 8, 128, FI_PAGE_SIZE,
         pos_encoding_mode="NONE", q_data_type=dt, kv_data_type=dt, sm_scale=0.1,
         window_left=5, logits_soft_cap=50.0)
    bind("decode wrapper run", W.run, None, t, (t, t), out=t)
    bind("decode wrapper plan (fp8 cache)", W.plan, None, t, t, t, 32, 8, 128, FI_PAGE_SIZE,
         pos_encoding_mode="NONE", q_data_type=dt, kv_data_type=torch.float8_e4m3fn,
         sm_scale=0.1)
    bind("decode wrapper run (fp8 scales)", W.run, None, t, (t, t), out=t, k_scale=0.5,
         v_scale=0.25)
    from flashinfer.decode import cudnn_batch_decode_with_kv_cache, xqa_batch_decode_with_kv_cache
    bind("xqa", xqa_batch_decode_with_kv_cache, t, (t, t), t, t, t, 16, bmm1_scale=0.1,
         bmm2_scale=1.0, window_left=-1, out=t, sinks=None, kv_layout="NHD")
    bind("cudnn decode", cudnn_batch_decode_with_kv_cache, t, t, t, 0.1, t, max_sequence_kv=16,
         actual_seq_lens_kv=t, block_tables=t, out=t)
    C = fi.MultiLevelCascadeAttentionWrapper
    bind("cascade __init__", C.__init__, None, 2, t, "NHD")
    bind("cascade plan", C.plan, None, [t, t], [t, t], [t, t], [t, t], 32, 8, 128, FI_PAGE_SIZE,
         causal=False, sm_scale=0.1, q_data_type=dt, kv_data_type=dt)
    bind("cascade run", C.run, None, t, (t, t))
    return problems
