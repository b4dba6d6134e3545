"""test_bench_multi_gpu.py — bench/bench_multi_gpu.py's CPU path (--cpu --quick):
the benchmark's code (plans, packed states, the exchange through gloo between
2 processes, the merge, its check against the whole-cache decode, the model
fit, the CSV) runs on the CPU, so the GPU benchmark does not rot between GPU
runs. Its timings mean nothing. Skipped without torch."""
import csv
import glob
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench", "bench_multi_gpu.py")


def test_bench_multi_gpu_cpu_path(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the package under test
    res = subprocess.run([sys.executable, BENCH, "--cpu", "--quick", "--out-dir", str(tmp_path),
                          "--commit", "test"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    (path,) = glob.glob(os.path.join(str(tmp_path), "*-test-cpu-multi.csv"))
    with open(path) as f:
        lines = f.read().splitlines()
    assert any("t_step(N) = t_local" in line for line in lines if line.startswith("#"))
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    modes = {r["mode"] for r in rows}
    assert modes == {"allgather", "nccl", "one-gpu", "model"}, modes
    for r in rows:
        assert r["commit"] == "test" and r["gpu"] == "cpu"
        if r["mode"] == "nccl":
            assert float(r["check_max_abs"]) < 1e-4, r
        if r["mode"] in ("nccl", "one-gpu", "model"):
            assert float(r["us_step"]) > 0 and int(r["batch"]) in (1, 8), r
    assert {int(r["shards"]) for r in rows if r["mode"] == "one-gpu"} == {1, 2, 8}
    assert {int(r["shards"]) for r in rows if r["mode"] == "model"} == {8}


def test_bench_multi_gpu_dry_run():
    res = subprocess.run([sys.executable, BENCH, "--dry-run"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert "B=8 kv_len=2097152 shards=1: K+V 64.00 GiB a GPU" in res.stdout
