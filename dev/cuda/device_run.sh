#!/bin/bash
# device_run.sh — one device session for the CUDA kernels, from the repository
# root on an sm_90 GPU: builds check_kernels.cu and time_kernels.cu (objects in
# parallel, ptxas -v kept), summarises registers/spills and the SASS of the
# tensor-core kernel (HMMA count, local memory), runs the correctness check,
# the timing (old vs new, split sweep), then compute-sanitizer racecheck and
# memcheck on the tensor-core subsets. Full logs go to OUTDIR; stdout gets a
# short summary. A variant of the kernel can be timed by building
# split_mma_kernel.cu with other -D flags into its own object and linking
# tk.o against it (time_kernels -n TAG prints new-path lines only).
#   bash dev/cuda/device_run.sh OUTDIR
set -u
OUT=${1:-/tmp/fd_out}
B=/tmp/fd_build
mkdir -p "$OUT" "$B"
NV="nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Iinclude -Isrc"
t0=$(date +%s)
for f in split_kernel split_mma_kernel split_mma_fp8 combine_kernel cuda_backend; do
  $NV -Xptxas -v -c src/cuda/$f.cu -o $B/$f.o >$B/$f.log 2>&1 &
done
$NV -c dev/cuda/check_kernels.cu -o $B/ck.o >$B/ck.log 2>&1 &
$NV -c dev/cuda/time_kernels.cu -o $B/tk.o >$B/tk.log 2>&1 &
gcc -O2 -std=c11 -Iinclude -Isrc -c src/plan.c -o $B/plan.o &
gcc -O2 -std=c11 -Iinclude -Isrc -c src/errors.c -o $B/errors.o &
wait
cat $B/*.log >"$OUT/build.log"
NL="nvcc -gencode=arch=compute_90a,code=sm_90a"
COMMON="$B/split_kernel.o $B/split_mma_fp8.o $B/combine_kernel.o"
HOST="$B/cuda_backend.o $B/plan.o $B/errors.o"
$NL $B/ck.o $B/split_mma_kernel.o $COMMON -o $B/fd_check ||
  { grep -iE "error" "$OUT/build.log" | head -20; exit 1; }
$NL $B/tk.o $B/split_mma_kernel.o $COMMON $HOST -o $B/fd_time || exit 1
echo "build $(($(date +%s) - t0)) s"

# ptxas: one line per tensor-core instance (default build).
awk '/Compiling entry function/ { match($0, /fd_split_mma_kernelI[^E]*E/); n = substr($0, RSTART + 20, RLENGTH - 20) }
     /spill/ && n != "" { sp = $0 } /Used [0-9]+ registers/ && n != "" { print "ptxas", n, $5, "regs |", sp; n = "" }' \
  $B/split_mma_kernel.log | sed 's/ bytes/B/g'
grep -A3 "fd_combine_kernel" $B/combine_kernel.log | grep -E "Used" | head -1 | sed 's/^/combine: /'
cuobjdump -sass $B/split_mma_kernel.o >$B/sass.txt 2>&1
echo "SASS: HMMA $(grep -c HMMA $B/sass.txt), LDSM $(grep -c LDSM $B/sass.txt), LDGSTS $(grep -c LDGSTS $B/sass.txt), LDL/STL $(grep -cE 'LDL|STL' $B/sass.txt)"
gzip -c $B/sass.txt >"$OUT/sass_mma.txt.gz"

t1=$(date +%s)
$B/fd_check >"$OUT/check.log" 2>&1
echo "check rc=$? ($(($(date +%s) - t1)) s)"
grep -E "FAIL|passed|error" "$OUT/check.log" | head -20

$B/fd_time 2>&1 | tee "$OUT/time.log"

t1=$(date +%s)
timeout 60 compute-sanitizer --tool racecheck --racecheck-report hazard $B/fd_check -r >"$OUT/racecheck.log" 2>&1
echo "racecheck rc=$? ($(($(date +%s) - t1)) s): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed' "$OUT/racecheck.log" | tr '\n' ' ')"
grep -m3 -E "Error:|Thread" "$OUT/racecheck.log"
t1=$(date +%s)
timeout 40 compute-sanitizer --tool memcheck $B/fd_check -s >"$OUT/memcheck.log" 2>&1
echo "memcheck rc=$? ($(($(date +%s) - t1)) s): $(grep -E 'ERROR SUMMARY|passed' "$OUT/memcheck.log" | tr '\n' ' ')"

echo "total $(($(date +%s) - t0)) s"
