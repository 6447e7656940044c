#!/usr/bin/env bash
# Memory per idle HTTP/1 keep-alive connection (issue 36): rondo against HAProxy, behind the
# same member, for 1,000 to ~18,000 held connections.
#
#   bench/idle.sh                  full run: 1,000 / 5,000 / 10,000 / 18,000 connections, 3 rounds
#   bench/idle.sh --quick          1,000 and 10,000 connections, one round
#
# Options:
#   --counts "N..."     connection counts (at most 19,000: the hard fd limit is 20,000 a process)
#   --rounds R          rounds (default 3; medians are reported)
#   --workers W         `rondo serve --workers W` (default: rondo's own default, one per core)
#   --rondo-only        skip HAProxy
#   --no-install        don't apt-get anything
#   --no-build          use the binaries already built (CARGO_TARGET_DIR or target/release)
#
# Each reading starts the proxy afresh (rondo with its default workers, HAProxy with
# `nbthread 1`; neither pinned), warms it with 0.5 s of requests, reads VmRSS, then
# `rondo-loadgen hold` opens N keep-alive connections (64 at a time), makes one request on
# each and holds them idle; one second after the last opened, VmRSS again. Per connection:
# (RSS held - RSS before) / N. Socket buffers are kernel memory and not in VmRSS. Idle timeouts
# are set to 10 minutes on both proxies so nothing closes while it is read. Ports 18400-18402
# (BENCH_PORT_BASE). The soft fd limit is raised to the hard one. Results: a table on stdout
# and in bench/results/idle.md (quick runs: bench/results/idle-quick.md).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

quick=0 install=1 build=1 rounds=3 workers="" rondo_only=0 counts=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --counts) shift; counts=${1:-} ;;
    --rounds) shift; rounds=${1:-} ;;
    --workers) shift; workers=${1:-} ;;
    --rondo-only) rondo_only=1 ;;
    --no-install) install=0 ;;
    --no-build) build=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/idle.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$counts" ]; then
  if [ "$quick" = 1 ]; then counts="1000 10000"; rounds=1; else counts="1000 5000 10000 18000"; fi
fi
case "$rounds" in ''|*[!0-9]*|0) echo "bench/idle.sh: --rounds is a positive number" >&2; exit 2 ;; esac
case "$workers" in *[!0-9]*) echo "bench/idle.sh: --workers is a positive number" >&2; exit 2 ;; esac
for n in $counts; do
  case "$n" in ''|*[!0-9]*|0) echo "bench/idle.sh: a count is a positive number" >&2; exit 2 ;; esac
  [ "$n" -le 19000 ] || { echo "bench/idle.sh: at most 19000 connections" >&2; exit 2; }
done

BASE=${BENCH_PORT_BASE:-18400}
MEMBER_PORT=$((BASE + 1))
declare -A PORT=([rondo]=$((BASE + 10)) [haproxy]=$((BASE + 11)))
PROXIES=(rondo)
[ "$rondo_only" = 1 ] || PROXIES+=(haproxy)

BENCH_NAME=bench-idle TMP_PREFIX=rondo-idle
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_tools "$install" haproxy:haproxy nginx:nginx-light taskset:util-linux
bench_binaries "$build"
[ -x "$LOADGEN" ] || die "missing $LOADGEN (build it first)"
ulimit -n "$(ulimit -Hn)"
FDS=$(ulimit -n)
ALL_CPUS=0-$(($(nproc) - 1))

for p in "$MEMBER_PORT" "${PORT[@]}"; do port_open "$p" && die "port $p is taken (set BENCH_PORT_BASE)"; done

idle_member_conf "$TMP/member.conf" "$MEMBER_PORT"
idle_rondo_conf "$TMP/rondo.toml" "${PORT[rondo]}" "$MEMBER_PORT"
cat >"$TMP/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn 19500
  # The hard limit here, allowed below what HAProxy would ask (two descriptors a connection;
  # only a few dozen member connections are open at once).
  ulimit-n 20000
  no strict-limits

defaults
  mode http
  option http-keep-alive
  option forwardfor
  http-reuse always
  timeout connect 5s
  timeout client 600s
  timeout server 600s
  timeout http-keep-alive 600s

frontend web
  bind 127.0.0.1:${PORT[haproxy]}
  default_backend members

backend members
  server m1 127.0.0.1:$MEMBER_PORT
EOF

start member "$ALL_CPUS" nginx -e "$TMP/member.err" -p "$TMP" -c "$TMP/member.conf" -g 'daemon off;'
wait_port "$MEMBER_PORT" member

# start_proxy NAME: starts the proxy afresh; its process id in PROXY_PID.
start_proxy() {
  case "$1" in
    rondo)
      local w=()
      [ -n "$workers" ] && w=(--workers "$workers")
      start rondo "$ALL_CPUS" "$RONDO" serve --config "$TMP/rondo.toml" "${w[@]}" --log-level warn
      PROXY_PID=$PID_rondo ;;
    haproxy)
      start haproxy "$ALL_CPUS" haproxy -db -f "$TMP/haproxy.cfg"
      PROXY_PID=$PID_haproxy ;;
  esac
  wait_port "${PORT[$1]}" "$1"
}

# hold_once NAME N: sets R_BEFORE and R_HELD (KiB) for N idle connections to a fresh proxy.
hold_once() {
  local px=$1 n=$2 out
  start_proxy "$px"
  out=$(timeout 20 "$LOADGEN" rate --target "127.0.0.1:${PORT[$px]}" --rate 400 --duration-secs 0.5 \
    --warmup-secs 0 --connections 4) || die "$px: warm-up failed: $out"
  sleep 0.5
  R_BEFORE=$(rss_kib "$PROXY_PID")
  hold_connections "127.0.0.1:${PORT[$px]}" "$n" 300 "$px"
  sleep 1
  R_HELD=$(rss_kib "$PROXY_PID")
  stop_pids "${HELD_PIDS[@]}"
  stop_pids "$PROXY_PID"
}

declare -A PER HELD_MIB BEFORE_MIB
log "$(printf '%s ' "${PROXIES[@]}")| counts: $counts | $rounds round(s) | fd limit $FDS | rondo ${workers:-default} workers"
for round in $(seq "$rounds"); do
  for n in $counts; do
    for px in "${PROXIES[@]}"; do
      hold_once "$px" "$n"
      before=$R_BEFORE held=$R_HELD
      per=$(awk -v a="$held" -v b="$before" -v n="$n" 'BEGIN {printf "%.2f", (a - b) / n}')
      log "  round $round, $n connections, $px: RSS $before KiB before, $held KiB held: $per KiB per connection"
      PER[$px,$n]+="$per "
      HELD_MIB[$px,$n]+="$(awk -v a="$held" 'BEGIN {printf "%.1f", a / 1024}') "
      BEFORE_MIB[$px,$n]+="$(awk -v a="$before" 'BEGIN {printf "%.1f", a / 1024}') "
    done
  done
done

out=$ROOT/bench/results/idle.md
[ "$quick" = 1 ] && out=$ROOT/bench/results/idle-quick.md
last=${counts##* }
{
  echo "Memory per idle HTTP/1 keep-alive connection: \`bench/idle.sh $([ "$quick" = 1 ] && echo --quick)\`, rondo $REV,"
  echo "$(haproxy -v | awk 'NR == 1 {print $1, $3}') (nbthread 1), rondo with ${workers:-its default} workers on $(nproc) cores;"
  echo "medians of $rounds round(s), each on a fresh process; load average at the start $LOADAVG."
  echo
  printf '| connections |'; for px in "${PROXIES[@]}"; do printf ' %s KiB/conn | %s RSS before → held (MiB) |' "$px" "$px"; done; echo
  printf '|---:|'; for _ in "${PROXIES[@]}"; do printf '%s' '---:|---:|'; done; echo
  for n in $counts; do
    printf '| %s |' "$n"
    for px in "${PROXIES[@]}"; do
      printf ' %s |  %s → %s |' "$(med "${PER[$px,$n]}")" "$(med "${BEFORE_MIB[$px,$n]}")" "$(med "${HELD_MIB[$px,$n]}")"
    done
    echo
  done
  echo
  for px in "${PROXIES[@]}"; do
    awk -v p="$(med "${PER[$px,$last]}")" -v b="$(med "${BEFORE_MIB[$px,$last]}")" -v px="$px" -v n="$last" \
      'BEGIN {printf "- %s at 100,000 connections, projected from %d: %.0f MiB (%.1f MiB + 100,000 × %.2f KiB)\n", px, n, b + p * 100000 / 1024, b, p}'
  done
} | tee "$out"
