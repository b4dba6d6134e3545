#!/usr/bin/env python3
"""bench_gpu.py — the decode-attention benchmark of flashdecode (H200): the read ceiling, our
CUDA backend on the benchmark grid and the attention-variant rows, and the peers (PyTorch SDPA,
FlashInfer's decode paths, FlexAttention) on the same rows, each output checked against a
float64 reference. `python3 bench/bench_gpu.py --help` says more; the code is in
bench/gpubench/ (one module per purpose, listed in its __init__.py).

  python3 bench/bench_gpu.py [--quick] [--shapes a,b] [--variants-only] [--no-peers] ...
  python3 bench/bench_gpu.py --dry-run      # no GPU: made-up timings through the reporting
  python3 bench/bench_gpu.py --self-test    # CPU: the reference, its variants, the layouts
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpubench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
