"""A real HTTP/3 client for the router's HTTP/3 tests (crates/rondo/tests/http3.rs): aioquic's.

    python3 h3_client.py ADDR CA_PEM SERVER_NAME METHOD PATH BODY_BYTES COUNT [HOLD_SECONDS]
    python3 h3_client.py flood ADDR COUNT
    python3 h3_client.py session ADDR CA_PEM SERVER_NAME

opens ONE QUIC connection to ADDR (HOST:PORT), checking the router's certificate against
CA_PEM for SERVER_NAME, and sends COUNT requests on it at once, one stream each, every one
METHOD PATH with a body of BODY_BYTES bytes (0: none; the bytes are `abcdefghij...` repeated).
Prints one JSON line per request, in request order:

    {"status": 200, "headers": {...}, "body_len": N, "body_sha256": "...", "body": "first 2000"}

with the limits the server announced in its transport parameters beside them
("server_max_streams_bidi", "server_idle_timeout_ms"), or {"error": "..."} for a request that
got no response. With HOLD_SECONDS the connection is then kept open, silent, that long. With
H3_ZERO_RTT=1 the requests go on a resumed connection, in 0-RTT early data when the server's
ticket allows it (each line then also says "early_data": whether the server accepted it). Every request (and the connect) has a
10 s deadline, so the process always ends.

`session` keeps ONE connection open and takes commands on stdin, one a line, answering each
with one JSON line: `get PATH` (a GET, answered as above), `open COUNT PATH BYTES` (COUNT POST
streams whose heads announce BYTES bytes, sent now; their bodies not yet: {"opened": COUNT}),
`send` (the bodies of the streams opened, then their answers, one line each). It ends at
`quit`, at the end of stdin, or 60 s after it started.
"""

import asyncio
import hashlib
import json
import os
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import QuicEvent, StreamReset

DEADLINE = 10.0


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.waiting = {}
        self.answers = {}

    def request(self, method, authority, path, body, length=None):
        """Sends a request; with `length`, only its head announcing `length` bytes (the body
        then goes with `send_body`)."""
        stream = self._quic.get_next_available_stream_id()
        headers = [
            (b":method", method.encode()),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
            (b"user-agent", b"aioquic-test"),
        ]
        if body or length:
            headers.append((b"content-length", str(length or len(body)).encode()))
        # H3_EXTRA_HEADERS=COUNT:BYTES adds COUNT fields of BYTES-byte values (limits tests).
        count, size = map(int, os.environ.get("H3_EXTRA_HEADERS", "0:0").split(":"))
        headers += [(f"x-extra-{i}".encode(), b"v" * size) for i in range(count)]
        self.h3.send_headers(stream, headers, end_stream=not body and not length)
        if body:
            self.h3.send_data(stream, body, end_stream=True)
        done = self._loop.create_future()
        self.waiting[stream] = done
        self.answers[stream] = {"headers": {}, "body": bytearray()}
        self.transmit()
        return stream, done

    def quic_event_received(self, event: QuicEvent):
        if isinstance(event, StreamReset) and event.stream_id in self.waiting:
            done = self.waiting.pop(event.stream_id)
            if not done.done():
                done.set_exception(RuntimeError(f"stream reset {event.error_code}"))
            return
        for e in self.h3.handle_event(event):
            answer = self.answers.get(e.stream_id)
            if answer is None:
                continue
            if isinstance(e, HeadersReceived):
                for k, v in e.headers:
                    answer["headers"].setdefault(k.decode(), v.decode())
            elif isinstance(e, DataReceived):
                answer["body"] += e.data
            if getattr(e, "stream_ended", False):
                done = self.waiting.pop(e.stream_id, None)
                if done is not None and not done.done():
                    done.set_result(answer)


    def send_body(self, stream, body):
        self.h3.send_data(stream, body, end_stream=True)
        self.transmit()


def answer_line(answer):
    data = bytes(answer["body"])
    return json.dumps(
        {
            "status": int(answer["headers"].get(":status", "0")),
            "headers": answer["headers"],
            "body_len": len(data),
            "body": data[:2000].decode("utf-8", "replace"),
        }
    )


async def session():
    """The `session` mode (see the module docs)."""
    addr, ca, server_name = sys.argv[2:5]
    host, port = addr.rsplit(":", 1)
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.load_verify_locations(ca)
    config.server_name = server_name
    loop = asyncio.get_running_loop()
    async with connect(host, int(port), configuration=config, create_protocol=Client) as client:
        opened = []
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            words = line.split()
            if not words or words[0] == "quit":
                break
            if words[0] == "get":
                sent = [client.request("GET", server_name, words[1], b"")]
            elif words[0] == "open":
                count, path, length = int(words[1]), words[2], int(words[3])
                for _ in range(count):
                    stream, done = client.request("POST", server_name, path, b"", length)
                    opened.append((stream, done, length))
                print(json.dumps({"opened": count}), flush=True)
                continue
            elif words[0] == "send":
                for stream, _, length in opened:
                    client.send_body(stream, body_of(length))
                sent = [(s, d) for s, d, _ in opened]
                opened = []
            else:
                print(json.dumps({"error": f"unknown command {words[0]}"}), flush=True)
                continue
            for _, done in sent:
                try:
                    print(answer_line(await asyncio.wait_for(done, DEADLINE)), flush=True)
                except Exception as e:  # a reset, a timeout: reported, the others go on
                    print(json.dumps({"error": str(e) or type(e).__name__}), flush=True)


def body_of(n):
    pattern = b"abcdefghijklmnopqrstuvwxyz0123456789"
    return (pattern * (n // len(pattern) + 1))[:n]


async def main():
    addr, ca, server_name, method, path, body_bytes, count = sys.argv[1:8]
    hold = float(sys.argv[8]) if len(sys.argv) > 8 else 0.0
    host, port = addr.rsplit(":", 1)
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.load_verify_locations(ca)
    config.server_name = server_name
    if os.environ.get("H3_CLIENT_CERT"):
        # H3_CLIENT_CERT and H3_CLIENT_KEY: the client's certificate, for listeners that ask.
        config.load_cert_chain(os.environ["H3_CLIENT_CERT"], os.environ["H3_CLIENT_KEY"])
    body = body_of(int(body_bytes))
    zero_rtt = os.environ.get("H3_ZERO_RTT") == "1"
    if zero_rtt:
        # H3_ZERO_RTT=1: a first connection (one GET /) only to get a session ticket, then the
        # requests sent at once on a resumed connection, in 0-RTT early data if the ticket
        # allows it.
        tickets = []
        async with connect(
            host, int(port), configuration=config, create_protocol=Client,
            session_ticket_handler=tickets.append,
        ) as first:
            _, done = first.request("GET", server_name, "/", b"")
            await asyncio.wait_for(done, DEADLINE)
            for _ in range(100):
                if tickets:
                    break
                await asyncio.sleep(0.02)
        if not tickets:
            raise RuntimeError("no session ticket")
        config.session_ticket = tickets[-1]
    async with connect(
        host, int(port), configuration=config, create_protocol=Client,
        wait_connected=not zero_rtt,
    ) as client:
        sent = [client.request(method, server_name, path, body) for _ in range(int(count))]
        for _, done in sent:
            try:
                answer = await asyncio.wait_for(done, DEADLINE)
            except Exception as e:  # a reset, a timeout: reported, the others go on
                print(json.dumps({"error": str(e) or type(e).__name__}), flush=True)
                continue
            data = bytes(answer["body"])
            print(
                json.dumps(
                    {
                        "status": int(answer["headers"].get(":status", "0")),
                        "headers": answer["headers"],
                        "body_len": len(data),
                        "body_sha256": hashlib.sha256(data).hexdigest(),
                        "body": data[:2000].decode("utf-8", "replace"),
                        "server_max_streams_bidi": client._quic._remote_max_streams_bidi,
                        "server_idle_timeout_ms": int(client._quic._remote_max_idle_timeout * 1000),
                        "early_data": bool(getattr(client._quic.tls, "early_data_accepted", False)),
                    }
                ),
                flush=True,
            )
        await asyncio.sleep(hold)


async def bounded():
    try:
        await asyncio.wait_for(main(), 3 * DEADLINE)
    except Exception as e:  # the connection failed: said on stdout, for the test's assertion
        print(json.dumps({"error": f"connection: {type(e).__name__} {e}"}), flush=True)


def flood(addr, count):
    """The first flight (an Initial with a ClientHello) of COUNT new connections to ADDR, from
    250 loopback source addresses (127.0.0.2 up), none ever answered: what a flood of Initials
    from spoofed addresses costs the server. Prints `sent N`."""
    import socket
    import ssl
    import time

    from aioquic.quic.connection import QuicConnection

    host, port = addr.rsplit(":", 1)
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.verify_mode = ssl.CERT_NONE
    socks = []
    for i in range(250):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((f"127.0.0.{2 + i}", 0))
        socks.append(s)
    sent = 0
    deadline = time.time() + 60
    for i in range(count):
        if time.time() > deadline:
            break
        c = QuicConnection(configuration=config)
        c.connect((host, int(port)), now=time.time())
        for data, _ in c.datagrams_to_send(now=time.time()):
            socks[i % len(socks)].sendto(data, (host, int(port)))
        sent += 1
    print(f"sent {sent}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "flood":
        flood(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "session":
        try:
            asyncio.run(asyncio.wait_for(session(), 6 * DEADLINE))
        except Exception as e:
            print(json.dumps({"error": f"connection: {type(e).__name__} {e}"}), flush=True)
    else:
        asyncio.run(bounded())
