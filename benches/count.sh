#!/usr/bin/env bash
# A read's instructions, counted under callgrind (not timed):
#
#   benches/count.sh [-n N] [MODE …]      (default: -n 2000 hit hit-new get keep miss)
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
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "count.sh: -n takes a count of reads, 1 or more" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "count.sh: needs valgrind" >&2; exit 2; }
modes=("$@")
[[ ${#modes[@]} -eq 0 ]] && modes=(hit hit-new get keep miss)
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if ! cargo bench --bench read_counted --no-run >"$out/build" 2>&1; then
  cat "$out/build" >&2
  exit 1
fi
exe=$(sed -n 's/.*(\(.*read_counted-[0-9a-f]*\)).*/\1/p' "$out/build" | tail -1)
[[ -x "$exe" ]] || { cat "$out/build" >&2; echo "count.sh: no read_counted executable" >&2; exit 1; }
count() { # mode reads -> instructions of the whole run
  if ! valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$exe" "$1" "$2" >"$out/run" 2>&1; then
    cat "$out/run" >&2
    return 1
  fi
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/run"
}
for mode in "${modes[@]}"; do
  # A mode's baseline: the same run with no reads — or, for the first hits
  # on entries kept beforehand, the same entries kept and not read again.
  case "$mode" in
    hit-new) none=$(count warm-new "$n") ;;
    *) none=$(count "$mode" 0) ;;
  esac
  some=$(count "$mode" "$n")
  echo "$mode: $(( (some - none) / n )) instructions a read ($n reads: $some, baseline: $none)"
done
