"""The SSRF guard (``core.ssrf``): address classification,
URL checks, host names allowed by name, the resolver, and zero real connections."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.test_utils import TestServer

from core.ssrf import (
    BlockedAddress,
    GuardedResolver,
    check_webhook_url,
    is_blocked,
    literal_address,
    parse_cidrs,
)
from tracker.webhooks import DeliveryFailed, WebhookPolicy, open_session, post

SECRET = "whsec_" + "A" * 44
LOOPBACK = parse_cidrs("127.0.0.0/8")

BLOCKED_ADDRESSES = [
    "127.0.0.1",
    "127.1.2.3",
    "::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "64:ff9b::7f00:1",  # NAT64 of loopback
    "2002:7f00:1::",  # 6to4 of loopback
    "169.254.169.254",
    "fd00:ec2::254",
    "10.0.0.1",
    "172.16.0.1",
    "192.168.1.1",
    "100.64.0.1",
    "0.0.0.0",
    "::",
    "224.0.0.1",
    "fe80::1",
    "fc00::1",
]
ALLOWED_ADDRESSES = ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"]

BLOCKED_URLS = [
    "http://127.0.0.1:8080/x",
    "http://localhost/x",
    "http://foo.localhost/",
    "http://[::1]:9/",
    "http://[::ffff:127.0.0.1]/",
    "http://2130706433/",
    "http://0x7f000001/",
    "http://127.1/",
    "http://0177.0.0.1/",
    "http://169.254.169.254/latest/meta-data",
    "http://10.0.0.1/",
    "http://100.64.0.1/",
    "http://0.0.0.0:80/",
    "ftp://example.com/",
    "file:///etc/passwd",
    "http://user:pw@example.com/",
    # yarl maps these to 127.0.0.1 (IDNA/UTS-46) and aiohttp then skips the resolver.
    "http://\uff11\uff12\uff17.\uff10.\uff10.\uff11/",
    "http://\u2460\u2461\u2466.0.0.1/",
]
ALLOWED_URLS = ["https://example.com/hook", "http://hooks.example.org:8443/a"]


@pytest.mark.parametrize("address", BLOCKED_ADDRESSES)
def test_internal_addresses_are_blocked(address: str) -> None:
    assert is_blocked(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ALLOWED_ADDRESSES)
def test_public_addresses_are_allowed(address: str) -> None:
    assert not is_blocked(ipaddress.ip_address(address))


def test_allow_opens_only_the_listed_ranges() -> None:
    assert not is_blocked(ipaddress.ip_address("127.0.0.1"), LOOPBACK)
    assert is_blocked(ipaddress.ip_address("10.0.0.1"), LOOPBACK)
    check_webhook_url("http://127.0.0.1:8080/x", LOOPBACK)
    with pytest.raises(BlockedAddress):
        check_webhook_url("http://10.0.0.1/", LOOPBACK)


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1"),
        ("fe80::1%eth0", "fe80::1"),
        ("example.com", None),
    ],
)
def test_literal_address_reads_every_spelling(host: str, address: str | None) -> None:
    expected = ipaddress.ip_address(address) if address else None
    assert literal_address(host) == expected


@pytest.mark.parametrize("url", BLOCKED_URLS)
def test_check_webhook_url_refuses(url: str) -> None:
    with pytest.raises(BlockedAddress):
        check_webhook_url(url)


@pytest.mark.parametrize("url", ALLOWED_URLS)
def test_check_webhook_url_accepts(url: str) -> None:
    check_webhook_url(url)


def test_allowed_host_names_pass_by_exact_name_only() -> None:
    hosts = ["director-echo"]
    check_webhook_url("http://director-echo:5001/runner/x", allow_hosts=hosts)
    check_webhook_url("http://DIRECTOR-ECHO.:5001/", allow_hosts=hosts)
    for url in ("http://other-host/", "http://director-echo.local/", "http://127.0.0.1/"):
        with pytest.raises(BlockedAddress):
            check_webhook_url(url, allow_hosts=hosts)
    with pytest.raises(BlockedAddress):  # the name does not waive the other checks
        check_webhook_url("ftp://director-echo/", allow_hosts=hosts)


class FakeResolver(AbstractResolver):
    """Answers every name with chosen addresses and records what it was asked."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = addresses
        self.asked: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.asked.append(host)
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                "proto": 0,
                "flags": 0,
            }
            for address in self.addresses
        ]

    async def close(self) -> None:
        pass


async def test_resolver_refuses_a_name_that_resolves_only_inside() -> None:
    inner = FakeResolver("127.0.0.1")
    with pytest.raises(BlockedAddress):
        await GuardedResolver(inner=inner).resolve("rebind.example.com", 80)
    assert inner.asked == ["rebind.example.com"]


async def test_resolver_returns_only_permitted_addresses() -> None:
    inner = FakeResolver("10.0.0.5", "93.184.216.34", "::1")
    results = await GuardedResolver(inner=inner).resolve("mixed.example.com", 443)
    assert [r["host"] for r in results] == ["93.184.216.34"]
    assert results[0]["port"] == 443


async def test_resolver_allow_opens_a_range() -> None:
    inner = FakeResolver("127.0.0.1", "10.0.0.5")
    results = await GuardedResolver(LOOPBACK, inner=inner).resolve("dev.example.com", 80)
    assert [r["host"] for r in results] == ["127.0.0.1"]


async def test_resolver_lets_an_allowed_host_reach_its_internal_address() -> None:
    inner = FakeResolver("172.18.0.5")
    resolver = GuardedResolver(inner=inner, allow_hosts=["director-echo"])
    results = await resolver.resolve("director-echo", 5001)
    assert [r["host"] for r in results] == ["172.18.0.5"]
    with pytest.raises(BlockedAddress):
        await resolver.resolve("director-echo.example.com", 5001)


async def test_resolver_classifies_literals_without_asking_inner() -> None:
    inner = FakeResolver("93.184.216.34")
    resolver = GuardedResolver(inner=inner)
    with pytest.raises(BlockedAddress):
        await resolver.resolve("2130706433", 80)
    results = await resolver.resolve("8.8.8.8", 80)
    assert [r["host"] for r in results] == ["8.8.8.8"]
    assert inner.asked == []


@dataclass
class Receiver:
    url: str
    requests: list[str] = field(default_factory=list)


@asynccontextmanager
async def receiver(
    respond: Callable[[], web.StreamResponse] = lambda: web.Response(text="ok"),
) -> AsyncIterator[Receiver]:
    """A real aiohttp server on 127.0.0.1 that counts the requests it is sent."""
    app = web.Application()
    server = TestServer(app, host="127.0.0.1", port=0)
    target = Receiver("")

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        target.requests.append(request.path)
        return respond()

    app.router.add_route("*", "/{tail:.*}", handle)
    await server.start_server()
    target.url = f"http://127.0.0.1:{server.port}"
    try:
        yield target
    finally:
        await server.close()


@pytest.mark.parametrize(
    "template",
    [
        "http://127.0.0.1:{port}/",
        "http://localhost:{port}/",
        "http://[::ffff:127.0.0.1]:{port}/",
        "http://2130706433:{port}/",
        "http://0x7f.1:{port}/",
        "http://\uff11\uff12\uff17.\uff10.\uff10.\uff11:{port}/",
        "http://\u2460\u2461\u2466.0.0.1:{port}/",
    ],
)
async def test_default_policy_never_connects_to_loopback(template: str) -> None:
    policy = WebhookPolicy()
    async with receiver() as target, open_session(policy) as session:
        url = template.format(port=target.url.rsplit(":", 1)[1])
        with pytest.raises(DeliveryFailed) as failure:
            await post(session, policy, url, "msg_1", SECRET, "{}")
        assert failure.value.status is None
        assert target.requests == []


async def test_resolver_blocks_a_name_the_url_check_lets_through() -> None:
    # Any allow list lets "localhost" past the name check; the resolver still refuses 127.0.0.1.
    policy = WebhookPolicy(allow=parse_cidrs("192.0.2.0/24"))
    async with receiver() as target, open_session(policy) as session:
        url = target.url.replace("127.0.0.1", "localhost") + "/"
        with pytest.raises(DeliveryFailed, match="resolves only to"):
            await post(session, policy, url, "msg_1", SECRET, "{}")
        assert target.requests == []


async def test_allowed_name_connects_through_the_resolver() -> None:
    policy = WebhookPolicy(allow=LOOPBACK)
    async with receiver() as target, open_session(policy) as session:
        url = target.url.replace("127.0.0.1", "localhost") + "/hook"
        assert await post(session, policy, url, "msg_1", SECRET, "{}") == 200
        assert target.requests == ["/hook"]


async def test_redirects_are_not_followed() -> None:
    policy = WebhookPolicy(allow=LOOPBACK)
    async with receiver() as inside:
        location = inside.url + "/secret"

        def redirect() -> web.StreamResponse:
            return web.Response(status=302, headers={"Location": location})

        async with receiver(redirect) as outside, open_session(policy) as session:
            with pytest.raises(DeliveryFailed) as failure:
                await post(session, policy, outside.url + "/hook", "msg_1", SECRET, "{}")
            assert failure.value.status == 302
            assert outside.requests == ["/hook"]
        assert inside.requests == []
