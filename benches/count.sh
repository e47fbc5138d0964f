#!/usr/bin/env bash
# A read's instructions, counted under callgrind (not timed):
#
#   benches/count.sh [-n N] [MODE …]      (default: -n 2000 hit get keep miss)
#
# Builds `benches/read_counted.rs` in the bench profile, runs it under
# `valgrind --tool=callgrind` with N reads of MODE and with none, and prints
# the difference over N: one read's instructions, its making included (see
# that file for the modes). Repeatable for one binary whatever else the
# machine does; two builds of one tree can differ by a few tenths of a
# percent (code placement). Needs valgrind.
set -euo pipefail
n=2000
if [[ "${1:-}" == "-n" ]]; then n=$2; shift 2; fi
modes=("$@")
[[ ${#modes[@]} -eq 0 ]] && modes=(hit get keep miss)
cd "$(dirname "$0")/.."
exe=$(cargo bench --bench read_counted --no-run 2>&1 | sed -n 's/.*(\(.*read_counted-[0-9a-f]*\)).*/\1/p' | tail -1)
[[ -x "$exe" ]] || { echo "count.sh: no read_counted executable" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
count() { # mode reads -> instructions of the whole run
  valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$exe" "$1" "$2" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
for mode in "${modes[@]}"; do
  none=$(count "$mode" 0)
  some=$(count "$mode" "$n")
  echo "$mode: $(( (some - none) / n )) instructions a read ($n reads: $some, none: $none)"
done
