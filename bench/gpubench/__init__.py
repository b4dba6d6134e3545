"""gpubench — the pieces of bench/bench_gpu.py, one purpose each.

  common.py          constants, records (Rec, SweepRec), formatting helpers, the device setting
  shapes.py          the shape grid, the variant rows, the trace batches
  data.py            buffer sets (contiguous / paged / shared-prefix), the float64 reference
                     (window, soft-cap, sinks, non-causal included), the output check
  timing.py          CUDA-graph replay over rotating buffers, eager timing
  ceiling.py         the read ceiling: bench/probe/read_probe.cu through ctypes
  peers.py           flashdecode itself, PyTorch SDPA (flash, cuDNN), FlexAttention
  flashinfer_peers.py  FlashInfer's decode paths (CUDA-core, tensor-core, XQA, cuDNN, cascade)
  fi_prebuild.py     compiles FlashInfer's JIT modules in a background process (no GPU)
  runner.py          the phases of one run (GpuBench)
  report.py          CSV / PNG files, verdicts, the printed summary
  fake.py            --dry-run timings and --self-test
  cli.py             arguments and main()
"""
