#!/usr/bin/env python3
"""UDP helpers for bench/udp.sh: an echo member, and a bounded closed-loop load generator.

  udp.py echo PORT                        answers every datagram with itself, until killed
  udp.py load HOST:PORT CLIENTS WINDOW SECONDS
                                          CLIENTS sockets (each its own source port, so a
                                          flow of its own) keep WINDOW datagrams in flight each
                                          for SECONDS; prints `answered=N lost_refills=M`

The generator is closed loop: a datagram goes out only when an answer came back (or, after
200 ms without any answer on a socket, its window is sent again: lost datagrams do not stall
it). Every loop is bounded by SECONDS.
"""
import select
import socket
import sys
import time


def echo(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind(("127.0.0.1", port))
    while True:
        data, peer = s.recvfrom(65535)
        s.sendto(data, peer)


def load(target, clients, window, seconds):
    host, port = target.rsplit(":", 1)
    addr = (host, int(port))
    payload = b"x" * 64
    ep = select.epoll()
    socks = {}
    for _ in range(clients):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setblocking(False)
        s.connect(addr)
        socks[s.fileno()] = s
        ep.register(s.fileno(), select.EPOLLIN)
    last_heard = {}
    start = time.monotonic()
    end = start + seconds
    for fd, s in socks.items():
        for _ in range(window):
            try:
                s.send(payload)
            except (BlockingIOError, ConnectionRefusedError):
                pass
        last_heard[fd] = start
    answered = 0
    refills = 0
    while True:
        now = time.monotonic()
        if now >= end:
            break
        for fd, _ in ep.poll(min(0.05, end - now)):
            s = socks[fd]
            for _ in range(window * 4):
                try:
                    s.recv(2048)
                except (BlockingIOError, ConnectionRefusedError):
                    break
                answered += 1
                try:
                    s.send(payload)
                except (BlockingIOError, ConnectionRefusedError):
                    pass
            last_heard[fd] = now
        for fd, s in socks.items():
            if now - last_heard[fd] > 0.2:
                refills += 1
                last_heard[fd] = now
                for _ in range(window):
                    try:
                        s.send(payload)
                    except (BlockingIOError, ConnectionRefusedError):
                        pass
    print(f"answered={answered} lost_refills={refills} seconds={seconds}")


if __name__ == "__main__":
    if sys.argv[1] == "echo":
        echo(int(sys.argv[2]))
    elif sys.argv[1] == "load":
        load(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
    else:
        sys.exit(f"udp.py: unknown mode {sys.argv[1]}")
