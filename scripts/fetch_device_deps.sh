#!/usr/bin/env bash
# fetch_device_deps.sh — unpack what the GPU machine lacks (it reaches no
# network) into .deps/ (git-ignored), to be carried with the device call:
# cmocka from Debian's packages. (The serving traces are in the repository:
# bench/data.)
set -eu
cd "$(dirname "$0")/.."
mkdir -p .deps && cd .deps
apt-get download libcmocka0 libcmocka-dev
for f in *.deb; do dpkg -x "$f" root; done
