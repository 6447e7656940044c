#!/usr/bin/env bash
# Connection-count soak (issue 36): 50,000 idle HTTP/1 keep-alive connections in all, opened
# and closed in waves of up to 15,000 over 10 minutes, against one `rondo serve` with its
# default workers. Afterwards its RSS must be back within 10 % of where it started, and it must
# hold exactly the descriptors it held before (no fd leaked).
#
#   bench/soak.sh              the full soak: waves of 15,000, 15,000, 10,000, 10,000, 10 minutes
#   bench/soak.sh --quick      10,000 in waves of 5,000 over about a minute
#
# Options: --no-build (use the binaries already built: CARGO_TARGET_DIR or target/release),
# --no-install (don't apt-get nginx). Ports 18450-18460 (BENCH_PORT_BASE).
#
# Each wave: `rondo-loadgen hold` processes (at most 9,000 connections each: a process has
# 20,000 descriptors here) open the wave's connections 64 at a time, one request on each, and
# hold them; at the wave's end they exit, the kernel closes their sockets, and rondo sees each
# close. RSS (VmRSS) and open descriptors (/proc/PID/fd, less the idle upstream connections
# rondo keeps for later requests, counted with `ss`) are read before the first wave, with each
# wave held, and once the last wave's client sockets are gone from rondo (or after 30 s). Exit
# status 1 when either check fails. Results: stdout and bench/results/soak.md (quick: soak-quick.md).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

quick=0 install=1 build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --no-install) install=0 ;;
    --no-build) build=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/soak.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$quick" = 1 ]; then WAVES=(5000 5000) PERIOD=30; else WAVES=(15000 15000 10000 10000) PERIOD=150; fi

BASE=${BENCH_PORT_BASE:-18450}
MEMBER_PORT=$((BASE + 1)) PORT=$((BASE + 10))
BENCH_NAME=bench-soak TMP_PREFIX=rondo-soak
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_tools "$install" nginx:nginx-light
bench_binaries "$build"
[ -x "$LOADGEN" ] || die "missing $LOADGEN (build it first)"
ulimit -n "$(ulimit -Hn)"
ALL_CPUS=0-$(($(nproc) - 1))
for p in "$MEMBER_PORT" "$PORT"; do port_open "$p" && die "port $p is taken (set BENCH_PORT_BASE)"; done

idle_member_conf "$TMP/member.conf" "$MEMBER_PORT"
idle_rondo_conf "$TMP/rondo.toml" "$PORT" "$MEMBER_PORT"

start member "$ALL_CPUS" nginx -e "$TMP/member.err" -p "$TMP" -c "$TMP/member.conf" -g 'daemon off;'
wait_port "$MEMBER_PORT" member
start rondo "$ALL_CPUS" "$RONDO" serve --config "$TMP/rondo.toml" --log-level warn
wait_port "$PORT" rondo
fds() { find "/proc/$PID_rondo/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
# rondo's TCP sockets towards the member (idle upstream connections it keeps, up to 256 per
# member, for a later request: not a leak) and from clients (its listener's port).
socks() { ss -tanpH 2>/dev/null | grep "pid=$PID_rondo," | awk -v p=":$1\$" "\$1 != \"LISTEN\" && \$$2 ~ p" | wc -l; }
upstream() { socks "$MEMBER_PORT" 5; }
active() { socks "$PORT" 4; }
# own: descriptors other than the kept upstream connections.
own() { echo $(($(fds) - $(upstream))); }
# settle: waits (at most 30 s) until rondo holds no client connection.
settle() {
  for _ in $(seq 300); do
    [ "$(active)" = 0 ] && return 0
    sleep 0.1
  done
  log "rondo still counts $(active) active connections after 30 s"
}

out=$(timeout 20 "$LOADGEN" rate --target "127.0.0.1:$PORT" --rate 400 --duration-secs 1 \
  --warmup-secs 0 --connections 4) || die "warm-up failed: $out"
settle
sleep 1
RSS0=$(rss_kib "$PID_rondo") FD0=$(own) UP0=$(upstream)
log "start: RSS $RSS0 KiB, $FD0 descriptors besides $UP0 kept upstream connections; waves ${WAVES[*]}, one every $PERIOD s"
started=$(date +%s)
total=0 rows=()
for w in "${!WAVES[@]}"; do
  n=${WAVES[$w]} t0=$(date +%s)
  hold_connections "127.0.0.1:$PORT" "$n" 600 "wave-$((w + 1))"
  sleep 1
  rss=$(rss_kib "$PID_rondo") fd=$(fds)
  total=$((total + n))
  log "wave $((w + 1)): $n held, RSS $rss KiB, $fd descriptors"
  rows+=("| $((w + 1)) | $n | $(awk -v a="$rss" 'BEGIN {printf "%.1f", a / 1024}') | $fd |")
  # Held until the wave's period ends (the last wave: half of it), then closed.
  hold=$((PERIOD - ($(date +%s) - t0) - 5))
  [ "$w" = $((${#WAVES[@]} - 1)) ] && hold=$((hold / 2))
  [ "$hold" -gt 0 ] && sleep "$hold"
  stop_pids "${HELD_PIDS[@]}"
  settle
  log "wave $((w + 1)) closed: RSS $(rss_kib "$PID_rondo") KiB, $(own) descriptors besides $(upstream) kept upstream connections"
done
sleep 2
RSS1=$(rss_kib "$PID_rondo") FD1=$(own) UP1=$(upstream)
took=$(($(date +%s) - started))
rss_ok=$(awk -v a="$RSS1" -v b="$RSS0" 'BEGIN {print (a <= b * 1.10) ? "met" : "not met"}')
fd_ok=$([ "$FD1" -le "$FD0" ] && echo met || echo "not met")

result=$ROOT/bench/results/soak.md
[ "$quick" = 1 ] && result=$ROOT/bench/results/soak-quick.md
{
  echo "Connection-count soak: \`bench/soak.sh $([ "$quick" = 1 ] && echo --quick)\`, rondo $REV (default workers, $(nproc) cores),"
  echo "$total connections in ${#WAVES[@]} waves over $took s; load average at the start $LOADAVG."
  echo
  echo "| wave | connections held | RSS held (MiB) | descriptors held |"
  echo "|---:|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "- RSS: $(awk -v a="$RSS0" 'BEGIN {printf "%.1f", a / 1024}') MiB before the first wave, $(awk -v a="$RSS1" 'BEGIN {printf "%.1f", a / 1024}') MiB after the last ($(awk -v a="$RSS1" -v b="$RSS0" 'BEGIN {printf "%+.1f", 100 * (a - b) / b}') %): within 10 % **$rss_ok**"
  echo "- descriptors besides the kept upstream connections ($UP0 before, $UP1 after, at most 256 a member): $FD0 before, $FD1 after: no leak **$fd_ok**"
} | tee "$result"
[ "$rss_ok" = met ] && [ "$fd_ok" = met ]
