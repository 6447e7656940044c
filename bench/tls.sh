#!/usr/bin/env bash
# TLS benchmark: rondo (rustls, ring) vs HAProxy (OpenSSL), side by side in one run, behind the
# same three nginx members. Run through bench/run.sh:
#
#   bench/run.sh --tls              full run (about 4 minutes once built)
#   bench/run.sh --tls --quick      smoke test (about 1 minute, one round, short runs)
#
# Options: --quick, --no-install (don't apt-get anything), --no-build (use the binaries already
# in $CARGO_TARGET_DIR/release, default target/release). Environment as for bench/run.sh:
# BENCH_PROXY_CPU (default 0), BENCH_LOAD_CPU (default 1), BENCH_PORT_BASE (default 18100),
# BENCH_KEEP_TMP=1.
#
# Both proxies run at once, each with one thread pinned to BENCH_PROXY_CPU (rondo --workers 1,
# HAProxy nbthread 1), each with two TLS ports: one with an ECDSA P-256 certificate, one with an
# RSA-2048 certificate (both made here with openssl, self-signed). TLS 1.3 with X25519 in both
# (each side's default). Members, load generators: on BENCH_LOAD_CPU. Runs are interleaved
# across the proxies, round by round.
#   (a) full handshakes/s, per certificate type: `rondo-loadgen tls-handshakes` keeps 32
#       connections in flight, each a new TCP connection, a full handshake (a rustls client with
#       session resumption off: wrk and openssl s_time resume sessions or run one at a time),
#       one GET with `Connection: close` proxied to a member, and the close.
#   (b) keep-alive requests/s over TLS: wrk -t1 -c64 https:// (ECDSA port; one handshake per
#       connection, then requests), and the same over plain HTTP to a plain port of the same
#       process, so that what TLS adds per request is the difference.
#   (c) CPU per handshake and per request: utime+stime of the proxy (/proc/PID/stat) over the
#       run divided by what completed; "per core-second" is its inverse, the rate one fully
#       busy core would give. Where the load core saturates first (a full handshake costs the
#       client about as much as the server), the measured rate is the client's limit and the
#       per-core-second figure is the comparable one.
#   (d) RSS per idle TLS connection: `rondo-loadgen tls-hold` opens 1,000 TLS connections (64 at
#       a time), one request on each, holds them; VmRSS after minus before, per connection; and
#       the same with 1,000 plain connections (`rondo-loadgen hold`).
# Results: markdown on stdout and in bench/results/tls-latest.md (quick runs: tls-quick.md).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)

quick=0 install=1 build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --tls) ;;
    --quick) quick=1 ;;
    --no-install) install=0 ;;
    --no-build) build=0 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/tls.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$quick" = 1 ]; then WARM=1 DUR=3 ROUNDS=1; else WARM=2 DUR=10 ROUNDS=3; fi
HS_CONNS=32        # handshakes in flight
TP_CONNS=64        # wrk connections
HOLD_CONNS=1000    # idle TLS connections for the memory reading
PROXY_CPU=${BENCH_PROXY_CPU:-0}
LOAD_CPU=${BENCH_LOAD_CPU:-1}
BASE=${BENCH_PORT_BASE:-18100}
MEMBER_PORTS=($((BASE + 1)) $((BASE + 2)) $((BASE + 3)))
PROXIES=(rondo haproxy)
KINDS=(ecdsa rsa)
declare -A PORT=([rondo-ecdsa]=$((BASE + 10)) [rondo-rsa]=$((BASE + 11)) [haproxy-ecdsa]=$((BASE + 12)) [haproxy-rsa]=$((BASE + 13)))
# Plain HTTP ports of the same processes: what TLS adds is the difference.
declare -A PLAIN=([rondo]=$((BASE + 14)) [haproxy]=$((BASE + 15)))

BENCH_NAME=bench-tls TMP_PREFIX=rondo-bench-tls
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_tools "$install" haproxy:haproxy nginx:nginx wrk:wrk taskset:util-linux openssl:openssl
bench_binaries "$build"
[ -x "$LOADGEN" ] || die "missing $LOADGEN (build it first)"
for p in "${MEMBER_PORTS[@]}" "${PORT[@]}" "${PLAIN[@]}"; do
  port_open "$p" && die "port $p is taken (set BENCH_PORT_BASE)"
done
# --- certificates -------------------------------------------------------------------------------
san="subjectAltName=DNS:localhost,IP:127.0.0.1"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 -subj /CN=localhost \
  -addext "$san" -keyout "$TMP/ecdsa.key" -out "$TMP/ecdsa.pem" 2>/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj /CN=localhost \
  -addext "$san" -keyout "$TMP/rsa.key" -out "$TMP/rsa.pem" 2>/dev/null
for k in "${KINDS[@]}"; do cat "$TMP/$k.pem" "$TMP/$k.key" >"$TMP/$k.haproxy.pem"; done

# --- configurations -----------------------------------------------------------------------------
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
  i=1
  for p in "${MEMBER_PORTS[@]}"; do
    echo "  server { listen 127.0.0.1:$p backlog=4096; location / { default_type text/plain; return 200 \"m$i\\n\"; } }"
    i=$((i + 1))
  done
  echo "}"
} >"$TMP/members.conf"

{
  for k in "${KINDS[@]}"; do
    cat <<EOF
[[listener]]
name = "$k"
listen = "127.0.0.1:${PORT[rondo-$k]}"
max_connections = 20000
tls = { certs = [ { cert = "$TMP/$k.pem", key = "$TMP/$k.key" } ] }

[[route]]
listener = "$k"
cluster = "members"

EOF
  done
  cat <<EOF
[[listener]]
name = "plain"
listen = "127.0.0.1:${PLAIN[rondo]}"
max_connections = 20000

[[route]]
listener = "plain"
cluster = "members"

EOF
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

EOF
  for k in "${KINDS[@]}"; do
    cat <<EOF
frontend $k
  bind 127.0.0.1:${PORT[haproxy-$k]} ssl crt $TMP/$k.haproxy.pem alpn h2,http/1.1
  http-request set-header X-Forwarded-Proto https
  default_backend members

EOF
  done
  cat <<EOF
frontend plain
  bind 127.0.0.1:${PLAIN[haproxy]}
  default_backend members

EOF
  echo "backend members"
  echo "  balance roundrobin"
  i=1
  for p in "${MEMBER_PORTS[@]}"; do
    echo "  server m$i 127.0.0.1:$p"
    i=$((i + 1))
  done
} >"$TMP/haproxy.cfg"

# --- start everything ---------------------------------------------------------------------------
start members "$LOAD_CPU" nginx -e "$TMP/members.err" -p "$TMP" -c "$TMP/members.conf" -g 'daemon off;'
for p in "${MEMBER_PORTS[@]}"; do wait_port "$p" members; done
start rondo "$PROXY_CPU" "$RONDO" serve --config "$TMP/rondo.toml" --workers 1
start haproxy "$PROXY_CPU" haproxy -db -f "$TMP/haproxy.cfg"
for key in "${!PORT[@]}"; do wait_port "${PORT[$key]}" "${key%-*}"; done
for px in "${PROXIES[@]}"; do wait_port "${PLAIN[$px]}" "$px"; done
sleep 0.5
declare -A PPID_OF=([rondo]=$PID_rondo [haproxy]=$PID_haproxy)

# Every port answers 200 over TLS before anything is measured.
for key in "${!PORT[@]}"; do
  out=$(timeout 20 taskset -c "$LOAD_CPU" "$LOADGEN" tls-handshakes --target "127.0.0.1:${PORT[$key]}" \
    --connections 2 --duration-secs 0.5 --warmup-secs 0) || die "$key: smoke test failed: $out"
  done_=$(sed -n 's/.*done=\([0-9]*\).*/\1/p' <<<"$out")
  errs=$(sed -n 's/.*errors=\([0-9]*\).*/\1/p' <<<"$out")
  [ "${done_:-0}" -gt 0 ] && [ "${errs:-1}" = 0 ] || die "$key: smoke test failed: $out"
done
log "members and proxies up; rondo $("$RONDO" --version | awk 'NR == 1 {print $2}'), $(haproxy -v | awk 'NR == 1' | awk '{print $1, $3}'), $(openssl version | awk '{print $1, $2}') on the HAProxy side"

# --- (a) full handshakes ------------------------------------------------------------------------
declare -A HS HS_CORE HS_US HS_PB HS_LB HS_ERR
log "full handshakes: $HS_CONNS in flight, ${DUR}s (after ${WARM}s) x $ROUNDS rounds"
for round in $(seq "$ROUNDS"); do
  for k in "${KINDS[@]}"; do
    for px in "${PROXIES[@]}"; do
      res=$(measure "$px" timeout $((WARM + DUR + 30)) "$LOADGEN" tls-handshakes \
        --target "127.0.0.1:${PORT[$px-$k]}" --connections "$HS_CONNS" --duration-secs "$DUR" --warmup-secs "$WARM")
      n=$(kv "$res" done) rate=$(kv "$res" per_sec) us=$(kv "$res" cpu_us)
      # The CPU was read over warm-up and measured time: price it per handshake of that span.
      per=$(awk -v us="$us" -v r="$rate" -v t=$((WARM + DUR)) 'BEGIN {printf "%.1f", (r > 0 ? us / (r * t) : 0)}')
      core=$(awk -v p="$per" 'BEGIN {printf "%.0f", (p > 0 ? 1e6 / p : 0)}')
      log "  round $round $px $k: $rate handshakes/s, $per us proxy CPU each ($core per core-second), errors $(kv "$res" errors); busy proxy $(kv "$res" pbusy)%, load $(kv "$res" lbusy)%"
      HS[$px-$k]+="$rate " HS_US[$px-$k]+="$per " HS_CORE[$px-$k]+="$core "
      HS_PB[$px-$k]+="$(kv "$res" pbusy) " HS_LB[$px-$k]+="$(kv "$res" lbusy) "
      HS_ERR[$px-$k]=$(( ${HS_ERR[$px-$k]:-0} + $(kv "$res" errors) ))
    done
  done
done

# --- (b) keep-alive requests over TLS -----------------------------------------------------------
declare -A KA KA_CORE KA_US KA_PB KA_LB KA_ERR
log "keep-alive over TLS (ECDSA ports) and plain HTTP: wrk -t1 -c$TP_CONNS, ${DUR}s x $ROUNDS rounds"
ka_url() {
  case "$1" in
    *-plain) echo "http://127.0.0.1:${PLAIN[${1%-plain}]}/" ;;
    *) echo "https://127.0.0.1:${PORT[$1-ecdsa]}/" ;;
  esac
}
KA_RUNS=(rondo haproxy rondo-plain haproxy-plain)
for t in "${KA_RUNS[@]}"; do
  taskset -c "$LOAD_CPU" wrk -t1 -c"$TP_CONNS" -d"${WARM}s" "$(ka_url "$t")" >/dev/null
done
for round in $(seq "$ROUNDS"); do
  for px in "${KA_RUNS[@]}"; do
    res=$(measure "${px%-plain}" timeout $((DUR + 30)) wrk -t1 -c"$TP_CONNS" -d"${DUR}s" --timeout 2s "$(ka_url "$px")")
    reqs=$(awk '/requests in/{print $1}' <<<"$res")
    rate=$(awk '/^Requests\/sec/{printf "%.0f", $2}' <<<"$res")
    errs=$(awk '/Non-2xx/{n += $NF} /Socket errors/{gsub(/[^0-9 ]/, ""); for (i = 1; i <= NF; i++) n += $i} END {print n + 0}' <<<"$res")
    us=$(kv "$(tail -1 <<<"$res")" cpu_us)
    per=$(awk -v us="$us" -v r="$reqs" 'BEGIN {printf "%.2f", (r > 0 ? us / r : 0)}')
    core=$(awk -v p="$per" 'BEGIN {printf "%.0f", (p > 0 ? 1e6 / p : 0)}')
    pb=$(kv "$(tail -1 <<<"$res")" pbusy) lb=$(kv "$(tail -1 <<<"$res")" lbusy)
    log "  round $round $px: $rate req/s, $per us proxy CPU each ($core per core-second), errors $errs; busy proxy $pb%, load $lb%"
    KA[$px]+="$rate " KA_US[$px]+="$per " KA_CORE[$px]+="$core " KA_PB[$px]+="$pb " KA_LB[$px]+="$lb "
    KA_ERR[$px]=$(( ${KA_ERR[$px]:-0} + errs ))
  done
done

# --- (c) memory per idle TLS connection ---------------------------------------------------------
declare -A RSS0 RSS1
# Each reading in a fresh process: memory freed by earlier connections would be reused and hide
# what a connection costs.
restart() {
  local px=$1
  stop_pids "${PPID_OF[$px]}"
  case "$px" in
    rondo) start rondo "$PROXY_CPU" "$RONDO" serve --config "$TMP/rondo.toml" --workers 1 ;;
    haproxy) start haproxy "$PROXY_CPU" haproxy -db -f "$TMP/haproxy.cfg" ;;
  esac
  local pid_var=PID_$px
  PPID_OF[$px]=${!pid_var}
  wait_port "${PLAIN[$px]}" "$px"
  wait_port "${PORT[$px-ecdsa]}" "$px"
  # One connection of each kind first, so that what every process allocates once is counted
  # before the reading.
  taskset -c "$LOAD_CPU" "$LOADGEN" tls-handshakes --target "127.0.0.1:${PORT[$px-ecdsa]}" \
    --connections 1 --duration-secs 0.2 --warmup-secs 0 >/dev/null
  sleep 0.5
}
log "memory: $HOLD_CONNS idle TLS connections, then $HOLD_CONNS plain ones, each in a fresh process"
for px in "${PROXIES[@]}" rondo-plain haproxy-plain; do
  restart "${px%-plain}"
  RSS0[$px]=$(rss_kib "${PPID_OF[${px%-plain}]}")
  hold_out=$TMP/hold-$px.out
  case "$px" in
    *-plain) hold_cmd=(hold --target "127.0.0.1:${PLAIN[${px%-plain}]}") ;;
    *) hold_cmd=(tls-hold --target "127.0.0.1:${PORT[$px-ecdsa]}") ;;
  esac
  taskset -c "$LOAD_CPU" "$LOADGEN" "${hold_cmd[@]}" \
    --connections "$HOLD_CONNS" --concurrency 64 --hold-secs 60 >"$hold_out" 2>&1 &
  hold_pid=$!
  PIDS+=("$hold_pid")
  for _ in $(seq 600); do
    grep -q '^held=' "$hold_out" 2>/dev/null && break
    kill -0 "$hold_pid" 2>/dev/null || break
    sleep 0.1
  done
  grep -q "^held=$HOLD_CONNS errors=0" "$hold_out" || { cat "$hold_out" >&2; die "$px: could not open $HOLD_CONNS TLS connections"; }
  sleep 1
  RSS1[$px]=$(rss_kib "${PPID_OF[${px%-plain}]}")
  log "  $px: RSS ${RSS0[$px]} KiB before, ${RSS1[$px]} KiB with $HOLD_CONNS idle connections"
  stop_pids "$hold_pid"
  sleep 1
done

# --- results ------------------------------------------------------------------------------------
hv=$(haproxy -v | awk 'NR == 1' | awk '{print $3}' | sed 's/-.*//')
rv=$("$RONDO" --version | awk 'NR == 1 {print $2}')
mode=full cmd="bench/run.sh --tls"
if [ "$quick" = 1 ]; then mode=quick cmd+=" --quick"; fi
row() { printf '| %s | %s | %s | %s |\n' "$@"; }
report() {
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) with \`$cmd\` ($mode run: $ROUNDS round(s), medians); rondo built from git $REV."
  echo "Machine: $(nproc) vCPU ($(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)), Linux $(uname -r);"
  echo "proxies on CPU $PROXY_CPU (one thread each), members and load on CPU $LOAD_CPU; load average at start: $LOADAVG."
  echo "TLS 1.3, X25519; rondo with rustls (ring, or aws-lc-rs when built with `--features aws-lc`), HAProxy with $(openssl version | awk '{print $1, $2}')."
  echo
  row "" "rondo $rv (1 worker)" "HAProxy $hv (nbthread 1)" "rondo / HAProxy"
  row "---" "---:" "---:" "---:"
  for k in "${KINDS[@]}"; do
    local name=ECDSA\ P-256
    [ "$k" = rsa ] && name=RSA-2048
    local r=$(med "${HS[rondo-$k]}") h=$(med "${HS[haproxy-$k]}")
    local rc=$(med "${HS_CORE[rondo-$k]}") hc=$(med "${HS_CORE[haproxy-$k]}")
    row "full handshakes/s, $name (measured)" "$r" "$h" "$(ratio "$r" "$h")"
    row "proxy CPU per full handshake, $name (µs)" "$(med "${HS_US[rondo-$k]}")" "$(med "${HS_US[haproxy-$k]}")" "–"
    row "full handshakes per core-second, $name" "$rc" "$hc" "$(ratio "$rc" "$hc") [target ≥ 1.0: $(verdict "$(ratio "$rc" "$hc")" 1.0)]"
    row "busy % proxy / load core, $name" "$(med "${HS_PB[rondo-$k]}") / $(med "${HS_LB[rondo-$k]}")" "$(med "${HS_PB[haproxy-$k]}") / $(med "${HS_LB[haproxy-$k]}")" "–"
  done
  local r=$(med "${KA[rondo]}") h=$(med "${KA[haproxy]}") rc=$(med "${KA_CORE[rondo]}") hc=$(med "${KA_CORE[haproxy]}")
  row "keep-alive requests/s over TLS (wrk -t1 -c$TP_CONNS, measured)" "$r" "$h" "$(ratio "$r" "$h") [target ≥ 1.15: $(verdict "$(ratio "$r" "$h")" 1.15)]"
  row "proxy CPU per keep-alive request (µs)" "$(med "${KA_US[rondo]}")" "$(med "${KA_US[haproxy]}")" "–"
  row "keep-alive requests per core-second" "$rc" "$hc" "$(ratio "$rc" "$hc")"
  local rp=$(med "${KA_US[rondo-plain]}") hp=$(med "${KA_US[haproxy-plain]}")
  row "proxy CPU per keep-alive request, plain HTTP, same run (µs)" "$rp" "$hp" "$(ratio "$rp" "$hp")"
  row "what TLS adds per keep-alive request (µs)" "$(awk -v a="$(med "${KA_US[rondo]}")" -v b="$rp" 'BEGIN {printf "%.2f", a - b}')" "$(awk -v a="$(med "${KA_US[haproxy]}")" -v b="$hp" 'BEGIN {printf "%.2f", a - b}')" "–"
  row "busy % proxy / load core, keep-alive" "$(med "${KA_PB[rondo]}") / $(med "${KA_LB[rondo]}")" "$(med "${KA_PB[haproxy]}") / $(med "${KA_LB[haproxy]}")" "–"
  local rm=$(per_conn "${RSS1[rondo]}" "${RSS0[rondo]}" "$HOLD_CONNS") hm=$(per_conn "${RSS1[haproxy]}" "${RSS0[haproxy]}" "$HOLD_CONNS")
  row "RSS per idle TLS connection (KiB, $HOLD_CONNS held)" "$rm" "$hm" "$(ratio "$rm" "$hm")"
  local rpm=$(per_conn "${RSS1[rondo-plain]}" "${RSS0[rondo-plain]}" "$HOLD_CONNS") hpm=$(per_conn "${RSS1[haproxy-plain]}" "${RSS0[haproxy-plain]}" "$HOLD_CONNS")
  row "RSS per idle plain connection, same run (KiB)" "$rpm" "$hpm" "$(ratio "$rpm" "$hpm")"
  row "errors (handshakes ECDSA / RSA / keep-alive)" "${HS_ERR[rondo-ecdsa]} / ${HS_ERR[rondo-rsa]} / ${KA_ERR[rondo]}" "${HS_ERR[haproxy-ecdsa]} / ${HS_ERR[haproxy-rsa]} / ${KA_ERR[haproxy]}" "–"
  echo
  echo "Per-round values (rounds in order):"
  echo
  for px in "${PROXIES[@]}"; do
    echo "- $px: handshakes/s ECDSA ${HS[$px-ecdsa]}| RSA ${HS[$px-rsa]}| keep-alive req/s TLS ${KA[$px]}| plain ${KA[$px-plain]}| CPU µs/handshake ECDSA ${HS_US[$px-ecdsa]}| RSA ${HS_US[$px-rsa]}| CPU µs/request TLS ${KA_US[$px]}| plain ${KA_US[$px-plain]}"
  done
}
mkdir -p "$ROOT/bench/results"
out_md=$ROOT/bench/results/tls-latest.md
[ "$quick" = 1 ] && out_md=$ROOT/bench/results/tls-quick.md
report | tee "$out_md"
log "wrote ${out_md#"$ROOT"/}"
