#!/usr/bin/env python3
"""Summarise Nsight Compute's source page (`ncu -i R --page source --csv --print-source sass`):
the stall samples by SASS opcode and the instructions with the most samples, with their
neighbourhood so a wait can be tied to the code around it. Usage: ncu_source_summary.py FILE.csv"""
import csv
import re
import sys
from collections import defaultdict


def main(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head_at = next((i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r)), None)
    if head_at is None:
        print("no header with a Source column; first lines:")
        for r in rows[:8]:
            print("  ", r)
        return
    head = [c.strip() for c in rows[head_at]]
    print("columns:", "; ".join(head))
    src = head.index("Source")
    addr = next((i for i, c in enumerate(head) if "Address" in c), None)
    samp = [i for i, c in enumerate(head) if "Sampling" in c or c.lower().startswith("stall")]
    if not samp:
        print("no sampling columns")
        return
    key = samp[0]

    def num(r, i):
        try:
            return float(r[i].replace(",", ""))
        except (ValueError, IndexError):
            return 0.0

    body = [r for r in rows[head_at + 1:] if len(r) > src]
    total = sum(num(r, key) for r in body) or 1.0
    by_op = defaultdict(float)
    for r in body:
        text = re.sub(r"^@!?U?P\w+\s+", "", r[src].strip())
        by_op[text.split(" ")[0] if text else "?"] += num(r, key)
    print(f"\n{head[key]}: {total:.0f} samples; by opcode:")
    for op, v in sorted(by_op.items(), key=lambda x: -x[1])[:25]:
        print(f"  {op:28s} {v:10.0f} {100 * v / total:5.1f}%")
    print("\ntop instructions (index, address, samples, %, text), with the 3 before each:")
    order = sorted(range(len(body)), key=lambda i: -num(body[i], key))[:25]
    for i in sorted(order):
        for j in range(max(0, i - 3), i):
            print(f"      {j:5d} {body[j][addr] if addr is not None else '':>8s}         {body[j][src].strip()[:80]}")
        extra = " ".join(f"{head[c][:18]}={num(body[i], c):.0f}" for c in samp[1:4])
        print(f"  >>> {i:5d} {body[i][addr] if addr is not None else '':>8s} {num(body[i], key):7.0f} "
              f"{100 * num(body[i], key) / total:4.1f}% {body[i][src].strip()[:80]}  {extra}")


if __name__ == "__main__":
    main(sys.argv[1])
