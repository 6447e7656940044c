#!/usr/bin/env bash
# Loopback benchmark: rondo vs HAProxy (one thread) vs nginx (one worker), side by side in one
# run, behind the same three members.
#
#   bench/run.sh              full run (about 5 minutes once built)
#   bench/run.sh --quick      smoke test (about 1 minute, one repeat, short runs)
#   bench/run.sh --tls        the TLS benchmark instead, rondo vs HAProxy (bench/tls.sh: full
#                             handshakes/s with ECDSA and RSA certificates, keep-alive requests/s
#                             over TLS, RSS per idle TLS connection; --quick, --no-install and
#                             --no-build apply)
#   bench/run.sh --h2         the HTTP/2 benchmark instead, rondo vs HAProxy with h2load
#                             (bench/h2.sh: h2c → HTTP/1.1, h2c → h2c and TLS h2 → HTTP/1.1
#                             members; requests/s, CPU per request, p50/p99 at a fixed rate,
#                             RSS per idle HTTP/2 connection; --quick, --no-install and
#                             --no-build apply)
#   bench/run.sh --workers 2  two cores instead (bench/cores.sh): rondo --workers 2, work-stealing
#                             and per-core, against HAProxy nbthread 2, unpinned; requests/s and
#                             requests per proxy CPU-second (--quick, --no-install and
#                             --no-build apply)
#
# Options:
#   --members nginx|rondo     what serves as the three members (default nginx, see below)
#   --profile                 afterwards, profile each proxy under wrk (perf record -g, self
#                             time grouped by bench/perf-categories.awk, priced in µs/request;
#                             appended to the results and in bench/results/perf.md; installs
#                             linux-perf if missing)
#   --no-install              don't apt-get anything (fail if a tool is missing)
#   --no-build                use the binaries already in target/release
#
# Environment: BENCH_PROXY_CPU (default 0) and BENCH_LOAD_CPU (default 1) choose the cores;
# BENCH_PORT_BASE (default 18000) the ports; BENCH_KEEP_TMP=1 keeps the temporary directory;
# BENCH_LAT_ROUNDS (default: the throughput rounds, 3) how many latency rounds (b) makes, for a
# p99 that one disturbed minute moves less (each round is 12 s per target).
#
# What it measures, for each proxy (all three run at once, each pinned to BENCH_PROXY_CPU; the
# members, wrk and the load generator share BENCH_LOAD_CPU; throughput and latency runs are
# interleaved across proxies so drift on a noisy machine hits all of them alike):
#   (a) requests/s: wrk -t1 -c64 for 10 s after a 2 s warm-up, median of 3 rounds;
#   (b) latency at a fixed 5,000 requests/s for 10 s (after 2 s unmeasured) from rondo-loadgen
#       (open loop, 64 keep-alive connections; a request's latency runs from its release on
#       the fixed schedule, queueing behind slow responses included, so no coordinated
#       omission), median of 3 rounds (BENCH_LAT_ROUNDS); the same run straight at the members
#       is the baseline, and "added" latency is proxy minus direct;
#   (c) CPU per request: utime+stime of all the proxy's processes (/proc/PID/stat) across each
#       throughput run divided by the requests wrk completed (and the same at 5,000 req/s);
#   (d) RSS at 1,000 client connections: rondo-loadgen opens 1,000 keep-alive connections (64
#       at a time), one request on each, and holds them; VmRSS of the proxy's processes, summed.
# Results: a markdown table on stdout and in bench/results/latest.md (quick runs write
# bench/results/quick.md instead, so a smoke test never overwrites the recorded numbers).
#
# Members: nginx (one worker process, three `server` blocks on three ports, `return 200`) by
# default. A member must cost little CPU because it shares a core with the load generator: at
# proxy saturation the members serve every request too, and if that core ran out first the
# numbers would measure it, not the proxies. nginx's static `return` is the cheapest neutral
# HTTP/1.1 server at hand (5.1 µs CPU per request here, against 5.5 µs for `rondo member`),
# runs as one single-threaded process (no threads competing on the shared core) and is not
# rondo's own HTTP stack. `--members rondo` uses three `rondo member` processes instead. The
# table's "busy %" row shows how close the load core came to saturation in each run.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

for arg in "$@"; do
  if [ "$arg" = --tls ]; then exec "$ROOT/bench/tls.sh" "$@"; fi
  if [ "$arg" = --h2 ]; then exec "$ROOT/bench/h2.sh" "$@"; fi
  case "$arg" in --workers|--workers=*) exec "$ROOT/bench/cores.sh" "$@" ;; esac
done

quick=0
members=nginx
profile=0
install=1
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --members) shift; members=${1:-} ;;
    --members=*) members=${1#*=} ;;
    --profile) profile=1 ;;
    --no-install) install=0 ;;
    --no-build) build=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/run.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$members" in nginx|rondo) ;; *) echo "bench/run.sh: --members is nginx or rondo" >&2; exit 2 ;; esac

if [ "$quick" = 1 ]; then
  TP_WARM=1 TP_DUR=3 ROUNDS=1 LAT_WARM=1 LAT_DUR=3
else
  TP_WARM=2 TP_DUR=10 ROUNDS=3 LAT_WARM=2 LAT_DUR=10
fi
LAT_ROUNDS=${BENCH_LAT_ROUNDS:-$ROUNDS}
case "$LAT_ROUNDS" in ''|*[!0-9]*|0) echo "bench/run.sh: BENCH_LAT_ROUNDS is a positive number" >&2; exit 2 ;; esac
RATE=5000          # fixed rate of the latency runs, requests/s
TP_CONNS=64        # wrk connections
LAT_CONNS=64       # load generator connections at the fixed rate
HOLD_CONNS=1000    # connections held for the memory reading
PROXY_CPU=${BENCH_PROXY_CPU:-0}
LOAD_CPU=${BENCH_LOAD_CPU:-1}
BASE=${BENCH_PORT_BASE:-18000}
MEMBER_PORTS=($((BASE + 1)) $((BASE + 2)) $((BASE + 3)))
PROXIES=(rondo haproxy nginx)
declare -A PORT=([rondo]=$((BASE + 10)) [haproxy]=$((BASE + 11)) [nginx]=$((BASE + 12)))

# Logging, process tracking and readings shared with the other benchmark scripts.
BENCH_NAME=bench-run TMP_PREFIX=rondo-bench
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --- tools --------------------------------------------------------------------------------------
need=(haproxy:haproxy nginx:nginx wrk:wrk taskset:util-linux)
[ "$profile" = 1 ] && need+=(perf:linux-perf)
missing=()
for entry in "${need[@]}"; do
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

if [ "$build" = 1 ]; then
  log "building rondo and rondo-loadgen (release)"
  cargo build --release --quiet -p rondo -p rondo-bench
fi
RONDO=$ROOT/target/release/rondo
LOADGEN=$ROOT/target/release/rondo-loadgen
[ -x "$RONDO" ] && [ -x "$LOADGEN" ] || die "missing $RONDO or $LOADGEN (build them first)"

LOADAVG=$(cut -d' ' -f1-3 /proc/loadavg)
REV=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no -- crates Cargo.toml Cargo.lock 2>/dev/null)" ]; then
  REV+=" with uncommitted changes to crates/"
fi
cpus=$(nproc)
[ "$cpus" -ge 2 ] || log "warning: only $cpus CPU: the proxy and the load share it"
[ "$PROXY_CPU" -lt "$cpus" ] && [ "$LOAD_CPU" -lt "$cpus" ] || die "no CPU $PROXY_CPU or $LOAD_CPU here"

# --- processes (tracked by lib.sh) and ports ----------------------------------------------------
for p in "${MEMBER_PORTS[@]}" "${PORT[@]}"; do
  port_open "$p" && die "port $p is taken (set BENCH_PORT_BASE)"
done

# The proxy's processes: the process itself and its children (nginx's workers).
proxy_pids() { local p=${1}; echo "$p" $(children "$p"); }
# "busy total steal" jiffies of one CPU from /proc/stat (lib.sh's two, and the steal this
# script reports).
core_jiffies() { awk -v c="cpu$1" '$1 == c {print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9, $9}' /proc/stat; }
# Voluntary context switches (sleeps) summed over every thread of the given processes.
sleeps() {
  local p
  for p in "$@"; do cat /proc/"$p"/task/*/status 2>/dev/null; done | awk '/^voluntary_ctxt_switches/ {s += $2} END {print s + 0}'
}

# --- configurations -----------------------------------------------------------------------------
nginx_common() {
  cat <<EOF
worker_processes 1;
worker_rlimit_nofile 20000;
pid $TMP/$1.pid;
error_log $TMP/$1.err warn;
events { worker_connections 8192; }
EOF
}
nginx_http_common() {
  cat <<EOF
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 120s;
  client_body_temp_path $TMP/$1-body;
  proxy_temp_path $TMP/$1-proxy;
  fastcgi_temp_path $TMP/$1-fastcgi;
  uwsgi_temp_path $TMP/$1-uwsgi;
  scgi_temp_path $TMP/$1-scgi;
EOF
}

{
  nginx_common members
  echo "http {"
  nginx_http_common members
  i=1
  for p in "${MEMBER_PORTS[@]}"; do
    echo "  server { listen 127.0.0.1:$p backlog=4096; location / { default_type text/plain; return 200 \"m$i\\n\"; } }"
    i=$((i + 1))
  done
  echo "}"
} >"$TMP/members.conf"

{
  echo "[[listener]]"
  echo "name = \"web\""
  echo "listen = \"127.0.0.1:${PORT[rondo]}\""
  echo "max_connections = 20000"
  echo
  echo "[[route]]"
  echo "listener = \"web\""
  echo "cluster = \"members\""
  echo
  echo "[cluster.members]"
  echo "algorithm = \"round-robin\""
  echo "members = ["
  i=1
  for p in "${MEMBER_PORTS[@]}"; do
    echo "  { name = \"m$i\", address = \"127.0.0.1:$p\" },"
    i=$((i + 1))
  done
  echo "]"
} >"$TMP/rondo.toml"

{
  cat <<EOF
global
  nbthread 1
  maxconn 9000

defaults
  mode http
  option http-keep-alive
  option forwardfor
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout http-keep-alive 60s

frontend web
  bind 127.0.0.1:${PORT[haproxy]}
  default_backend members

backend members
  balance roundrobin
EOF
  i=1
  for p in "${MEMBER_PORTS[@]}"; do
    echo "  server m$i 127.0.0.1:$p"
    i=$((i + 1))
  done
} >"$TMP/haproxy.cfg"

{
  nginx_common nginx-proxy
  echo "http {"
  nginx_http_common nginx-proxy
  echo "  upstream members {"
  for p in "${MEMBER_PORTS[@]}"; do echo "    server 127.0.0.1:$p;"; done
  echo "    keepalive 64;"
  echo "    keepalive_requests 100000000;"
  echo "  }"
  cat <<EOF
  server {
    listen 127.0.0.1:${PORT[nginx]} backlog=4096;
    location / {
      proxy_pass http://members;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
    }
  }
}
EOF
} >"$TMP/nginx-proxy.conf"

# --- start everything ---------------------------------------------------------------------------
if [ "$members" = nginx ]; then
  start members "$LOAD_CPU" nginx -e "$TMP/members.err" -p "$TMP" -c "$TMP/members.conf" -g 'daemon off;'
else
  i=1
  for p in "${MEMBER_PORTS[@]}"; do
    start "member$i" "$LOAD_CPU" "$RONDO" member --name "m$i" --listen "127.0.0.1:$p"
    i=$((i + 1))
  done
fi
for p in "${MEMBER_PORTS[@]}"; do wait_port "$p" members; done
MPIDS=()
if [ "$members" = nginx ]; then
  MPIDS=($(proxy_pids "$PID_members"))
else
  MPIDS=("$PID_member1" "$PID_member2" "$PID_member3")
fi

start rondo "$PROXY_CPU" "$RONDO" serve --config "$TMP/rondo.toml" --workers 1
start haproxy "$PROXY_CPU" haproxy -db -f "$TMP/haproxy.cfg"
start nginx "$PROXY_CPU" nginx -e "$TMP/nginx-proxy.err" -p "$TMP" -c "$TMP/nginx-proxy.conf" -g 'daemon off;'
for px in "${PROXIES[@]}"; do wait_port "${PORT[$px]}" "$px"; done
sleep 0.5
declare -A PPIDS
for px in "${PROXIES[@]}"; do
  pid_var=PID_$px
  PPIDS[$px]=$(proxy_pids "${!pid_var}")
done

url() { echo "http://127.0.0.1:$1/"; }
direct_targets=()
for p in "${MEMBER_PORTS[@]}"; do direct_targets+=(--target "127.0.0.1:$p"); done
targets_of() {
  if [ "$1" = direct ]; then echo "${direct_targets[@]}"; else echo "--target 127.0.0.1:${PORT[$1]}"; fi
}
kv() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k {print $2}'; }

# Every target answers 200 before anything is measured.
for t in direct "${PROXIES[@]}"; do
  out=$(timeout 20 taskset -c "$LOAD_CPU" "$LOADGEN" rate $(targets_of "$t") --rate 200 \
    --duration-secs 0.5 --warmup-secs 0 --connections 4) || die "$t: smoke test failed: $out"
  [ "$(kv "$out" ok)" -gt 0 ] && [ "$(kv "$out" errors)" = 0 ] && [ "$(kv "$out" bad_status)" = 0 ] \
    || die "$t: smoke test failed: $out"
done
log "members ($members) and proxies up; rondo $("$RONDO" --version | awk 'NR == 1 {print $2}'), $(haproxy -v | awk 'NR == 1' | awk '{print $1, $3}'), $(nginx -v 2>&1 | sed 's/.*: //')"

# --- (a)+(c) throughput -------------------------------------------------------------------------
# wrk_run NAME PORT SECONDS: prints "requests rps errors cpu_us_per_request"
wrk_run() {
  local name=$1 port=$2 secs=$3 pids=() before after out reqs rps errs p0 p1 l0 l1 m0 m1
  [ "$name" != direct ] && read -r -a pids <<<"${PPIDS[$name]}"
  before=$(cpu_ticks "${pids[@]}")
  p0=$(core_jiffies "$PROXY_CPU") l0=$(core_jiffies "$LOAD_CPU") m0=$(sleeps "${MPIDS[@]}")
  out=$(timeout $((secs + 20)) taskset -c "$LOAD_CPU" wrk -t1 -c"$TP_CONNS" -d"${secs}s" --timeout 2s "$(url "$port")") \
    || die "wrk against $name failed: $out"
  after=$(cpu_ticks "${pids[@]}")
  p1=$(core_jiffies "$PROXY_CPU") l1=$(core_jiffies "$LOAD_CPU") m1=$(sleeps "${MPIDS[@]}")
  reqs=$(awk '/requests in/{print $1}' <<<"$out")
  rps=$(awk '/^Requests\/sec/{print $2}' <<<"$out")
  errs=$(awk '/Non-2xx/{n += $NF} /Socket errors/{gsub(/[^0-9 ]/, ""); for (i = 1; i <= NF; i++) n += $i} END {print n + 0}' <<<"$out")
  awk -v r="$reqs" -v s="$rps" -v e="$errs" -v d=$((after - before)) -v t="$TCK" -v p0="$p0" -v p1="$p1" \
    -v l0="$l0" -v l1="$l1" -v m=$((m1 - m0)) '
    function busy(a, b,    x, y) { split(a, x, " "); split(b, y, " "); return y[2] > x[2] ? 100 * (y[1] - x[1]) / (y[2] - x[2]) : 0 }
    function steal(a, b,    x, y) { split(a, x, " "); split(b, y, " "); return y[2] > x[2] ? 100 * (y[3] - x[3]) / (y[2] - x[2]) : 0 }
    BEGIN {printf "%d %.0f %d %.2f %.0f %.0f %.0f %.3f\n", r, s, e, (r > 0 ? d / t * 1e6 / r : 0),
      busy(p0, p1), busy(l0, l1), steal(p0, p1) + steal(l0, l1), (r > 0 ? m / r : 0)}'
}
median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

declare -A TP_RPS TP_CPU TP_ERR TP_PBUSY TP_LBUSY TP_STEAL TP_MSLEEP
log "throughput: wrk -t1 -c$TP_CONNS, ${TP_DUR}s x $ROUNDS rounds (warm-up ${TP_WARM}s each)"
for t in direct "${PROXIES[@]}"; do
  p=${PORT[$t]:-${MEMBER_PORTS[0]}}
  res=$(wrk_run "$t" "$p" "$TP_WARM")
done
for round in $(seq "$ROUNDS"); do
  for t in direct "${PROXIES[@]}"; do
    p=${PORT[$t]:-${MEMBER_PORTS[0]}}
    res=$(wrk_run "$t" "$p" "$TP_DUR")
    read -r reqs rps errs cpu pbusy lbusy steal msleep <<<"$res"
    log "  round $round $t: $rps req/s, $cpu us CPU/request, $errs errors; cores busy: proxy $pbusy%, load $lbusy% (steal $steal%); member sleeps/request $msleep"
    TP_PBUSY[$t]+="$pbusy "
    TP_LBUSY[$t]+="$lbusy "
    TP_STEAL[$t]+="$steal "
    TP_MSLEEP[$t]+="$msleep "
    TP_RPS[$t]+="$rps "
    TP_CPU[$t]+="$cpu "
    TP_ERR[$t]=$(( ${TP_ERR[$t]:-0} + errs ))
  done
done

# --- (b) latency at a fixed rate ----------------------------------------------------------------
declare -A L50 L99 L999 LMAX LERR LCPU LAG
log "latency: $RATE req/s open loop, ${LAT_DUR}s (after ${LAT_WARM}s) x $LAT_ROUNDS rounds"
for round in $(seq "$LAT_ROUNDS"); do
  for t in direct "${PROXIES[@]}"; do
    pids=()
    [ "$t" != direct ] && read -r -a pids <<<"${PPIDS[$t]}"
    before=$(cpu_ticks "${pids[@]}")
    out=$(timeout $((LAT_WARM + LAT_DUR + 30)) taskset -c "$LOAD_CPU" "$LOADGEN" rate $(targets_of "$t") \
      --rate "$RATE" --duration-secs "$LAT_DUR" --warmup-secs "$LAT_WARM" --connections "$LAT_CONNS") \
      || die "rondo-loadgen against $t failed: $out"
    after=$(cpu_ticks "${pids[@]}")
    log "  round $round $t: p50 $(kv "$out" p50_us) us, p99 $(kv "$out" p99_us) us, max $(kv "$out" max_us) us, errors $(( $(kv "$out" errors) + $(kv "$out" bad_status) + $(kv "$out" timeouts) )), pacer lag p99 $(kv "$out" pacer_lag_p99_us) us"
    L50[$t]+="$(kv "$out" p50_us) "
    L99[$t]+="$(kv "$out" p99_us) "
    L999[$t]+="$(kv "$out" p999_us) "
    LMAX[$t]+="$(kv "$out" max_us) "
    LAG[$t]+="$(kv "$out" pacer_lag_p99_us) "
    LERR[$t]=$(( ${LERR[$t]:-0} + $(kv "$out" errors) + $(kv "$out" bad_status) + $(kv "$out" timeouts) ))
    total=$(awk -v r="$RATE" -v a="$LAT_WARM" -v b="$LAT_DUR" 'BEGIN {print r * (a + b)}')
    LCPU[$t]+="$(awk -v d=$((after - before)) -v tck="$TCK" -v n="$total" 'BEGIN {printf "%.2f", d / tck * 1e6 / n}') "
  done
done

# --- (d) memory at 1,000 client connections -----------------------------------------------------
declare -A RSS_IDLE RSS_HELD HELD
log "memory: $HOLD_CONNS keep-alive connections held"
for px in "${PROXIES[@]}"; do
  read -r -a pids <<<"${PPIDS[$px]}"
  RSS_IDLE[$px]=$(rss_kib "${pids[@]}")
  hold_out=$TMP/hold-$px.out
  taskset -c "$LOAD_CPU" "$LOADGEN" hold --target "127.0.0.1:${PORT[$px]}" --connections "$HOLD_CONNS" \
    --concurrency 64 --hold-secs 60 >"$hold_out" 2>&1 &
  hold_pid=$!
  PIDS+=("$hold_pid")
  for _ in $(seq 300); do
    grep -q '^held=' "$hold_out" 2>/dev/null && break
    kill -0 "$hold_pid" 2>/dev/null || break
    sleep 0.1
  done
  grep -q '^held=' "$hold_out" || { cat "$hold_out" >&2; die "$px: could not open $HOLD_CONNS connections"; }
  sleep 1
  RSS_HELD[$px]=$(rss_kib "${pids[@]}")
  HELD[$px]=$(sed -n 's/^held=\([0-9]*\).*/\1/p' "$hold_out")
  log "  $px: $(cat "$hold_out"), RSS ${RSS_IDLE[$px]} KiB before, ${RSS_HELD[$px]} KiB held"
  stop_pids "$hold_pid"
  sleep 1
done

# --- optional profile ---------------------------------------------------------------------------
# Each proxy under wrk for PROF_SECS with `perf record -g` attached; the flat profile (self time)
# is grouped by bench/perf-categories.awk and priced in CPU microseconds per request.
if [ "$profile" = 1 ]; then
  PROF_SECS=10
  perf_md=$TMP/perf.md
  {
    echo "Profiles: \`perf record -F 999 -g\` attached to each proxy for ${PROF_SECS}s of \`wrk -t1 -c$TP_CONNS\`;"
    echo "self time (\`perf report --no-children\`) grouped by bench/perf-categories.awk. µs/request is the"
    echo "share times the proxy's CPU per request measured during the profiled run (perf adds some overhead)."
  } >"$perf_md"
  for px in "${PROXIES[@]}"; do
    read -r -a pids <<<"${PPIDS[$px]}"
    log "profiling $px under wrk (perf record -g, ${PROF_SECS}s)"
    before=$(cpu_ticks "${pids[@]}")
    timeout $((PROF_SECS + 20)) perf record -F 999 -g -o "$TMP/perf-$px.data" -p "$(tr ' ' ',' <<<"${pids[*]}")" \
      -- sleep "$PROF_SECS" >"$TMP/perf-$px.log" 2>&1 &
    perf_pid=$!
    PIDS+=("$perf_pid")
    out=$(timeout $((PROF_SECS + 20)) taskset -c "$LOAD_CPU" wrk -t1 -c"$TP_CONNS" -d"$((PROF_SECS + 1))s" "$(url "${PORT[$px]}")") || true
    wait "$perf_pid" || true
    after=$(cpu_ticks "${pids[@]}")
    reqs=$(awk '/requests in/{print $1}' <<<"$out")
    rps=$(awk '/^Requests\/sec/{print $2}' <<<"$out")
    us=$(awk -v d=$((after - before)) -v t="$TCK" -v r="${reqs:-0}" 'BEGIN {printf "%.2f", (r > 0 ? d / t * 1e6 / r : 0)}')
    perf report -i "$TMP/perf-$px.data" --no-children --stdio -g none --sort dso,sym 2>/dev/null >"$TMP/perf-$px.txt" || true
    {
      echo
      echo "### $px: ${rps:-?} requests/s under perf, $us µs CPU per request"
      echo
      echo "| where | share | µs/request |"
      echo "|---|---:|---:|"
      awk -v us_per_req="$us" -f "$ROOT/bench/perf-categories.awk" "$TMP/perf-$px.txt"
      if [ "$px" = rondo ]; then
        echo
        echo "Top symbols (self time):"
        echo
        echo '```'
        grep -E '^ +[0-9.]+%' "$TMP/perf-$px.txt" | awk 'NR <= 40' | sed -E 's/ +$//' | cut -c1-160
        echo '```'
      fi
    } >>"$perf_md"
  done
  mkdir -p "$ROOT/bench/results"
  cp "$perf_md" "$ROOT/bench/results/perf.md"
  log "  wrote bench/results/perf.md"
fi

# --- results ------------------------------------------------------------------------------------
declare -A M_RPS M_CPU M_L50 M_L99 M_L999 M_LMAX M_LCPU M_LAG M_PBUSY M_LBUSY M_STEAL M_MSLEEP
for t in direct "${PROXIES[@]}"; do
  M_RPS[$t]=$(tr ' ' '\n' <<<"${TP_RPS[$t]}" | grep . | median)
  M_CPU[$t]=$(tr ' ' '\n' <<<"${TP_CPU[$t]}" | grep . | median)
  M_L50[$t]=$(tr ' ' '\n' <<<"${L50[$t]}" | grep . | median)
  M_L99[$t]=$(tr ' ' '\n' <<<"${L99[$t]}" | grep . | median)
  M_L999[$t]=$(tr ' ' '\n' <<<"${L999[$t]}" | grep . | median)
  M_LMAX[$t]=$(tr ' ' '\n' <<<"${LMAX[$t]}" | grep . | median)
  M_LCPU[$t]=$(tr ' ' '\n' <<<"${LCPU[$t]}" | grep . | median)
  M_LAG[$t]=$(tr ' ' '\n' <<<"${LAG[$t]}" | grep . | median)
  M_PBUSY[$t]=$(tr ' ' '\n' <<<"${TP_PBUSY[$t]}" | grep . | median)
  M_LBUSY[$t]=$(tr ' ' '\n' <<<"${TP_LBUSY[$t]}" | grep . | median)
  M_STEAL[$t]=$(tr ' ' '\n' <<<"${TP_STEAL[$t]}" | grep . | median)
  M_MSLEEP[$t]=$(tr ' ' '\n' <<<"${TP_MSLEEP[$t]}" | grep . | median)
done

f() { awk -v v="$1" -v fmt="$2" 'BEGIN {printf fmt, v}'; }
sub_() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.0f", a - b}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b == 0) print "n/a"; else printf "%.2f", a / b}'; }
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
per_conn() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN {printf "%.1f", (a - b) / n}'; }
verdict() { awk -v v="$1" -v op="$2" -v t="$3" 'BEGIN {ok = (op == ">=") ? v >= t : v <= t; print ok ? "met" : "not met"}'; }

hv=$(haproxy -v | awk 'NR == 1' | awk '{print $3}' | sed 's/-.*//')
nv=$(nginx -v 2>&1 | sed 's/.*nginx\///')
rv=$("$RONDO" --version | awk 'NR == 1 {print $2}')
mode=full
cmd=bench/run.sh
if [ "$quick" = 1 ]; then mode=quick cmd+=" --quick"; fi
if [ "$members" != nginx ]; then cmd+=" --members $members"; fi
if [ "$profile" = 1 ]; then cmd+=" --profile"; fi
if [ "$LAT_ROUNDS" != "$ROUNDS" ]; then cmd="BENCH_LAT_ROUNDS=$LAT_ROUNDS $cmd"; fi

r_tp=$(ratio "${M_RPS[rondo]}" "${M_RPS[haproxy]}")
r_tp_n=$(ratio "${M_RPS[rondo]}" "${M_RPS[nginx]}")
add99() { sub_ "${M_L99[$1]}" "${M_L99[direct]}"; }
add50() { sub_ "${M_L50[$1]}" "${M_L50[direct]}"; }
r_p99=$(ratio "$(add99 rondo)" "$(add99 haproxy)")
r_p99_n=$(ratio "$(add99 rondo)" "$(add99 nginx)")
r_rss=$(ratio "${RSS_HELD[rondo]}" "${RSS_HELD[haproxy]}")
r_rss_n=$(ratio "${RSS_HELD[rondo]}" "${RSS_HELD[nginx]}")
r_cpu=$(ratio "${M_CPU[rondo]}" "${M_CPU[haproxy]}")
r_cpu_n=$(ratio "${M_CPU[rondo]}" "${M_CPU[nginx]}")
# Requests per second per proxy core: the inverse of the CPU per request ratio (the target's
# measure; raw requests/s also moves with how busy the load core was).
r_core=$(ratio "${M_CPU[haproxy]}" "${M_CPU[rondo]}")
r_core_n=$(ratio "${M_CPU[nginx]}" "${M_CPU[rondo]}")

row() { printf '| %s | %s | %s | %s | %s |\n' "$@"; }
report() {
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) with \`$cmd\` ($mode run: ${ROUNDS} round(s)$([ "$LAT_ROUNDS" != "$ROUNDS" ] && echo ", $LAT_ROUNDS latency rounds"), medians);"
  echo "rondo built from git $REV."
  echo "Machine: $(nproc) vCPU ($(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)), Linux $(uname -r);"
  echo "proxy on CPU $PROXY_CPU; members ($members), wrk and rondo-loadgen on CPU $LOAD_CPU; load average at start: $LOADAVG."
  echo
  row "" "rondo $rv (1 worker)" "HAProxy $hv (nbthread 1)" "nginx $nv (1 worker)" "direct to members"
  row "---" "---:" "---:" "---:" "---:"
  row "requests/s (wrk -t1 -c$TP_CONNS, ${TP_DUR}s)" "$(f "${M_RPS[rondo]}" %.0f)" "$(f "${M_RPS[haproxy]}" %.0f)" "$(f "${M_RPS[nginx]}" %.0f)" "$(f "${M_RPS[direct]}" %.0f)"
  row "CPU per request at saturation (µs)" "${M_CPU[rondo]}" "${M_CPU[haproxy]}" "${M_CPU[nginx]}" "–"
  row "CPU per request at $RATE req/s (µs)" "${M_LCPU[rondo]}" "${M_LCPU[haproxy]}" "${M_LCPU[nginx]}" "–"
  row "p50 latency at $RATE req/s (µs)" "$(f "${M_L50[rondo]}" %.0f)" "$(f "${M_L50[haproxy]}" %.0f)" "$(f "${M_L50[nginx]}" %.0f)" "$(f "${M_L50[direct]}" %.0f)"
  row "p99 latency at $RATE req/s (µs)" "$(f "${M_L99[rondo]}" %.0f)" "$(f "${M_L99[haproxy]}" %.0f)" "$(f "${M_L99[nginx]}" %.0f)" "$(f "${M_L99[direct]}" %.0f)"
  row "p99.9 latency at $RATE req/s (µs)" "$(f "${M_L999[rondo]}" %.0f)" "$(f "${M_L999[haproxy]}" %.0f)" "$(f "${M_L999[nginx]}" %.0f)" "$(f "${M_L999[direct]}" %.0f)"
  row "p50 added over direct (µs)" "$(add50 rondo)" "$(add50 haproxy)" "$(add50 nginx)" "–"
  row "p99 added over direct (µs)" "$(add99 rondo)" "$(add99 haproxy)" "$(add99 nginx)" "–"
  row "RSS before, after the load runs (MiB)" "$(mib "${RSS_IDLE[rondo]}")" "$(mib "${RSS_IDLE[haproxy]}")" "$(mib "${RSS_IDLE[nginx]}")" "–"
  row "RSS at $HOLD_CONNS client connections (MiB)" "$(mib "${RSS_HELD[rondo]}")" "$(mib "${RSS_HELD[haproxy]}")" "$(mib "${RSS_HELD[nginx]}")" "–"
  row "RSS per held connection (KiB)" "$(per_conn "${RSS_HELD[rondo]}" "${RSS_IDLE[rondo]}" "$HOLD_CONNS")" "$(per_conn "${RSS_HELD[haproxy]}" "${RSS_IDLE[haproxy]}" "$HOLD_CONNS")" "$(per_conn "${RSS_HELD[nginx]}" "${RSS_IDLE[nginx]}" "$HOLD_CONNS")" "–"
  row "busy % of proxy core / load core (throughput)" "${M_PBUSY[rondo]} / ${M_LBUSY[rondo]}" "${M_PBUSY[haproxy]} / ${M_LBUSY[haproxy]}" "${M_PBUSY[nginx]} / ${M_LBUSY[nginx]}" "${M_PBUSY[direct]} / ${M_LBUSY[direct]}"
  row "member sleeps per request (throughput)" "${M_MSLEEP[rondo]}" "${M_MSLEEP[haproxy]}" "${M_MSLEEP[nginx]}" "${M_MSLEEP[direct]}"
  row "errors (throughput / latency runs)" "${TP_ERR[rondo]} / ${LERR[rondo]}" "${TP_ERR[haproxy]} / ${LERR[haproxy]}" "${TP_ERR[nginx]} / ${LERR[nginx]}" "${TP_ERR[direct]} / ${LERR[direct]}"
  echo
  echo "Ratios in this run (targets for one worker thread vs HAProxy in brackets):"
  echo
  echo "| | rondo / HAProxy | rondo / nginx |"
  echo "|---|---:|---:|"
  echo "| requests/s | $r_tp | $r_tp_n |"
  echo "| requests/s per proxy core | $r_core [≥ 1.15: $(verdict "$r_core" ">=" 1.15)] | $r_core_n |"
  echo "| p99 added latency at $RATE req/s | $r_p99 [≤ 1.00: $(verdict "$r_p99" "<=" 1.0)] | $r_p99_n |"
  echo "| RSS at $HOLD_CONNS connections | $r_rss [≤ 1.00: $(verdict "$r_rss" "<=" 1.0)] | $r_rss_n |"
  echo "| CPU per request at saturation | $r_cpu | $r_cpu_n |"
  echo
  echo "Per-round values (rounds in order):"
  echo
  TP_CPU[direct]="– "
  for t in direct "${PROXIES[@]}"; do
    echo "- $t: req/s ${TP_RPS[$t]}| CPU µs/req ${TP_CPU[$t]}| steal % ${TP_STEAL[$t]}| p50 µs ${L50[$t]}| p99 µs ${L99[$t]}| max µs ${LMAX[$t]}| pacer lag p99 µs ${LAG[$t]}"
  done
}
mkdir -p "$ROOT/bench/results"
out_md=$ROOT/bench/results/latest.md
[ "$quick" = 1 ] && out_md=$ROOT/bench/results/quick.md
{
  report
  if [ "$profile" = 1 ]; then echo; cat "$TMP/perf.md"; fi
} | tee "$out_md"
log "wrote ${out_md#"$ROOT"/}"
