#!/bin/sh
# Interleaved A/B of two flashdecode CLIs on the CPU MLA shapes and the GQA
# reference row: dev/cpu/mla-values-ab.sh OLD NEW ROUNDS (2 threads, cold).
old=$1 new=$2 rounds=${3:-2}
mla="--backend cpu --threads 2 --num-heads-kv 1 --head-dim 512 --rope-dim 64"
for r in $(seq 1 "$rounds"); do
  for bin in old new; do
    eval exe=\$$bin
    for shape in "--num-heads-q 16 --kv-len 16384" "--num-heads-q 16 --kv-len 16384 --batch 4" \
                 "--num-heads-q 128 --kv-len 4096" "--num-heads-q 16 --kv-len 16384 --q-len 2"; do
      line=$($exe bench $mla $shape)
      echo "$r $bin [$shape]: $(echo "$line" | grep -o ' us=[0-9.]*\| gbps=[0-9.]*\| pct_read=[0-9.]*' | tr -d '\n')"
    done
    line=$($exe bench --backend cpu --threads 2 --num-heads-q 32 --num-heads-kv 8 --head-dim 128 --kv-len 32768)
    echo "$r $bin [gqa 32/8 d128 32k]: $(echo "$line" | grep -o ' us=[0-9.]*\| gbps=[0-9.]*\| pct_read=[0-9.]*' | tr -d '\n')"
    line=$($exe bench --backend cpu --threads 2 --num-heads-q 16 --num-heads-kv 1 --head-dim 256 --kv-len 32768)
    echo "$r $bin [mqa 16/1 d256 32k]: $(echo "$line" | grep -o ' us=[0-9.]*\| gbps=[0-9.]*\| pct_read=[0-9.]*' | tr -d '\n')"
  done
done
