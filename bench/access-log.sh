#!/usr/bin/env bash
# What the access log costs per request: two `rondo serve` processes side by side, identical
# except that one has `access_log` on its listener, behind the same three `rondo member`
# processes, measured in interleaved rounds so drift on a noisy machine hits both alike.
#
#   bench/access-log.sh                 3 rounds of 10 s at 5,000 requests/s (about 2 minutes)
#   bench/access-log.sh --quick         1 round of 3 s
#
# Options:
#   --format text|json    the access log's format (default text)
#   --rate N              requests/s of each run (default 5000)
#   --no-build            use the binaries already in target/release
#
# Environment: BENCH_PROXY_CPU (default 0) and BENCH_LOAD_CPU (default 1) choose the cores;
# BENCH_PORT_BASE (default 18100) the ports; BENCH_KEEP_TMP=1 keeps the temporary directory.
#
# Each run is rondo-loadgen at a fixed rate (open loop, 64 keep-alive connections, 1 s warm-up)
# against one router. CPU per request is utime+stime of the router process (all its threads,
# the access log's writer included; /proc/PID/stat) across the run divided by the requests
# answered; latency percentiles are rondo-loadgen's. Medians over the rounds. The log goes to a
# file in the temporary directory; the lines written and rondo_access_log_dropped_total (lines
# dropped because the writer fell behind, read from the "on" router's admin API) are printed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

quick=0 format=text rate=5000 build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --format) shift; format=${1:-} ;;
    --rate) shift; rate=${1:-} ;;
    --no-build) build=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/access-log.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$format" in text|json) ;; *) echo "bench/access-log.sh: --format is text or json" >&2; exit 2 ;; esac
if [ "$quick" = 1 ]; then ROUNDS=1 DUR=3; else ROUNDS=3 DUR=10; fi
PROXY_CPU=${BENCH_PROXY_CPU:-0}
LOAD_CPU=${BENCH_LOAD_CPU:-1}
BASE=${BENCH_PORT_BASE:-18100}
MEMBER_PORTS=($((BASE + 1)) $((BASE + 2)) $((BASE + 3)))
declare -A PORT=([off]=$((BASE + 10)) [on]=$((BASE + 11)))
ADMIN=$((BASE + 12))

log() { printf '[access-log %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'bench/access-log.sh: %s\n' "$*" >&2; exit 1; }

if [ "$build" = 1 ]; then
  log "building rondo and rondo-loadgen (release)"
  cargo build --release --quiet -p rondo -p rondo-bench
fi
RONDO=$ROOT/target/release/rondo
LOADGEN=$ROOT/target/release/rondo-loadgen
[ -x "$RONDO" ] && [ -x "$LOADGEN" ] || die "missing $RONDO or $LOADGEN (build them first)"
command -v taskset >/dev/null || die "taskset (util-linux) is needed"

TMP=$(mktemp -d /tmp/rondo-access-bench.XXXXXX)
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
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  for _ in $(seq 100); do port_open "$1" && return 0; sleep 0.1; done
  cat "$TMP/$2.log" >&2 || true
  die "$2 did not listen on port $1 within 10 s"
}
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'; }
TCK=$(getconf CLK_TCK)
kv() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k {print $2}'; }
median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

config() { # config NAME PORT [ACCESS_LOG_LINE]
  cat <<EOF
[[listener]]
name = "web"
listen = "127.0.0.1:$2"
max_connections = 20000
$3

[[route]]
listener = "web"
cluster = "members"

[cluster.members]
algorithm = "round-robin"
members = [
  { name = "m1", address = "127.0.0.1:${MEMBER_PORTS[0]}" },
  { name = "m2", address = "127.0.0.1:${MEMBER_PORTS[1]}" },
  { name = "m3", address = "127.0.0.1:${MEMBER_PORTS[2]}" },
]
EOF
}
config off "${PORT[off]}" "" >"$TMP/off.toml"
{
  config on "${PORT[on]}" "access_log = { path = \"$TMP/access.log\", format = \"$format\" }"
  printf '\n[admin]\nlisten = "127.0.0.1:%s"\ntoken = "bench"\n' "$ADMIN"
} >"$TMP/on.toml"

i=1
for p in "${MEMBER_PORTS[@]}"; do
  start "member$i" "$LOAD_CPU" "$RONDO" member --name "m$i" --listen "127.0.0.1:$p"
  i=$((i + 1))
done
for p in "${MEMBER_PORTS[@]}"; do wait_port "$p" member1; done
for v in off on; do
  start "$v" "$PROXY_CPU" "$RONDO" serve --config "$TMP/$v.toml" --workers 1
done
for v in off on; do wait_port "${PORT[$v]}" "$v"; done
log "rondo $("$RONDO" --version | awk 'NR == 1 {print $2}'); access log $format; $ROUNDS x ${DUR}s at $rate req/s; load $(cut -d' ' -f1-3 /proc/loadavg)"

declare -A CPU P50 P99 OK ERR
for round in $(seq "$ROUNDS"); do
  for v in off on; do
    pid_var=PID_$v
    before=$(cpu_ticks "${!pid_var}")
    out=$(timeout $((DUR + 40)) taskset -c "$LOAD_CPU" "$LOADGEN" rate --target "127.0.0.1:${PORT[$v]}" \
      --rate "$rate" --duration-secs "$DUR" --warmup-secs 1 --connections 64) || die "rondo-loadgen against $v failed: $out"
    after=$(cpu_ticks "${!pid_var}")
    ok=$(kv "$out" ok)
    errs=$(( $(kv "$out" errors) + $(kv "$out" bad_status) + $(kv "$out" timeouts) ))
    cpu=$(awk -v d=$((after - before)) -v t="$TCK" -v n="$ok" 'BEGIN {printf "%.2f", (n > 0 ? d / t * 1e6 / n : 0)}')
    log "  round $round $v: $cpu us CPU/request, p50 $(kv "$out" p50_us) us, p99 $(kv "$out" p99_us) us, ok $ok, errors $errs"
    CPU[$v]+="$cpu "
    P50[$v]+="$(kv "$out" p50_us) "
    P99[$v]+="$(kv "$out" p99_us) "
    ERR[$v]=$(( ${ERR[$v]:-0} + errs ))
  done
done
sleep 0.5
lines=$(wc -l <"$TMP/access.log")
# rondo_access_log_dropped_total from the "on" router's /metrics (plain bash, no curl needed).
dropped=$(exec 3<>"/dev/tcp/127.0.0.1/$ADMIN"
  printf 'GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer bench\r\nConnection: close\r\n\r\n' >&3
  awk '/^rondo_access_log_dropped_total/ {print $2}' <&3)

m() { tr ' ' '\n' <<<"$1" | grep -v '^$' | median; }
off_cpu=$(m "${CPU[off]}") on_cpu=$(m "${CPU[on]}")
cat <<EOF

| access log ($format) | CPU per request (µs) | p50 (µs) | p99 (µs) | errors |
|---|---|---|---|---|
| off | $off_cpu | $(m "${P50[off]}") | $(m "${P99[off]}") | ${ERR[off]} |
| on | $on_cpu | $(m "${P50[on]}") | $(m "${P99[on]}") | ${ERR[on]} |
| on − off | $(awk -v a="$on_cpu" -v b="$off_cpu" 'BEGIN {printf "%+.2f (%+.0f %%)", a - b, (b > 0 ? 100 * (a - b) / b : 0)}') | | | |

$lines lines in the access log (every request, warm-ups included), ${dropped:-?} dropped.
EOF
