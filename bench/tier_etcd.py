#!/usr/bin/env python3
"""Can etcd carry the tier's load view (issue 37, item 9)? N simulated routers each put their
per-member load table (M members, the JSON rondo's tier view publishes) every 100 ms into one
real etcd (started here on free loopback ports, in a temporary directory) through its v3 JSON
gateway, for a bounded time. Prints, per (N, M): puts asked and done per second, put latency
p50/p99/max, the share of 100 ms periods a router missed (its put took longer than the period),
and how much the backend grew (etcd keeps every revision until compaction).

    python3 bench/tier_etcd.py [--seconds 10] [--cases 4x100,4x1000,16x100,16x1000]
"""
import argparse, base64, http.client, json, os, shutil, socket, subprocess, sys, tempfile, threading, time

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def b64(s):
    return base64.b64encode(s.encode()).decode()

def call(conn, path, body):
    conn.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse(); data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{path}: {r.status} {data[:200]!r}")
    return json.loads(data)

def payload(router, seq, members):
    m = {f"api/m{i}": {"in_flight": (i * 7 + seq) % 13, "sessions": 0, "ewma_us": 1200 + i}
         for i in range(members)}
    return json.dumps({"router": router, "seq": seq, "members": m})

def run_case(port, routers, members, seconds, interval=0.1):
    lat, missed, periods, lock = [], [0], [0], threading.Lock()
    stop_at = time.monotonic() + seconds
    def router(r):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        key = b64(f"rondo/tier/test/load/{r}")
        seq, next_at = 0, time.monotonic()
        while time.monotonic() < stop_at:
            seq += 1
            body = {"key": key, "value": b64(payload(r, seq, members))}
            t0 = time.monotonic()
            call(conn, "/v3/kv/put", body)
            dt = time.monotonic() - t0
            with lock:
                lat.append(dt); periods[0] += 1
                if dt > interval: missed[0] += 1
            next_at += interval
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                next_at = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    size0 = int(call(conn, "/v3/maintenance/status", {}).get("dbSize", 0))
    ts = [threading.Thread(target=router, args=(r,)) for r in range(routers)]
    t0 = time.monotonic()
    for t in ts: t.start()
    for t in ts: t.join()
    took = time.monotonic() - t0
    size1 = int(call(conn, "/v3/maintenance/status", {}).get("dbSize", 0))
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000
    return {
        "routers": routers, "members": members, "bytes": len(payload(0, 1, members)),
        "asked_per_s": routers / interval, "done_per_s": len(lat) / took,
        "p50_ms": q(0.50), "p99_ms": q(0.99), "max_ms": lat[-1] * 1000,
        "missed": missed[0] / max(1, periods[0]), "db_growth_mb": (size1 - size0) / 1e6,
    }

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--cases", default="4x100,4x1000,16x100,16x1000")
    a = ap.parse_args()
    if a.seconds > 120:
        sys.exit("--seconds: at most 120")
    d = tempfile.mkdtemp(prefix="tier-etcd-")
    cport, pport = free_port(), free_port()
    c, p = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
    log = open(os.path.join(d, "etcd.log"), "w")
    etcd = subprocess.Popen(["etcd", "--name", "default", "--data-dir", os.path.join(d, "data"),
        "--listen-client-urls", c, "--advertise-client-urls", c, "--listen-peer-urls", p,
        "--initial-advertise-peer-urls", p, "--initial-cluster", f"default={p}"],
        stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                call(http.client.HTTPConnection("127.0.0.1", cport, timeout=2), "/v3/kv/range", {"key": b64("x")})
                break
            except Exception:
                if time.monotonic() > deadline: sys.exit("etcd did not start")
                time.sleep(0.1)
        print("| routers | members | report bytes | puts/s asked | puts/s done | p50 ms | p99 ms | max ms | periods missed | backend growth MB |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for case in a.cases.split(","):
            n, m = (int(x) for x in case.split("x"))
            r = run_case(cport, n, m, a.seconds)
            print(f"| {r['routers']} | {r['members']} | {r['bytes']} | {r['asked_per_s']:.0f} | {r['done_per_s']:.0f} | "
                  f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.0f} | {100 * r['missed']:.1f} % | {r['db_growth_mb']:.1f} |", flush=True)
    finally:
        etcd.kill(); etcd.wait(); log.close(); shutil.rmtree(d, ignore_errors=True)

if __name__ == "__main__":
    main()
