#!/usr/bin/env python3
"""compare_builds.py — our rows of two builds, timed in the same device run.

    python3 bench/compare_builds.py --base A1.csv A2.csv --new B1.csv B2.csv [--out FILE]

Each argument is a main CSV of bench/bench_gpu.py (--no-peers is enough). Runs of the
two builds should alternate (base, new, base, new) so that drift of the card touches
both. Per row, each build's time is the fastest of its runs (the graph-replay median of
each run); the table gives base µs, new µs, new / base, and marks rows where the new
build is slower than the base by more than the spread between the base's own runs
(at least 1 %). Exit status 0 always: the verdict is in the table."""
import argparse
import csv
import math
import sys


def read_ours(path, impl="flashdecode"):
    rows = {}
    with open(path) as fh:
        lines = [ln for ln in fh if not ln.startswith("#")]
    for r in csv.DictReader(lines):
        if r["impl"] != impl:
            continue
        try:
            rows[r["shape"]] = float(r["us_graph"])
        except ValueError:
            pass
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", nargs="+", required=True, help="main CSVs of the base build")
    ap.add_argument("--new", nargs="+", required=True, help="main CSVs of the new build")
    ap.add_argument("--impl", default="flashdecode", help="which of our rows (default: auto splits)")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    base = [read_ours(p, args.impl) for p in args.base]
    new = [read_ours(p, args.impl) for p in args.new]
    names = [n for n in base[0] if all(n in b for b in base) and all(n in x for x in new)]
    out = [f"{'row':58s} {'base us':>9s} {'new us':>9s} {'new/base':>8s} {'noise':>6s}"]
    ratios, slower = [], []
    for n in names:
        b = [r[n] for r in base]
        x = [r[n] for r in new]
        bmin, xmin = min(b), min(x)
        noise = max(0.01, (max(b) - bmin) / bmin, (max(x) - xmin) / xmin)
        ratio = xmin / bmin
        ratios.append(ratio)
        mark = "  SLOWER" if ratio > 1.0 + noise else ""
        if mark:
            slower.append(n)
        out.append(f"{n:58s} {bmin:9.2f} {xmin:9.2f} {ratio:8.3f} {100 * noise:5.1f}%{mark}")
    gm = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else float("nan")
    out.append(f"{len(names)} rows; geomean new/base {gm:.4f}; slower beyond noise: "
               f"{len(slower)}" + (" (" + ", ".join(slower) + ")" if slower else ""))
    text = "\n".join(out)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
