#!/usr/bin/env bash
# Two cores (issue 36, item 3): rondo `--workers 2` against HAProxy `nbthread 2`, behind the same
# three nginx members, in one run. `bench/run.sh --workers 2` runs this script.
#
#   bench/cores.sh              full run: 3 rounds of 10 s per target (about 3 minutes)
#   bench/cores.sh --quick      smoke test: 1 round of 3 s
#   bench/cores.sh --no-build   use the binaries already in target/release
#   bench/cores.sh --no-install don't apt-get anything
#
# Targets, all started at once and measured one after another, in an order that rotates each
# round (drift on a shared machine hits all alike):
#   rondo-ws      rondo serve --workers 2                        (one work-stealing runtime)
#   rondo-pc      rondo serve --workers 2 --runtime per-core     (one runtime per worker, one
#                                                                 SO_REUSEPORT socket each)
#   rondo-pc-one  rondo serve --workers 2 --runtime per-core --shards one (both runtimes accept
#                                                                 on one shared socket)
#   haproxy       HAProxy nbthread 2, otherwise its default config (as bench/run.sh's)
# Nothing is pinned: the proxies, the members (nginx, one worker) and wrk (-t2 -c64) share every
# core, as in production. ON TWO CORES THE LOAD GENERATOR AND THE MEMBERS COMPETE WITH THE PROXY
# FOR THE CPU: requests/s is bounded by the machine, not by the proxy, so the measure that decides
# is requests per proxy CPU-second (requests wrk completed / utime+stime of the proxy's process
# from /proc/PID/stat over the run).
# Ports: BENCH_PORT_BASE (default 18550) and the next 6. BENCH_CORES_TARGETS (default all four)
# measures only the targets it names ("rondo-ws haproxy").
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
quick=0 install=1 build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --no-install) install=0 ;;
    --no-build) build=0 ;;
    --workers=*|--workers)
      if [ "$1" = --workers ]; then shift; w=${1:-}; else w=${1#*=}; fi
      [ "$w" = 2 ] || { echo "bench/cores.sh: only --workers 2 is measured here" >&2; exit 2; } ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/cores.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$quick" = 1 ]; then WARM=1 DUR=3 ROUNDS=1; else WARM=2 DUR=10 ROUNDS=3; fi
BASE=${BENCH_PORT_BASE:-18550}
MEMBER_PORTS=($((BASE + 1)) $((BASE + 2)) $((BASE + 3)))
read -r -a TARGETS <<<"${BENCH_CORES_TARGETS:-rondo-ws rondo-pc rondo-pc-one haproxy}"
declare -A PORT=([rondo-ws]=$BASE [rondo-pc]=$((BASE + 4)) [rondo-pc-one]=$((BASE + 5)) [haproxy]=$((BASE + 6)))

BENCH_NAME=bench-cores TMP_PREFIX=rondo-cores
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_tools "$install" haproxy:haproxy nginx:nginx wrk:wrk
bench_binaries "$build"
ALL_CPUS="0-$(($(nproc) - 1))"
for p in "${MEMBER_PORTS[@]}" "${PORT[@]}"; do port_open "$p" && die "port $p is taken (set BENCH_PORT_BASE)"; done

# --- configurations (as bench/run.sh's, two threads) --------------------------------------------
{
  echo "worker_processes 1; worker_rlimit_nofile 20000; pid $TMP/members.pid; error_log $TMP/members.err warn;"
  echo "events { worker_connections 8192; }"
  echo "http { access_log off; keepalive_requests 100000000; keepalive_timeout 120s;"
  echo "  client_body_temp_path $TMP/body; proxy_temp_path $TMP/proxy; fastcgi_temp_path $TMP/fcgi;"
  echo "  uwsgi_temp_path $TMP/uwsgi; scgi_temp_path $TMP/scgi;"
  i=1
  for p in "${MEMBER_PORTS[@]}"; do
    echo "  server { listen 127.0.0.1:$p backlog=4096; location / { return 200 \"m$i\\n\"; } }"
    i=$((i + 1))
  done
  echo "}"
} >"$TMP/members.conf"
rondo_conf() {
  echo "[[listener]]"
  echo "name = \"web\""
  echo "listen = \"127.0.0.1:$1\""
  echo "max_connections = 20000"
  echo "[[route]]"
  echo "listener = \"web\""
  echo "cluster = \"members\""
  echo "[cluster.members]"
  echo "algorithm = \"round-robin\""
  echo "members = ["
  i=1
  for p in "${MEMBER_PORTS[@]}"; do echo "  { name = \"m$i\", address = \"127.0.0.1:$p\" },"; i=$((i + 1)); done
  echo "]"
}
for t in rondo-ws rondo-pc rondo-pc-one; do rondo_conf "${PORT[$t]}" >"$TMP/$t.toml"; done
{
  cat <<EOF
global
  nbthread 2
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
  for p in "${MEMBER_PORTS[@]}"; do echo "  server m$i 127.0.0.1:$p"; i=$((i + 1)); done
} >"$TMP/haproxy.cfg"

# --- start (unpinned: every core) ---------------------------------------------------------------
start members "$ALL_CPUS" nginx -e "$TMP/members.err" -p "$TMP" -c "$TMP/members.conf" -g 'daemon off;'
for p in "${MEMBER_PORTS[@]}"; do wait_port "$p" members; done
start rondo_ws "$ALL_CPUS" "$RONDO" serve --config "$TMP/rondo-ws.toml" --workers 2 --log-level warn
start rondo_pc "$ALL_CPUS" "$RONDO" serve --config "$TMP/rondo-pc.toml" --workers 2 --runtime per-core --log-level warn
start rondo_pc_one "$ALL_CPUS" "$RONDO" serve --config "$TMP/rondo-pc-one.toml" --workers 2 --runtime per-core --shards one --log-level warn
start haproxy "$ALL_CPUS" haproxy -db -f "$TMP/haproxy.cfg"
declare -A TPID=([rondo-ws]=$PID_rondo_ws [rondo-pc]=$PID_rondo_pc [rondo-pc-one]=$PID_rondo_pc_one [haproxy]=$PID_haproxy)
for t in "${TARGETS[@]}"; do wait_port "${PORT[$t]}" "${t//-/_}"; done
# shellcheck disable=SC2153 # PER_CPU and friends are filled below
for t in "${TARGETS[@]}"; do
  curl -sf "http://127.0.0.1:${PORT[$t]}/" | grep -q '^m[123]$' || die "$t does not answer through the members"
done
threads() { ls "/proc/$1/task" | wc -l; }
log "up: rondo $("$RONDO" --version | awk 'NR == 1 {print $2}') (threads: ws $(threads "${TPID[rondo-ws]}"), pc $(threads "${TPID[rondo-pc]}")), $(haproxy -v | awk 'NR == 1 {print $1, $3}') (threads $(threads "${TPID[haproxy]}"))"

# wrk_run TARGET SECONDS: "requests rps errors proxy_cpu_s"
wrk_run() {
  local t=$1 secs=$2 before after out reqs rps errs
  before=$(cpu_ticks "${TPID[$t]}")
  out=$(timeout $((secs + 20)) wrk -t2 -c64 -d"${secs}s" --timeout 2s "http://127.0.0.1:${PORT[$t]}/") \
    || die "wrk against $t failed: $out"
  after=$(cpu_ticks "${TPID[$t]}")
  reqs=$(awk '/requests in/{print $1}' <<<"$out")
  rps=$(awk '/^Requests\/sec/{printf "%.0f", $2}' <<<"$out")
  errs=$(awk '/Non-2xx/{n += $NF} /Socket errors/{gsub(/[^0-9 ]/, ""); for (i = 1; i <= NF; i++) n += $i} END {print n + 0}' <<<"$out")
  echo "$reqs $rps $errs $(awk -v d=$((after - before)) -v k="$TCK" 'BEGIN {printf "%.2f", d / k}')"
}

declare -A RPS PER_CPU CPU ERR
log "wrk -t2 -c64, ${DUR}s x $ROUNDS rounds after ${WARM}s warm-up each; ON TWO CORES wrk AND THE MEMBERS COMPETE WITH THE PROXY FOR THE CPU"
for round in $(seq "$ROUNDS"); do
  # Rotate the order each round.
  order=("${TARGETS[@]:$(((round - 1) % ${#TARGETS[@]}))}" "${TARGETS[@]:0:$(((round - 1) % ${#TARGETS[@]}))}")
  for t in "${order[@]}"; do
    wrk_run "$t" "$WARM" >/dev/null
    read -r reqs rps errs cpu <<<"$(wrk_run "$t" "$DUR")"
    per=$(awk -v r="$reqs" -v c="$cpu" 'BEGIN {printf "%.0f", (c > 0 ? r / c : 0)}')
    log "  round $round $t: $rps req/s, proxy CPU ${cpu}s ($(awk -v c="$cpu" -v d="$DUR" 'BEGIN {printf "%.2f", c / d}') cores), $per requests per proxy CPU-second, $errs errors"
    RPS[$t]+="$rps " PER_CPU[$t]+="$per " CPU[$t]+="$(awk -v c="$cpu" -v d="$DUR" 'BEGIN {printf "%.2f", c / d}') "
    ERR[$t]=$(( ${ERR[$t]:-0} + errs ))
  done
done

mode=full cmd="bench/run.sh --workers 2"
[ "$quick" = 1 ] && mode=quick cmd+=" --quick"
[ -n "${BENCH_PORT_BASE:-}" ] && cmd="BENCH_PORT_BASE=$BENCH_PORT_BASE $cmd"
hv=$(haproxy -v | awk 'NR == 1 {print $3}' | sed 's/-.*//')
{
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) with \`$cmd\` ($mode run: $ROUNDS round(s) of ${DUR}s, medians); rondo from git $REV."
  echo "Machine: $(nproc) vCPU ($(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)), load average at start $LOADAVG; shared with other work."
  echo "Nothing pinned: on $(nproc) cores the load generator (wrk -t2 -c64) and the members (nginx, one worker) compete with the proxy for the CPU, so requests/s says what the machine did; requests per proxy CPU-second says what the proxy costs."
  echo
  echo "| target | requests/s | proxy CPU (cores) | requests per proxy CPU-second | / HAProxy | errors |"
  echo "|---|---:|---:|---:|---:|---:|"
  h=$(med "${PER_CPU[haproxy]}")
  for t in "${TARGETS[@]}"; do
    case $t in
      rondo-ws) name="rondo --workers 2 (work-stealing)" ;;
      rondo-pc) name="rondo --workers 2 --runtime per-core (shards by-core)" ;;
      rondo-pc-one) name="rondo --workers 2 --runtime per-core --shards one" ;;
      haproxy) name="HAProxy $hv nbthread 2" ;;
    esac
    echo "| $name | $(med "${RPS[$t]}") | $(med "${CPU[$t]}") | $(med "${PER_CPU[$t]}") | $(ratio "$(med "${PER_CPU[$t]}")" "$h") | ${ERR[$t]} |"
  done
  echo
  echo "Target: rondo --workers 2 ≥ 1.0× HAProxy nbthread 2 in requests per proxy CPU-second."
  echo
  echo "Per round (requests per proxy CPU-second, rounds in order):"
  for t in "${TARGETS[@]}"; do echo "- $t: ${PER_CPU[$t]}(req/s ${RPS[$t]})"; done
} | tee "$TMP/report.md"
mkdir -p "$ROOT/bench/results"
if [ "$quick" = 0 ]; then cp "$TMP/report.md" "$ROOT/bench/results/cores.md"; log "wrote bench/results/cores.md"; fi
