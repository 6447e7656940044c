#!/usr/bin/env bash
# Balancing overhead, the PKUAS table: call latency over loopback with balancing off (direct),
# per lookup (the naming service picks once) and per request (rondo-client picks every call),
# for 16 B, 1 KiB and 64 KiB payloads. See `rondo-overhead --help` and docs/benchmarks.md.
#
#   bench/overhead.sh            full run: 10,000 calls per mode and payload, pinned to one CPU,
#                                then the same unpinned (about a minute once built); writes
#                                bench/results/overhead.md
#   bench/overhead.sh --quick    smoke run (a few seconds), pinned only, stdout only
#
# Options:
#   --no-build     use target/release/rondo-overhead as it is
#   -- ARGS        passed to rondo-overhead (e.g. -- --calls 20000 --sizes 16)
#
# Environment: OVERHEAD_CPU (default 0) is the CPU the pinned run uses.
#
# Why pinned: with one call in flight the caller and the members never run at the same time, so
# one CPU loses nothing; on two CPUs every call wakes a thread on the other vCPU, and on this
# kind of VM waking an idle vCPU costs tens of microseconds (an IPI through the hypervisor) and
# varies with whatever else the host runs. The pinned run measures the call; the unpinned run
# shows what the wake-ups add on top.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

quick=0
build=1
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --no-build) build=0 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/overhead.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$build" = 1 ]; then
  cargo build --release -p rondo-bench --bin rondo-overhead >&2
  cargo build --release -p rondo --bin rondo >&2
fi
bin=target/release/rondo-overhead
# The router mode (CLB's "over the network") when a release rondo is there.
if [ -x target/release/rondo ]; then
  extra=(--rondo target/release/rondo "${extra[@]}")
fi
[ -x "$bin" ] || { echo "bench/overhead.sh: $bin is missing (run without --no-build)" >&2; exit 1; }
cpu=${OVERHEAD_CPU:-0}
command -v taskset >/dev/null || { echo "bench/overhead.sh: taskset (util-linux) is missing" >&2; exit 1; }

if [ "$quick" = 1 ]; then
  exec taskset -c "$cpu" "$bin" --quick "${extra[@]}"
fi

out=bench/results/overhead.md
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
{
  echo "# Balancing overhead (PKUAS table): raw output"
  echo
  echo "Date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet -- . ':!bench/results' 2>/dev/null || echo ' plus working-tree changes')."
  echo "Machine: $(nproc) vCPUs, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), Linux $(uname -r)."
  echo "Command: \`bench/overhead.sh${extra[*]:+ -- ${extra[*]}}\`."
  echo
  echo "## Pinned to CPU $cpu (\`taskset -c $cpu $bin${extra[*]:+ ${extra[*]}}\`)"
  echo
  taskset -c "$cpu" "$bin" "${extra[@]}"
  echo
  echo "## Unpinned, $(nproc) vCPUs (\`$bin${extra[*]:+ ${extra[*]}}\`)"
  echo
  "$bin" "${extra[@]}"
} | tee "$tmp"
mkdir -p bench/results
cp "$tmp" "$out"
echo "bench/overhead.sh: written to $out" >&2
