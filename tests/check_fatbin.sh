#!/usr/bin/env bash
# check_fatbin.sh — the GPU code a built library holds, against the targets it
# was configured for (CMake FD_CUDA_ARCHS), read with cuobjdump:
#   every CUDA object holds SASS for exactly the configured sm_XX (e.g. sm_80
#   and sm_90a) and PTX for exactly the configured compute_XX (e.g.
#   compute_80); PTX for targets below sm_90 holds no griddepcontrol (the
#   Hopper-only instructions sit behind __CUDA_ARCH__ >= 900), PTX for sm_90+
#   does.
# Usage: check_fatbin.sh "SASS list" "PTX list" OBJECTS LIBRARY...
#   lists as CMake gives them ("sm_80;sm_90a", "compute_80"; may be empty),
#   OBJECTS: the number of CUDA objects (.cu files) in the library.
# cuobjdump: see find_cuobjdump.sh (without it: exit 77, ctest: skipped).
set -u
SASS_WANT=$1 PTX_WANT=$2 OBJECTS=$3
shift 3

# shellcheck source=tests/find_cuobjdump.sh
. "$(dirname "$0")/find_cuobjdump.sh" # sets tool, or exits 77

status=0
fail() { echo "FAIL: $*"; status=1; }

# "sm_80;sm_90a" -> sorted unique lines
norm() { tr ';' '\n' <<<"$1" | sed '/^$/d' | sort -u; }
# cuobjdump's names: ELF "...N.sm_90a.cubin", PTX "...N.sm_80.ptx" (compute_80)
want_sass=$(norm "$SASS_WANT")
want_ptx=$(norm "$(sed 's/compute_/sm_/g' <<<"$PTX_WANT")")

for lib in "$@"; do
  echo "== $lib"
  elf=$("$tool" --list-elf "$lib" 2>&1)
  ptx=$("$tool" --list-ptx "$lib" 2>&1)
  got_sass=$(grep -o 'sm_[0-9]*[af]\?\.cubin' <<<"$elf" | sed 's/\.cubin$//' | sort)
  got_ptx=$(grep -o 'sm_[0-9]*[af]\?\.ptx' <<<"$ptx" | sed 's/\.ptx$//' | sort)
  [ -n "$got_sass" ] || echo "(no SASS: $(head -1 <<<"$elf"))"
  [ -n "$got_ptx" ] || echo "(no PTX: $(head -1 <<<"$ptx"))"
  echo "SASS: $(sed '/^$/d' <<<"$got_sass" | uniq -c | awk '{printf "%s x%s  ", $2, $1}')"
  echo "PTX:  $(sed '/^$/d' <<<"$got_ptx" | uniq -c | awk '{printf "%s x%s  ", $2, $1}')"
  [ "$(sort -u <<<"$got_sass" | sed '/^$/d')" = "$want_sass" ] ||
    fail "$lib: SASS for [$(sort -u <<<"$got_sass" | tr '\n' ' ')], configured [$(tr '\n' ' ' <<<"$want_sass")]"
  [ "$(sort -u <<<"$got_ptx" | sed '/^$/d')" = "$want_ptx" ] ||
    fail "$lib: PTX for [$(sort -u <<<"$got_ptx" | tr '\n' ' ')], configured [$(tr '\n' ' ' <<<"$want_ptx")]"
  # every CUDA object holds every target
  for a in $want_sass; do
    n=$(grep -cx "$a" <<<"$got_sass")
    [ "$n" -eq "$OBJECTS" ] || fail "$lib: $n objects hold $a SASS, expected $OBJECTS"
  done
  for a in $want_ptx; do
    n=$(grep -cx "$a" <<<"$got_ptx")
    [ "$n" -eq "$OBJECTS" ] || fail "$lib: $n objects hold $a PTX, expected $OBJECTS"
  done
done

# griddepcontrol only in sm_90+ PTX (the first library; PTX is the same in all)
if [ -n "$want_ptx" ]; then
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  (cd "$dir" && "$tool" --extract-ptx all "$1" >/dev/null 2>&1)
  for a in $want_ptx; do
    num=$(sed 's/^sm_\([0-9]*\).*/\1/' <<<"$a")
    files=$(ls "$dir"/*."$a".ptx 2>/dev/null)
    [ -n "$files" ] || { fail "could not extract the $a PTX"; continue; }
    hits=$(cat $files | grep -c griddepcontrol)
    if [ "$num" -lt 90 ]; then
      [ "$hits" -eq 0 ] || fail "$a PTX holds $hits griddepcontrol instructions (sm_90+ only)"
      echo "$a PTX: no griddepcontrol (PDL compiled out)"
    else
      [ "$hits" -gt 0 ] || fail "$a PTX holds no griddepcontrol (PDL expected from sm_90 on)"
      echo "$a PTX: $hits griddepcontrol"
    fi
  done
fi
[ $status -eq 0 ] && echo "PASS"
exit $status
