#!/usr/bin/env bash
# san_ab_call.sh — one device call for the restructuring issue's last GPU checks:
#   1 dev/cuda/san_shards.sh's compute-sanitizer runs (racecheck of the GPU grid's bf16
#     d128 cases in shards, the reliability suite under the four tools), while the
#     base tree (.base, carried: `git archive <rev> | tar -x -C .base`) builds its library
#   2 the A/B rows: bench_gpu.py --no-peers --no-sweep --shapes $FD_AB_SHAPES on the base
#     and this tree, alternating FD_AB_ROUNDS times; bench/compare_builds.py's table
#   3 Nsight Compute of FD_AB_NCU's split kernel on both builds
# Usage on the device: OUT=... FD_AB_SHAPES=b1-h32/8-d128 FD_AB_NCU=b1-h32/8-d128-bf16-n4096
#   dev/cuda/san_ab_call.sh
set -u
OUT=${OUT:-/tmp/fd-out}
mkdir -p "$OUT"
start=$(date +%s)
[ -f .base/CMakeLists.txt ] || { echo "no .base/ carried"; exit 1; }
(cmake -S .base -B .base/build -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON -DFD_CUDA_ARCHS=90a-real \
   -DFD_BUILD_TESTS=OFF -DFD_BUILD_CLI=OFF && cmake --build .base/build -j 6 --target flashdecode) \
  >/tmp/fd-build-base.txt 2>&1 &
base_pid=$!
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFD_CUDA=ON -DFD_CUDA_ARCHS=90a-real >/tmp/fd-b0.txt 2>&1 &&
  cmake --build build -j 10 --target flashdecode fd_read_probe >>/tmp/fd-b0.txt 2>&1 ||
  { tail -30 /tmp/fd-b0.txt; exit 1; }
dev/cuda/san_shards.sh
echo "sanitizer part done at $(( $(date +%s) - start )) s"
wait "$base_pid" || { echo "BASE BUILD FAILED"; tail -30 /tmp/fd-build-base.txt; exit 1; }
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
mkdir -p /tmp/fd-ab
for i in $(seq 1 "${FD_AB_ROUNDS:-3}"); do
  for which in base new; do
    if [ $which = base ]; then dir=.base; else dir=.; fi
    (cd $dir && FLASHDECODE_LIBRARY="$PWD/build/libflashdecode.so" PYTHONPATH="$PWD/python" \
      FD_READ_PROBE_LIBRARY="$OLDPWD/build/libfd_read_probe.so" timeout 120 \
      python3 bench/bench_gpu.py --no-peers --no-sweep --tag "$which$i" --out-dir /tmp/fd-ab \
      --shapes "${FD_AB_SHAPES:?}" --traces "$OLDPWD/bench/data" --commit "$COMMIT" --ceiling-reps 3) \
      >"/tmp/fd-ab-$which$i.txt" 2>&1 || { echo "   $which$i failed"; tail -12 "/tmp/fd-ab-$which$i.txt"; }
  done
done
main_csv() { ls /tmp/fd-ab/*-"$1"-*.csv | grep -vE -- '-(check|sweep)\.csv$' | head -1; }
bases=(); news=()
for i in $(seq 1 "${FD_AB_ROUNDS:-3}"); do bases+=("$(main_csv base$i)"); news+=("$(main_csv new$i)"); done
python3 bench/compare_builds.py --base "${bases[@]}" --new "${news[@]}" --out "$OUT/ab-compare.txt"
cat "$OUT/ab-compare.txt"
(cd /tmp/fd-ab && tar czf "$OUT/ab-runs.tgz" *.csv *.json 2>/dev/null)
echo "A/B done at $(( $(date +%s) - start )) s"
if [ -n "${FD_AB_NCU:-}" ]; then
  for which in base new; do
    if [ $which = base ]; then dir=.base; else dir=.; fi
    (cd $dir && FLASHDECODE_LIBRARY="$PWD/build/libflashdecode.so" PYTHONPATH="$PWD/python" \
      FD_READ_PROBE_LIBRARY="$OLDPWD/build/libfd_read_probe.so" timeout 100 \
      ncu -k regex:fd_split_mma_kernel --launch-skip 20 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        --section LaunchStats --section Occupancy --section InstructionStats --print-details all \
        python3 bench/bench_gpu.py --no-peers --no-sweep --shapes "$FD_AB_NCU" \
        --out-dir /tmp/fd-ab-ncu-$which --traces "$OLDPWD/bench/data" --ceiling-reps 1) \
      >"$OUT/ab-ncu-$which.txt" 2>&1
    echo "   [$which]"
    grep -E "Duration|Issue Slots Busy|Warp Cycles Per Issued|Stall [A-Z]|Registers Per|Executed Instructions  " \
      "$OUT/ab-ncu-$which.txt" | head -20 | sed 's/^/     /'
  done
fi
echo "done at $(( $(date +%s) - start )) s"
