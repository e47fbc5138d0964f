#!/usr/bin/env bash
# The judge: two builds of the load bench, run interleaved and paired.
#
#   benches/judge.sh [-n PAIRS] [-a 'CARGO FLAGS'] [-b 'CARGO FLAGS'] [-o DIR]
#                    [-t DIR] [--separate-targets] [--env-a 'K=V …'] [--env-b 'K=V …']
#                    [-i] A B [-- BENCH ARGS]
#
# A and B are commits (anything `git rev-parse` takes; the same commit twice
# with different flags compares features, e.g. allocators). Each is exported
# with `git archive` into a directory under /tmp and its load bench built
# once, in the bench profile (`cargo bench -p fanout-gateway --bench load
# --no-run`, plus that side's cargo flags: -a for A, -b for B, e.g.
# -b '--features alloc-mimalloc' or -a '--no-default-features --features otel').
# Both builds share one CARGO_TARGET_DIR under /tmp, so the dependencies both
# commits use are compiled once (--separate-targets: one per side); each
# executable is copied out and every build directory deleted before the
# first run, the rest on exit. -t DIR builds in DIR instead and keeps it:
# judging again then compiles only the workspace's crates (delete DIR after).
#
# Then PAIRS pairs (default 5) of runs, the order turning about so drift
# hits both alike: A B, B A, A B, … Each run prints a `judge:` line (the
# load bench's summary: `on.rps`, `on.cpu` — engine on's requests/s and µs
# of CPU per request, medians of its rounds —, the same for `stock` and
# `off`, and the paired ratios `on/stock.rps`, `on/stock.cpu`, `on/off.*`,
# `telemetry1.0/on.*`, …, and each side's minor page faults per request,
# `<side>.flt`; a commit from before that line: the summary's
# `on/off.*` and `on/stock.*` ratios). Per pair, each figure's B / A; printed per figure:
# the median over pairs, its spread (min, quartiles, max), how many pairs
# had B above A, and each side's median figure.
#
# The bench's environment passes through; unset, LOAD_ONLY=stock (engine
# on, stock protections, engine off) and LOAD_ROUNDS=3 (LOAD_SECS stays 3):
# a run takes ~40 s, the 5 pairs ~7 minutes, each build ~5–9 minutes on a
# 2-core machine (the second one less with the shared target).
# -o DIR keeps every run's output there. --env-a / --env-b set variables
# for that side's runs only: the same commit twice with different
# variables compares run-time settings (the allocator's, e.g.
# MIMALLOC_ALLOW_THP=0) on one executable, built once.
#
# Examples:
#   benches/judge.sh HEAD~1 HEAD
#   benches/judge.sh -b '--features alloc-jemalloc' HEAD HEAD     # mimalloc (the default) → jemalloc
#   benches/judge.sh -a '--no-default-features --features otel' HEAD HEAD  # glibc → mimalloc
#   LOAD_ROUNDS=5 benches/judge.sh -n 7 -o /tmp/judge-logs 1a83523 HEAD
#   benches/judge.sh --env-b 'MIMALLOC_ALLOW_THP=0' HEAD HEAD       # THP on → off, one build
#
# -i (--instructions): no clock at all. Each run counts, under valgrind's
# cachegrind (its cache simulated: the machine's L1 and last level, every
# thread on one simulated core), what one request costs each side in user
# space: the load bench sends exactly N1 then N2 requests to the side in two
# processes (LOAD_REQUESTS, LOAD_ONLY=<the side>), and the difference over
# N2 - N1 is a request's, whatever setting up costs. Figures per request:
# `<side>.ir` instructions, `<side>.d1` L1 data misses (reads and writes),
# `<side>.i1` L1 instruction misses (last-level misses, a few dozen a
# request, move more between runs than between commits: left out); ratios
# `on/stock.*`, `on/off.*`, and `<side>/on.*` for any other side. A
# process's count moves little between runs (wake-ups, timers), not with
# what else the machine runs: one executable counted twice, ≤ 0.3 % in
# instructions and ≤ 1 % in data misses; two builds of the same code (any
# change to a crate moves its layout and inlining), up to 0.6 % and 3 % —
# judge A against A first when a change is near those. Not
# CPU time — no kernel, no stall is counted, threads never run at once —
# but what the code executes and the memory it touches. Sides: JUDGE_SIDES
# (';'-separated LOAD_ONLY values, default 'on;stock;off'); N1, N2:
# JUDGE_REQUESTS (default '200 1200'); PAIRS defaults to 1. ~3 minutes a
# commit for the default sides. Both commits' load bench must know
# LOAD_REQUESTS (since 2026-12-07).
#   benches/judge.sh -i HEAD~1 HEAD
#   LOAD_TELEMETRY=1 JUDGE_SIDES='on;engine on, telemetry 1.0' benches/judge.sh -i HEAD HEAD
set -euo pipefail

pairs=""
instructions=0
flags_a=""
flags_b=""
keep=""
builds=""
separate=0
env_a=""
env_b=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n) pairs="$2"; shift 2 ;;
    -a) flags_a="$2"; shift 2 ;;
    -b) flags_b="$2"; shift 2 ;;
    -o) keep="$2"; shift 2 ;;
    -t) builds="$2"; shift 2 ;;
    --separate-targets) separate=1; shift ;;
    --env-a) env_a="$2"; shift 2 ;;
    --env-b) env_b="$2"; shift 2 ;;
    -i|--instructions) instructions=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) break ;;
    -*) echo "judge: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "usage: $0 [-n PAIRS] [-a FLAGS] [-b FLAGS] [-o DIR] [-t DIR] [--separate-targets] [--env-a VARS] [--env-b VARS] [-i] A B [-- BENCH ARGS]" >&2
  exit 2
fi
commit_a="$1"
commit_b="$2"
shift 2
[ "${1:-}" = "--" ] && shift
bench_args=("$@")

if [ "$instructions" = 1 ]; then
  pairs="${pairs:-1}"
  command -v valgrind >/dev/null || { echo "judge: -i needs valgrind" >&2; exit 2; }
  read -ra counts <<<"${JUDGE_REQUESTS:-200 1200}"
  if [ "${#counts[@]}" != 2 ] || [ "${counts[0]}" -ge "${counts[1]}" ]; then
    echo "judge: JUDGE_REQUESTS takes two numbers, the first the smaller" >&2
    exit 2
  fi
else
  pairs="${pairs:-5}"
fi

repo="$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
rev_a="$(git -C "$repo" rev-parse --verify "$commit_a^{commit}")"
rev_b="$(git -C "$repo" rev-parse --verify "$commit_b^{commit}")"
export LOAD_ONLY="${LOAD_ONLY-stock}"
export LOAD_ROUNDS="${LOAD_ROUNDS-3}"
export CARGO_INCREMENTAL=0

work="$(mktemp -d /tmp/judge.XXXXXX)"
trap 'rm -rf "$work"' EXIT
if [ -n "$keep" ]; then mkdir -p "$keep"; fi
# Where the sources and targets go: $work, deleted, or -t's, kept.
builds="${builds:-$work}"
mkdir -p "$builds"

# build SIDE REV FLAGS: the side's load bench, copied to $work/SIDE.bin.
build() {
  # The sources' directory is named by commit and flags: with -t, every
  # build judged before is still there (one target, no rebuild).
  local side="$1" rev="$2" flags="$3" target="$builds/target" src
  src="$builds/src-${rev:0:12}-$(printf '%s' "$flags" | cksum | cut -d' ' -f1)"
  if [ "$separate" = 1 ]; then target="$builds/target-$side"; fi
  # Files get the time they are written (-m), not their commit's: cargo
  # takes a workspace member's unit in both sources' copies for the same
  # unit (its metadata hashes the path relative to the workspace), so a
  # source older than the other side's build would be taken as built, and
  # B would be A's binary. Every build compiles the workspace's own crates.
  rm -rf "$src"
  mkdir -p "$src"
  git -C "$repo" archive --format=tar "$rev" | tar -x -m -C "$src"
  echo "judge: building $side = ${rev:0:7} ${flags:-(default features)} ..." >&2
  local started=$SECONDS exe
  # shellcheck disable=SC2086 # the flags are words
  exe="$(cd "$src" && CARGO_TARGET_DIR="$target" cargo bench -p fanout-gateway --bench load \
    --no-run $flags --message-format=json-render-diagnostics 2>"$work/build-$side.log" \
    | python3 -c 'import json, sys
for m in map(json.loads, sys.stdin):
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "load" \
            and m.get("executable"):
        print(m["executable"])')" || true
  [ -n "$exe" ] || {
    tail -30 "$work/build-$side.log" >&2
    echo "judge: no load bench executable for $side" >&2
    exit 1
  }
  cp "$exe" "$work/$side.bin"
  echo "judge: built $side in $((SECONDS - started)) s" >&2
  if [ "$builds" = "$work" ]; then
    rm -rf "$src"
    if [ "$separate" = 1 ]; then rm -rf "$target"; fi
  fi
}

build A "$rev_a" "$flags_a"
if [ "$rev_a" = "$rev_b" ] && [ "$flags_a" = "$flags_b" ]; then
  cp "$work/A.bin" "$work/B.bin" # one executable, two environments
else
  build B "$rev_b" "$flags_b"
fi
if cmp -s "$work/A.bin" "$work/B.bin"; then
  if [ "$rev_a" != "$rev_b" ] || [ "$flags_a" != "$flags_b" ]; then
    echo "judge: A and B built to the same executable; nothing to judge" >&2
    exit 1
  fi
fi
rm -rf "$work/target"

echo "judge: A = ${rev_a:0:7} ${flags_a:-(default features)}${env_a:+ with $env_a}"
echo "judge: B = ${rev_b:0:7} ${flags_b:-(default features)}${env_b:+ with $env_b}"
if [ "$instructions" = 1 ]; then
  echo "judge: $pairs pairs, instructions (cachegrind), sides ${JUDGE_SIDES:-on;stock;off}, requests ${JUDGE_REQUESTS:-200 1200}, $(date -u '+%Y-%m-%d %H:%M UTC')"
else
  echo "judge: $pairs pairs, LOAD_ONLY=$LOAD_ONLY LOAD_ROUNDS=$LOAD_ROUNDS LOAD_SECS=${LOAD_SECS:-3}${bench_args[*]:+, args ${bench_args[*]}}, $(date -u '+%Y-%m-%d %H:%M UTC')"
fi

# count BIN VARS: the judge: line of a request's instructions and simulated
# cache misses on each side (-i).
count() {
  local bin="$1" vars="$2" side n files=()
  local sides
  IFS=';' read -ra sides <<<"${JUDGE_SIDES:-on;stock;off}"
  for side in "${sides[@]}"; do
    side="$(sed 's/^ *//; s/ *$//' <<<"$side")"
    for n in ${JUDGE_REQUESTS:-200 1200}; do
      local out="$work/cg-$bin-$n-${#files[@]}"
      # shellcheck disable=SC2086 # the variables are words
      (cd "$work" && env $vars LOAD_ONLY="$side" LOAD_REQUESTS="$n" valgrind --tool=cachegrind \
        --cache-sim=yes --cachegrind-out-file="$out" "./$bin" --bench "${bench_args[@]}") \
        >"$out.log" 2>&1 || { tail -20 "$out.log" >&2; return 1; }
      grep -q "^load: $n requests answered" "$out.log" \
        || { echo "judge: $bin ran no counted requests (a bench without LOAD_REQUESTS?)" >&2; return 1; }
      files+=("$side" "$n" "$out")
    done
  done
  python3 - "${files[@]}" <<'PY'
import sys

def totals(path):
    events = summary = None
    for line in open(path):
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            summary = [int(x) for x in line.split()[1:]]
    return dict(zip(events, summary))

args = sys.argv[1:]
runs = {}
for i in range(0, len(args), 3):
    side, n, path = args[i], int(args[i + 1]), args[i + 2]
    runs.setdefault(side, []).append((n, totals(path)))
figures = {}
for side, ((n1, a), (n2, b)) in runs.items():
    per = lambda *events: sum(b[e] - a[e] for e in events) / (n2 - n1)
    key = side if side in ("on", "stock", "off") else side.replace(" ", "").replace(",", "_")
    figures[key] = {
        "ir": per("Ir"),
        "d1": per("D1mr", "D1mw"),
        "i1": per("I1mr"),
    }
line = []
for key, f in figures.items():
    line += [f"{key}.{k}={v:.1f}" for k, v in f.items()]
pairs = [("on", "stock"), ("on", "off")] + [(k, "on") for k in figures if k not in ("on", "stock", "off")]
for a, b in pairs:
    if a in figures and b in figures:
        line += [f"{a}/{b}.{k}={figures[a][k] / figures[b][k]:.4f}" for k in figures[a] if figures[b][k]]
print("judge: " + " ".join(line))
PY
}

figures="$work/figures"
: >"$figures"
for ((i = 1; i <= pairs; i++)); do
  if ((i % 2)); then order="A B"; else order="B A"; fi
  for side in $order; do
    log="$work/run-$i-$side.log"
    if [ "$side" = A ]; then vars="$env_a"; else vars="$env_b"; fi
    if [ "$instructions" = 1 ]; then
      count "$side.bin" "$vars" >"$log" 2>&1 \
        || { echo "judge: pair $i, side $side failed:" >&2; tail -20 "$log" >&2; exit 1; }
    else
      # shellcheck disable=SC2086 # the variables are words
      (cd "$work" && env $vars "./$side.bin" --bench "${bench_args[@]}") >"$log" 2>&1 \
        || { echo "judge: pair $i, side $side failed:" >&2; tail -20 "$log" >&2; exit 1; }
    fi
    line="$(grep '^judge:' "$log" | tail -1 || true)"
    # A commit from before the judge: line: its summary's ratios.
    [ -n "$line" ] || line="$(sed -nE \
      -e 's/^ratio engine on \/ engine off: throughput ([0-9.]+)×.*CPU per request ([0-9.]+)×.*/judge: on\/off.rps=\1 on\/off.cpu=\2/p' \
      -e 's/^engine on \/ stock protections: throughput ([0-9.]+)×.*CPU per request ([0-9.]+)×.*/judge: on\/stock.rps=\1 on\/stock.cpu=\2/p' \
      "$log" | sed 's/^judge: //' | paste -sd' ' | sed 's/^./judge: &/')"
    [ -n "$line" ] || { echo "judge: pair $i, side $side printed no judge: line" >&2; exit 1; }
    echo "$i $side ${line#judge: }" >>"$figures"
    echo "pair $i $side: ${line#judge: }"
    if [ -n "$keep" ]; then cp "$log" "$keep/"; fi
  done
done

python3 - "$figures" <<'EOF'
import sys
from collections import defaultdict

runs = defaultdict(dict)  # (pair, side) -> {figure: value}
order = []
for line in open(sys.argv[1]):
    pair, side, *fields = line.split()
    for field in fields:
        key, value = field.split("=", 1)
        runs[(int(pair), side)][key] = float(value)
        if key not in order:
            order.append(key)

def quantile(xs, q):
    xs = sorted(xs)
    at = (len(xs) - 1) * q
    lo = int(at)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (at - lo)

pairs = sorted({p for p, _ in runs})
print()
print("B / A per pair, then over the pairs: median [min, q1, q3, max]; B above A in how many pairs; each side's median")
print()
print("| figure | B / A median | min | q1 | q3 | max | B > A | A | B |")
print("|---|---|---|---|---|---|---|---|---|")
for key in order:
    both = [p for p in pairs if key in runs[(p, "A")] and key in runs[(p, "B")]]
    if not both:
        continue
    a = [runs[(p, "A")][key] for p in both]
    b = [runs[(p, "B")][key] for p in both]
    # A figure of 0 on A's side (no page fault in a run) has no ratio.
    if any(x == 0 for x in a):
        print(f"| {key} | n/a (A is 0 in a pair) | | | | | | {quantile(a, .5):.4g} | {quantile(b, .5):.4g} |")
        continue
    r = [y / x for x, y in zip(a, b)]
    above = sum(y > x for x, y in zip(a, b))
    print(f"| {key} | {quantile(r, .5):.4f} | {min(r):.4f} | {quantile(r, .25):.4f} | "
          f"{quantile(r, .75):.4f} | {max(r):.4f} | {above}/{len(r)} | "
          f"{quantile(a, .5):.4g} | {quantile(b, .5):.4g} |")
EOF
