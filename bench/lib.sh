# Shared helpers of the benchmark scripts that run proxies side by side (bench/tls.sh,
# bench/h2.sh): tools, process tracking (every process started is ended on exit), ports, CPU
# and memory readings, medians. Sourced, not run. The sourcing script sets BENCH_NAME (for
# messages) and TMP_PREFIX before sourcing, and calls `bench_tools PKG...` and
# `bench_binaries BUILD` itself.

log() { printf '[%s %s] %s\n' "$BENCH_NAME" "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'bench/%s.sh: %s\n' "${BENCH_NAME#bench-}" "$*" >&2; exit 1; }

# bench_tools INSTALL CMD:PKG...: apt-gets the packages whose command is missing (INSTALL=1) or
# fails naming them.
bench_tools() {
  local install=$1 entry cmd pkg missing=()
  shift
  for entry in "$@"; do
    cmd=${entry%%:*} pkg=${entry#*:}
    command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    [ "$install" = 1 ] || die "missing ${missing[*]} (run without --no-install to apt-get them)"
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  export PATH="$PATH:/usr/sbin:/sbin"
}

# bench_binaries BUILD: sets RONDO and LOADGEN (building them first with BUILD=1; only RONDO must
# exist, a script that runs LOADGEN checks it), REV (the git revision, marked when crates/ has
# uncommitted changes) and LOADAVG.
bench_binaries() {
  local target_dir=${CARGO_TARGET_DIR:-$ROOT/target}
  if [ "$1" = 1 ]; then
    log "building rondo and rondo-loadgen (release)"
    cargo build --release --quiet -p rondo -p rondo-bench
  fi
  RONDO=$target_dir/release/rondo
  LOADGEN=$target_dir/release/rondo-loadgen
  [ -x "$RONDO" ] || die "missing $RONDO (build it first)"
  LOADAVG=$(cut -d' ' -f1-3 /proc/loadavg)
  REV=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
  if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no -- crates Cargo.toml Cargo.lock 2>/dev/null)" ]; then
    REV+=" with uncommitted changes to crates/"
  fi
}

# --- processes: every one started is tracked and ended on exit ----------------------------------
TMP=$(mktemp -d "/tmp/$TMP_PREFIX.XXXXXX")
PIDS=()
children() { pgrep -P "$1" 2>/dev/null || true; }
stop_pids() {
  local all=() p
  for p in "$@"; do all+=("$p" $(children "$p")); done
  [ "${#all[@]}" -gt 0 ] || return 0
  kill -TERM "${all[@]}" 2>/dev/null || true
  for _ in $(seq 30); do
    local alive=0
    for p in "${all[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  kill -KILL "${all[@]}" 2>/dev/null || true
  for p in "$@"; do wait "$p" 2>/dev/null || true; done
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  stop_pids "${PIDS[@]}"
  if [ "${BENCH_KEEP_TMP:-0}" = 1 ]; then log "kept $TMP"; else rm -rf "$TMP"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# start NAME CPU CMD...: runs CMD pinned to CPU in the background, logs in $TMP/NAME.log, sets
# PID_NAME.
start() {
  local name=$1 cpu=$2
  shift 2
  taskset -c "$cpu" "$@" >"$TMP/$name.log" 2>&1 &
  PIDS+=($!)
  eval "PID_$name=$!"
}
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  for _ in $(seq 100); do
    port_open "$1" && return 0
    sleep 0.1
  done
  cat "$TMP/$2.log" >&2 2>/dev/null || true
  die "$2 did not listen on port $1 within 10 s"
}

# --- readings -----------------------------------------------------------------------------------
# utime+stime in clock ticks, summed over the given processes (all their threads).
cpu_ticks() {
  local total=0 p t
  for p in "$@"; do
    t=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}') || t=0
    total=$((total + ${t:-0}))
  done
  echo "$total"
}
rss_kib() {
  local total=0 p r
  for p in "$@"; do
    r=$(awk '/^VmRSS:/{print $2}' "/proc/$p/status" 2>/dev/null) || r=0
    total=$((total + ${r:-0}))
  done
  echo "$total"
}
TCK=$(getconf CLK_TCK)
core_jiffies() { awk -v c="cpu$1" '$1 == c {print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
busy() { awk -v a="$1" -v b="$2" 'BEGIN {split(a, x, " "); split(b, y, " "); printf "%.0f", (y[2] > x[2] ? 100 * (y[1] - x[1]) / (y[2] - x[2]) : 0)}'; }
# measure PROXY CMD...: runs CMD on LOAD_CPU; prints its output, then a line
# "cpu_us=... pbusy=... lbusy=..." (the proxy's CPU over the run, both cores' busy %). The
# proxy's process id is PPID_OF[PROXY].
measure() {
  local px=$1 before after p0 p1 l0 l1 out
  shift
  before=$(cpu_ticks "${PPID_OF[$px]}")
  p0=$(core_jiffies "$PROXY_CPU") l0=$(core_jiffies "$LOAD_CPU")
  out=$(taskset -c "$LOAD_CPU" "$@") || die "$px: $* failed: $out"
  after=$(cpu_ticks "${PPID_OF[$px]}")
  p1=$(core_jiffies "$PROXY_CPU") l1=$(core_jiffies "$LOAD_CPU")
  echo "$out"
  echo "cpu_us=$(((after - before) * 1000000 / TCK)) pbusy=$(busy "$p0" "$p1") lbusy=$(busy "$l0" "$l1")"
}
kv() { tr ' \n' '\n\n' <<<"$1" | awk -F= -v k="$2" '$1 == k {print $2; exit}'; }
median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
med() { tr ' ' '\n' <<<"$1" | grep . | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b == 0) print "n/a"; else printf "%.2f", a / b}'; }
per_conn() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN {printf "%.1f", (a - b) / n}'; }
verdict() { awk -v v="$1" -v t="$2" 'BEGIN {print (v >= t) ? "met" : "not met"}'; }

# The idle-connection benchmarks' setup (bench/idle.sh, bench/soak.sh): idle_member_conf FILE
# PORT writes one nginx member answering "m1" on PORT that keeps its connections 15 minutes;
# idle_rondo_conf FILE LISTEN MEMBER_PORT a rondo listening on LISTEN (20,000 connections, a
# 10-minute idle timeout) in front of it. nginx's temporary paths are under $TMP.
idle_member_conf() {
  cat >"$1" <<EOF
worker_processes 1;
worker_rlimit_nofile 4096;
pid $TMP/member.pid;
error_log $TMP/member.err warn;
events { worker_connections 2048; }
http {
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 900s;
  client_body_temp_path $TMP/body;
  proxy_temp_path $TMP/proxy;
  fastcgi_temp_path $TMP/fastcgi;
  uwsgi_temp_path $TMP/uwsgi;
  scgi_temp_path $TMP/scgi;
  server { listen 127.0.0.1:$2 backlog=4096; location / { return 200 "m1\n"; } }
}
EOF
}
idle_rondo_conf() {
  cat >"$1" <<EOF
[[listener]]
name = "web"
listen = "127.0.0.1:$2"
max_connections = 20000

[[route]]
listener = "web"
cluster = "members"
idle_timeout_ms = 600000

[cluster.members]
members = [ { name = "m1", address = "127.0.0.1:$3" } ]
EOF
}

# hold_connections ADDR N SECS TAG: N idle keep-alive connections to ADDR (one request each),
# held for SECS by $LOADGEN, one process per 9,000 connections (each needs a descriptor per
# connection); returns once all are open, or dies naming TAG. The processes' ids are in
# HELD_PIDS (and PIDS, for the cleanup).
hold_connections() {
  local addr=$1 n=$2 secs=$3 tag=$4 left=$2 k=0 share i
  local outs=() shares=()
  HELD_PIDS=()
  while [ "$left" -gt 0 ]; do
    share=$((left > 9000 ? 9000 : left))
    "$LOADGEN" hold --target "$addr" --connections "$share" --concurrency 64 \
      --hold-secs "$secs" >"$TMP/hold-$tag-$k.out" 2>&1 &
    HELD_PIDS+=($!) PIDS+=($!) outs+=("$TMP/hold-$tag-$k.out") shares+=("$share")
    left=$((left - share)) k=$((k + 1))
  done
  for i in "${!outs[@]}"; do
    for _ in $(seq 1200); do
      grep -q '^held=' "${outs[$i]}" 2>/dev/null && break
      sleep 0.1
    done
    grep -q "^held=${shares[$i]} errors=0 " "${outs[$i]}" \
      || { cat "${outs[$i]}" >&2; die "$tag: could not open ${shares[$i]} of $n connections"; }
  done
}
