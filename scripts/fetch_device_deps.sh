#!/usr/bin/env bash
# fetch_device_deps.sh — unpack what the GPU machine lacks (it reaches no
# network) into .deps/ (git-ignored), to be carried with the device call:
# cmocka from Debian's packages; the serving traces from ../shared.
set -eu
cd "$(dirname "$0")/.."
mkdir -p .deps && cd .deps
apt-get download libcmocka0 libcmocka-dev
for f in *.deb; do dpkg -x "$f" root; done
cd ..
if [ -d ../shared/data/traces ]; then
  mkdir -p shared_data && cp -r ../shared/data/traces shared_data/
else
  echo "fetch_device_deps.sh: no ../shared/data/traces next to the repository;" \
       "the ragged benchmark rows need those traces (bench_gpu.py --traces DIR)" >&2
fi
