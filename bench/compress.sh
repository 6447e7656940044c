#!/usr/bin/env bash
# Compression benchmark: rondo's `compress` filter (gzip, level 6) vs nginx's `gzip on;
# gzip_comp_level 6;`, both as proxies in front of the same nginx member serving the same
# uncompressed body. Standalone (not part of bench/run.sh):
#
#   bench/compress.sh              full run (50 requests per case, 3 rounds)
#   bench/compress.sh --quick      smoke test (5 requests, 1 round)
#
# Options: --quick, --no-install (don't apt-get nginx), --no-build (use the rondo binary already
# in $CARGO_TARGET_DIR/release, default target/release; or RONDO=path). Environment:
# BENCH_PROXY_CPU (default 0), BENCH_LOAD_CPU (default 1), BENCH_PORT_BASE (default 18200),
# BENCH_BODY (a text file to serve; default: 4 MiB of /usr/share/doc's copyright files, the same
# bytes for both proxies), BENCH_KEEP_TMP=1.
#
# Each proxy runs one worker pinned to BENCH_PROXY_CPU (rondo --workers 1, nginx
# worker_processes 1); the member and curl run on BENCH_LOAD_CPU. Per case, sequential
# `curl -H 'Accept-Encoding: gzip'` requests of the body; the figure is the proxy's CPU
# (utime+stime from /proc/PID/stat) over the requests divided by the MiB of uncompressed body
# they carried, with the same requests without `Accept-Encoding` (the proxy's cost without
# compression) beside it. Results: markdown on stdout.
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
    *) echo "bench/compress.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$quick" = 1 ]; then REQS=5 ROUNDS=1; else REQS=50 ROUNDS=3; fi
PROXY_CPU=${BENCH_PROXY_CPU:-0}
LOAD_CPU=${BENCH_LOAD_CPU:-1}
BASE=${BENCH_PORT_BASE:-18200}
MEMBER_PORT=$((BASE + 1)) NGINX_PORT=$((BASE + 2)) RONDO_PORT=$((BASE + 3))

log() { printf '[bench-compress %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'bench/compress.sh: %s\n' "$*" >&2; exit 1; }

export PATH="$PATH:/usr/sbin:/sbin"
missing=()
command -v nginx >/dev/null 2>&1 || missing+=(nginx-light)
command -v taskset >/dev/null 2>&1 || missing+=(util-linux)
command -v curl >/dev/null 2>&1 || missing+=(curl)
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$install" = 1 ] || die "missing ${missing[*]} (run without --no-install to apt-get them)"
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ "$build" = 1 ] && [ -z "${RONDO:-}" ]; then
  log "building rondo (release)"
  cargo build --release --quiet -p rondo
fi
RONDO=${RONDO:-$TARGET_DIR/release/rondo}
[ -x "$RONDO" ] || die "missing $RONDO (build it first)"

TMP=$(mktemp -d /tmp/rondo-bench-compress.XXXXXX)
PIDS=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
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
wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$TMP/$2.log" >&2 2>/dev/null || true
  die "$2 did not listen on $1"
}
cpu_s() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$1/stat"; }

mkdir -p "$TMP/www" "$TMP/temp"
# nginx's workers drop root: they must read the body.
chmod 755 "$TMP" "$TMP/www"
if [ -n "${BENCH_BODY:-}" ]; then
  cp "$BENCH_BODY" "$TMP/www/body.txt"
else
  find /usr/share/doc -name copyright -type f | sort | xargs cat 2>/dev/null | head -c 4194304 >"$TMP/www/body.txt" || true
fi
chmod 644 "$TMP/www/body.txt"
BODY_BYTES=$(stat -c %s "$TMP/www/body.txt")
[ "$BODY_BYTES" -gt 0 ] || die "empty body"

temp_paths="client_body_temp_path $TMP/temp; proxy_temp_path $TMP/temp; fastcgi_temp_path $TMP/temp; uwsgi_temp_path $TMP/temp; scgi_temp_path $TMP/temp;"
cat >"$TMP/member.conf" <<EOF
worker_processes 1;
pid $TMP/member.pid;
error_log $TMP/member.err warn;
events { worker_connections 1024; }
http { access_log off; $temp_paths default_type text/plain; gzip off;
  server { listen 127.0.0.1:$MEMBER_PORT; root $TMP/www; } }
EOF
cat >"$TMP/nginx.conf" <<EOF
worker_processes 1;
pid $TMP/nginx.pid;
error_log $TMP/nginx.err warn;
events { worker_connections 1024; }
http { access_log off; $temp_paths
  gzip on; gzip_comp_level 6; gzip_types text/plain; gzip_proxied any; gzip_min_length 1024;
  upstream m { server 127.0.0.1:$MEMBER_PORT; keepalive 16; }
  server { listen 127.0.0.1:$NGINX_PORT;
    location / { proxy_pass http://m; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
EOF
cat >"$TMP/rondo.toml" <<EOF
[[listener]]
name = "web"
listen = "127.0.0.1:$RONDO_PORT"

[[route]]
listener = "web"
cluster = "m"
filters = [ { compress = { types = ["text/*"], level = 6, encodings = ["gzip"] } } ]

[cluster.m]
members = [ { name = "m", address = "127.0.0.1:$MEMBER_PORT" } ]
EOF

start member "$LOAD_CPU" nginx -p "$TMP" -c "$TMP/member.conf" -g 'daemon off;'
start nginx "$PROXY_CPU" nginx -p "$TMP" -c "$TMP/nginx.conf" -g 'daemon off;'
start rondo "$PROXY_CPU" "$RONDO" serve --config "$TMP/rondo.toml" --workers 1
wait_port "$MEMBER_PORT" member
wait_port "$NGINX_PORT" nginx
wait_port "$RONDO_PORT" rondo
# nginx's work is its worker's (the master only waits).
NGINX_WORKER=$(pgrep -P "$PID_nginx" | head -1)
[ -n "$NGINX_WORKER" ] || die "no nginx worker"
declare -A PROC=([rondo]=$PID_rondo [nginx]=$NGINX_WORKER)
declare -A PORT=([rondo]=$RONDO_PORT [nginx]=$NGINX_PORT)

# Both proxies must hand back the member's exact bytes, gzip-encoded.
for p in rondo nginx; do
  curl -sS -H 'Accept-Encoding: gzip' -D "$TMP/$p.head" -o "$TMP/$p.gz" "http://127.0.0.1:${PORT[$p]}/body.txt"
  grep -qi '^content-encoding: gzip' "$TMP/$p.head" || die "$p did not gzip the body"
  gzip -dc "$TMP/$p.gz" | cmp -s - "$TMP/www/body.txt" || die "$p's gzip does not decode to the body"
done

# One case: REQS requests through proxy $1 with extra curl arguments; prints "cpu_ms_per_mib
# bytes_per_response".
measure() {
  local p=$1
  shift
  local before after size=0
  before=$(cpu_s "${PROC[$p]}")
  for _ in $(seq "$REQS"); do
    size=$(taskset -c "$LOAD_CPU" curl -sS "$@" -o /dev/null -w '%{size_download}' "http://127.0.0.1:${PORT[$p]}/body.txt")
  done
  after=$(cpu_s "${PROC[$p]}")
  awk -v a="$after" -v b="$before" -v n="$REQS" -v bytes="$BODY_BYTES" -v s="$size" \
    'BEGIN { printf "%.2f %d\n", (a - b) * 1000 / (n * bytes / 1048576), s }'
}

REV=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "## Compression: rondo \`compress\` (gzip 6) vs nginx \`gzip_comp_level 6\`"
echo
echo "rev $REV, body $BODY_BYTES bytes, $REQS requests x $ROUNDS rounds, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| round | proxy | gzip: CPU ms/MiB | identity: CPU ms/MiB | gzip ratio |"
echo "|---|---|---|---|---|"
for r in $(seq "$ROUNDS"); do
  for p in rondo nginx; do
    read -r gz gz_size < <(measure "$p" -H 'Accept-Encoding: gzip')
    read -r id _ < <(measure "$p")
    ratio=$(awk -v s="$gz_size" -v b="$BODY_BYTES" 'BEGIN { printf "%.3f", s / b }')
    echo "| $r | $p | $gz | $id | $ratio |"
  done
done
