"""graphtrace.py — the GPU kernels of one CUDA-graph replay, from a torch.profiler trace
(bench_e2e.py --graph-profile, bench_interleave.py --profile)."""
import json
import os
import tempfile

import torch


def replay_kernels(replay, replays=3):
    """Runs ``replay()`` (one CUDA-graph replay) ``replays`` times under torch.profiler,
    synchronising after each, and returns the kernels of the last one in start order as
    (start_us, dur_us, idle_before_us, name) tuples, start relative to its first kernel and
    idle_before the time since the latest end of the kernels before it. [] when the trace
    holds no kernel records."""
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(replays):
            replay()
            torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)
    finally:
        os.unlink(path)
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    kernels = sorted((float(e["ts"]), float(e.get("dur", 0)), e.get("name", "?"))
                     for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")
                     and "ts" in e)
    if not kernels:
        return []
    # the replays are apart by the host's synchronisation: cut at the largest gaps
    gaps = sorted(range(1, len(kernels)), key=lambda i: kernels[i][0] - kernels[i - 1][0]
                  - kernels[i - 1][1], reverse=True)[:replays - 1]
    last = kernels[max(gaps) if gaps else 0:]
    t0, prev_end, rows = last[0][0], last[0][0], []
    for ts, dur, name in last:
        rows.append((ts - t0, dur, max(0.0, ts - prev_end), name))
        prev_end = max(prev_end, ts + dur)
    return rows
