#!/usr/bin/env bash
# How `rondo serve` scales with its workers: requests/s with `--workers 1` and `--workers 2`
# on this machine, behind the same three nginx members, in one run.
#
#   bench/workers.sh              target/release/rondo (built first)
#   bench/workers.sh --no-build   the binary already in target/release
#
# Each round starts rondo with 1 worker, then with 2 (not pinned: the kernel spreads the
# workers, the members and wrk over every core, as in production), warms up for 2 s, then runs
# `wrk -t2 -c64 -d10s`; three rounds, medians, and the ratio 2 workers / 1 worker. On a 2-core
# machine the members and wrk share the cores with the router, so the ratio says how much of a
# second core the router can use while its load generator needs one too. Ports 18300-18303
# (BENCH_PORT_BASE to move them). Needs nginx and wrk (apt-get install nginx-light wrk).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
if [ "${1:-}" != "--no-build" ]; then
  cargo build --release --quiet -p rondo
fi
for tool in nginx wrk; do
  command -v "$tool" >/dev/null || { echo "bench/workers.sh: $tool is missing" >&2; exit 1; }
done
RONDO=$PWD/target/release/rondo
BASE=${BENCH_PORT_BASE:-18300}
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  for _ in $(seq 100); do port_open "$1" && return 0; sleep 0.1; done
  echo "bench/workers.sh: nothing listens on port $1 after 10 s" >&2
  exit 1
}

{
  echo "worker_processes 1; pid $TMP/nginx.pid; error_log $TMP/nginx.err warn;"
  echo "events { worker_connections 8192; }"
  echo "http { access_log off; keepalive_requests 100000000; keepalive_timeout 120s;"
  for i in 1 2 3; do
    echo "  server { listen 127.0.0.1:$((BASE + i)) backlog=4096; location / { return 200 \"m$i\\n\"; } }"
  done
  echo "}"
} >"$TMP/nginx.conf"
{
  echo "[[listener]]"
  echo "name = \"web\""
  echo "listen = \"127.0.0.1:$BASE\""
  echo "max_connections = 20000"
  echo "[[route]]"
  echo "listener = \"web\""
  echo "cluster = \"members\""
  echo "[cluster.members]"
  echo "algorithm = \"round-robin\""
  echo "members = ["
  for i in 1 2 3; do echo "  { name = \"m$i\", address = \"127.0.0.1:$((BASE + i))\" },"; done
  echo "]"
} >"$TMP/rondo.toml"

nginx -e "$TMP/nginx.err" -p "$TMP" -c "$TMP/nginx.conf" -g 'daemon off;' &
PIDS+=($!)
wait_port $((BASE + 1))

# One measurement: rondo with $1 workers, its requests/s.
measure() {
  "$RONDO" serve --config "$TMP/rondo.toml" --workers "$1" --log-level warn >"$TMP/rondo.log" 2>&1 &
  local pid=$!
  wait_port "$BASE"
  wrk -t2 -c64 -d2s "http://127.0.0.1:$BASE/" >/dev/null
  wrk -t2 -c64 -d10s "http://127.0.0.1:$BASE/" | awk '/^Requests\/sec/ {printf "%d\n", $2}'
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}
median() { sort -n | sed -n '2p'; }

one=()
two=()
for round in 1 2 3; do
  one+=("$(measure 1)")
  two+=("$(measure 2)")
  echo "round $round: 1 worker ${one[-1]} req/s, 2 workers ${two[-1]} req/s" >&2
done
m1=$(printf '%s\n' "${one[@]}" | median)
m2=$(printf '%s\n' "${two[@]}" | median)
echo "| workers | requests/s (median of 3, wrk -t2 -c64 -d10s) |"
echo "|---|---:|"
echo "| 1 | $m1 |"
echo "| 2 | $m2 |"
echo
awk -v a="$m1" -v b="$m2" 'BEGIN { printf "2 workers / 1 worker: %.2f\n", b / a }'
