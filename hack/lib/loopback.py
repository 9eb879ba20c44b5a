"""Loopback for the network rule: free ports on 127.0.0.1 for the servers the local cluster and
the tests start (every one binds loopback only; the one port picker of the repository), and the
check that a server the tests would talk to is on loopback."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlparse

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


def is_loopback_url(url: str) -> bool:
    """Whether `url`'s host is `localhost` or a loopback address."""
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
