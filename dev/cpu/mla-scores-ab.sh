#!/bin/sh
# Interleaved A/B of two flashdecode CLIs on the CPU MLA shapes (separate c_kv / k_pe caches)
# and the GQA reference row: dev/cpu/mla-scores-ab.sh OLD NEW ROUNDS (2 threads, cold).
old=$1 new=$2 rounds=${3:-2}
mla="--backend cpu --threads 2 --num-heads-kv 1 --head-dim 512 --rope-dim 64"
fields() { tr ' ' '\n' | grep -E '^(us|gbps|read_gbps|pct_read|num_splits)=' | tr '\n' ' '; }
for r in $(seq 1 "$rounds"); do
  for bin in old new; do
    eval exe=\$$bin
    for shape in "--num-heads-q 16 --kv-len 16384" "--num-heads-q 16 --kv-len 16384 --batch 4" \
                 "--num-heads-q 128 --kv-len 4096" "--num-heads-q 16 --kv-len 16384 --q-len 2"; do
      echo "$r $bin [$shape]: $($exe bench $mla $shape | fields)"
    done
    echo "$r $bin [gqa 32/8 d128 32k]: $($exe bench --backend cpu --threads 2 --num-heads-q 32 --num-heads-kv 8 --head-dim 128 --kv-len 32768 | fields)"
  done
done
