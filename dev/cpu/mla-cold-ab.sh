#!/bin/sh
# Interleaved A/B of flashdecode CLIs on CPU MLA 16 heads B=1 16k bf16 (separate c_kv / k_pe
# caches, 2 threads, cold), with the GQA 32/8 d128 32k reference row from the first CLI:
#   dev/cpu/mla-cold-ab.sh ROUNDS NAME=CLI [NAME=CLI ...]   (CLI may be "VAR=x /path/cli")
rounds=$1; shift
mla="--backend cpu --threads 2 --num-heads-kv 1 --head-dim 512 --rope-dim 64 --num-heads-q 16 --kv-len 16384"
fields() { tr ' ' '\n' | grep -E '^(us|gbps|read_gbps|num_splits)=' | tr '\n' ' '; }
for r in $(seq 1 "$rounds"); do
  first=1
  for arg in "$@"; do
    name=${arg%%=*} exe=${arg#*=}
    echo "$r $name [mla h16 b1 16k]: $(eval "$exe bench $mla" | fields)"
    if [ $first = 1 ]; then
      echo "$r $name [gqa 32/8 d128 32k]: $(eval "$exe bench --backend cpu --threads 2 --num-heads-q 32 --num-heads-kv 8 --head-dim 128 --kv-len 32768" | fields)"
      first=0
    fi
  done
done
