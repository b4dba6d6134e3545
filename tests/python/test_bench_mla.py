"""test_bench_mla.py — the MLA rows of bench/bench_gpu.py without a GPU, so they do not rot
between GPU runs: the CPU harness runs them through the library (MLADecodePlan on the CPU
backend, checked against the benchmark's float64 reference: bf16, q_len 2, an e4m3 latent)
and its FlashInfer phase through a stand-in of the MLA wrapper (the peers' records, best
peer, ratio, summary);
--dry-run writes their CSV and summary rows (made-up timings); --self-test checks the MLA
reference, data, byte and FLOP counts and FlashInfer's MLA arguments. Skipped without torch."""
import csv
import glob
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench")


def run(args, tmp_path, timeout=600):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the package under test
    env.setdefault("OMP_NUM_THREADS", "1")  # tiny rows: threads only wait for each other
    res = subprocess.run([sys.executable] + args, env=env, capture_output=True, text=True,
                         timeout=timeout, cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return res.stdout


def test_mla_rows_through_the_library_on_the_cpu(tmp_path):
    out = run([os.path.join(BENCH, "cpu_harness.py"), "--mla-only", "--fake-flashinfer",
               "--out-dir", str(tmp_path)], tmp_path)
    assert "12 passed, 0 failed" in out, out[-3000:]
    with open(os.path.join(str(tmp_path), "cpu-check.csv")) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    mla = [r for r in rows if r["shape"].startswith("mla-")]
    assert len(mla) == 12 and all(r["status"] == "ok" for r in mla), mla
    assert {r["impl"] for r in mla} == {"flashdecode", "flashdecode-nosplit", "fi-mla-fa2",
                                        "fi-mla-fa3"}
    summary = json.load(open(os.path.join(str(tmp_path), "cpu-summary.json")))
    assert len(summary) == 3 and all(r["best_peer"] in ("fi-mla-fa2", "fi-mla-fa3")
                                     and r["ratio"] > 0 for r in summary), summary
    for r in mla:  # bf16 rows vs float64; the e4m3 row vs the dequantized latent
        rel = float(r["rel_err_dequant"] or r["rel_err"])
        assert 0 < rel < 0.02, r


def test_mla_dry_run_summary(tmp_path):
    run([os.path.join(BENCH, "bench_gpu.py"), "--dry-run", "--mla-only", "--out-dir",
         str(tmp_path), "--commit", "test"], tmp_path)
    (summary,) = glob.glob(os.path.join(str(tmp_path), "*-test-nogpu-dryrun-summary.json"))
    rows = json.load(open(summary))
    assert len(rows) == 15 and all(r["row"].startswith("mla/mla-") for r in rows), rows
    for r in rows:
        assert set(r) == {"row", "ours_us", "best_peer", "best_peer_us", "ratio", "pct_ceiling",
                          "tflops"}, r
        assert r["tflops"] > 0 and (r["best_peer"] or "").startswith("fi-mla-"), r
    (main,) = glob.glob(os.path.join(str(tmp_path), "*-test-nogpu-dryrun.csv"))
    with open(main) as f:
        recs = list(csv.DictReader(line for line in f if not line.startswith("#")))
    impls = {r["impl"] for r in recs}
    assert impls == {"flashdecode", "flashdecode-nosplit", "fi-mla-fa2", "fi-mla-fa3"}, impls
    assert all(r["tflops"] for r in recs if r["us_graph"] not in ("n/a", "FAIL")), recs[:3]


def test_mla_self_test(tmp_path):
    out = run([os.path.join(BENCH, "bench_gpu.py"), "--self-test"], tmp_path)
    assert " 0 failed" in out and "FlashInfer MLA arguments (e4m3" in out, out[-3000:]
