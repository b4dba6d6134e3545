"""The rows of a run: the benchmark grid (GRID), dtype and paged rows, the ragged
trace batches, and the attention-variant rows (sliding window, soft-cap, sinks,
head_dim 96, a shared prefix decoded as a cascade)."""
import csv
import os
import statistics
from dataclasses import dataclass

from benchutil import REPO

from .common import ESIZE

RAGGED_BATCH = 64
RAGGED_OFFSET = 6000  # first trace row of both ragged batches (consecutive rows)
TRACE_FILES = {"mooncake": "mooncake_conversation_trace.csv",
               "azureconv": "AzureLLMInferenceTrace_conv.csv"}
FI_PAGE_SIZE = 16  # FlashInfer is always given a paged cache of 16-key pages, scattered


@dataclass
class Shape:
    name: str
    batch: int
    hq: int  # num_heads_q
    hkv: int  # num_heads_kv
    d: int  # head_dim
    dtype: str  # bf16 | fp16 | fp32
    lens: list  # kv_len per sequence
    page_size: int = 0  # 0 = contiguous cache
    # grid (GRID, bf16) | fp16 | fp32 | paged | paged-inorder | variant
    kind: str = "grid"
    base: str = ""  # the row this one is compared with (bf16 contiguous, or a variant's plain row)
    sweep: bool = False  # forced split-count sweep on this row
    note: str = ""
    # ---- attention variants (variant rows) ----
    window_left: int = -1  # a row at position p sees keys p - window_left .. p; -1 = none
    softcap: float = 0.0  # logits soft-cap; 0 = off
    sinks: bool = False  # one sink logit per query head
    prefix_len: int = 0  # > 0: every sequence's first prefix_len keys are the same pages
    cascade: bool = False  # timed as prefix call + suffix call + merge (one graph)
    family: str = ""  # variant family ("mistral", "gemma2", ...)
    q_scale: float = 1.0  # q is drawn as randn * q_scale (soft-cap rows: scores large enough to be capped)
    deterministic: bool = False  # flashdecode's deterministic (batch-invariant) plan; ours only
    ours_only: bool = False  # no peers on this row (they run on the grid row of the same shape)
    # ---- fp8 KV cache (fp8 rows): q / out stay `dtype`; K and V are stored as fp8 ----
    kv_dtype: str = ""  # "" = the cache has `dtype`; "e4m3" | "e5m2"
    kv_scale: str = ""  # fp8 scales' granularity: "tensor" | "head" | "token"
    # ---- MLA rows (kind "mla", gpubench/mla.py): one kv head, d = the latent width ----
    rope_dim: int = 0  # > 0: an MLA row; keys are [latent d | rope rope_dim], values the latent
    q_len: int = 1  # query rows per sequence (MLA rows; causal as decode)
    softmax_scale: float = 0.0  # 0 = 1 / sqrt(d)

    @property
    def esize(self):
        """Bytes of one cached K or V element (1 for an fp8 cache)."""
        return 1 if self.kv_dtype else ESIZE[self.dtype]

    @property
    def is_fp8(self):
        return bool(self.kv_dtype)

    def scale_bytes(self, keys):
        """Bytes of the K and V scales one call reads: float32 per (key, kv head) for per-token
        scales, per kv head for per-head ones, one float each for per-tensor ones."""
        if not self.kv_dtype:
            return 0
        per = {"token": keys * self.hkv, "head": self.hkv, "tensor": 1}[self.kv_scale or "tensor"]
        return 2 * 4 * per

    def needed_keys(self, b):
        """Keys sequence b's query row must read (the window's, when there is one)."""
        n = self.lens[b]
        if self.window_left >= 0:
            n = min(n, self.window_left + 1)
        return n

    @property
    def kv_bytes(self):
        """K + V bytes one call must read at least: 2 * keys * num_heads_kv * head_dim *
        sizeof, keys = sum of each sequence's visible keys (a shared prefix once); an fp8
        cache: 1 byte an element, plus its scales' bytes (scale_bytes). MLA rows: the
        latent + rope cache once (the values are the latent's bytes), the rope part 16-bit
        beside an fp8 latent, one float32 scale, plus q and out (mla.mla_bytes)."""
        if self.rope_dim:
            from .mla import mla_bytes
            return mla_bytes(self)
        if self.prefix_len:
            keys = self.prefix_len + sum(n - self.prefix_len for n in self.lens)
        else:
            keys = sum(self.needed_keys(b) for b in range(self.batch))
        return 2 * keys * self.hkv * self.d * self.esize + self.scale_bytes(keys)

    @property
    def capacity(self):
        return max(self.lens)

    @property
    def ragged(self):
        return len(set(self.lens)) > 1

    @property
    def pages_per_seq(self):
        return [(n + self.page_size - 1) // self.page_size for n in self.lens]

    @property
    def is_variant(self):
        return self.kind == "variant"

    @property
    def peerless(self):
        """Ours only: the deterministic mode's rows and the rows marked ours_only."""
        return self.deterministic or self.ours_only

    @property
    def plain(self):
        """No window, no soft-cap, no sinks, no shared prefix: every peer computes it."""
        return (self.window_left < 0 and not self.softcap and not self.sinks
                and not self.prefix_len and not self.peerless
                and not self.kv_dtype and not self.rope_dim)

    def features(self):
        f = []
        if self.window_left >= 0:
            f.append(f"window_left {self.window_left}")
        if self.softcap:
            f.append(f"soft-cap {self.softcap:g}")
        if self.sinks:
            f.append("sinks")
        if self.prefix_len:
            f.append(f"shared prefix {self.prefix_len}")
        if self.cascade:
            f.append("cascade")
        if self.deterministic:
            f.append("deterministic")
        if self.kv_dtype:
            f.append(f"fp8 {self.kv_dtype} cache, per-{self.kv_scale or 'tensor'} scales")
        if self.rope_dim:
            f.append(f"MLA latent {self.d} + rope {self.rope_dim}"
                     + (f", q_len {self.q_len}" if self.q_len > 1 else ""))
        return ", ".join(f) or "plain"


def uniform_name(b, hq, hkv, n, d, dt, ps=0):
    return f"b{b}-h{hq}/{hkv}-d{d}-{dt}-n{n}" + (f"-paged{ps}" if ps else "")


# The benchmark grid: (batch, num_heads_q, num_heads_kv, kv_len, head_dim).
GRID = [
    (1, 32, 8, 1024, 128), (1, 32, 8, 4096, 128), (1, 32, 8, 16384, 128),
    (1, 32, 8, 65536, 128), (1, 32, 8, 131072, 128),
    (1, 64, 8, 32768, 128),
    (8, 32, 8, 8192, 128), (32, 32, 8, 4096, 128), (128, 32, 8, 1024, 128),
    (64, 32, 8, 8192, 128),
    (1, 32, 32, 16384, 128),
    (16, 8, 1, 32768, 128),
    (1, 16, 8, 16384, 256),
    (1, 32, 32, 16384, 64),
]
DTYPE_ROWS = [(1, 32, 8, 1024, 128), (1, 32, 8, 16384, 128), (1, 32, 8, 131072, 128),
              (64, 32, 8, 8192, 128)]
PAGED_ROWS = [(1, 32, 8, 16384, 128), (32, 32, 8, 4096, 128), (64, 32, 8, 8192, 128)]
QUICK_GRID = [(1, 32, 8, 1024, 128), (1, 32, 8, 16384, 128), (64, 32, 8, 8192, 128)]


def load_trace(path):
    """(context, output) token counts of every request, in file order."""
    rows = []
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        next(reader)  # header
        for rec in reader:
            if len(rec) >= 3 and rec[1].strip():
                rows.append((int(rec[1]), int(rec[2])))
    return rows


def ragged_lens(rows, offset, count):
    """kv_len = context + output // 2 (mid-way through decoding) of rows [offset, offset + count)."""
    if offset + count > len(rows):
        raise ValueError(f"trace has {len(rows)} rows, need {offset + count}")
    return [c + g // 2 for c, g in rows[offset:offset + count]]


def find_trace_dir(arg):
    if arg:
        return arg if os.path.isdir(arg) else None
    cand = os.path.join(REPO, "bench", "data")  # the vendored traces (bench/data/README.md)
    return cand if os.path.isdir(cand) else None


def build_shapes(quick, trace_dir, notes):
    """The grid rows: the grid, ragged trace batches, paged, fp16 and fp32 rows."""
    shapes = []

    def add_uniform(b, hq, hkv, n, d, dt="bf16", ps=0, kind="grid", sweep=False):
        base = "" if (dt == "bf16" and ps == 0) else uniform_name(b, hq, hkv, n, d, "bf16")
        shapes.append(Shape(uniform_name(b, hq, hkv, n, d, dt, ps), b, hq, hkv, d, dt, [n] * b,
                            ps, kind, base, sweep))

    grid = QUICK_GRID if quick else GRID
    for b, hq, hkv, n, d in grid:
        add_uniform(b, hq, hkv, n, d, sweep=True)

    ragged = []
    sources = ["azureconv"] if quick else ["mooncake", "azureconv"]
    for tag in sources:
        if trace_dir is None:
            notes.append(f"ragged {tag}: trace folder not found (pass --traces DIR); row skipped")
            continue
        path = os.path.join(trace_dir, TRACE_FILES[tag])
        try:
            lens = ragged_lens(load_trace(path), RAGGED_OFFSET, RAGGED_BATCH)
        except Exception as exc:
            notes.append(f"ragged {tag}: cannot read {path}: {exc}; row skipped")
            continue
        name = f"ragged{RAGGED_BATCH}-{tag}[{RAGGED_OFFSET}:{RAGGED_OFFSET + RAGGED_BATCH}]-h32/8-d128-bf16"
        note = (f"{TRACE_FILES[tag]} rows {RAGGED_OFFSET}..{RAGGED_OFFSET + RAGGED_BATCH - 1}, "
                f"kv_len = context + output//2: sum {sum(lens)} min {min(lens)} "
                f"median {int(statistics.median(lens))} max {max(lens)}")
        shape = Shape(name, RAGGED_BATCH, 32, 8, 128, "bf16", lens, 0, "grid", "", True, note)
        shapes.append(shape)
        ragged.append(shape)

    paged_rows = [(1, 32, 8, 16384, 128)] if quick else PAGED_ROWS
    for ps in ((16,) if quick else (16, 64)):
        for b, hq, hkv, n, d in paged_rows:
            # B=1 rows are swept too: their split count decides the kernel variant.
            add_uniform(b, hq, hkv, n, d, ps=ps, kind="paged", sweep=(b == 1))
        # Diagnostic (not a target row): the same pages in pool order, so that the
        # cost of scattered pages (DRAM/TLB locality) separates from the cost of
        # walking block_table.
        # B=1 too: one block an SM there, where the page walk costs most.
        if not quick:
            for b, hq, hkv, n, d in (PAGED_ROWS[1], PAGED_ROWS[0]):
                shapes.append(Shape(uniform_name(b, hq, hkv, n, d, "bf16", ps) + "-inorder", b, hq,
                                    hkv, d, "bf16", [n] * b, ps, "paged-inorder",
                                    uniform_name(b, hq, hkv, n, d, "bf16")))
        for r in ([] if quick else ragged[:1]):
            shapes.append(Shape(f"{r.name}-paged{ps}", r.batch, r.hq, r.hkv, r.d, r.dtype, r.lens,
                                ps, "paged", r.name, False, r.note))
    dtype_rows = [(1, 32, 8, 16384, 128)] if quick else DTYPE_ROWS
    for dt in ("fp16", "fp32"):
        for b, hq, hkv, n, d in dtype_rows:
            # fp32 B=1 rows are swept: fp32 has its own split rule (plan.c).
            add_uniform(b, hq, hkv, n, d, dt=dt, kind=dt, sweep=(dt == "fp32" and b == 1))

    return shapes


# ---- The variants issue's rows ----------------------------------------------------------
# Soft-cap rows draw q 6x larger, so that the largest scores (~4.5 sigma ~ 27) are bent
# by the cap (50 tanh(27/50) = 24.6) and the output check sees a missing cap (see
# data.softcap_sensitivity and dev/NOTES.md).
SOFTCAP_Q_SCALE = 6.0


def variant_name(family, b, hq, hkv, d, n, extra=""):
    return f"var-{family}-b{b}-h{hq}/{hkv}-d{d}-n{n}" + (f"-{extra}" if extra else "")


def build_variant_shapes(quick=False):
    """Model-shaped rows of the attention variants, each with the plain row it is costed
    against (Shape.base): Mistral-7B window 4096, Gemma-2-9B soft-cap 50 (+ window 4096),
    gpt-oss-120b sinks (full and 128-key-window layers), Phi-3-mini head_dim 96, and a
    64-sequence batch sharing a 16k prefix (cascade vs plain decode)."""
    out = []

    def add(family, b, hq, hkv, d, n, extra="", base="", **kw):
        name = variant_name(family, b, hq, hkv, d, n, extra)
        out.append(Shape(name, b, hq, hkv, d, "bf16", [n] * b, 0, "variant", base, False,
                         family=family, **kw))
        return name

    # Mistral-7B: 32/8 d128, sliding window 4096 keys (window_left 4095) at kv_len 32k,
    # costed against a plain call over 4097 keys.
    for b in ((1,) if quick else (1, 16)):
        plain = add("mistral", b, 32, 8, 128, 4097)
        add("mistral", b, 32, 8, 128, 32768, "win4096", plain, window_left=4095,
            note="window_left 4095 (a 4096-key window) at kv_len 32768; base: plain call over "
                 "4097 keys")
    if quick:
        return out
    out += fp8_shapes()
    # Gemma-2-9B: 16/8 d256, soft-cap 50, local layers with a 4096-key window.
    plain = add("gemma2", 1, 16, 8, 256, 16384)
    add("gemma2", 1, 16, 8, 256, 16384, "cap50", plain, softcap=50.0, q_scale=SOFTCAP_Q_SCALE,
        note=f"logits soft-cap 50; q drawn {SOFTCAP_Q_SCALE:g}x larger so the cap bends the "
             "largest scores")
    add("gemma2", 1, 16, 8, 256, 16384, "cap50-win4096", plain, softcap=50.0, window_left=4095,
        q_scale=SOFTCAP_Q_SCALE, note="soft-cap 50 and window_left 4095 (Gemma-2 local layers)")
    # gpt-oss-120b: 64/8 d64, one sink logit per query head; full layers and 128-key-window layers.
    for b in (1, 32):
        plain = add("gptoss", b, 64, 8, 64, 16384)
        add("gptoss", b, 64, 8, 64, 16384, "sinks", plain, sinks=True,
            note="sinks (one logit per query head, ~ log of the visible keys)")
        add("gptoss", b, 64, 8, 64, 16384, "sinks-win128", plain, sinks=True, window_left=127,
            note="sinks and window_left 127 (gpt-oss sliding layers, 128 keys)")
    # The deterministic mode (fixed 2048-key splits, the 4-warp kernel whatever the grid)
    # against the automatic plan of the same call: its cost at B = 1, 8 and 64.
    for b, n in ((1, 16384), (8, 8192), (64, 8192)):
        plain = add("det", b, 32, 8, 128, n, ours_only=True,
                    note="the automatic plan (peers: the grid row of this shape)")
        add("det", b, 32, 8, 128, n, "deterministic", plain, deterministic=True, ours_only=True,
            note="deterministic=True (batch-invariant plan); base: the automatic plan")
    # Phi-3-mini: 32/32 d96 (MHA, head_dim 96).
    for n in (4096, 16384):
        add("phi3", 1, 32, 32, 96, n)
    # Shared prefix: 64 sequences, a 16k prefix (the same pages) + 512 own keys each.
    prefix, suffix, bsz = 16384, 512, 64
    tag = f"p{prefix}+s{suffix}"
    plain = f"var-prefix{bsz}-h32/8-d128-{tag}-plain"
    kw = dict(page_size=16, kind="variant", family="prefix", prefix_len=prefix)
    out.append(Shape(plain, bsz, 32, 8, 128, "bf16", [prefix + suffix] * bsz,
                     note=f"{bsz} sequences, each a shared {prefix}-key prefix (the same 16-key "
                          f"pages) + {suffix} own keys; plain paged decode of all {bsz} "
                          f"({prefix + suffix} keys each); bytes count the prefix once", **kw))
    out.append(Shape(f"var-prefix{bsz}-h32/8-d128-{tag}-cascade", bsz, 32, 8, 128, "bf16",
                     [prefix + suffix] * bsz, base=plain, cascade=True,
                     note="cascade: one non-causal call over the prefix with the 64 sequences' "
                          "rows as q_len=64 rows of one sequence, one decode of the 64 suffixes, "
                          "merge_states; the three calls in one CUDA graph", **kw))
    return out


# ---- fp8 KV-cache rows -------------------------------------------------------------------
# Llama-3-8B-like 32/8 d128, bf16 q and out, e4m3 cache: (batch, kv_len, scale granularities).
FP8_ROWS = [(1, 32768, ("tensor",)), (1, 131072, ("tensor",)), (64, 8192, ("tensor", "token")),
            (16, 32768, ("token",))]


def fp8_shapes():
    """fp8 rows, each after its bf16 base row (the same call on a bf16 cache, ours only: the
    0.55x target). Data: realistic bf16 K/V (data.realistic_qkv), quantized to e4m3 with
    amax scales (data.quantize_fp8); the check is against float64 attention over the
    ORIGINAL bf16 K/V, and against the dequantized cache (the kernel's own error)."""
    out = []
    for b, n, grans in FP8_ROWS:
        base = variant_name("fp8", b, 32, 8, 128, n, "bf16")
        out.append(Shape(base, b, 32, 8, 128, "bf16", [n] * b, 0, "variant", "", False,
                         family="fp8", ours_only=True,
                         note="bf16 cache (the fp8 rows' base; peers: the grid rows)"))
        for gran in grans:
            out.append(Shape(variant_name("fp8", b, 32, 8, 128, n, f"e4m3-{gran}"), b, 32, 8, 128,
                             "bf16", [n] * b, 0, "variant", base, False, family="fp8",
                             kv_dtype="e4m3", kv_scale=gran,
                             note=f"e4m3 cache, per-{gran} scales (amax / 448), realistic data; "
                                  f"bytes = fp8 K+V + scales; base: the bf16 cache"))
    return out


def select(shapes, keys):
    """Shapes whose name contains one of the comma-separated substrings in keys."""
    ks = [k for k in (keys or "").split(",") if k]
    if not ks:
        return list(shapes)
    return [s for s in shapes if any(k in s.name for k in ks)]
