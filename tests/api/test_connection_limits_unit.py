"""The sans-IO parts of the connection limits: who is admitted, and when a body is too slow."""

from __future__ import annotations

import ipaddress

from api.connections import Admission, BodyPace, ConnectionLedger, ConnectionLimits, ConnectionsFull


def _limits(total: int = 4, per_address: int = 2, proxies: str = "") -> ConnectionLimits:
    return ConnectionLimits(
        head_timeout=10,
        max_head_bytes=65536,
        max_headers=100,
        body_timeout=10,
        body_min_rate=100,
        send_timeout=60,
        max_connections=total,
        max_connections_per_address=per_address,
        max_pipelined=16,
        proxies=tuple(ipaddress.ip_network(p) for p in proxies.split(",") if p),
    )


def test_an_address_gets_its_share_and_others_the_rest() -> None:
    ledger = ConnectionLedger(_limits())
    first = [ledger.admit("192.0.2.1") for _ in range(2)]
    assert all(isinstance(a, Admission) for a in first)
    assert ledger.admit("192.0.2.1") is ConnectionsFull.ADDRESS_FULL
    assert isinstance(ledger.admit("192.0.2.2"), Admission)
    assert isinstance(ledger.admit("192.0.2.3"), Admission)
    assert ledger.admit("192.0.2.4") is ConnectionsFull.FULL
    admitted = first[0]
    assert isinstance(admitted, Admission)
    ledger.release(admitted)
    assert ledger.held_by("192.0.2.1") == 1
    assert isinstance(ledger.admit("192.0.2.1"), Admission)


def test_ipv6_addresses_share_their_64() -> None:
    ledger = ConnectionLedger(_limits())
    assert isinstance(ledger.admit("2001:db8::1"), Admission)
    assert isinstance(ledger.admit("2001:db8::2"), Admission)
    assert ledger.admit("2001:db8::3") is ConnectionsFull.ADDRESS_FULL
    assert isinstance(ledger.admit("2001:db8:0:1::1"), Admission)


def test_a_trusted_proxy_is_held_to_the_total_only() -> None:
    ledger = ConnectionLedger(_limits(proxies="10.0.0.0/8"))
    for _ in range(4):
        assert isinstance(ledger.admit("10.1.2.3"), Admission)
    assert ledger.admit("10.1.2.3") is ConnectionsFull.FULL


def test_a_steady_body_passes_every_window() -> None:
    pace = BodyPace(window=10, min_rate=100, now=0)
    for window in range(1, 6):
        pace.received(1000)
        assert not pace.too_slow(window * 10.0, server_paused=False)


def test_a_body_that_stops_or_drips_fails_its_window_whatever_came_before() -> None:
    pace = BodyPace(window=10, min_rate=100, now=0)
    pace.received(10 * 1024 * 1024)
    assert not pace.too_slow(10, server_paused=False)
    pace.received(999)  # one byte short of 100 B/s over 10 s
    assert pace.too_slow(20, server_paused=False)


def test_a_window_the_server_paused_is_not_judged() -> None:
    pace = BodyPace(window=10, min_rate=100, now=0)
    assert not pace.too_slow(10, server_paused=True)
    assert pace.too_slow(20, server_paused=False)


def test_even_a_zero_rate_needs_a_byte_a_window() -> None:
    pace = BodyPace(window=10, min_rate=0, now=0)
    assert pace.too_slow(10, server_paused=False)
