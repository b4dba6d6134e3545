"""Constants, records and small helpers shared by every gpubench module."""
from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30
L2_BYTES = 60 * MIB  # H200
ROTATE_BYTES = 256 * MIB  # K+V read by one graph replay over its R sets
assert ROTATE_BYTES > 2 * L2_BYTES  # so no call finds its K/V in L2
R_MAX = 128
CEILING_BYTES = 4 * GIB
SWEEP_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)
ESIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
# Max |out - ref| / max |ref| allowed (ref = float64 over the same rounded inputs).
# bf16 / fp16 outputs round at 2^-9 / 2^-11 relative; fp32 leaves room for TF32 mma.
TOL = {"bf16": 2e-2, "fp16": 5e-3, "fp32": 5e-3}

OURS = ("flashdecode", "flashdecode-nosplit")
SDPA_PEERS = ("sdpa-flash", "sdpa-cudnn")
FI_PEERS = ("fi-cudacore", "fi-tensorcore", "fi-xqa", "fi-cudnn", "fi-cascade",
            "fi-mla-fa2", "fi-mla-fa3")  # the last two: BatchMLAPagedAttentionWrapper (MLA rows)
PEERS = SDPA_PEERS + ("flex",) + FI_PEERS
# Peers that see a ragged batch padded to its longest sequence (no serving engine
# runs a batch that way): on ragged rows they are context, not the bar, whenever
# a paged peer (FlashInfer) measured the row.
PADDED_PEERS = SDPA_PEERS + ("flex",)

CSV_COLUMNS = ["shape", "impl", "us_graph", "us_eager", "tbps", "pct_ceiling", "num_splits",
               "ratio_vs_best_peer", "tflops"]  # tflops: MLA rows only


class Settings:
    """Process-wide settings a CPU harness may override (tensors' device)."""
    device = "cuda"


SETTINGS = Settings()


@dataclass
class Rec:
    shape: str
    impl: str
    us_graph: float = None
    us_eager: float = None
    num_splits: int = None
    status: str = "ok"  # ok | FAIL (wrong result) | n/a (unsupported / failed) | skipped
    err: float = None  # max |out - ref|
    rel: float = None  # err / max |ref|
    reason: str = ""
    replicas: int = 0  # R
    rel_deq: float = None  # fp8 rows: rel err against float64 over the dequantized cache


@dataclass
class SweepRec:
    shape: str
    requested: int
    num_splits: int
    us_graph: float = None
    status: str = "ok"
    rel: float = None
    reason: str = ""


def fmt(x, digits):
    return "n/a" if x is None else f"{x:.{digits}f}"


def short(msg, n=110):
    msg = " ".join(str(msg).split())
    return msg if len(msg) <= n else msg[:n - 3] + "..."


def exc_text(exc, n=150):
    return short(f"{type(exc).__name__}: {exc}", n)


def na(shape, impl, reason):
    """A record for an implementation that cannot run this row (reason says why)."""
    return Rec(shape, impl, status="n/a", reason=reason)


def recs_by_shape(recs):
    out = {}
    for r in recs:
        out.setdefault(r.shape, []).append(r)
    return out
