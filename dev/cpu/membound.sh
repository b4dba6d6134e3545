#!/bin/sh
# dev/cpu/membound.sh BIN [threads...] — the memory-bound grid of
# dev/cpu-memory-bound.md: 32/8 d128 and MQA 32/1 d128, B=1 and B=8,
# f32/bf16/f16/e4m3 at 16 MB and 64 MB of K+V, CLI timing (median of
# --iters, inputs rotated over 4 x LLC) and its read probe (pct_read).
# Prints: threads hkv batch dtype mb kv_len us gbps read_gbps pct_read load1
BIN=${1:-build-cpu/flashdecode}; shift
THREADS=${*:-"1 2"}
SIZES=${SIZES:-"16 64"}
DTYPES=${DTYPES:-"f32 bf16 f16 e4m3"}
SHAPES=${SHAPES:-"8:1 8:8 1:1 1:8"}   # hkv:batch
for th in $THREADS; do for sh in $SHAPES; do hkv=${sh%:*}; bt=${sh#*:}
for mb in $SIZES; do for dt in $DTYPES; do
  case $dt in f32) es=4; a="--dtype f32";; bf16) es=2; a="--dtype bf16";;
    f16) es=2; a="--dtype f16";; e4m3) es=1; a="--dtype bf16 --kv-dtype e4m3";; esac
  n=$(( mb * 1048576 / (2 * bt * hkv * 128 * es) ))
  line=$(nice -n 5 $BIN bench --backend cpu --threads $th --batch $bt --num-heads-q 32 \
     --num-heads-kv $hkv --head-dim 128 --kv-len $n $a --iters ${ITERS:-30} 2>&1)
  us=$(echo "$line" | sed -n 's/.*\bus=\([0-9.]*\).*/\1/p')
  g=$(echo "$line" | sed -n 's/.*\bgbps=\([0-9.]*\).*/\1/p')
  r=$(echo "$line" | sed -n 's/.*read_gbps=\([0-9.]*\).*/\1/p')
  p=$(echo "$line" | sed -n 's/.*pct_read=\([0-9.]*\).*/\1/p')
  ns=$(echo "$line" | sed -n 's/.*num_splits=\([0-9]*\).*/\1/p')
  echo "$th $hkv $bt $dt $mb $n $us $g $r $p $ns $(cut -d' ' -f1 /proc/loadavg)"
done; done; done; done
