"""Free ports on 127.0.0.1 for the servers the local cluster and the tests start (every one binds
loopback only). The one port picker of the repository."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports, held open together while they are picked (ports picked one
    at a time may repeat)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((LOOPBACK, 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()
