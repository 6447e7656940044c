#!/usr/bin/env python3
"""Hold N idle HTTP/2 connections open (bench/h2.sh's memory reading).

Each connection: TCP (or TLS with ALPN h2, certificate not checked), the client preface, an empty
SETTINGS frame, one GET / on stream 1 read to its end, then idle. Prints `held=N errors=E` once
all are open, then keeps them for --hold-secs, acknowledging the server's SETTINGS and answering
its PINGs so that no keepalive closes them. Standard library only (no h2 package): the request
is one HEADERS frame whose fields are HPACK static-table indexes plus one literal :authority.
"""

import argparse
import resource
import selectors
import socket
import ssl
import struct
import sys
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x4, 0x6, 0x7
END_STREAM, ACK = 0x1, 0x1


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def request(authority, use_tls):
    # :method GET (2), :scheme http/https (6/7), :path / (4), :authority literal with index 1.
    auth = authority.encode()
    scheme = 0x87 if use_tls else 0x86
    return frame(HEADERS, 0x4 | END_STREAM, 1, bytes([0x82, scheme, 0x84, 0x41, len(auth)]) + auth)


class Conn:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.done = False

    def frames(self):
        """Parses whole frames out of the buffer; answers SETTINGS and PING."""
        out = []
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + length:
                break
            kind, flags = self.buf[3], self.buf[4]
            stream = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            payload = self.buf[9 : 9 + length]
            self.buf = self.buf[9 + length :]
            if kind == SETTINGS and not flags & ACK:
                self.sock.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                self.sock.sendall(frame(PING, ACK, 0, payload))
            elif kind == GOAWAY:
                raise OSError("GOAWAY from the server")
            elif kind in (DATA, HEADERS) and stream == 1 and flags & END_STREAM:
                self.done = True
            out.append(kind)
        return out

    def pump(self, deadline):
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        data = self.sock.recv(65536)
        if not data:
            raise OSError("closed by the server")
        self.buf += data
        self.frames()


def open_one(host, port, use_tls, ctx):
    raw = socket.create_connection((host, port), timeout=10)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock = ctx.wrap_socket(raw, server_hostname="localhost") if use_tls else raw
    if use_tls and sock.selected_alpn_protocol() != "h2":
        raise OSError(f"ALPN gave {sock.selected_alpn_protocol()!r}, not h2")
    conn = Conn(sock)
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0) + request(f"{host}:{port}", use_tls))
    deadline = time.monotonic() + 10
    while not conn.done:
        if time.monotonic() > deadline:
            raise OSError("no response within 10 s")
        conn.pump(deadline)
    return conn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True, help="host:port")
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--hold-secs", type=float, default=60)
    ap.add_argument("--tls", action="store_true")
    args = ap.parse_args()
    host, port = args.target.rsplit(":", 1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.connections + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    conns, errors, first_error = [], 0, ""
    for _ in range(args.connections):
        try:
            conns.append(open_one(host, int(port), args.tls, ctx))
        except OSError as e:
            errors += 1
            first_error = first_error or str(e)
    print(f"held={len(conns)} errors={errors}" + (f" first_error={first_error}" if first_error else ""), flush=True)
    sel = selectors.DefaultSelector()
    for c in conns:
        c.sock.setblocking(False)
        sel.register(c.sock, selectors.EVENT_READ, c)
    end = time.monotonic() + args.hold_secs
    while time.monotonic() < end:
        for key, _ in sel.select(timeout=max(0.0, min(1.0, end - time.monotonic()))):
            c = key.data
            try:
                data = c.sock.recv(65536)
                if not data:
                    raise OSError("closed")
                c.buf += data
                c.sock.setblocking(True)
                c.frames()
                c.sock.setblocking(False)
            except (BlockingIOError, ssl.SSLWantReadError):
                pass
            except OSError:
                sel.unregister(c.sock)
                print("a held connection closed", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
