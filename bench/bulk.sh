#!/usr/bin/env bash
# Bulk bytes (issue 36): CPU per GiB moved through a proxy, rondo vs HAProxy, at L4 (`tcp`
# listener / `mode tcp`) and L7 (`http` listener / `mode http`):
#
#   bench/bulk.sh                 full run (3 rounds, 2 GiB per run; a few minutes once built)
#   bench/bulk.sh --quick         smoke test (1 round, 512 MiB per run)
#
# Options: --quick, --no-install (don't apt-get anything), --no-build (use the binaries already
# in $CARGO_TARGET_DIR/release, default target/release). Environment: BENCH_PROXY_CPU (default
# 0), BENCH_LOAD_CPU (default 1), BENCH_PORT_BASE (default 18500), BENCH_KEEP_TMP=1,
# BENCH_RONDO_BEFORE=PATH (another rondo binary, e.g. main's, measured on L7 in the same run as
# `l7-rondo-before`, on a process of its own pinned to the same CPU).
#
# One nginx member on BENCH_LOAD_CPU serves a 64 MiB file (sendfile). Each proxy runs one thread
# pinned to BENCH_PROXY_CPU (rondo --workers 1, HAProxy nbthread 1), both started at once and
# measured one at a time. A run is 4 curl clients at once on BENCH_LOAD_CPU, each downloading
# the file FILES times over one connection; the proxy's CPU is utime+stime from /proc/PID/stat
# over the run, divided by the GiB moved (every download's size is checked). Medians of ROUNDS
# rounds, runs interleaved across proxies round by round. Configurations:
#   L4: rondo (`splice = "auto"`, the default), rondo `splice = "off"`, HAProxy's default
#       (`mode tcp`, no splice), HAProxy `option splice-auto` (frontend and backend), and
#       HAProxy `option splice-request` + `option splice-response` (splice always).
#   L7: rondo's `http` listener (HTTP/1.1 to the member; bodies spliced, the default) and with
#       `splice = "off"`, HAProxy `mode http` default and with `option splice-auto`.
# Results: markdown on stdout and in bench/results/bulk-latest.md (quick runs: bulk-quick.md).
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
    *) echo "bench/bulk.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$quick" = 1 ]; then ROUNDS=1 FILES=2; else ROUNDS=3 FILES=${BENCH_FILES:-8}; fi
CLIENTS=4
FILE_MIB=64
PROXY_CPU=${BENCH_PROXY_CPU:-0}
LOAD_CPU=${BENCH_LOAD_CPU:-1}
BASE=${BENCH_PORT_BASE:-18500}
MEMBER_PORT=$((BASE + 1))
CONFIGS=(l4-rondo l4-rondo-off l4-haproxy l4-haproxy-splice l4-haproxy-splice-always l7-rondo
  l7-rondo-off l7-haproxy l7-haproxy-splice)
declare -A PORT=([l4-rondo]=$((BASE + 10)) [l4-rondo-off]=$((BASE + 11)) [l7-rondo]=$((BASE + 12))
  [l7-rondo-off]=$((BASE + 13)) [l7-rondo-before]=$((BASE + 14))
  [l4-haproxy]=$((BASE + 20)) [l4-haproxy-splice]=$((BASE + 21)) [l7-haproxy]=$((BASE + 22))
  [l7-haproxy-splice]=$((BASE + 23)) [l4-haproxy-splice-always]=$((BASE + 24)))
BEFORE=${BENCH_RONDO_BEFORE:-}
if [ -n "$BEFORE" ]; then
  [ -x "$BEFORE" ] || { echo "bench/bulk.sh: BENCH_RONDO_BEFORE: no binary at $BEFORE" >&2; exit 2; }
  CONFIGS+=(l7-rondo-before)
fi

BENCH_NAME=bench-bulk TMP_PREFIX=rondo-bench-bulk
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_tools "$install" haproxy:haproxy nginx:nginx curl:curl taskset:util-linux
bench_binaries "$build"
for p in "$MEMBER_PORT" "${PORT[@]}"; do
  port_open "$p" && die "port $p is taken (set BENCH_PORT_BASE)"
done

# --- the member and the proxies -----------------------------------------------------------------
mkdir -p "$TMP/www"
chmod 755 "$TMP"  # nginx's workers (nobody) read the file
head -c $((FILE_MIB << 20)) /dev/urandom >"$TMP/www/big"
cat >"$TMP/members.conf" <<EOF
worker_processes 1;
pid $TMP/members.pid;
error_log $TMP/members.err;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  server {
    listen 127.0.0.1:$MEMBER_PORT;
    root $TMP/www;
  }
}
EOF

cat >"$TMP/rondo.toml" <<EOF
[[listener]]
name = "l4"
listen = "127.0.0.1:${PORT[l4-rondo]}"
protocol = "tcp"

[[listener]]
name = "l4off"
listen = "127.0.0.1:${PORT[l4-rondo-off]}"
protocol = "tcp"
splice = "off"

[[listener]]
name = "l7"
listen = "127.0.0.1:${PORT[l7-rondo]}"

[[listener]]
name = "l7off"
listen = "127.0.0.1:${PORT[l7-rondo-off]}"
splice = "off"

[[route]]
listener = "l7off"
cluster = "http"

[[route]]
listener = "l4"
cluster = "tcp"

[[route]]
listener = "l4off"
cluster = "tcp"

[[route]]
listener = "l7"
cluster = "http"

[cluster.tcp]
upstream_protocol = "tcp"
members = [{ name = "m1", address = "127.0.0.1:$MEMBER_PORT" }]

[cluster.http]
members = [{ name = "m1", address = "127.0.0.1:$MEMBER_PORT" }]
EOF

{
  cat <<EOF
global
  nbthread 1
  maxconn 1000

defaults
  timeout connect 5s
  timeout client 60s
  timeout server 60s
EOF
  # haproxy_pair NAME MODE OPTIONS: a frontend and its backend, both with OPTIONS (lines).
  haproxy_pair() {
    local opt=$3
    printf 'frontend %s\n  mode %s\n%s\n  bind 127.0.0.1:%s\n  default_backend %s\n\n' \
      "$1" "$2" "$opt" "${PORT[$1]}" "$1"
    printf 'backend %s\n  mode %s\n%s\n  server m1 127.0.0.1:%s\n\n' "$1" "$2" "$opt" "$MEMBER_PORT"
  }
  auto="  option splice-auto"
  always=$'  option splice-request\n  option splice-response'
  haproxy_pair l4-haproxy tcp ""
  haproxy_pair l4-haproxy-splice tcp "$auto"
  haproxy_pair l4-haproxy-splice-always tcp "$always"
  haproxy_pair l7-haproxy http ""
  haproxy_pair l7-haproxy-splice http "$auto"
} >"$TMP/haproxy.cfg"

start members "$LOAD_CPU" nginx -p "$TMP" -c "$TMP/members.conf" -g 'daemon off;'
wait_port "$MEMBER_PORT" members
start rondo "$PROXY_CPU" "$RONDO" serve --config "$TMP/rondo.toml" --workers 1
if [ -n "$BEFORE" ]; then
  # The other binary: the L7 listener alone (an older one may not know every field above).
  cat >"$TMP/rondo-before.toml" <<EOF
[[listener]]
name = "l7"
listen = "127.0.0.1:${PORT[l7-rondo-before]}"

[[route]]
listener = "l7"
cluster = "http"

[cluster.http]
members = [{ name = "m1", address = "127.0.0.1:$MEMBER_PORT" }]
EOF
  start before "$PROXY_CPU" "$BEFORE" serve --config "$TMP/rondo-before.toml" --workers 1
fi
start haproxy "$PROXY_CPU" haproxy -db -f "$TMP/haproxy.cfg"
for c in "${CONFIGS[@]}"; do wait_port "${PORT[$c]}" "${c#*-}"; done
sleep 0.5
pid_of() {
  case "$1" in *before) echo "$PID_before" ;; *rondo*) echo "$PID_rondo" ;; *) echo "$PID_haproxy" ;; esac
}
log "member and proxies up; rondo $("$RONDO" --version | awk 'NR == 1 {print $2}'), $(haproxy -v | awk 'NR == 1 {print $1, $3}'), $(nginx -v 2>&1 | sed 's/.*: //')"

# run CONFIG: prints the proxy's CPU per GiB (ms) over CLIENTS x FILES downloads.
run() {
  local c=$1 pid before after i urls=() sizes
  pid=$(pid_of "$c")
  for i in $(seq "$FILES"); do urls+=(-o /dev/null "http://127.0.0.1:${PORT[$c]}/big"); done
  before=$(cpu_ticks "$pid")
  for i in $(seq "$CLIENTS"); do
    taskset -c "$LOAD_CPU" curl -s -w '%{size_download}\n' "${urls[@]}" >"$TMP/sizes.$i" &
  done
  wait  # run is called in a subshell: its only children are the clients
  after=$(cpu_ticks "$pid")
  sizes=$(cat "$TMP"/sizes.* | awk -v want=$((FILE_MIB << 20)) '$1 == want {n++} END {print n + 0}')
  rm -f "$TMP"/sizes.*
  [ "$sizes" = $((CLIENTS * FILES)) ] || die "$c: $sizes of $((CLIENTS * FILES)) downloads complete"
  awk -v t=$((after - before)) -v tck="$TCK" -v mib=$((CLIENTS * FILES * FILE_MIB)) \
    'BEGIN {printf "%.0f", t * 1000 / tck / (mib / 1024)}'
}

declare -A RUNS
for c in "${CONFIGS[@]}"; do v=$(run "$c"); done  # warm-up
for r in $(seq "$ROUNDS"); do
  for c in "${CONFIGS[@]}"; do
    v=$(run "$c")
    RUNS[$c]="${RUNS[$c]:-} $v"
    log "round $r: $c $v ms CPU/GiB"
  done
done
declare -A MED
for c in "${CONFIGS[@]}"; do MED[$c]=$(med "${RUNS[$c]}"); done

# Efficiency: HAProxy's CPU per GiB over rondo's (above 1: rondo spends less).
l4_default=$(ratio "${MED[l4-haproxy]}" "${MED[l4-rondo]}")
l4_splice=$(ratio "${MED[l4-haproxy-splice]}" "${MED[l4-rondo]}")
l4_always=$(ratio "${MED[l4-haproxy-splice-always]}" "${MED[l4-rondo]}")
l7_default=$(ratio "${MED[l7-haproxy]}" "${MED[l7-rondo]}")
l7_off=$(ratio "${MED[l7-haproxy]}" "${MED[l7-rondo-off]}")
out="bench/results/bulk-$([ "$quick" = 1 ] && echo quick || echo latest).md"
{
  echo "# Bulk bytes: CPU per GiB (bench/bulk.sh)"
  echo
  echo "rondo $REV, $(haproxy -v | awk 'NR == 1 {print $1, $3}'); $CLIENTS clients at once, ${FILE_MIB} MiB files, $((CLIENTS * FILES * FILE_MIB)) MiB per run, medians of $ROUNDS rounds; proxy on CPU $PROXY_CPU, member and clients on CPU $LOAD_CPU; load average $LOADAVG."
  echo
  echo "| configuration | ms CPU/GiB (median) | runs |"
  echo "|---|---|---|"
  for c in "${CONFIGS[@]}"; do echo "| $c | ${MED[$c]} | ${RUNS[$c]# } |"; done
  echo
  echo "| target | efficiency (HAProxy CPU / rondo CPU) | verdict |"
  echo "|---|---|---|"
  echo "| L4 vs HAProxy default ≥ 1.5× | ${l4_default}× | $(verdict "$l4_default" 1.5) |"
  echo "| L4 vs HAProxy splice-auto ≥ 1.0× | ${l4_splice}× | $(verdict "$l4_splice" 1.0) |"
  echo "| L4 vs HAProxy splice-request/response (no target) | ${l4_always}× | – |"
  echo "| L7 vs HAProxy default ≥ 1.2× | ${l7_default}× | $(verdict "$l7_default" 1.2) |"
  echo "| L7 \`splice = \"off\"\` vs HAProxy default (no target) | ${l7_off}× | – |"
  if [ -n "$BEFORE" ]; then
    l7_before=$(ratio "${MED[l7-haproxy]}" "${MED[l7-rondo-before]}")
    echo "| L7 before (\`$BEFORE\`) vs HAProxy default (no target) | ${l7_before}× | – |"
  fi
} | tee "$out"
