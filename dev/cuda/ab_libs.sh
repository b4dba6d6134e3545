#!/usr/bin/env bash
# ab_libs.sh — which half of a change moved a benchmark row: the library or
# the Python package. Builds this tree and the one in .base/ (carried), runs
# the GPU tests named by FD_CTEST_QUICK, then times the rows whose names
# contain SHAPES (bench_gpu.py --no-peers --no-sweep) with every pair of
# (library, Python package) of the two trees, twice.
# Usage (on the GPU machine): OUT=... dev/cuda/ab_libs.sh [SHAPES] [--variants-only]
set -u
OUT=${OUT:-/tmp/fd-out}
mkdir -p "$OUT" /tmp/ab
SHAPES=${1:-var-prefix64}
shift
(cmake -S .base -B .base/build -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON -DFD_BUILD_TESTS=OFF \
   -DFD_BUILD_CLI=OFF >/tmp/b.txt 2>&1 && cmake --build .base/build -j 8 >>/tmp/b.txt 2>&1) &
bp=$!
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON >/tmp/n.txt 2>&1 &&
  cmake --build build -j 8 >>/tmp/n.txt 2>&1 || { echo "BUILD FAILED"; tail -30 /tmp/n.txt; exit 1; }
wait $bp || { echo "BASE BUILD FAILED"; tail -30 /tmp/b.txt; exit 1; }
if [ -n "${FD_CTEST_QUICK:-}" ]; then
  (cd build && ctest -R "$FD_CTEST_QUICK" --output-on-failure --timeout 300) >"$OUT/ctest-quick.txt" 2>&1
  grep -E "tests passed|FAIL|Passed|Failed" "$OUT/ctest-quick.txt" | head -30
fi
for round in 1 2; do
  for lib in base new; do
    for py in base new; do
      L=$PWD/build; [ $lib = base ] && L=$PWD/.base/build
      P=$PWD/python; [ $py = base ] && P=$PWD/.base/python
      FLASHDECODE_LIBRARY=$L/libflashdecode.so PYTHONPATH=$P \
        FD_READ_PROBE_LIBRARY=$PWD/build/libfd_read_probe.so timeout 150 \
        python3 bench/bench_gpu.py --no-peers --no-sweep --shapes "$SHAPES" "$@" \
        --tag "lib$lib-py$py-$round" --out-dir /tmp/ab --commit x --ceiling-reps 1 \
        >"/tmp/ab-$lib-$py-$round.txt" 2>&1 || tail -5 "/tmp/ab-$lib-$py-$round.txt"
      f=$(ls /tmp/ab/*"lib$lib-py$py-$round"-*.csv | grep -vE -- '-(check|sweep)\.csv$' | head -1)
      echo "lib=$lib py=$py round=$round: $(grep ',flashdecode,' "$f" | cut -d, -f1,3 | tr '\n' ' ')"
    done
  done
done | tee "$OUT/ab-libs.txt"
