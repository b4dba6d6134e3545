#!/usr/bin/env python3
"""bench_e2e.py — end-to-end decode through transformers with flashdecode.hf.

A Llama-3.1-8B-shaped model (random bf16 weights made on the GPU from a LlamaConfig:
32 layers, 32/8 heads, head_dim 128, vocab 128256; nothing downloaded) decodes one token
per sequence from a transformers StaticCache filled with random keys/values up to the
context length, each step captured once in a CUDA graph and replayed (the cache position
advances on the device, as in transformers' compiled static-cache generation). For batch
1 and 16 at contexts 8k and 32k it times, per attention implementation:

  fdecode        attn_implementation "fdecode" (flashdecode.hf): flashdecode reads the
                 static cache in place, kv_len from the device-side cache position
                 (plain launches, the integration's default; fdecode-pdl: the same with
                 programmatic dependent launch, flashdecode.hf.pdl = True)
  sdpa           attn_implementation "sdpa" as transformers runs it on a static cache
                 (a boolean mask over the whole capacity; PyTorch picks the backend)
  sdpa-flash     SDPA's flash backend, sdpa-cudnn its cuDNN backend, flex FlexAttention
                 (torch.compile'd flex_attention): peers given what suits them best, K/V
                 sliced to the step's exact length (no mask, enable_gqa) through a custom
                 attention function (the slice is fixed when the graph is captured)
  no-attention   attention replaced by a no-op (the rest of the step: weights, cache
                 writes, lm_head), for attention's share of the step

and writes <out-dir>/<date>-<commit>-e2e.csv (ms per step, tokens/s, attention share,
next-token logits vs sdpa) and .png. Logits: every implementation's first replayed step
from the same cache state against "sdpa"; tolerance = 2 x the largest difference between
the SDPA-family peers themselves (their bf16 spread) + 0.02.

  PYTHONPATH=python FLASHDECODE_LIBRARY=build/libflashdecode.so \\
      python3 bench/bench_e2e.py --out-dir /tmp/e2e          # H200, about 4-6 minutes
  python3 bench/bench_e2e.py --tiny --out-dir /tmp/e2e       # CPU check: a tiny config, eager steps
"""
import argparse
import csv
import datetime
import inspect
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchutil import git_commit  # noqa: E402

import transformers  # noqa: E402
from transformers import AttentionInterface, LlamaConfig  # noqa: E402

import flashdecode  # noqa: E402
import flashdecode.hf as fh  # noqa: E402

IMPLS = ["fdecode", "fdecode-pdl", "sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-math", "flex", "no-attention"]
DEFAULT_IMPLS = ["fdecode", "sdpa", "sdpa-flash", "sdpa-cudnn", "flex", "no-attention"]
SDPA_FAMILY = ["sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-math", "flex"]


def log(msg):
    print(msg, flush=True)


def llama_config(tiny):
    if tiny:
        kw = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    else:  # Llama-3.1-8B's shapes
        kw = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128)
    cfg = LlamaConfig(max_position_embeddings=131072, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, **kw)
    if hasattr(cfg, "rope_parameters") and isinstance(cfg.rope_parameters, dict):
        cfg.rope_parameters["rope_theta"] = 500000.0
    else:
        cfg.rope_theta = 500000.0
    return cfg


def make_model(cfg, device, dtype):
    major = int(transformers.__version__.split(".")[0])
    dtype_kw = {"dtype" if major >= 5 else "torch_dtype": dtype}
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                              **dtype_kw)
    return model.to(device=device, dtype=dtype).eval()


# ---- the static cache, filled and positioned by hand ------------------------------------------

class Cache:
    """A transformers StaticCache with random keys/values and a settable position."""

    def __init__(self, cfg, batch, capacity, device, dtype):
        from transformers import StaticCache

        try:
            self.cache = StaticCache(config=cfg, max_cache_len=capacity)
        except TypeError:  # transformers 4.x
            self.cache = StaticCache(config=cfg, max_batch_size=batch, max_cache_len=capacity,
                                     device=device, dtype=dtype)
        if hasattr(self.cache, "early_initialization"):
            self.cache.early_initialization(batch, cfg.num_key_value_heads, cfg.head_dim, dtype,
                                            device)
        self.layers = getattr(self.cache, "layers", None)
        gen = torch.Generator(device=device).manual_seed(1)
        for k, v in self.kv():
            k.normal_(generator=gen)
            v.normal_(generator=gen)
        # transformers 4.x takes the position as cache_position; 5.x keeps it in the layers
        self.position = torch.zeros(1, dtype=torch.long, device=device)

    def kv(self):
        if self.layers is not None:
            return [(layer.keys, layer.values) for layer in self.layers]
        return list(zip(self.cache.key_cache, self.cache.value_cache))

    def set_position(self, pos):
        self.position.fill_(pos)
        for layer in self.layers or []:
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                layer.cumulative_length.fill_(pos)
            if hasattr(layer, "cumulative_length_int"):
                layer.cumulative_length_int = pos

    def free(self):
        for layer in self.layers or []:
            layer.keys = layer.values = None
        self.cache = self.layers = None


# ---- the peers' attention functions -----------------------------------------------------------

EXACT = {"n": 0, "flex": None, "block_mask": None}


def exact_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA on keys 0 .. n-1 (n fixed per configuration), no mask, GQA in the kernel."""
    n = EXACT["n"]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key[:, :, :n], value[:, :, :n], scale=scaling, enable_gqa=True)
    return out.transpose(1, 2), None


def exact_flex(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    out = EXACT["flex"](query, key, value, block_mask=EXACT["block_mask"], scale=scaling,
                        enable_gqa=True)
    return out.transpose(1, 2), None


def no_attention(module, query, key, value, attention_mask, **kwargs):
    return query.transpose(1, 2), None


def setup_flex(batch, capacity, n, device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if EXACT["flex"] is None:
        EXACT["flex"] = torch.compile(flex_attention, dynamic=False)

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx < n

    EXACT["block_mask"] = create_block_mask(mask_mod, B=None, H=None, Q_LEN=1, KV_LEN=capacity,
                                            device=device)


def backend_context(impl):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if impl == "sdpa-flash":
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION])
    if impl == "sdpa-cudnn":
        return sdpa_kernel([SDPBackend.CUDNN_ATTENTION])
    if impl == "sdpa-math":
        return sdpa_kernel([SDPBackend.MATH])
    import contextlib
    return contextlib.nullcontext()


def select(model, impl):
    name = {"fdecode": fh.NAME, "fdecode-pdl": fh.NAME, "sdpa": "sdpa", "flex": "bench_flex",
            "no-attention": "bench_none"}.get(impl, "bench_exact")
    fh.pdl = impl == "fdecode-pdl"
    model.set_attn_implementation(name)


# ---- one configuration --------------------------------------------------------------------------

class Step:
    """One decode step of ``model`` over ``cache``: eager call or CUDA graph replay."""

    def __init__(self, model, cache, batch, device, graph):
        self.model, self.cache = model, cache
        self.ids = torch.full((batch, 1), 7, dtype=torch.long, device=device)
        params = inspect.signature(model.forward).parameters
        self.pass_position = "cache_position" in params
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.graph, self.logits = None, None
        if graph:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self._forward()

    def _forward(self):
        kw = {self.cache_kw: self.cache.cache}
        if self.pass_position:
            kw["cache_position"] = self.cache.position
        with torch.no_grad():
            logits = self.model(self.ids, use_cache=True, **kw).logits[:, -1]
        self.cache.position.add_(1)
        return logits

    def __call__(self):
        if self.graph is not None:
            self.graph.replay()
            return self.logits
        return self._forward()


def time_steps(step, steps, repeats, cuda):
    """Median ms per step over ``repeats`` runs of ``steps`` back-to-back steps."""
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / steps)
        else:
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            times.append((time.perf_counter() - t0) * 1e3 / steps)
    return statistics.median(times)


def kernel_profile(model, cache, batch, device, context, impl, steps=3):
    """--profile: ``steps`` eager steps under torch.profiler; logs the GPU kernels of one step
    (launches and device microseconds a step, by kernel name, largest first) and their sum,
    so that a gap between two implementations' graph times can be pinned to kernels."""
    from torch.profiler import ProfilerActivity, profile

    step = Step(model, cache, batch, device, graph=False)
    cache.set_position(context)
    step()
    torch.cuda.synchronize()
    cache.set_position(context)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            rows.append((us / steps, e.count / steps, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    log("    profile %s B=%d ctx=%d: kernels %.1f us a step in %.0f launches" %
        (impl, batch, context, total, sum(r[1] for r in rows)))
    for us, n, name in rows[:14]:
        log("      %9.1f us %6.1f x  %s" % (us, n, name[:110]))


def graph_profile(step, impl, batch, context, out_dir, replays=3):
    """--graph-profile: ``replays`` CUDA-graph replays under torch.profiler; from the trace's
    kernel records (start, duration) of the last replay, logs the step's span, the kernels'
    time, the idle time between kernels, and by kernel name the device time and the idle
    time just before it, largest first; the kernel list goes to <out_dir>/graph-<impl>-B-ctx.csv."""
    from graphtrace import replay_kernels

    rows = replay_kernels(step, replays)
    if not rows:
        log("    graph profile %s: no kernel records in the trace" % impl)
        return
    busy = sum(r[1] for r in rows)
    span = max(r[0] + r[1] for r in rows)
    by = {}
    for _, dur, gap, name in rows:
        b = by.setdefault(name[:90], [0.0, 0.0, 0])
        b[0] += dur
        b[1] += gap
        b[2] += 1
    log("    graph profile %s B=%d ctx=%d: one replay spans %.1f us: %d kernels busy %.1f us, "
        "idle between them %.1f us" % (impl, batch, context, span, len(rows), busy, span - busy))
    for name, (dur, gap, n) in sorted(by.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:12]:
        log("      %9.1f us busy %8.1f us idle before  %4d x  %s" % (dur, gap, n, name[:80]))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "graph-%s-B%d-ctx%d.csv" % (impl, batch, context)), "w") as f:
        f.write("start_us,dur_us,idle_before_us,kernel\n")
        for start, dur, gap, name in rows:
            f.write("%.2f,%.2f,%.2f,\"%s\"\n" % (start, dur, gap, name[:90].replace('"', "'")))


def run_config(model, cfg, batch, context, impls, args, device, dtype, deadline):
    cuda = device.type == "cuda"
    margin = 16 + args.steps * args.repeats + 8
    capacity = context + margin
    cache = Cache(cfg, batch, capacity, device, dtype)
    EXACT["n"] = context + 1
    rows = {}
    for impl in impls:
        row = rows[impl] = {"impl": impl, "batch": batch, "context": context, "status": "ok"}
        if time.time() > deadline:
            row["status"] = "skipped: time budget"
            continue
        step = None
        try:
            if impl == "flex":
                setup_flex(batch, capacity, context + 1, device)
            select(model, impl)
            fh.reset_stats()
            with backend_context(impl):
                cache.set_position(context)
                step = Step(model, cache, batch, device, graph=cuda and not args.no_graph)
                cache.set_position(context)
                row["logits"] = step().float().clone()
                ms = time_steps(step, args.steps, args.repeats, cuda)
            row["ms"] = ms
            row["tok_s"] = batch / (ms / 1e3)
            if args.graph_profile and step.graph is not None:
                try:
                    graph_profile(step, impl, batch, context, args.out_dir)
                except Exception as exc:  # a diagnostic: never lose the timing for it
                    log("    graph profile %s failed: %s: %s" % (impl, type(exc).__name__, exc))
            if args.profile and cuda:
                del step
                step = None
                with backend_context(impl):
                    kernel_profile(model, cache, batch, device, context, impl)
            if impl.startswith("fdecode") and not fh.stats.get("flashdecode"):
                row["status"] = "FAIL: no flashdecode call (%s)" % dict(fh.stats)
        except Exception as exc:  # a backend that cannot run this shape: say why
            row["status"] = "n/a: %s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:120]
                                             if str(exc) else "")
        finally:
            del step
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        log("  B=%-3d ctx=%-6d %-13s %s" % (batch, context, impl,
                                            "%.3f ms/step, %.0f tok/s" % (row["ms"], row["tok_s"])
                                            if "ms" in row else row["status"]))
    cache.free()
    del cache
    if cuda:
        torch.cuda.empty_cache()
    # attention share and logits check
    base = rows.get("no-attention", {}).get("ms")
    ref = rows.get("sdpa", {}).get("logits")
    family = [rows[i]["logits"] for i in SDPA_FAMILY if "logits" in rows.get(i, {})]
    spread = max(((a - b).abs().max().item() for a in family for b in family), default=0.0)
    tol = 2 * spread + 0.02
    for impl, row in rows.items():
        if base and "ms" in row and impl != "no-attention":
            row["attn_ms"] = row["ms"] - base
            row["attn_share"] = row["attn_ms"] / row["ms"]
        if ref is not None and "logits" in row and impl != "no-attention":
            diff = (row["logits"] - ref).abs().max().item()
            row["logit_diff"] = diff
            row["top1_agree"] = (row["logits"].argmax(-1) == ref.argmax(-1)).float().mean().item()
            row["tol"] = tol
            if diff > tol and row["status"] == "ok":
                row["status"] = "FAIL: logits %.4f from sdpa > tol %.4f" % (diff, tol)
        row.pop("logits", None)
    return list(rows.values())


# ---- output -----------------------------------------------------------------------------------

COLUMNS = ["date", "commit", "device", "impl", "batch", "context", "ms_per_step", "tokens_per_s",
           "attn_ms", "attn_share", "logit_max_abs_diff_vs_sdpa", "logit_tol", "top1_agree",
           "status"]


def fmt(x, digits):
    return "" if x is None else ("%.*f" % (digits, x))


def write_csv(path, rows, meta, header_lines):
    with open(path, "w", newline="") as f:
        for line in header_lines:
            f.write("# " + line + "\n")
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([meta["date"], meta["commit"], meta["device"], r["impl"], r["batch"],
                        r["context"], fmt(r.get("ms"), 4), fmt(r.get("tok_s"), 1),
                        fmt(r.get("attn_ms"), 4), fmt(r.get("attn_share"), 3),
                        fmt(r.get("logit_diff"), 5), fmt(r.get("tol"), 5),
                        fmt(r.get("top1_agree"), 3), r["status"]])


def write_png(path, rows, title):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return "plot skipped: matplotlib unavailable (%s)" % exc
    configs = sorted({(r["batch"], r["context"]) for r in rows})
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    width = 0.8 / max(1, len(impls))
    colors = {"fdecode": "tab:red", "fdecode-pdl": "tab:orange", "sdpa": "tab:gray", "sdpa-flash": "tab:blue",
              "sdpa-cudnn": "tab:green", "sdpa-math": "tab:olive", "flex": "tab:purple",
              "no-attention": "black"}
    for k, impl in enumerate(impls):
        ms, att = [], []
        for c in configs:
            r = next((r for r in rows if r["impl"] == impl and (r["batch"], r["context"]) == c), {})
            ms.append(r.get("ms") or 0)
            att.append(r.get("attn_ms") or 0)
        xs = [i + (k - (len(impls) - 1) / 2) * width for i in range(len(configs))]
        axes[0].bar(xs, ms, width, label=impl, color=colors.get(impl))
        if impl != "no-attention":
            axes[1].bar(xs, att, width, label=impl, color=colors.get(impl))
    labels = ["B=%d\n%dk" % (b, c // 1024) if c >= 1024 else "B=%d\n%d" % (b, c)
              for b, c in configs]
    for ax, ylabel in ((axes[0], "ms per decode step (whole model)"),
                       (axes[1], "attention ms per step (step - no-attention step)")):
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels(labels)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--tiny", action="store_true",
                    help="a tiny Llama on the CPU (eager steps): checks that the script runs")
    ap.add_argument("--batches", default=None, help="comma list (default 1,16; tiny 1,4)")
    ap.add_argument("--contexts", default=None, help="comma list (default 8192,32768; tiny 64,200)")
    ap.add_argument("--impls", default=",".join(DEFAULT_IMPLS))
    ap.add_argument("--steps", type=int, default=None, help="steps per timed run (default 20; tiny 3)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-graph", action="store_true", help="time eager steps, no CUDA graph")
    ap.add_argument("--profile", action="store_true",
                    help="also log each implementation's GPU kernels a step (torch.profiler, "
                    "eager steps)")
    ap.add_argument("--graph-profile", action="store_true",
                    help="also profile CUDA-graph replays (torch.profiler): each kernel's device "
                    "time and the idle time before it, logged and written to "
                    "<out-dir>/graph-<impl>-B<batch>-ctx<context>.csv")
    ap.add_argument("--budget-s", type=float, default=330,
                    help="skip the remaining measurements past this many seconds")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--device", default=None, help="default: cuda unless --tiny")
    args = ap.parse_args()
    t_start = time.time()
    deadline = t_start + args.budget_s

    device = torch.device(args.device or ("cpu" if args.tiny else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_e2e.py: no CUDA device (use --tiny for the CPU check)")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    batches = [int(x) for x in (args.batches or ("1,4" if args.tiny else "1,16")).split(",")]
    contexts = [int(x) for x in (args.contexts or ("64,200" if args.tiny else "8192,32768")).split(",")]
    args.steps = args.steps or (3 if args.tiny else 20)
    impls = [i for i in args.impls.split(",") if i]
    if device.type == "cpu":   # no flash/cuDNN SDPA on the CPU: the exact-length path on math
        impls = ["sdpa-math" if i in ("sdpa-flash", "sdpa-cudnn") else i for i in impls]
        impls = list(dict.fromkeys(impls))

    name = fh.register()
    AttentionInterface.register("bench_exact", exact_sdpa)
    AttentionInterface.register("bench_flex", exact_flex)
    AttentionInterface.register("bench_none", no_attention)
    commit = args.commit or git_commit()
    date = datetime.date.today().isoformat()
    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    meta = {"date": date, "commit": commit, "device": dev_name}
    cfg = llama_config(args.tiny)
    log("bench_e2e: %s, torch %s, transformers %s, flashdecode %s (%s), %s %s"
        % (dev_name, torch.__version__, transformers.__version__, flashdecode.version(),
           flashdecode.library_path, "tiny" if args.tiny else "Llama-3.1-8B-shaped", dtype))
    t0 = time.time()
    model = make_model(cfg, device, dtype)
    log("model: %.2fB parameters, built in %.1f s" %
        (sum(p.numel() for p in model.parameters()) / 1e9, time.time() - t0))

    rows = []
    for batch in batches:
        for context in contexts:
            rows += run_config(model, cfg, batch, context, impls, args, device, dtype, deadline)

    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, "%s-%s-e2e%s" % (date, commit, "-tiny" if args.tiny else ""))
    header = [
        "flashdecode end-to-end decode (bench/bench_e2e.py) date %s commit %s" % (date, commit),
        "device %s; torch %s; transformers %s; flashdecode %s" % (
            dev_name, torch.__version__, transformers.__version__, flashdecode.version()),
        "model: LlamaConfig %s layers, %d/%d heads, head_dim %d, hidden %d, vocab %d, random "
        "weights, %s" % (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
                         cfg.head_dim, cfg.hidden_size, cfg.vocab_size, dtype),
        "step: one token per sequence, StaticCache filled with random K/V to `context`, %s; "
        "ms_per_step = median of %d runs of %d steps; tokens_per_s = batch / step"
        % ("CUDA graph replay" if device.type == "cuda" and not args.no_graph else "eager",
           args.repeats, args.steps),
        "impl fdecode = attn_implementation %r (flashdecode.hf); sdpa = transformers' sdpa "
        "(masked static cache); sdpa-flash/-cudnn/-math, flex = exact-length K/V, no mask, "
        "enable_gqa; no-attention = attention replaced by a no-op" % name,
        "attn_ms = ms_per_step - no-attention's; attn_share = attn_ms / ms_per_step",
        "logits: first step from the same cache state vs sdpa; logit_tol = 2 x max spread "
        "between sdpa, sdpa-flash, sdpa-cudnn, flex (+0.02); top1_agree = fraction of "
        "sequences with the same argmax",
        "total time %.0f s" % (time.time() - t_start),
    ]
    write_csv(stem + ".csv", rows, meta, header)
    note = write_png(stem + ".png", rows, "%s, %s: decode step, %s" % (
        "tiny Llama (CPU)" if args.tiny else "Llama-3.1-8B-shaped bf16", dev_name, commit))
    log("\n".join("# " + h for h in header))
    log("%-13s %4s %7s %10s %9s %8s %10s  %s" % ("impl", "B", "ctx", "ms/step", "tok/s", "attn%",
                                              "dlogit", "status"))
    for r in rows:
        log("%-13s %4d %7d %10s %9s %8s %10s  %s" % (
            r["impl"], r["batch"], r["context"], fmt(r.get("ms"), 3), fmt(r.get("tok_s"), 0),
            fmt(100 * r["attn_share"], 1) if "attn_share" in r else "", ("%.2e" % r["logit_diff"]) if "logit_diff" in r else "",
            r["status"]))
    log("wrote %s.csv%s" % (stem, "" if note else " and .png") + (" (%s)" % note if note else ""))
    bad = [r for r in rows if r["impl"].startswith("fdecode") and r["status"] != "ok"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
