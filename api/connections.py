"""What a client connection may hold of the api process, and for how long: the sans-IO part.

An HTTP server that waits for whatever a client sends can be held by clients that send
nothing, or almost nothing: sockets that stay silent, heads that never end, bodies that stop
or drip, answers nobody reads. Each is cheap for the client and costs the server a socket, a
buffer or a request's memory. The limits here bound each of them:

- **Connections**: at most ``max_connections`` at once, and ``max_connections_per_address`` of
  them from one client address (an IPv6 client counts per /64), so one address cannot take
  them all; trusted proxies are held to the overall cap only (every client behind them shares
  their address). Past either, a connection is answered 503 and closed at once.
- **Head**: a request's head (request line and headers) must arrive within ``head_timeout``
  seconds of the connection opening or of its first byte, be at most ``max_head_bytes`` long
  and hold at most ``max_headers`` fields.
- **Body**: once the head is read, each window of ``body_timeout`` seconds must bring at least
  ``body_min_rate`` bytes a second of body (a body that stalls or drips is ended); a window in
  which the server itself stopped reading does not count.
- **Answers**: a connection whose answers are not read for ``send_timeout`` seconds is dropped,
  and at most ``max_pipelined`` requests wait behind the one being answered before the server
  stops reading the socket.

:class:`ConnectionLedger` counts connections and :class:`BodyPace` judges a body's pace; the
protocol that applies them to sockets is :mod:`api.http_protocol`.
"""

from __future__ import annotations

import ipaddress
import logging
import resource
from collections import Counter
from dataclasses import dataclass
from enum import Enum

from api.settings import ApiSettings
from catalog.token_checks import address_key

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: File descriptors kept for what is not a client connection: database and Redis pools, the
#: listening sockets, log files, the metrics listener, webhooks.
RESERVED_DESCRIPTORS = 256


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    head_timeout: float
    max_head_bytes: int
    max_headers: int
    body_timeout: float
    body_min_rate: float
    send_timeout: float
    max_connections: int
    max_connections_per_address: int
    max_pipelined: int
    #: Peers held to the overall cap only: the trusted proxies.
    proxies: tuple[Network, ...] = ()
    #: Every peer is a trusted proxy (``trusted_proxies = *``): no per-address share.
    all_proxies: bool = False

    @classmethod
    def from_settings(cls, settings: ApiSettings) -> ConnectionLimits:
        entries = [p.strip() for p in settings.trusted_proxies.split(",") if p.strip()]
        proxies = []
        for entry in entries:
            try:
                proxies.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                continue  # "*" or a socket path: not an address of a peer
        reserve = RESERVED_DESCRIPTORS + settings.db_pool_size * 2 + settings.redis_pool_size
        return cls(
            head_timeout=settings.head_timeout,
            max_head_bytes=settings.max_head_bytes,
            max_headers=settings.max_headers,
            body_timeout=settings.body_timeout,
            body_min_rate=settings.body_min_rate,
            send_timeout=settings.send_timeout,
            max_connections=fit_to_descriptors(settings.max_connections, reserve),
            max_connections_per_address=settings.max_connections_per_address,
            max_pipelined=settings.max_pipelined,
            proxies=tuple(proxies),
            all_proxies="*" in entries,
        )

    def is_proxy(self, host: str) -> bool:
        if self.all_proxies:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.proxies)


def fit_to_descriptors(wanted: int, reserve: int) -> int:
    """``wanted`` connections, or fewer when the process may not open that many files: a
    connection refused with a 503 is better than an accept that fails for want of one."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or wanted + reserve <= soft:
        return wanted
    fitted = max(1, soft - reserve)
    log.warning(
        "max_connections %d lowered to %d: the process may open %d files (ulimit -n)",
        wanted,
        fitted,
        soft,
    )
    return fitted


class ConnectionsFull(Enum):
    """Why a connection was not admitted."""

    FULL = "The server holds as many connections as it may; retry shortly."
    ADDRESS_FULL = "Your address holds as many connections as one address may; retry shortly."


@dataclass(frozen=True, slots=True)
class Admission:
    """A connection admitted under ``key`` (None: it counts only towards the overall cap)."""

    key: str | None


class ConnectionLedger:
    """Open connections, overall and per client address (one per server process)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open = 0
        self._per_address: Counter[str] = Counter()

    def admit(self, host: str) -> Admission | ConnectionsFull:
        if self.open >= self.limits.max_connections:
            return ConnectionsFull.FULL
        key = None if self.limits.is_proxy(host) else address_key(host)
        if key is not None:
            if self._per_address[key] >= self.limits.max_connections_per_address:
                return ConnectionsFull.ADDRESS_FULL
            self._per_address[key] += 1
        self.open += 1
        return Admission(key)

    def release(self, admission: Admission) -> None:
        self.open -= 1
        if admission.key is not None:
            self._per_address[admission.key] -= 1
            if self._per_address[admission.key] <= 0:
                del self._per_address[admission.key]

    def held_by(self, host: str) -> int:
        return self._per_address.get(address_key(host), 0)


class BodyPace:
    """Whether a request body arrives fast enough, judged one window at a time.

    Each window of ``window`` seconds must bring ``min_rate * window`` bytes (and at least
    one): a body that stops is ended within one window, and so is one that drips a byte now
    and then, whatever it sent before. A window during which the server stopped reading (its
    application had not taken what came) proves nothing about the client and is not judged.
    """

    def __init__(self, window: float, min_rate: float, now: float) -> None:
        self.window = window
        self.needed = max(1, int(min_rate * window))
        self._started = now
        self._bytes = 0

    def received(self, size: int) -> None:
        self._bytes += size

    def too_slow(self, now: float, server_paused: bool) -> bool:
        """Judge the window that ends ``now`` and start the next one."""
        slow = not server_paused and now - self._started >= self.window
        slow = slow and self._bytes < self.needed
        self._started, self._bytes = now, 0
        return slow
