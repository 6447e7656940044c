#!/usr/bin/env bash
# System calls per proxied request, by kind: `rondo serve` (one worker, round-robin over three
# `rondo member`s on 127.0.0.1, as bench/instructions.sh sets up) and HAProxy (nbthread 1, the
# bench/run.sh configuration) over the same members, each driven by `wrk -t1 -c8` keep-alive.
# The kernel's syscall tracepoints are counted for the proxy process only (`perf stat -p`), for
# the duration of one wrk run, and divided by the requests wrk completed. Counting does not
# slow the proxy the way strace does, so the batching (how many requests one epoll_wait
# returns) stays close to the unmeasured one; the counts of read/write/sendto/recvfrom per
# request are exact, those of epoll_wait and of reads that find nothing move a little with
# timing.
#
#   bench/syscalls.sh BIN ...            each rondo binary, then HAProxy
#   RONDO_SYSCALLS_NO_HAPROXY=1 bench/syscalls.sh BIN ...   rondo only
#
# Needs perf (linux-perf, run as root or with perf_event_paranoid <= 1 for tracepoints), wrk,
# curl and haproxy. Ports 19110-19114. Prints one table per proxy: calls per request by kind
# (those at 0.01 or more), the failed reads (`EAGAIN`) separately, and the total.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
for tool in perf wrk curl; do
  command -v "$tool" >/dev/null || { echo "bench/syscalls.sh: $tool is missing" >&2; exit 1; }
done
[ $# -gt 0 ] || { echo "bench/syscalls.sh: no binary given" >&2; exit 2; }
SECS=${RONDO_SYSCALLS_SECS:-5}

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

cat > "$tmp/rondo.toml" <<'EOF'
[[listener]]
name = "web"
listen = "127.0.0.1:19110"

[[route]]
listener = "web"
cluster = "app"

[cluster.app]
algorithm = "round-robin"
members = [
  { name = "m1", address = "127.0.0.1:19111" },
  { name = "m2", address = "127.0.0.1:19112" },
  { name = "m3", address = "127.0.0.1:19113" },
]
EOF
cat > "$tmp/haproxy.cfg" <<'EOF'
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
  bind 127.0.0.1:19114
  default_backend members

backend members
  balance roundrobin
  server m1 127.0.0.1:19111
  server m2 127.0.0.1:19112
  server m3 127.0.0.1:19113
EOF

# The syscalls worth a line; everything else is in the total (raw_syscalls:sys_enter).
kinds=(read write readv writev recvfrom sendto recvmsg sendmsg epoll_wait epoll_pwait
  epoll_ctl futex clock_gettime clock_nanosleep timerfd_settime accept4 connect close
  shutdown setsockopt getsockopt ioctl sched_yield)
events="raw_syscalls:sys_enter,syscalls:sys_exit_read,syscalls:sys_exit_recvfrom"
for k in "${kinds[@]}"; do events+=",syscalls:sys_enter_$k"; done

# measure NAME PID PORT: warm up, then count PID's syscalls over one wrk run.
measure() {
  local name=$1 pid=$2 port=$3 up=0
  for _ in $(seq 100); do
    if curl -s -o /dev/null "http://127.0.0.1:$port/"; then up=1; break; fi
    sleep 0.2
  done
  [ "$up" = 1 ] || { echo "bench/syscalls.sh: $name did not come up" >&2; exit 1; }
  wrk -t1 -c8 -d2s "http://127.0.0.1:$port/" >/dev/null
  # Failed reads: sys_exit_read with ret < 0 (EAGAIN is -11), counted by a filtered event.
  perf stat -x, -o "$tmp/stat" -e "$events" \
    -e 'syscalls:sys_exit_read' --filter 'ret < 0' \
    -e 'syscalls:sys_exit_recvfrom' --filter 'ret < 0' \
    -p "$pid" -- wrk -t1 -c8 -d"${SECS}s" "http://127.0.0.1:$port/" >"$tmp/wrk"
  local requests
  requests=$(awk '/requests in/ {print $1}' "$tmp/wrk")
  echo "$name: $requests requests in ${SECS} s (wrk -t1 -c8)"
  echo "| system call | per request |"
  echo "|---|---:|"
  awk -F, -v n="$requests" '
    /^#/ || NF < 3 { next }
    {
      ev = $3; c = $1 + 0
      if (ev == "raw_syscalls:sys_enter") { total = c; next }
      if (ev ~ /sys_exit_/) { seen[ev]++; if (seen[ev] == 2) failed[ev] = c; next }
      sub("syscalls:sys_enter_", "", ev)
      if (c / n >= 0.01) printf "| %s | %.2f |\n", ev, c / n
    }
    END {
      for (ev in failed) { e = ev; sub("syscalls:sys_exit_", "", e); if (failed[ev] / n >= 0.01) printf "| of which %s failed (EAGAIN) | %.2f |\n", e, failed[ev] / n }
      printf "| **all system calls** | **%.2f** |\n", total / n
    }' "$tmp/stat"
  echo
}

for bin in "$@"; do
  [ -x "$bin" ] || { echo "bench/syscalls.sh: $bin is not executable" >&2; exit 1; }
  members=()
  for i in 1 2 3; do
    "$bin" member --name "m$i" --listen "127.0.0.1:1911$i" >/dev/null 2>&1 &
    members+=($!)
    pids+=($!)
  done
  "$bin" serve --config "$tmp/rondo.toml" --workers 1 >"$tmp/serve.log" 2>&1 &
  serve=$!
  pids+=("$serve")
  measure "$bin" "$serve" 19110
  kill -INT "$serve"
  wait "$serve" 2>/dev/null || true
  if [ "$bin" = "${!#}" ] && [ -z "${RONDO_SYSCALLS_NO_HAPROXY:-}" ]; then
    command -v haproxy >/dev/null || { echo "bench/syscalls.sh: haproxy is missing" >&2; exit 1; }
    haproxy -db -f "$tmp/haproxy.cfg" >"$tmp/haproxy.log" 2>&1 &
    hp=$!
    pids+=("$hp")
    measure "haproxy $(haproxy -v | awk 'NR == 1 {print $3}')" "$hp" 19114
    kill "$hp"
    wait "$hp" 2>/dev/null || true
  fi
  for p in "${members[@]}"; do kill "$p" 2>/dev/null || true; done
  wait "${members[@]}" 2>/dev/null || true
done
