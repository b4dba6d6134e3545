"""test_examples.py — the Python examples run as a user runs them (CPU), so CI runs them."""
import importlib.util
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


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the example needs torch")
@pytest.mark.parametrize("args", [
    (),
    ("--kv-dtype", "e4m3", "--page-size", "0", "--q-len", "1", "--batch", "3"),
    ("--dtype", "bfloat16", "--page-size", "1", "--q-len", "16", "--max-len", "200"),
], ids=["defaults", "fp8-contiguous-qlen1", "bf16-page1-qlen16"])
def test_deepseek_mla_decode_cpu(args):
    res = run_example("deepseek_mla_decode.py", "--device", "cpu", *args)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS" in res.stdout and "max error" in res.stdout


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the example needs torch")
@pytest.mark.parametrize("args", [
    (),
    ("--nodes", "64", "--prefix-len", "0", "--dtype", "bfloat16", "--batch", "1"),
    ("--nodes", "1", "--num-heads-q", "4", "--num-heads-kv", "4", "--dtype", "float16"),
], ids=["defaults", "64-nodes-no-prefix-bf16", "one-node-mha-f16"])
def test_tree_verify_cpu(args):
    res = run_example("tree_verify.py", *args)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS" in res.stdout and "max error" in res.stdout
