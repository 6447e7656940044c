#!/usr/bin/env python3
"""The naming service's xDS server against its targets (issue 44; results in docs/benchmarks.md).

  python3 bench/xds.py [--rondo target/debug/rondo] [--load target/debug/rondo-xds-load]
                       [--changes 100] [--clients 1000]

It starts two grpcio members (crates/rondo/tests/xds/peer.py) and `rondo serve` (built with
--features xds) with cluster `web` over them, the naming service's xDS server and the admin API,
then:

1. pick latency: a proxyless grpcio client in this process (xds:///web) calls in a tight loop
   while member m1 is disabled and enabled in turn through the admin API, `--changes` times;
   each change's latency is from the admin call's answer to the client's first pick that
   follows it (the last call m1 answered after a disable, the first after an enable);
   reported as median, p99 and worst;
2. scale: `rondo-xds-load` opens `--clients` ADS streams, reads the naming service's RSS and
   times pushes of 10 changes to all of them.

Everything it starts is ended on exit; every wait is bounded.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "crates/rondo/tests/xds/peer.py")
PROCS = []


def start(args, **kw):
    p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **kw)
    PROCS.append(p)
    return p


def line_with(p, needle, limit=20):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        line = p.stdout.readline()
        if not line:
            break
        if needle in line:
            return line.strip()
    sys.exit(f"bench/xds.py: no line with {needle!r}")


def admin(addr, path):
    req = urllib.request.Request(f"http://{addr}{path}", method="POST", data=b"",
                                 headers={"Authorization": "Bearer t"})
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def pick_latency(xds, admin_addr, changes):
    os.environ["GRPC_XDS_BOOTSTRAP_CONFIG"] = json.dumps({
        "xds_servers": [{"server_uri": xds, "channel_creds": [{"type": "insecure"}],
                         "server_features": ["xds_v3"]}],
        "node": {"id": "bench", "locality": {}},
    })
    import grpc  # after the bootstrap is set

    channel = grpc.insecure_channel("xds:///web")
    say = channel.unary_unary("/test.Echo/Say")
    calls = []  # (monotonic, member)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                member = say(b"", timeout=5).decode()
            except grpc.RpcError as e:
                member = "ERR " + e.code().name
            calls.append((time.monotonic(), member))

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    end = time.monotonic() + 20
    while not any(m == "m1" for _, m in calls[-50:]) and time.monotonic() < end:
        time.sleep(0.05)
    path = "/api/v1/clusters/web/members/m1/"
    lat = []
    for i in range(changes):
        disable = i % 2 == 0
        admin(admin_addr, path + ("disable" if disable else "enable"))
        t0 = time.monotonic()
        start_idx = len(calls)
        while time.monotonic() - t0 < 3:
            time.sleep(0.02)
            after = [(at, m) for at, m in calls[start_idx:] if at >= t0]
            m1 = [at for at, m in after if m == "m1"]
            if disable and after and after[-1][0] - (m1[-1] if m1 else t0) > 0.3:
                lat.append(max(0.0, (m1[-1] if m1 else t0) - t0))
                break
            if not disable and m1:
                lat.append(m1[0] - t0)
                break
        else:
            lat.append(float("inf"))
        time.sleep(0.05)
    stop.set()
    t.join(timeout=10)
    errors = sum(1 for _, m in calls if m.startswith("ERR"))
    channel.close()
    lat.sort()
    ms = lambda s: f"{s * 1000:.0f} ms" if s != float("inf") else "none within 3 s"
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"view change -> picks, {len(lat)} changes: median {ms(lat[len(lat) // 2])}, "
          f"p99 {ms(p99)}, worst {ms(lat[-1])}; {len(calls)} calls, {errors} failed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rondo", default=os.path.join(ROOT, "target/debug/rondo"))
    ap.add_argument("--load", default=os.path.join(ROOT, "target/debug/rondo-xds-load"))
    ap.add_argument("--changes", type=int, default=100)
    ap.add_argument("--clients", type=int, default=1000)
    a = ap.parse_args()
    members = []
    for name in ("m1", "m2"):
        p = start([sys.executable, PEER, "serve", name], stderr=subprocess.DEVNULL)
        port = line_with(p, "listening").split()[1]
        members.append((name, f"127.0.0.1:{port}"))
    rows = ", ".join(f'{{ name = "{n}", address = "{addr}" }}' for n, addr in members)
    tmp = tempfile.mkdtemp(prefix="rondo-xds-bench.")
    conf = os.path.join(tmp, "rondo.toml")
    with open(conf, "w") as f:
        f.write(f'''[log]
level = "warn"

[admin]
listen = "127.0.0.1:0"
token = "t"

[naming]
listen = "127.0.0.1:0"
xds = {{ listen = "127.0.0.1:0", max_clients = {a.clients + 10} }}

[[listener]]
name = "web"
listen = "127.0.0.1:0"

[[route]]
listener = "web"
cluster = "web"

[cluster.web]
upstream_protocol = "http2"
members = [{rows}]
''')
    rondo = start([a.rondo, "serve", conf], stderr=subprocess.DEVNULL)
    addrs = {}
    while len(addrs) < 2:
        line = line_with(rondo, "rondo: ")
        if "admin API on" in line:
            addrs["admin"] = line.rsplit(" ", 1)[1]
        elif "naming xDS (ADS) on" in line:
            addrs["xds"] = line.rsplit(" ", 1)[1]
    print(f"rondo {a.rondo}, pid {rondo.pid}; load average {open('/proc/loadavg').read().split()[:3]}")
    # The load generator first: this process's own xDS client stays out of its count.
    load = subprocess.run([a.load, "--xds", addrs["xds"], "--admin", addrs["admin"],
                           "--clients", str(a.clients), "--pid", str(rondo.pid)],
                          timeout=600, check=False)
    if load.returncode != 0:
        print(f"rondo-xds-load failed ({load.returncode})")
    pick_latency(addrs["xds"], addrs["admin"], a.changes)


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in PROCS:
            p.kill()
            p.wait()
