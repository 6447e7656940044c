"""Real gRPC peers for crates/rondo/tests/xds.rs (grpcio, no generated code: raw bytes).

  peer.py serve NAME
      serves /test.Echo/Say on a free loopback port (printed as `listening PORT`), answering
      NAME, until stdin closes. A line `fail` on stdin makes it answer UNAVAILABLE from then on,
      `ok` answers again. `load CPU QPS` makes every answer carry an ORCA load report (gRFC A51:
      an `endpoint-load-metrics-bin` trailer, an xds.data.orca.v3.OrcaLoadReport) with that CPU
      utilization and rate of queries per second, which a client's weighted round robin
      (gRFC A58) weighs it by.
  peer.py client CLUSTER
      a proxyless xDS client (bootstrap in GRPC_XDS_BOOTSTRAP_CONFIG) of xds:///CLUSTER, driven
      by stdin lines, each answered by one JSON line on stdout:
        calls N [KEY]   N calls one after the other (with header x-key: KEY when given):
                        {"counts": {member: n}, "errors": {code: n}, "keys": [member per call]}
        keys N          N calls with keys k0..k(N-1): {"keys": [member per call], "errors": {}}
        run MS          calls for MS milliseconds: {"seq": [[ms, member or "ERR code"]], ...}
        wait MEMBER S   calls until one is answered by MEMBER, at most S seconds:
                        {"ok": true|false, "after_ms": ms}
        quit
      Every call has a 5 s deadline and no wait_for_ready.
"""

import json
import struct
import sys
import threading
import time
from concurrent import futures

import grpc

METHOD = "/test.Echo/Say"


def orca_report(cpu, qps):
    """An OrcaLoadReport, encoded by hand (no generated code): cpu_utilization (field 1),
    rps_fractional (field 6) and application_utilization (field 9), doubles (wire type 1).
    The utilization goes in both fields: gRFC A58 weighs by application_utilization, else by
    cpu_utilization, and grpc-js 1.14 reads application_utilization only."""
    cpu = struct.pack("<d", cpu)
    return b"\x09" + cpu + b"\x31" + struct.pack("<d", qps) + b"\x49" + cpu


def serve(name):
    state = {"fail": False, "load": None}

    def say(request, context):
        if state["fail"]:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{name} is failing")
        load = state["load"]
        if load is not None:
            context.set_trailing_metadata((("endpoint-load-metrics-bin", load),))
        return name.encode()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening {port}", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "fail":
            state["fail"] = True
        elif cmd == "ok":
            state["fail"] = False
        elif cmd.startswith("load "):
            cpu, qps = (float(x) for x in cmd.split()[1:3])
            state["load"] = orca_report(cpu, qps)
        print(f"done {cmd}", flush=True)
    server.stop(0)


def client(cluster):
    channel = grpc.insecure_channel(f"xds:///{cluster}")
    say = channel.unary_unary(METHOD)

    def one(key=None):
        meta = (("x-key", key),) if key is not None else None
        try:
            return say(b"", timeout=5, metadata=meta).decode(), None
        except grpc.RpcError as e:
            return None, e.code().name

    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        cmd, args = parts[0], parts[1:]
        if cmd == "quit":
            break
        out = {"counts": {}, "errors": {}, "keys": []}
        if cmd in ("calls", "keys"):
            n = int(args[0])
            for i in range(n):
                key = (args[1] if len(args) > 1 else None) if cmd == "calls" else f"k{i}"
                member, err = one(key)
                if err:
                    out["errors"][err] = out["errors"].get(err, 0) + 1
                    out["keys"].append(f"ERR {err}")
                else:
                    out["counts"][member] = out["counts"].get(member, 0) + 1
                    out["keys"].append(member)
        elif cmd == "run":
            start = time.monotonic()
            seq = []
            while (time.monotonic() - start) * 1000 < int(args[0]):
                member, err = one()
                ms = int((time.monotonic() - start) * 1000)
                seq.append([ms, member if member else f"ERR {err}"])
                if err:
                    out["errors"][err] = out["errors"].get(err, 0) + 1
                time.sleep(0.005)
            out["seq"] = seq
        elif cmd == "wait":
            start = time.monotonic()
            out["ok"] = False
            while time.monotonic() - start < float(args[1]):
                member, _ = one()
                if member == args[0]:
                    out["ok"] = True
                    break
                time.sleep(0.005)
            out["after_ms"] = int((time.monotonic() - start) * 1000)
        print(json.dumps(out), flush=True)
    channel.close()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        client(sys.argv[2])
