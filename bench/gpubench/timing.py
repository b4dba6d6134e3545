"""How every row is timed: CUDA events around a CUDA graph that
replays R calls back to back over R distinct buffer sets (K+V over the R sets > 2 x L2),
time per call = replay time / R, median of 10-20 replays after warm-up; eager time = median
of single calls (events around one call, synchronised between calls)."""
import math
import statistics

from .common import R_MAX, ROTATE_BYTES


def replicas_for(kv_bytes):
    """Buffer sets a graph rotates over: >= 2, and >= ROTATE_BYTES of K+V over all of them."""
    return max(2, min(R_MAX, math.ceil(ROTATE_BYTES / max(1, kv_bytes))))


def replays_for(kv_bytes, replicas):
    est_ms = replicas * kv_bytes / 4e12 * 1e3
    return 10 if est_ms > 5 else 20


def time_events(torch, fn, reps, warmup=2):
    """Median seconds of fn() between CUDA events, synchronised after each call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e-3)  # seconds
    return statistics.median(ts)


class GraphFailed(RuntimeError):
    """The graph could not be captured or replayed; us_eager holds the eager time if any."""

    def __init__(self, msg, us_eager):
        super().__init__(msg)
        self.us_eager = us_eager


def measure(torch, call, replicas, replays, eager_calls, check):
    """Time call(i) (i = buffer set) under CUDA-graph replay and eagerly.

    Returns (us_graph, us_eager, check_result); check(out0) runs on the output of set 0
    written by the last graph replay (the exact configuration timed). A failure during
    capture or replay raises GraphFailed carrying the eager time.
    """
    cur = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):  # warm-up (and compilation) outside the capture
        for i in range(replicas):
            call(i)
    cur.wait_stream(side)
    torch.cuda.synchronize()
    us_eager = None
    if eager_calls:
        ts = []
        for j in range(eager_calls + 1):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            call(j % replicas)
            e.record()
            e.synchronize()
            if j:
                ts.append(s.elapsed_time(e) * 1e3)
        us_eager = statistics.median(ts)
    try:
        graph = torch.cuda.CUDAGraph()
        outs = [None] * replicas
        with torch.cuda.graph(graph):
            for i in range(replicas):
                outs[i] = call(i)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
    except Exception as exc:
        raise GraphFailed(f"CUDA graph: {type(exc).__name__}: {exc}", us_eager) from exc
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(replays)]
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(2_000_000)  # keeps the GPU busy while the replays are enqueued
    for s, e in events:
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    us_graph = statistics.median(s.elapsed_time(e) * 1e3 / replicas for s, e in events)
    result = check(outs[0])
    del outs, graph
    return us_graph, us_eager, result
