#!/usr/bin/env bash
# HTTP/3 against HTTP/2 over TLS on the same rondo (issue 40): router CPU per request.
#
#   bench/h3.sh [--requests N] [--rounds R] [--no-build]
#
# One `rondo serve --workers 1` (release, feature http3) pinned to BENCH_PROXY_CPU (default 0),
# one TLS listener with `http3 = true` (a `rondo tls dev-ca` certificate, ECDSA P-256) in front
# of one `rondo member` (HTTP/1.1); the member and the clients run on BENCH_LOAD_CPU (default 1).
# Each round runs, one after the other:
#   h2   h2load -c10 -m10 -n N over TLS 1.3 (ALPN h2): 10 connections, 10 streams each;
#   h3   rondo-h3load --connections 10 --streams 10 --requests N (quinn + h3; h2load here has
#        no HTTP/3);
# after one unmeasured warm-up run of each. The router's utime+stime (/proc/PID/stat) over a
# run, divided by the requests answered, is its CPU per request; the median over the rounds is
# reported, and HTTP/3's as a multiple of HTTP/2's. The clients differ (nghttp2 in C, quinn in
# Rust), which moves the requests per second but not the router's CPU per request.
# Then memory per idle HTTP/3 connection: `rondo-h3load --hold 500` opens 500 QUIC connections,
# one GET on each, and holds them; the router's VmRSS after minus before, per connection.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
requests=20000 rounds=3 build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) shift; requests=$1 ;;
    --rounds) shift; rounds=$1 ;;
    --no-build) build=0 ;;
    *) echo "bench/h3.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
PROXY_CPU=${BENCH_PROXY_CPU:-0} LOAD_CPU=${BENCH_LOAD_CPU:-1}
REL=${CARGO_TARGET_DIR:-$ROOT/target}/release
if [ "$build" = 1 ]; then
  cargo build --release -p rondo -p rondo-bench --features rondo/http3,rondo-bench/http3 \
    --bin rondo --bin rondo-h3load
fi
TMP=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT
"$REL/rondo" tls dev-ca "$TMP/certs" --name localhost >/dev/null
taskset -c "$LOAD_CPU" "$REL/rondo" member --name m1 --listen 127.0.0.1:0 >"$TMP/member.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do grep -q " on " "$TMP/member.log" && break; sleep 0.1; done
member=$(grep -o '127.0.0.1:[0-9]*' "$TMP/member.log" | head -1)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$TMP/rondo.toml" <<TOML
[[listener]]
name = "web"
listen = "127.0.0.1:$port"
http3 = true
tls = { certs = [{ cert = "$TMP/certs/localhost.pem", key = "$TMP/certs/localhost.key" }] }

[[route]]
listener = "web"
cluster = "c"

[cluster.c]
members = [{ name = "m1", address = "$member" }]
TOML
taskset -c "$PROXY_CPU" "$REL/rondo" serve --config "$TMP/rondo.toml" --workers 1 >"$TMP/rondo.log" 2>&1 &
router=$!
pids+=($router)
for _ in $(seq 50); do grep -q "listener web on" "$TMP/rondo.log" && break; sleep 0.1; done
ticks() { sed 's/^.*) //' "/proc/$router/stat" | awk '{print $12 + $13}'; }
TCK=$(getconf CLK_TCK)
h2() { taskset -c "$LOAD_CPU" h2load -c10 -m10 -t1 -n "$1" "https://127.0.0.1:$port/" | awk '/^requests:/{print $8}'; }
h3() { taskset -c "$LOAD_CPU" "$REL/rondo-h3load" "127.0.0.1:$port" --connections 10 --streams 10 --requests "$1" | awk '{print $4}'; }
# run KIND N: the router's CPU µs per answered request over one run.
run() {
  local before after ok
  before=$(ticks)
  ok=$("$1" "$2")
  after=$(ticks)
  [ "${ok:-0}" -gt 0 ] || { echo "bench/h3.sh: $1 answered nothing" >&2; exit 1; }
  echo "$(((after - before) * 1000000 / TCK / ok))"
}
run h2 2000 >/dev/null; run h3 2000 >/dev/null
declare -A got=([h2]="" [h3]="")
for r in $(seq "$rounds"); do
  for kind in h2 h3; do got[$kind]+="$(run "$kind" "$requests") "; done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
m2=$(median <<<"${got[h2]}") m3=$(median <<<"${got[h3]}")
echo "| protocol | router CPU per request, µs (median of $rounds; each round) |"
echo "|---|---|"
echo "| HTTP/2 over TLS 1.3 (h2load -c10 -m10) | $m2 (${got[h2]% }) |"
echo "| HTTP/3 (rondo-h3load, 10 connections x 10 streams) | $m3 (${got[h3]% }) |"
awk -v a="$m3" -v b="$m2" 'BEGIN {printf "HTTP/3 costs %.2fx the router CPU per request of HTTP/2 over TLS (target <= 1.5x)\n", a / b}'
rss() { awk '/^VmRSS:/{print $2}' "/proc/$router/status"; }
before=$(rss)
taskset -c "$LOAD_CPU" "$REL/rondo-h3load" "127.0.0.1:$port" --hold 500 --hold-seconds 20 >"$TMP/hold.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do grep -q "^held" "$TMP/hold.log" && break; sleep 0.1; done
grep -q "^held 500" "$TMP/hold.log" || { cat "$TMP/hold.log" >&2; exit 1; }
sleep 1
after=$(rss)
awk -v a="$after" -v b="$before" 'BEGIN {printf "RSS per idle HTTP/3 connection: %.1f KiB (%d KiB before, %d KiB with 500 held)\n", (a - b) / 500, b, a}'
