"""Real gRPC peers for crates/rondo/tests/router/grpc.rs (grpcio, no generated code: the
messages are raw bytes, the health protocol's tiny protobuf written by hand).

  grpc_peer.py serve NAME BEHAVIOUR HEALTH
      serves /test.Echo/Say on a free loopback port (printed as `listening PORT`) until stdin
      closes. BEHAVIOUR: ok (answers NAME), unavailable (UNAVAILABLE, trailers-only), slow
      (answers after 1 s), remaining (answers the deadline left, in seconds, as the call saw it).
      HEALTH: serving | not-serving, the answer of grpc.health.v1.Health/Check for service
      `my.Service` (any other service: NOT_FOUND).
      Whatever BEHAVIOUR, it also serves /test.Echo/Echo (answers `NAME:REQUEST`),
      /test.Echo/Many (streams `NAME:0` to `NAME:4`, one message each) and /test.Echo/Deny
      (PERMISSION_DENIED, "no entry for REQUEST"), for the gRPC-Web tests.
  grpc_peer.py call ADDR N
      makes N calls of /test.Echo/Say through ADDR, one line each: `OK REPLY` or
      `ERR CODE DETAILS`.
"""

import sys
import time
from concurrent import futures

import grpc


def serve(name, behaviour, health):
    def say(request, context):
        if behaviour == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{name} is unavailable")
        if behaviour == "slow":
            time.sleep(1.0)
        if behaviour == "remaining":
            left = context.time_remaining()
            return f"{left:.3f}".encode() if left is not None else b"none"
        return name.encode()

    def check(request, context):
        want = b"my.Service"
        if request != b"\x0a" + bytes([len(want)]) + want:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request!r}")
        return b"\x08\x01" if health == "serving" else b"\x08\x02"

    def echo(request, context):
        return name.encode() + b":" + request

    def many(request, context):
        for i in range(5):
            yield f"{name}:{i}".encode()

    def deny(request, context):
        context.abort(grpc.StatusCode.PERMISSION_DENIED, f"no entry for {request.decode()}")

    handlers = [
        grpc.method_handlers_generic_handler(
            "test.Echo",
            {
                "Say": grpc.unary_unary_rpc_method_handler(say),
                "Echo": grpc.unary_unary_rpc_method_handler(echo),
                "Many": grpc.unary_stream_rpc_method_handler(many),
                "Deny": grpc.unary_unary_rpc_method_handler(deny),
            },
        ),
        grpc.method_handlers_generic_handler(
            "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(check)}
        ),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), handlers=handlers)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening {port}", flush=True)
    # Lives as long as the test holds its stdin.
    sys.stdin.read()
    server.stop(0)


def call(addr, n):
    with grpc.insecure_channel(addr) as channel:
        say = channel.unary_unary("/test.Echo/Say")
        for _ in range(n):
            try:
                reply = say(b"hi", timeout=10)
                print(f"OK {reply.decode()}", flush=True)
            except grpc.RpcError as e:
                print(f"ERR {e.code().name} {e.details()}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        call(sys.argv[2], int(sys.argv[3]))
