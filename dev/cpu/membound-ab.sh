#!/bin/sh
# dev/cpu/membound-ab.sh BASE NEW [threads...] — dev/cpu/membound.c built
# against two libraries (base, new), run interleaved per configuration (cold:
# input sets rotated over >= 256 MiB): 32/8 and MQA 32/1 d128, B=1 and B=8,
# f32/bf16/f16/e4m3 (q bf16, tensor scales), 16 and 64 MB of K+V.
# NEW_ISAS: the FD_CPU_ISA values the new library runs (default "auto").
# Prints: bin isa threads hkv batch dtype mb us gbps cpu_us cpu_gbps load1
BASE=$1; NEW=$2; shift 2
THREADS=${*:-"1 2"}
SIZES=${SIZES:-"16 64"}
DTYPES=${DTYPES:-"f32 bf16 f16 e4m3"}
SHAPES=${SHAPES:-"8:1 8:8 1:1"}
NEW_ISAS=${NEW_ISAS:-auto}
run() { # bin label isa th hkv bt dt mb
  line=$(FD_CPU_ISA=$3 nice -n 5 $1 $4 $5 $6 $7 $8 2>&1)
  us=$(echo "$line" | sed -n 's/.* us=\([0-9.]*\).*/\1/p'); g=$(echo "$line" | sed -n 's/.* gbps=\([0-9.]*\).*/\1/p')
  cu=$(echo "$line" | sed -n 's/.*cpu_us=\([0-9.]*\).*/\1/p'); cg=$(echo "$line" | sed -n 's/.*cpu_gbps=\([0-9.]*\).*/\1/p')
  echo "$2 $3 $4 $5 $6 $7 $8 $us $g $cu $cg $(cut -d' ' -f1 /proc/loadavg)"
}
for th in $THREADS; do for sh in $SHAPES; do hkv=${sh%:*}; bt=${sh#*:}
for mb in $SIZES; do for dt in $DTYPES; do
  run $BASE base auto $th $hkv $bt $dt $mb
  for isa in $NEW_ISAS; do run $NEW new $isa $th $hkv $bt $dt $mb; done
done; done; done; done
