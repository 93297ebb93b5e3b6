"""Keep webhooks from reaching inside the network (SSRF).

It lives in the ground floor: runners send webhooks too, and so do the api and the tracker.

Two checks. At create, a URL that is not http(s), or whose host is a literal address (in any
spelling the resolver would accept: ``2130706433``, ``0x7f.1``, ``[::ffff:127.0.0.1]``) or an
obviously internal name, is refused. At delivery, ``GuardedResolver`` resolves the host once and
hands aiohttp only permitted addresses, so the address checked is the address connected to:
there is no DNS-rebinding window between check and connect.

Whatever the address, a URL whose path is a route of Cog's runner protocol (``/shutdown``,
``/predictions/<id>/cancel``, a model pool's ``/models/<name>/predictions`` ...) is refused: a
webhook is a POST to a URL someone else chose, and must never drive a runner. So is an endpoint
in ``refused`` (:class:`RefusedEndpoints`: the fleet's runners, kept current by whoever knows
the fleet), at create and again at delivery, where the resolver checks each address it returns.

Refused unless opened by ``allow_cidrs``: private, loopback, link-local (cloud metadata),
CGNAT, multicast, reserved and unspecified addresses, and IPv6 forms that embed one of them
(IPv4-mapped, IPv4-compatible, NAT64, 6to4). ``allow_hosts`` names host names an operator
trusts whatever they resolve to (a runner's director by its service name in a compose network);
the match is exact, so a subdomain or another spelling of the name is checked as usual.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import socket
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_EXTRA_BLOCKED: tuple[Network, ...] = (
    ipaddress.ip_network("100.64.0.0/10"),  # CGNAT (not "private" to Python)
    ipaddress.ip_network("192.0.0.0/24"),
    ipaddress.ip_network("198.18.0.0/15"),
    ipaddress.ip_network("fd00:ec2::254/128"),  # AWS metadata over IPv6
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_INTERNAL_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain", ".home.arpa")


#: Routes of Cog's runner protocol (a runner's, a model pool's per-model ones, Cog's trainings)
#: as a server would route them; a webhook's path never may be one.
_PROTOCOL_PATH = re.compile(
    r"(?:/models/[^/]+)?"
    r"(?:/shutdown|/health-check"
    r"|/(?:predictions|trainings)(?:/[^/]+(?:/cancel)?)?"
    r"|/v1/models/(?:load(?:/[^/]+)?|unload)|/v1/cache/flush|/v1/capabilities)"
)
_SLASHES = re.compile(r"/{2,}")
_DEFAULT_PORTS = {"http": 80, "https": 443}
#: How every loopback spelling is keyed in :class:`RefusedEndpoints`: a runner bound to one
#: loopback address is often reached by another (``localhost``, ``127.0.0.1``, ``::1``).
_LOOPBACK = "loopback"


class BlockedAddress(Exception):
    """A webhook URL or its resolved address is not allowed."""


def protocol_route(url: str) -> str | None:
    """The Cog protocol route ``url``'s path names, as a server would route it (percent
    decoded, dot segments resolved, repeated and trailing slashes dropped, any case); None
    when it names none."""
    try:
        raw = urlsplit(url).path
        routed = URL(url).path
    except ValueError:
        return None
    for path in dict.fromkeys((raw, unquote(raw), routed)):
        normal = posixpath.normpath(_SLASHES.sub("/", "/" + path)).lower().rstrip("/")
        if _PROTOCOL_PATH.fullmatch(normal):
            return normal
    return None


def endpoint_key(host: str, port: int) -> tuple[str, int]:
    """How :class:`RefusedEndpoints` names a host and port: an address in one spelling (every
    loopback address, and ``localhost``, as one), a name lower-cased."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return _LOOPBACK, port
    address = literal_address(name)
    if address is None:
        return name, port
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback or address.is_unspecified:
        return _LOOPBACK, port
    return str(address), port


def url_endpoint(url: str) -> tuple[str, int] | None:
    """:func:`endpoint_key` of a URL's host and port (the scheme's default when it names
    none); None for a URL without both."""
    try:
        parts = urlsplit(url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return endpoint_key(parts.hostname, port)


class RefusedEndpoints:
    """Host-and-port pairs no webhook may reach (the fleet's runners), replaced as a whole by
    :meth:`install` whenever whoever watches them sees them change."""

    def __init__(self, urls: Iterable[str] = ()) -> None:
        self._keys: frozenset[tuple[str, int]] = frozenset()
        self.install(urls)

    def install(self, urls: Iterable[str]) -> None:
        self._keys = frozenset(key for url in urls if (key := url_endpoint(url)) is not None)

    def refuses(self, host: str, port: int) -> bool:
        return endpoint_key(host, port) in self._keys

    def __len__(self) -> int:
        return len(self._keys)


def parse_cidrs(value: str | Iterable[str]) -> tuple[Network, ...]:
    items = value.split(",") if isinstance(value, str) else value
    return tuple(ipaddress.ip_network(item.strip(), strict=False) for item in items if item.strip())


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    packed = address.packed
    if address in _NAT64 or address in _NAT64_LOCAL:
        return ipaddress.IPv4Address(packed[-4:])
    if packed[:12] == bytes(12) and packed[12:] != bytes(4):  # IPv4-compatible ::a.b.c.d
        return ipaddress.IPv4Address(packed[-4:])
    return None


def is_blocked(address: IPAddress, allow: Sequence[Network] = ()) -> bool:
    if any(address.version == net.version and address in net for net in allow):
        return False
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None and is_blocked(inner, allow):
            return True
    if (
        address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or (isinstance(address, ipaddress.IPv6Address) and address.is_site_local)
    ):
        return True
    return any(address.version == net.version and address in net for net in _EXTRA_BLOCKED)


def literal_address(host: str) -> IPAddress | None:
    """The address a host names literally, in any form the C resolver would accept."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        pass
    try:  # inet_aton accepts 2130706433, 0x7f000001, 127.1, 0177.0.0.1 ...
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def normalise_hosts(hosts: Iterable[str]) -> frozenset[str]:
    """Host names as :func:`check_webhook_url` and :class:`GuardedResolver` compare them."""
    return frozenset(host.strip().rstrip(".").lower() for host in hosts if host.strip())


def check_webhook_url(
    url: str,
    allow: Sequence[Network] = (),
    allow_hosts: Iterable[str] = (),
    refused: RefusedEndpoints | None = None,
) -> None:
    """Refuse at create time what can be refused without resolving a name."""
    try:
        parts = urlsplit(url)
        port = parts.port
        # aiohttp connects to yarl's host, which IDNA/UTS-46 maps (``１２７.０.０.１`` becomes
        # ``127.0.0.1``), and skips the resolver for IP literals: check that host too.
        connect_host = URL(url).raw_host or ""
    except ValueError as error:
        raise BlockedAddress(f"not a valid URL: {error}") from error
    if parts.scheme not in ("http", "https"):
        raise BlockedAddress("webhook URLs must use http or https")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise BlockedAddress("webhook URL has no host")
    if port == 0:
        raise BlockedAddress("webhook URL has an invalid port")
    if parts.username or parts.password:
        raise BlockedAddress("webhook URLs must not carry credentials")
    route = protocol_route(url)
    if route is not None:
        raise BlockedAddress(f"webhook path {route} is a route of Cog's runner protocol")
    names = dict.fromkeys((host, connect_host.rstrip(".").lower()))
    effective_port = port or _DEFAULT_PORTS[parts.scheme]
    if refused is not None and any(refused.refuses(name, effective_port) for name in names):
        where = f"[{host}]" if ":" in host else host
        raise BlockedAddress(f"webhook address {where}:{effective_port} is a runner's")
    if names.keys() <= normalise_hosts(allow_hosts):
        return
    for name in names:
        _check_host(name, allow)


def _check_host(host: str, allow: Sequence[Network]) -> None:
    address = literal_address(host)
    if address is not None:
        if is_blocked(address, allow):
            raise BlockedAddress(f"webhook address {address} is not publicly routable")
        return
    if host == "localhost" or host.endswith(_INTERNAL_SUFFIXES) or "." not in host:
        if not allow:
            raise BlockedAddress(f"webhook host {host!r} is internal")


class GuardedResolver(AbstractResolver):
    """Resolves through ``inner`` and returns only permitted addresses (any address of a host
    named in ``allow_hosts``), never one of ``refused`` at the port asked for."""

    def __init__(
        self,
        allow: Sequence[Network] = (),
        inner: AbstractResolver | None = None,
        allow_hosts: Iterable[str] = (),
        refused: RefusedEndpoints | None = None,
    ) -> None:
        self.allow = tuple(allow)
        self.allow_hosts = normalise_hosts(allow_hosts)
        self.inner = inner or DefaultResolver()
        self.refused = refused or RefusedEndpoints()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if self.refused.refuses(host, port):
            raise BlockedAddress(f"{host}:{port} is a runner's")
        trusted = host.rstrip(".").lower() in self.allow_hosts
        literal = None if trusted else literal_address(host)
        if literal is not None:
            results = [_result(host, str(literal), port, literal.version)]
        else:
            results = await self.inner.resolve(host, port, family)
        permitted = [
            r
            for r in results
            if (trusted or not is_blocked(ipaddress.ip_address(r["host"]), self.allow))
            and not self.refused.refuses(r["host"], port)
        ]
        if not permitted:
            raise BlockedAddress(f"{host} resolves only to addresses webhooks may not reach")
        return permitted

    async def close(self) -> None:
        await self.inner.close()


def _result(hostname: str, host: str, port: int, version: int) -> ResolveResult:
    family = socket.AF_INET6 if version == 6 else socket.AF_INET
    result: dict[str, Any] = {
        "hostname": hostname,
        "host": host,
        "port": port,
        "family": family,
        "proto": 0,
        "flags": socket.AI_NUMERICHOST,
    }
    return result  # type: ignore[return-value]
