#!/usr/bin/env bash
# UDP balancing against NGINX `stream` UDP (issue 37): a `rondo serve` with a `udp` listener
# and an nginx with a `stream { server { listen ... udp; } }` block, side by side, in front of
# the same two UDP echo members, measured in interleaved rounds so drift on a noisy machine hits
# both alike. The figure is round trips (a datagram in and its answer out) per CPU-second of the
# proxy: the proxy's utime+stime (all its threads; nginx: its one worker and the master) across
# the run, against the answers the generator got back.
#
#   bench/udp.sh                 3 rounds of 8 s each (about a minute)
#   bench/udp.sh --quick         1 round of 3 s
#
# Options:
#   --clients N      generator sockets, each a flow of its own (default 16)
#   --window N       datagrams in flight per socket (default 8)
#   --no-build       use target/release/rondo as it is
#
# Environment: BENCH_PROXY_CPU (default 0) and BENCH_LOAD_CPU (default 1) choose the cores;
# BENCH_PORT_BASE (default 18300) the ports; BENCH_KEEP_TMP=1 keeps the temporary directory;
# BENCH_RONDO another rondo binary (with --no-build).
#
# Needs nginx with its stream module (Debian: nginx and libnginx-mod-stream) and python3; the
# members and the generator are bench/udp.py (closed loop, bounded by the run's seconds). Both
# proxies keep a flow per client address (rondo's `granularity = "flow"`, nginx's UDP sessions)
# and use one worker thread or process.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

quick=0 clients=16 window=8 build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --clients) shift; clients=${1:-} ;;
    --window) shift; window=${1:-} ;;
    --no-build) build=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/udp.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$quick" = 1 ]; then ROUNDS=1 DUR=3; else ROUNDS=3 DUR=8; fi
PROXY_CPU=${BENCH_PROXY_CPU:-0}
LOAD_CPU=${BENCH_LOAD_CPU:-1}
BASE=${BENCH_PORT_BASE:-18300}
MEMBER_PORTS=($((BASE + 1)) $((BASE + 2)))
declare -A PORT=([rondo]=$((BASE + 10)) [nginx]=$((BASE + 11)))

log() { printf '[udp %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'bench/udp.sh: %s\n' "$*" >&2; exit 1; }

if [ "$build" = 1 ]; then
  log "building rondo (release)"
  cargo build --release --quiet -p rondo --bin rondo
fi
RONDO=${BENCH_RONDO:-$ROOT/target/release/rondo}
[ -x "$RONDO" ] || die "missing $RONDO (build it first)"
command -v nginx >/dev/null || die "nginx is needed (Debian: nginx libnginx-mod-stream)"
STREAM_MODULE=/usr/lib/nginx/modules/ngx_stream_module.so
[ -f "$STREAM_MODULE" ] || die "nginx's stream module is needed (Debian: libnginx-mod-stream)"
command -v taskset >/dev/null || die "taskset (util-linux) is needed"

TMP=$(mktemp -d /tmp/rondo-udp-bench.XXXXXX)
PIDS=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [ "${#PIDS[@]}" -gt 0 ] && kill -TERM "${PIDS[@]}" 2>/dev/null || true
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "${BENCH_KEEP_TMP:-0}" = 1 ]; then log "kept $TMP"; else rm -rf "$TMP"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start() {
  local name=$1 cpu=$2
  shift 2
  taskset -c "$cpu" "$@" >"$TMP/$name.log" 2>&1 &
  PIDS+=($!)
  eval "PID_$name=$!"
}
cpu_ticks() { # the process and its children that are still running (nginx's worker)
  local t=0 p
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] && t=$((t + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  echo "$t"
}
TCK=$(getconf CLK_TCK)
kv() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k {print $2}'; }
median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# An answer to one datagram within 5 s: the proxy (and its members) are up.
wait_udp() {
  python3 - "$1" <<'PY' || die "nothing answered on udp port $1 within 5 s"
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(0.2)
for _ in range(25):
    try:
        s.sendto(b"ping", ("127.0.0.1", int(sys.argv[1])))
        s.recvfrom(100)
        sys.exit(0)
    except OSError:
        time.sleep(0.0)
sys.exit(1)
PY
}

cat >"$TMP/rondo.toml" <<TOML
[[listener]]
name = "udp"
listen = "127.0.0.1:${PORT[rondo]}"
protocol = "udp"
udp = { idle_timeout = "30s" }

[[route]]
listener = "udp"
cluster = "echo"

[cluster.echo]
upstream_protocol = "udp"
algorithm = "round-robin"
members = [
  { name = "m1", address = "127.0.0.1:${MEMBER_PORTS[0]}" },
  { name = "m2", address = "127.0.0.1:${MEMBER_PORTS[1]}" },
]
TOML
cat >"$TMP/nginx.conf" <<CONF
load_module $STREAM_MODULE;
worker_processes 1;
daemon off;
pid $TMP/nginx.pid;
error_log $TMP/nginx-error.log error;
events { worker_connections 4096; }
stream {
  upstream echo {
    server 127.0.0.1:${MEMBER_PORTS[0]};
    server 127.0.0.1:${MEMBER_PORTS[1]};
  }
  server {
    listen 127.0.0.1:${PORT[nginx]} udp;
    proxy_pass echo;
    proxy_timeout 30s;
  }
}
CONF

i=1
for p in "${MEMBER_PORTS[@]}"; do
  start "member$i" "$LOAD_CPU" python3 "$ROOT/bench/udp.py" echo "$p"
  i=$((i + 1))
done
start rondo "$PROXY_CPU" "$RONDO" serve --config "$TMP/rondo.toml" --workers 1
start nginx "$PROXY_CPU" nginx -c "$TMP/nginx.conf" -e "$TMP/nginx-error.log"
for p in "${PORT[@]}"; do wait_udp "$p"; done
NGINX_WORKER=$(pgrep -P "$PID_nginx" | head -1)
[ -n "$NGINX_WORKER" ] || die "no nginx worker process"
log "rondo $("$RONDO" --version | awk 'NR == 1 {print $2}'); $(nginx -v 2>&1); $ROUNDS x ${DUR}s, $clients clients x $window in flight; load $(cut -d' ' -f1-3 /proc/loadavg)"

declare -A RATE
for round in $(seq "$ROUNDS"); do
  for v in rondo nginx; do
    if [ "$v" = rondo ]; then pids=("$PID_rondo"); else pids=("$PID_nginx" "$NGINX_WORKER"); fi
    before=$(cpu_ticks "${pids[@]}")
    out=$(timeout $((DUR + 20)) taskset -c "$LOAD_CPU" python3 "$ROOT/bench/udp.py" load \
      "127.0.0.1:${PORT[$v]}" "$clients" "$window" "$DUR") || die "the generator against $v failed: $out"
    after=$(cpu_ticks "${pids[@]}")
    answered=$(kv "$out" answered)
    ticks=$((after - before))
    [ "$ticks" -gt 0 ] || ticks=1
    rate=$(awk -v a="$answered" -v t="$ticks" -v hz="$TCK" 'BEGIN {printf "%.0f", a / (t / hz)}')
    RATE[$v]+="$rate "
    log "round $round $v: $answered round trips in ${DUR}s ($((answered / DUR))/s), proxy CPU $(awk -v t="$ticks" -v hz="$TCK" 'BEGIN {printf "%.2f", t / hz}') s: $rate per CPU-second ($(kv "$out" lost_refills) refills)"
  done
done
r=$(tr ' ' '\n' <<<"${RATE[rondo]}" | grep . | median)
n=$(tr ' ' '\n' <<<"${RATE[nginx]}" | grep . | median)
printf '| proxy | round trips per CPU-second (median of %s) |\n|---|---|\n| rondo | %s |\n| nginx stream | %s |\n' "$ROUNDS" "$r" "$n"
awk -v r="$r" -v n="$n" 'BEGIN {printf "\nrondo / nginx: %.2fx\n", r / n}'
