"""test_examples.py — the Python examples run as a user runs them (CPU), so CI runs them."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")


def run_example(name, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the package under test
    return subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args", [
    (),
    ("--q-len", "4", "--batch", "40", "--sinks", "--dtype", "float16"),  # 160 rows: 2 groups
    ("--num-heads-q", "4", "--num-heads-kv", "4", "--head-dim", "40", "--prefix-len", "1"),
], ids=["defaults", "qlen4-groups-sinks-f16", "mha-short-prefix"])
def test_shared_prefix_decode_cpu(args):
    res = run_example("shared_prefix_decode.py", "--device", "cpu", *args)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS" in res.stdout and "cascade vs plain decode: max_abs=" in res.stdout


def _cpu_mla():
    """True when this library runs MLA on the CPU backend (and torch is installed)."""
    try:
        import torch  # noqa: F401  (the example needs it)

        import flashdecode
        from flashdecode import _core, _lib

        _core.make_plan(backend=_lib.FD_BACKEND_CPU, device=0, dtype=_lib.FD_DTYPE_F32, batch=1,
                        q_len=1, num_heads_q=1, num_heads_kv=1, head_dim=512, kv_capacity=64,
                        page_size=0, max_pages_per_seq=0, num_pages=0, num_splits=0,
                        softmax_scale=1.0, rope_dim=64)
    except (ImportError, flashdecode.FlashDecodeError):
        return False
    return True


@pytest.mark.skipif(not _cpu_mla(), reason="needs torch and a library with MLA on the CPU")
@pytest.mark.parametrize("args", [
    (),
    ("--kv-dtype", "e4m3", "--page-size", "0", "--q-len", "1", "--batch", "3"),
    ("--dtype", "bfloat16", "--page-size", "1", "--q-len", "16", "--max-len", "200"),
], ids=["defaults", "fp8-contiguous-qlen1", "bf16-page1-qlen16"])
def test_deepseek_mla_decode_cpu(args):
    res = run_example("deepseek_mla_decode.py", "--device", "cpu", *args)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS" in res.stdout and "max error" in res.stdout
