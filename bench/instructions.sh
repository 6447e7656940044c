#!/usr/bin/env bash
# Instructions per proxied request: `rondo serve` (one worker, round-robin over three
# `rondo member`s on 127.0.0.1) under valgrind's callgrind, driven by wrk. Unlike requests/s on
# a shared VM, an instruction count does not move with the neighbours, so two builds can be
# compared to a percent in one minute each (it counts user-space work only: no kernel time,
# no cache misses).
#
#   bench/instructions.sh                      target/release/rondo (built first)
#   bench/instructions.sh --no-build BIN ...   the given rondo binaries, one line each
#   bench/instructions.sh --access-log text|json [--no-build BIN ...]
#                                              the same with the listener's access log on
#                                              (written to the temporary directory)
#   bench/instructions.sh --filters [--no-build BIN ...]
#                                              the same with the route's filter chain of
#                                              issue 34: request_id, three header edits (two
#                                              sets, one with ${client_ip}, one remove) and a
#                                              rate_limit that never refuses
#   bench/instructions.sh --h2 [--no-build BIN ...]
#                                              h2load (h2c, prior knowledge, -c8 -m10) as the
#                                              client instead of wrk: HTTP/2 from the client,
#                                              HTTP/1.1 to the members (may be combined with
#                                              --filters or --access-log)
#   bench/instructions.sh --h2 --h2-members [--no-build BIN ...]
#                                              the same with the members spoken to in h2c
#                                              (`upstream_protocol = "http2"`): h2c to h2c
#
# With RONDO_KEEP_PROFILE=DIR each run's callgrind profile is kept as DIR/<binary name>.cg
# (compare two with `callgrind_annotate --inclusive=yes`).
# Each run: 3 s of unmeasured warm-up with instrumentation off, then instrumentation on for
# 8 s of `wrk -t1 -c8`, dumped; prints the requests wrk completed in the measured part and
# the instructions counted (Ir) per request. Needs valgrind, wrk and curl (apt-get install
# valgrind wrk curl; --h2 needs h2load: nghttp2-client). Ports 19100-19103, or from
# INSTRUCTIONS_PORT_BASE (the router on the base, the members on the next three) so that two
# measurements can run at once.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

access_log=""
filters=0
h2=0
h2_members=0
while :; do
  case "${1:-}" in
    --access-log)
      access_log=${2:-}
      case "$access_log" in text|json) ;; *) echo "bench/instructions.sh: --access-log is text or json" >&2; exit 2 ;; esac
      shift 2 ;;
    --filters) filters=1; shift ;;
    --h2) h2=1; shift ;;
    --h2-members) h2_members=1; shift ;;
    *) break ;;
  esac
done
build=1
if [ "${1:-}" = "--no-build" ]; then
  build=0
  shift
fi
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi
client=wrk
[ "$h2" = 1 ] && client=h2load
for tool in valgrind callgrind_control callgrind_annotate "$client" curl; do
  command -v "$tool" >/dev/null || { echo "bench/instructions.sh: $tool is missing" >&2; exit 1; }
done
if [ "$build" = 1 ]; then
  cargo build --release -p rondo >&2
  set -- target/release/rondo
fi
[ $# -gt 0 ] || { echo "bench/instructions.sh: no binary given" >&2; exit 2; }

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

base=${INSTRUCTIONS_PORT_BASE:-19100}
router="127.0.0.1:$base"
cat > "$tmp/rondo.toml" <<EOF
[[listener]]
name = "web"
listen = "$router"

[[route]]
listener = "web"
cluster = "app"
FILTERS

[cluster.app]
algorithm = "round-robin"
UPSTREAM
members = [
  { name = "m1", address = "127.0.0.1:$((base + 1))" },
  { name = "m2", address = "127.0.0.1:$((base + 2))" },
  { name = "m3", address = "127.0.0.1:$((base + 3))" },
]
EOF
if [ "$filters" = 1 ]; then
  # The chain of issue 34: what a route with the common filters costs per request. The rate is
  # far above anything wrk reaches, so every request passes (a 429 would be cheaper).
  chain='filters = [ { request_id = {} }, { headers = { request = { set = { "x-a" = "1", "x-b" = "${client_ip}" }, remove = ["x-debug"] } } }, { rate_limit = { key = "client_ip", rate = "1000000/s", burst = 1000000 } } ]'
  awk -v c="$chain" '$0 == "FILTERS" {print c; next} {print}' "$tmp/rondo.toml" >"$tmp/rondo.toml.new"
else
  grep -v '^FILTERS$' "$tmp/rondo.toml" >"$tmp/rondo.toml.new"
fi
mv "$tmp/rondo.toml.new" "$tmp/rondo.toml"
if [ "$h2_members" = 1 ]; then
  sed -i 's/^UPSTREAM$/upstream_protocol = "http2"/' "$tmp/rondo.toml"
else
  sed -i '/^UPSTREAM$/d' "$tmp/rondo.toml"
fi
if [ -n "$access_log" ]; then
  sed -i "s|^listen = \"$router\"|&\naccess_log = { path = \"$tmp/access.log\", format = \"$access_log\" }|" "$tmp/rondo.toml"
fi

# load SECONDS: the client's run against the router.
load() {
  if [ "$h2" = 1 ]; then
    h2load -c8 -m10 -t1 -D "$1" http://$router/
  else
    wrk -t1 -c8 -d"$1"s http://$router/
  fi
}

for bin in "$@"; do
  [ -x "$bin" ] || { echo "bench/instructions.sh: $bin is not executable" >&2; exit 1; }
  members=()
  for i in 1 2 3; do
    "$bin" member --name "m$i" --listen "127.0.0.1:$((base + i))" >/dev/null 2>&1 &
    members+=($!)
    pids+=($!)
  done
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$tmp/cg.%p" \
    "$bin" serve --config "$tmp/rondo.toml" --workers 1 >"$tmp/serve.log" 2>&1 &
  vg=$!
  pids+=("$vg")
  up=0
  for _ in $(seq 100); do
    if curl -s -o /dev/null http://$router/; then up=1; break; fi
    sleep 0.2
  done
  [ "$up" = 1 ] || { echo "bench/instructions.sh: rondo did not come up:" >&2; cat "$tmp/serve.log" >&2; exit 1; }
  load 3 >/dev/null
  callgrind_control -i on "$vg" >/dev/null 2>&1
  out=$(load 8)
  callgrind_control -i off "$vg" >/dev/null 2>&1
  callgrind_control -d "$vg" >/dev/null 2>&1
  kill -INT "$vg"
  wait "$vg" 2>/dev/null || true
  for p in "${members[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${members[@]}" 2>/dev/null || true
  if [ "$h2" = 1 ]; then
    # "requests: N total, N started, N done, N succeeded, ..."; "status codes: N 2xx, N 3xx, ..."
    requests=$(echo "$out" | awk '/^requests:/ {print $8}')
    non2xx=$(echo "$out" | awk '/^status codes:/ {n = $5 + $7 + $9; if (n) print n}')
  else
    requests=$(echo "$out" | awk '/requests in/ {print $1}')
    non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
  fi
  ir=$(callgrind_annotate "$tmp/cg.$vg.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  echo "$bin: $requests requests measured, $ir instructions, $((ir / requests)) per request"
  [ -z "$non2xx" ] || echo "  warning: $non2xx responses were not 2xx (the count is not of proxied requests)"
  if [ -n "${RONDO_KEEP_PROFILE:-}" ]; then
    cp "$tmp/cg.$vg.1" "$RONDO_KEEP_PROFILE/$(basename "$bin").cg"
  fi
  if [ -n "$access_log" ]; then
    echo "  access log ($access_log): $(wc -l <"$tmp/access.log") lines (warm-up included)"
    rm -f "$tmp/access.log"
  fi
  rm -f "$tmp"/cg.*
done
