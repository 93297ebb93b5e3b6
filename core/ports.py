"""Free TCP ports on loopback, for processes a Conduit process starts next to itself."""

from __future__ import annotations

import socket
from typing import Final

LOOPBACK: Final = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """Return a currently unused TCP port on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
