#!/usr/bin/env bash
# HTTP/2 benchmark (issue 35): rondo vs HAProxy, side by side in one run, with h2load as the
# client. Run through bench/run.sh:
#
#   bench/run.sh --h2               full run (about 7 minutes once built)
#   bench/run.sh --h2 --quick       smoke test (about 2 minutes, one round, short runs)
#
# Options: --quick, --no-install (don't apt-get anything), --no-build (use the binaries already
# in $CARGO_TARGET_DIR/release, default target/release), --h2c-members rondo|nginx (see below). Environment as for bench/run.sh:
# BENCH_PROXY_CPU (default 0), BENCH_LOAD_CPU (default 1), BENCH_PORT_BASE (default 18200),
# BENCH_KEEP_TMP=1.
#
# Both proxies run at once, each with one thread pinned to BENCH_PROXY_CPU (rondo --workers 1,
# HAProxy nbthread 1), each with three ports, one per pairing:
#   h2c-h1   h2c clients (prior knowledge) → three HTTP/1.1 members (nginx `return 200`);
#   h2c-h2c  h2c clients → three h2c members: nginx `listen ... http2` (rondo: upstream_protocol
#            = "http2", HAProxy: `server ... proto h2`). Before session 7 rondo's requests got
#            400 from nginx ("client sent duplicate host header") and three `rondo member`
#            processes (hyper) stood in; `--h2c-members rondo` still uses them;
#   tls-h1   h2 over TLS 1.3 (ALPN h2, a self-signed ECDSA P-256 certificate made here with
#            openssl) → the HTTP/1.1 members.
# Members and h2load run on BENCH_LOAD_CPU. Runs are interleaved across the proxies, round by
# round, so drift on a noisy machine hits both alike.
#   (a) requests/s: `h2load -c32 -m10 -t1 -D 10` (after one unmeasured 2 s run per target),
#       median of 3 rounds;
#   (b) CPU per request: utime+stime of the proxy (/proc/PID/stat) over each run of (a) divided
#       by the requests h2load completed; "per core-second" is its inverse, the rate one fully
#       busy core would give: where the load core saturates first, the measured rate is the
#       client's limit and the per-core-second figure is the comparable one;
#   (c) latency at a fixed 5,000 requests/s: `h2load -c25 -m10 -t1 --rps 200` for 12 s with
#       --log-file, the first 2 s dropped, p50 and p99 of h2load's per-request times (from
#       sending the request to the end of the response: h2load's rate mode is not open-loop,
#       a request held back by a slow one is not counted from its due time), median of rounds;
#   (d) RSS per idle HTTP/2 connection: bench/h2hold.py opens 1,000 h2c connections (and then
#       1,000 h2 connections over TLS), one GET on each, and holds them (answering PINGs);
#       VmRSS after minus before, per connection, each reading in a fresh proxy process.
# Results: markdown on stdout and in bench/results/h2-latest.md (quick runs: h2-quick.md).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

quick=0 install=1 build=1 h2c_members=nginx
while [ $# -gt 0 ]; do
  case "$1" in
    --h2) ;;
    --h2c-members) shift; h2c_members=${1:-} ;;
    --h2c-members=*) h2c_members=${1#*=} ;;
    --quick) quick=1 ;;
    --no-install) install=0 ;;
    --no-build) build=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/h2.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

case "$h2c_members" in rondo|nginx) ;; *) echo "bench/h2.sh: --h2c-members is rondo or nginx" >&2; exit 2 ;; esac
if [ "$quick" = 1 ]; then WARM=1 DUR=3 ROUNDS=1; else WARM=2 DUR=10 ROUNDS=3; fi
TP_CONNS=32 TP_STREAMS=10  # h2load -c / -m of the throughput runs
LAT_CONNS=25 LAT_RPS=200   # h2load -c / --rps (per connection) of the latency runs
RATE=$((LAT_CONNS * LAT_RPS))
HOLD_CONNS=1000            # idle connections for the memory reading
PROXY_CPU=${BENCH_PROXY_CPU:-0}
LOAD_CPU=${BENCH_LOAD_CPU:-1}
BASE=${BENCH_PORT_BASE:-18200}
H1_PORTS=($((BASE + 1)) $((BASE + 2)) $((BASE + 3)))
H2_PORTS=($((BASE + 4)) $((BASE + 5)) $((BASE + 6)))
PROXIES=(rondo haproxy)
PAIRS=(h2c-h1 h2c-h2c tls-h1)
declare -A PORT=(
  [rondo-h2c-h1]=$((BASE + 10)) [rondo-h2c-h2c]=$((BASE + 11)) [rondo-tls-h1]=$((BASE + 12))
  [haproxy-h2c-h1]=$((BASE + 13)) [haproxy-h2c-h2c]=$((BASE + 14)) [haproxy-tls-h1]=$((BASE + 15))
)
declare -A PAIR_NAME=([h2c-h1]="h2c → HTTP/1.1 members" [h2c-h2c]="h2c → h2c members" [tls-h1]="h2 over TLS → HTTP/1.1 members")

BENCH_NAME=bench-h2 TMP_PREFIX=rondo-bench-h2
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_tools "$install" haproxy:haproxy nginx:nginx h2load:nghttp2-client taskset:util-linux openssl:openssl python3:python3
bench_binaries "$build"
for p in "${H1_PORTS[@]}" "${H2_PORTS[@]}" "${PORT[@]}"; do
  port_open "$p" && die "port $p is taken (set BENCH_PORT_BASE)"
done
url() { case "$1" in *-tls-h1) echo "https://127.0.0.1:${PORT[$1]}/" ;; *) echo "http://127.0.0.1:${PORT[$1]}/" ;; esac; }

# --- certificate and configurations -------------------------------------------------------------
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 -subj /CN=localhost \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -keyout "$TMP/ecdsa.key" -out "$TMP/ecdsa.pem" 2>/dev/null
cat "$TMP/ecdsa.pem" "$TMP/ecdsa.key" >"$TMP/ecdsa.haproxy.pem"

{
  cat <<EOF
worker_processes 1;
worker_rlimit_nofile 20000;
pid $TMP/members.pid;
error_log $TMP/members.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 120s;
  client_body_temp_path $TMP/body;
  proxy_temp_path $TMP/proxy;
  fastcgi_temp_path $TMP/fastcgi;
  uwsgi_temp_path $TMP/uwsgi;
  scgi_temp_path $TMP/scgi;
EOF
  for i in 1 2 3; do
    echo "  server { listen 127.0.0.1:${H1_PORTS[i - 1]} backlog=4096; location / { default_type text/plain; return 200 \"m$i\\n\"; } }"
    if [ "$h2c_members" = nginx ]; then
      echo "  server { listen 127.0.0.1:${H2_PORTS[i - 1]} http2 backlog=4096; location / { default_type text/plain; return 200 \"m$i\\n\"; } }"
    fi
  done
  echo "}"
} >"$TMP/members.conf"

members_toml() {
  local name=$1 ports=("${@:2}") i
  echo "[cluster.$name]"
  echo "algorithm = \"round-robin\""
  if [ "$name" = h2c ]; then echo "upstream_protocol = \"http2\""; fi
  echo "members = ["
  for i in 1 2 3; do echo "  { name = \"m$i\", address = \"127.0.0.1:${ports[i - 1]}\" },"; done
  echo "]"
  echo
}
{
  for pair in "${PAIRS[@]}"; do
    echo "[[listener]]"
    echo "name = \"$pair\""
    echo "listen = \"127.0.0.1:${PORT[rondo-$pair]}\""
    echo "max_connections = 20000"
    [ "$pair" = tls-h1 ] && echo "tls = { certs = [ { cert = \"$TMP/ecdsa.pem\", key = \"$TMP/ecdsa.key\" } ] }"
    echo
    echo "[[route]]"
    echo "listener = \"$pair\""
    echo "cluster = \"${pair##*-}\""
    echo
  done
  members_toml h1 "${H1_PORTS[@]}"
  members_toml h2c "${H2_PORTS[@]}"
} >"$TMP/rondo.toml"

{
  cat <<EOF
global
  nbthread 1
  maxconn 9000
  ssl-default-bind-options ssl-min-ver TLSv1.2

defaults
  mode http
  option http-keep-alive
  option forwardfor
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout http-keep-alive 60s

frontend h2c-h1
  bind 127.0.0.1:${PORT[haproxy-h2c-h1]} proto h2
  default_backend h1

frontend h2c-h2c
  bind 127.0.0.1:${PORT[haproxy-h2c-h2c]} proto h2
  default_backend h2c

frontend tls-h1
  bind 127.0.0.1:${PORT[haproxy-tls-h1]} ssl crt $TMP/ecdsa.haproxy.pem alpn h2
  http-request set-header X-Forwarded-Proto https
  default_backend h1

backend h1
  balance roundrobin
EOF
  for i in 1 2 3; do echo "  server m$i 127.0.0.1:${H1_PORTS[i - 1]}"; done
  echo
  echo "backend h2c"
  echo "  balance roundrobin"
  for i in 1 2 3; do echo "  server m$i 127.0.0.1:${H2_PORTS[i - 1]} proto h2"; done
} >"$TMP/haproxy.cfg"

# --- start everything ---------------------------------------------------------------------------
start_proxy() {
  case "$1" in
    rondo) start rondo "$PROXY_CPU" "$RONDO" serve --config "$TMP/rondo.toml" --workers 1 ;;
    haproxy) start haproxy "$PROXY_CPU" haproxy -db -f "$TMP/haproxy.cfg" ;;
  esac
  local pid_var=PID_$1 pair
  PPID_OF[$1]=${!pid_var}
  for pair in "${PAIRS[@]}"; do wait_port "${PORT[$1-$pair]}" "$1"; done
}
start members "$LOAD_CPU" nginx -e "$TMP/members.err" -p "$TMP" -c "$TMP/members.conf" -g 'daemon off;'
if [ "$h2c_members" = rondo ]; then
  for i in 1 2 3; do start "h2member$i" "$LOAD_CPU" "$RONDO" member --name "m$i" --listen "127.0.0.1:${H2_PORTS[i - 1]}"; done
fi
for p in "${H1_PORTS[@]}"; do wait_port "$p" members; done
for p in "${H2_PORTS[@]}"; do wait_port "$p" h2member1; done
declare -A PPID_OF
for px in "${PROXIES[@]}"; do start_proxy "$px"; done
sleep 0.5

# h2load's summary: "requests: N total, N started, N done, N succeeded, N failed, N errored,
# N timeout" and "status codes: N 2xx, N 3xx, N 4xx, N 5xx".
h2_field() { awk -v f="$2" '/^requests:/ {for (i = 2; i <= NF; i++) if ($(i + 1) ~ "^" f) {print $i; exit}}' <<<"$1"; }
h2_errors() {
  awk '/^requests:/ {for (i = 2; i <= NF; i++) if ($(i + 1) ~ /^(failed|errored|timeout)/) n += $i}
       /^status codes:/ {n += $5 + $7 + $9} END {print n + 0}' <<<"$1"
}

# Every port answers 200 over HTTP/2 before anything is measured.
for key in "${!PORT[@]}"; do
  out=$(timeout 20 taskset -c "$LOAD_CPU" h2load -n 20 -c 2 -m 2 "$(url "$key")" 2>&1) || die "$key: smoke test failed: $out"
  [ "$(h2_field "$out" succeeded)" = 20 ] && [ "$(h2_errors "$out")" = 0 ] || die "$key: smoke test failed: $out"
  grep -q 'Application protocol: h2' <<<"$out" || die "$key: not HTTP/2: $out"
done
log "members and proxies up; rondo $("$RONDO" --version | awk 'NR == 1 {print $2}'), $(haproxy -v | awk 'NR == 1' | awk '{print $1, $3}'), $(h2load --version | awk '{print $2}')"

# --- (a), (b) requests/s and CPU per request ----------------------------------------------------
declare -A TP TP_US TP_CORE TP_PB TP_LB TP_ERR
log "throughput: h2load -c$TP_CONNS -m$TP_STREAMS -t1, ${DUR}s x $ROUNDS rounds"
for pair in "${PAIRS[@]}"; do
  for px in "${PROXIES[@]}"; do
    taskset -c "$LOAD_CPU" h2load -c"$TP_CONNS" -m"$TP_STREAMS" -t1 -D "$WARM" "$(url "$px-$pair")" >/dev/null
  done
done
for round in $(seq "$ROUNDS"); do
  for pair in "${PAIRS[@]}"; do
    for px in "${PROXIES[@]}"; do
      res=$(measure "$px" timeout $((DUR + 30)) h2load -c"$TP_CONNS" -m"$TP_STREAMS" -t1 -D "$DUR" "$(url "$px-$pair")")
      n=$(h2_field "$res" succeeded) errs=$(h2_errors "$res")
      rate=$(awk '/^finished in/ {gsub(",", ""); printf "%.0f", $4}' <<<"$res")
      last=$(tail -1 <<<"$res")
      us=$(kv "$last" cpu_us) pb=$(kv "$last" pbusy) lb=$(kv "$last" lbusy)
      per=$(awk -v us="$us" -v r="$n" 'BEGIN {printf "%.2f", (r > 0 ? us / r : 0)}')
      core=$(awk -v p="$per" 'BEGIN {printf "%.0f", (p > 0 ? 1e6 / p : 0)}')
      log "  round $round $pair $px: $rate req/s, $per us proxy CPU each ($core per core-second), errors $errs; busy proxy $pb%, load $lb%"
      TP[$px-$pair]+="$rate " TP_US[$px-$pair]+="$per " TP_CORE[$px-$pair]+="$core "
      TP_PB[$px-$pair]+="$pb " TP_LB[$px-$pair]+="$lb "
      TP_ERR[$px-$pair]=$((${TP_ERR[$px-$pair]:-0} + errs))
    done
  done
done

# --- (c) latency at a fixed rate ----------------------------------------------------------------
declare -A P50 P99 LRATE LAT_US LAT_ERR
log "latency: $RATE req/s (h2load -c$LAT_CONNS -m$TP_STREAMS --rps $LAT_RPS), ${DUR}s after ${WARM}s x $ROUNDS rounds"
for round in $(seq "$ROUNDS"); do
  for pair in "${PAIRS[@]}"; do
    for px in "${PROXIES[@]}"; do
      logf=$TMP/lat-$px-$pair.tsv
      rm -f "$logf"
      res=$(measure "$px" timeout $((WARM + DUR + 30)) h2load -c"$LAT_CONNS" -m"$TP_STREAMS" -t1 --rps "$LAT_RPS" \
        -D $((WARM + DUR)) --log-file "$logf" "$(url "$px-$pair")")
      # Columns: start (µs since the epoch), status, µs to the end of the response. The first
      # WARM seconds (by start time) are the warm-up.
      awk -F'\t' -v w="$WARM" 'NR == FNR {if (min == "" || $1 + 0 < min) min = $1 + 0; next}
        $1 + 0 >= min + w * 1e6 {print $3, ($2 >= 200 && $2 < 300) ? 0 : 1}' "$logf" "$logf" | sort -n -k1,1 >"$TMP/lat.sorted"
      read -r p50 p99 got bad < <(awk '{v[NR] = $1; b += $2}
        END {if (NR == 0) {print "nan nan 0 0"; exit}
          i50 = int(NR * 0.50); if (i50 < 1) i50 = 1; i99 = int(NR * 0.99); if (i99 < 1) i99 = 1
          printf "%.2f %.2f %d %d\n", v[i50] / 1000, v[i99] / 1000, NR, b}' "$TMP/lat.sorted")
      us=$(kv "$(tail -1 <<<"$res")" cpu_us)
      total=$(wc -l <"$logf")
      achieved=$(awk -v n="$got" -v d="$DUR" 'BEGIN {printf "%.0f", n / d}')
      per=$(awk -v us="$us" -v r="$total" 'BEGIN {printf "%.2f", (r > 0 ? us / r : 0)}')
      errs=$(($(h2_errors "$res") + bad))
      log "  round $round $pair $px: p50 $p50 ms, p99 $p99 ms at $achieved req/s, $per us proxy CPU each, errors $errs"
      P50[$px-$pair]+="$p50 " P99[$px-$pair]+="$p99 " LRATE[$px-$pair]+="$achieved " LAT_US[$px-$pair]+="$per "
      LAT_ERR[$px-$pair]=$((${LAT_ERR[$px-$pair]:-0} + errs))
    done
  done
done

# --- (d) memory per idle HTTP/2 connection ------------------------------------------------------
declare -A RSS0 RSS1
HOLDS=(h2c tls)
hold_target() { [ "$2" = tls ] && echo "--tls --target 127.0.0.1:${PORT[$1-tls-h1]}" || echo "--target 127.0.0.1:${PORT[$1-h2c-h1]}"; }
log "memory: $HOLD_CONNS idle h2c connections, then $HOLD_CONNS h2 over TLS, each in a fresh process"
for kind in "${HOLDS[@]}"; do
  for px in "${PROXIES[@]}"; do
    # A fresh process: memory freed by earlier connections would be reused and hide what a
    # connection costs. One connection first, so that what is allocated once is not counted.
    stop_pids "${PPID_OF[$px]}"
    start_proxy "$px"
    # shellcheck disable=SC2046
    taskset -c "$LOAD_CPU" python3 "$ROOT/bench/h2hold.py" $(hold_target "$px" "$kind") --connections 1 --hold-secs 0 >/dev/null
    sleep 0.5
    RSS0[$px-$kind]=$(rss_kib "${PPID_OF[$px]}")
    hold_out=$TMP/hold-$px-$kind.out
    # shellcheck disable=SC2046
    taskset -c "$LOAD_CPU" python3 "$ROOT/bench/h2hold.py" $(hold_target "$px" "$kind") \
      --connections "$HOLD_CONNS" --hold-secs 120 >"$hold_out" 2>&1 &
    hold_pid=$!
    PIDS+=("$hold_pid")
    for _ in $(seq 900); do
      grep -q '^held=' "$hold_out" 2>/dev/null && break
      kill -0 "$hold_pid" 2>/dev/null || break
      sleep 0.1
    done
    grep -q "^held=$HOLD_CONNS errors=0" "$hold_out" || { cat "$hold_out" >&2; die "$px: could not open $HOLD_CONNS $kind connections"; }
    sleep 1
    RSS1[$px-$kind]=$(rss_kib "${PPID_OF[$px]}")
    log "  $px $kind: RSS ${RSS0[$px-$kind]} KiB before, ${RSS1[$px-$kind]} KiB with $HOLD_CONNS idle connections"
    stop_pids "$hold_pid"
    sleep 1
  done
done

# --- results ------------------------------------------------------------------------------------
hv=$(haproxy -v | awk 'NR == 1' | awk '{print $3}' | sed 's/-.*//')
rv=$("$RONDO" --version | awk 'NR == 1 {print $2}')
mode=full cmd="bench/run.sh --h2"
if [ "$quick" = 1 ]; then mode=quick cmd+=" --quick"; fi
row() { printf '| %s | %s | %s | %s |\n' "$@"; }
report() {
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) with \`$cmd\` ($mode run: $ROUNDS round(s), medians); rondo built from git $REV."
  echo "Machine: $(nproc) vCPU ($(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)), Linux $(uname -r);"
  echo "proxies on CPU $PROXY_CPU (one thread each), members (nginx for HTTP/1.1, $h2c_members for h2c) and h2load $(h2load --version | awk '{print $2}') on CPU $LOAD_CPU; load average at start: $LOADAVG."
  echo "TLS 1.3 with an ECDSA P-256 certificate; rondo with rustls (ring), HAProxy with $(openssl version | awk '{print $1, $2}')."
  echo
  row "" "rondo $rv (1 worker)" "HAProxy $hv (nbthread 1)" "rondo / HAProxy"
  row "---" "---:" "---:" "---:"
  local pair name r h rc hc ru hu eff
  for pair in "${PAIRS[@]}"; do
    name=${PAIR_NAME[$pair]}
    r=$(med "${TP[rondo-$pair]}") h=$(med "${TP[haproxy-$pair]}")
    ru=$(med "${TP_US[rondo-$pair]}") hu=$(med "${TP_US[haproxy-$pair]}")
    rc=$(med "${TP_CORE[rondo-$pair]}") hc=$(med "${TP_CORE[haproxy-$pair]}")
    eff=$(ratio "$rc" "$hc")
    row "**$name**: requests/s (h2load -c$TP_CONNS -m$TP_STREAMS, measured)" "$r" "$h" "$(ratio "$r" "$h")"
    row "$name: proxy CPU per request (µs)" "$ru" "$hu" "$(ratio "$ru" "$hu")"
    row "$name: requests per core-second (efficiency)" "$rc" "$hc" "$eff [target ≥ 1.15: $(verdict "$eff" 1.15); floor ≥ 1.0: $(verdict "$eff" 1.0)]"
    row "$name: busy % proxy / load core" "$(med "${TP_PB[rondo-$pair]}") / $(med "${TP_LB[rondo-$pair]}")" "$(med "${TP_PB[haproxy-$pair]}") / $(med "${TP_LB[haproxy-$pair]}")" "–"
    row "$name: p50 / p99 at $RATE req/s (ms)" "$(med "${P50[rondo-$pair]}") / $(med "${P99[rondo-$pair]}")" "$(med "${P50[haproxy-$pair]}") / $(med "${P99[haproxy-$pair]}")" "$(ratio "$(med "${P50[rondo-$pair]}")" "$(med "${P50[haproxy-$pair]}")") / $(ratio "$(med "${P99[rondo-$pair]}")" "$(med "${P99[haproxy-$pair]}")")"
    row "$name: achieved rate, proxy CPU per request at that rate (µs)" "$(med "${LRATE[rondo-$pair]}"), $(med "${LAT_US[rondo-$pair]}")" "$(med "${LRATE[haproxy-$pair]}"), $(med "${LAT_US[haproxy-$pair]}")" "–"
    row "$name: errors (throughput / latency runs)" "${TP_ERR[rondo-$pair]} / ${LAT_ERR[rondo-$pair]}" "${TP_ERR[haproxy-$pair]} / ${LAT_ERR[haproxy-$pair]}" "–"
  done
  local rm hm
  rm=$(per_conn "${RSS1[rondo-h2c]}" "${RSS0[rondo-h2c]}" "$HOLD_CONNS") hm=$(per_conn "${RSS1[haproxy-h2c]}" "${RSS0[haproxy-h2c]}" "$HOLD_CONNS")
  row "RSS per idle h2c connection (KiB, $HOLD_CONNS held)" "$rm" "$hm" "$(ratio "$rm" "$hm")"
  rm=$(per_conn "${RSS1[rondo-tls]}" "${RSS0[rondo-tls]}" "$HOLD_CONNS") hm=$(per_conn "${RSS1[haproxy-tls]}" "${RSS0[haproxy-tls]}" "$HOLD_CONNS")
  row "RSS per idle h2 connection over TLS (KiB, $HOLD_CONNS held)" "$rm" "$hm" "$(ratio "$rm" "$hm")"
  echo
  echo "Efficiency is requests per core-second of the proxy (the inverse of its CPU per request); the target"
  echo "of issue 35 is rondo ≥ 1.15× HAProxy's, at least ≥ 1.0×. Per-round values (rounds in order):"
  echo
  for px in "${PROXIES[@]}"; do
    for pair in "${PAIRS[@]}"; do
      echo "- $px $pair: req/s ${TP[$px-$pair]}| CPU µs/request ${TP_US[$px-$pair]}| p50 ms ${P50[$px-$pair]}| p99 ms ${P99[$px-$pair]}"
    done
  done
}
mkdir -p "$ROOT/bench/results"
out_md=$ROOT/bench/results/h2-latest.md
[ "$quick" = 1 ] && out_md=$ROOT/bench/results/h2-quick.md
report | tee "$out_md"
log "wrote ${out_md#"$ROOT"/}"
