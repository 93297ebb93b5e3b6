"""The api's authentication is no lever, and a stream URL is a capability of its own.

Whether a request queried Postgres for its token is told by Postgres itself: the test holds
``LOCK TABLE api_tokens IN ACCESS EXCLUSIVE MODE``, under which every token lookup waits. A
request answered while the lock is held did not look its token up; one that did shows in
``pg_locks`` as a waiter, and is answered once the lock is released.

The limiter tests run against an api of their own (small budgets, a long cache life, and
127.0.0.2 as its one trusted proxy), so the shared stack's budget is never spent. Requests from
127.0.0.2 name their client with ``X-Forwarded-For``; those from 127.0.0.1 are their own client
whatever they say. The pure parts (token shape, budget arithmetic, signatures, client
addresses, the two caches) are tested first, on clocks and loaders the tests control.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import psycopg
import pytest
import redis
from starlette.requests import Request

from api.auth import client_address
from catalog.records import AccountInfo
from catalog.token_checks import AccountCache, FailureBudget, well_formed
from core.ids import new_api_token
from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, fetch, wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.sse import events
from tests.fixtures.waiting import wait_for
from tracker import keys
from tracker.stream_urls import DEFAULT_TTL, Signature, StreamSigner

pytestmark = pytest.mark.e2e

MODEL_PATH = f"/v1/models/{ECHO}/predictions"
#: A liveness deadline for requests that must not wait on the database.
PROMPT = 30.0


# --- pure parts --------------------------------------------------------------------------


def test_token_shape_is_exactly_what_new_tokens_look_like() -> None:
    assert all(well_formed(new_api_token()) for _ in range(200))
    token = new_api_token()
    for bad in (
        token[:-1],
        token + "A",
        "r9_" + token[3:],
        "R8_" + token[3:],
        token[:10] + "=" + token[11:],
        token[:10] + "." + token[11:],
        token[:10] + "é" + token[11:],
        "",
        "r8_",
    ):
        assert not well_formed(bad), bad


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_failure_budget_allows_a_burst_then_one_per_refill() -> None:
    clock = Clock()
    budget = FailureBudget(per_minute=6, burst=3, clock=clock)
    for _ in range(3):
        assert budget.retry_after("a") is None
        budget.spend("a")
    assert budget.retry_after("a") == 10  # 6/min: one failure every 10 s
    assert budget.retry_after("b") is None  # addresses are apart
    for _ in range(50):  # refusals meanwhile do not push the wait further out
        budget.spend("a")
    assert budget.retry_after("a") == 10
    clock.now += 10
    assert budget.retry_after("a") is None
    budget.spend("a")
    assert budget.retry_after("a") == 10


def test_failure_budget_forgets_the_least_recently_failing_addresses() -> None:
    budget = FailureBudget(per_minute=1, burst=1, max_addresses=2, clock=Clock())
    for address in ("a", "b", "c"):
        budget.spend(address)
    assert budget.retry_after("a") is None  # forgotten: a fresh burst
    assert budget.retry_after("b") is not None and budget.retry_after("c") is not None


def _request(host: str) -> Request:
    return Request({"type": "http", "client": (host, 5555), "headers": []})


def test_client_address_counts_ipv6_per_64() -> None:
    assert client_address(_request("192.0.2.7")) == "192.0.2.7"
    assert client_address(_request("2001:db8:1:2:aaaa::1")) == "2001:db8:1:2::/64"
    assert client_address(_request("2001:db8:1:2:bbbb::9")) == "2001:db8:1:2::/64"
    assert client_address(_request("::ffff:192.0.2.7")) == "192.0.2.7"


def test_signatures_name_one_prediction_and_expire() -> None:
    clock = Clock()
    signer = StreamSigner(ttl=3600, key=b"k" * 32, clock=clock)
    query = parse_qs(signer.query("p1") or "")
    exp, sig = query["exp"][0], query["sig"][0]
    assert int(exp) == clock.now + 3600
    assert signer.verify("p1", exp, sig) is Signature.VALID
    assert signer.verify("p2", exp, sig) is Signature.FORGED
    assert signer.verify("p1", str(int(exp) + 1), sig) is Signature.FORGED
    assert signer.verify("p1", exp, ("A" if sig[0] != "A" else "B") + sig[1:]) is Signature.FORGED
    assert signer.verify("p1", exp, None) is Signature.FORGED
    assert signer.verify("p1", "soon", sig) is Signature.FORGED
    assert StreamSigner(key=b"x" * 32, clock=clock).verify("p1", exp, sig) is Signature.FORGED
    clock.now += 3600
    assert signer.verify("p1", exp, sig) is Signature.EXPIRED
    assert StreamSigner().query("p1") is None  # no key yet: the plain URL


def test_a_signer_keeps_accepting_keys_it_knew() -> None:
    old = StreamSigner(key=b"o" * 32)
    signer = StreamSigner(key=b"o" * 32)
    signer.adopt(b"n" * 32)
    by_old = parse_qs(old.query("p") or "")
    by_new = parse_qs(signer.query("p") or "")
    assert signer.verify("p", by_old["exp"][0], by_old["sig"][0]) is Signature.VALID
    assert old.verify("p", by_new["exp"][0], by_new["sig"][0]) is Signature.FORGED


async def test_unknown_tokens_never_evict_known_ones() -> None:
    account = AccountInfo(id=1, name="a", active=True, webhook_secret="whsec_x")
    valid = new_api_token()
    asked: list[str] = []

    async def load(token: str) -> AccountInfo | None:
        asked.append(token)
        return account if token == valid else None

    cache = AccountCache(load, ttl=300, max_unknown=4, max_known=4)
    assert await cache.lookup(valid) == account
    flood = [new_api_token() for _ in range(100)]
    for token in flood:
        assert await cache.lookup(token) is None
    assert cache.known(valid) == account
    assert [cache.unknown(t) for t in flood[-5:]] == [False, True, True, True, True]
    # Concurrent lookups of one token share one query.
    fresh = new_api_token()
    await asyncio.gather(*(cache.lookup(fresh) for _ in range(10)))
    assert asked.count(fresh) == 1


# --- live: no query for what cannot be a token, and a bounded, separate negative cache ----


@pytest.fixture(scope="module")
def guarded(launcher: Launcher) -> Iterator[str]:
    """An api with small auth budgets, a long cache life, and 127.0.0.2 as trusted proxy."""
    proc, url = launcher.api(
        env={
            "CONDUIT_API_CACHE_TTL": "600",
            "CONDUIT_API_UNKNOWN_TOKENS_CACHED": "4",
            "CONDUIT_API_AUTH_FAILURE_BURST": "5",
            "CONDUIT_API_AUTH_FAILURES_PER_MINUTE": "1",
            "CONDUIT_API_TRUSTED_PROXIES": "127.0.0.2",
        }
    )
    yield url
    proc.stop()


@pytest.fixture
def via_proxy(guarded: str) -> Iterator[httpx.Client]:
    """A client of the guarded api whose connections come from its trusted proxy."""
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=guarded, transport=transport, timeout=PROMPT) as client:
        yield client


def _as(token: str, address: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token}"}
    if address:
        headers["X-Forwarded-For"] = address
    return headers


def _address() -> str:
    """A client address of its own (a header value only: nothing is sent there)."""
    n = uuid.uuid4().int
    return f"10.{n % 250}.{(n >> 8) % 250}.{(n >> 16) % 250 + 1}"


def _waiters(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
            "WHERE c.relname = 'api_tokens' AND NOT l.granted"
        ).fetchone()
    assert row is not None
    return int(row[0])


@contextmanager
def tokens_locked(database_url: str) -> Iterator[None]:
    """Every token lookup waits while this is held (see the module's docstring)."""
    with psycopg.connect(database_url) as conn:
        conn.execute("LOCK TABLE api_tokens IN ACCESS EXCLUSIVE MODE")
        yield
        conn.rollback()


def _queries_for(
    database_url: str, client: httpx.Client, headers: dict[str, str]
) -> httpx.Response:
    """The answer to a request that must look its token up: it is seen waiting on the lock."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with tokens_locked(database_url):
            pending = pool.submit(client.get, "/v1/predictions", headers=headers)
            wait_for(lambda: _waiters(database_url) > 0, "the token lookup waiting on the lock")
            assert not pending.done()
        return pending.result()


def test_malformed_tokens_are_refused_without_a_query(
    via_proxy: httpx.Client, database_url: str
) -> None:
    malformed = [
        "nope",
        new_api_token() + "x",
        new_api_token()[:-1],
        "r8_" + "=" * 40,
        "sk_" + new_api_token()[3:],
    ]
    with tokens_locked(database_url):
        for token in malformed:
            response = via_proxy.get("/v1/predictions", headers=_as(token, _address()))
            assert_problem(response, 401)
        assert _waiters(database_url) == 0
    # The control: a well-formed unknown token is looked up, and refused once it is.
    answer = _queries_for(database_url, via_proxy, _as(new_api_token(), _address()))
    assert_problem(answer, 401)


def test_a_flood_of_unknown_tokens_does_not_evict_a_valid_one(
    via_proxy: httpx.Client, database_url: str, admin: Admin
) -> None:
    valid = admin.create_account(f"flood-{uuid.uuid4().hex[:8]}")
    assert via_proxy.get("/v1/predictions", headers=_as(valid, _address())).status_code == 200
    flood = [new_api_token() for _ in range(40)]
    for token in flood:  # each from its own address: no budget runs out
        assert_problem(via_proxy.get("/v1/predictions", headers=_as(token, _address())), 401)

    with tokens_locked(database_url):
        # Served from memory while the table is locked: the flood did not push it out.
        ok = via_proxy.get("/v1/predictions", headers=_as(valid, _address()))
        assert ok.status_code == 200, ok.text
        # The latest unknown tokens are refused from memory too ...
        assert_problem(via_proxy.get("/v1/predictions", headers=_as(flood[-1], _address())), 401)
        assert _waiters(database_url) == 0
    # ... while the earliest were forgotten (the negative cache holds 4): asked again.
    assert_problem(_queries_for(database_url, via_proxy, _as(flood[0], _address())), 401)


# --- live: failures are budgeted per client address ----------------------------------------


def test_failures_from_one_address_get_429_and_a_valid_token_still_works(
    guarded: str, database_url: str, admin: Admin
) -> None:
    valid = admin.create_account(f"limited-{uuid.uuid4().hex[:8]}")
    with httpx.Client(base_url=guarded, timeout=PROMPT) as direct:  # peer 127.0.0.1
        assert direct.get("/v1/predictions", headers=_as(valid)).status_code == 200
        refused = [
            direct.get("/v1/predictions", headers=_as(new_api_token(), _address()))
            for _ in range(5)
        ]
        assert [r.status_code for r in refused] == [401] * 5
        # X-Forwarded-For from an untrusted peer changes nothing: the budget is 127.0.0.1's.
        limited = direct.get("/v1/predictions", headers=_as(new_api_token(), _address()))
        body = assert_problem(limited, 429)
        assert body["code"] == "rate_limited"
        assert int(limited.headers["retry-after"]) >= 1

        with tokens_locked(database_url):
            # Decided before any query: an unknown token is not even looked up ...
            assert_problem(direct.get("/v1/predictions", headers=_as(new_api_token())), 429)
            # ... and a token this api has verified is never refused for its address.
            ok = direct.get("/v1/predictions", headers=_as(valid))
            assert ok.status_code == 200, ok.text
            assert _waiters(database_url) == 0


def test_a_trusted_proxy_names_the_client(via_proxy: httpx.Client) -> None:
    one, other = _address(), _address()
    statuses = [
        via_proxy.get("/v1/predictions", headers=_as(new_api_token(), one)).status_code
        for _ in range(6)
    ]
    assert statuses == [401] * 5 + [429]
    # Another client behind the same proxy has its own budget.
    assert_problem(via_proxy.get("/v1/predictions", headers=_as(new_api_token(), other)), 401)


# --- live: stream URLs are capabilities ----------------------------------------------------


@pytest.fixture
def finished(client: httpx.Client) -> dict[str, Any]:
    created = create(client, MODEL_PATH, input={"prompt": "cap", "n": 3})
    wait_status(client, created["id"])
    return fetch(client, created["id"])


def _stream(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """The stream's answer, its body read (a refusal's, or the whole replayed stream)."""
    with httpx.stream("GET", url, headers=headers or {}, timeout=PROMPT) as response:
        response.read()
    return response


def _outputs(url: str, headers: dict[str, str] | None = None) -> list[str]:
    with httpx.stream("GET", url, headers=headers or {}, timeout=PROMPT) as response:
        assert response.status_code == 200, response.read()
        return [e.data for e in events(response) if e.event == "output"]


def _with(url: str, **query: str) -> str:
    parts = urlsplit(url)
    params = {k: v[0] for k, v in parse_qs(parts.query).items()} | query
    return parts._replace(query="&".join(f"{k}={v}" for k, v in params.items())).geturl()


def test_the_signed_stream_url_works_without_a_bearer(finished: dict[str, Any]) -> None:
    url = finished["urls"]["stream"]
    assert set(parse_qs(urlsplit(url).query)) == {"exp", "sig"}
    assert _outputs(url) == ["cap-0", "cap-1", "cap-2"]


def test_a_fetch_renders_a_fresh_stream_url(client: httpx.Client) -> None:
    created = create(client, MODEL_PATH, input={"prompt": "fresh"})
    before = int(time.time())
    fetched = fetch(client, created["id"])
    exp = int(parse_qs(urlsplit(fetched["urls"]["stream"]).query)["exp"][0])
    assert exp >= before + DEFAULT_TTL
    first = int(parse_qs(urlsplit(created["urls"]["stream"]).query)["exp"][0])
    assert exp >= first


def test_tampered_and_borrowed_signatures_are_401(
    client: httpx.Client, finished: dict[str, Any]
) -> None:
    url = finished["urls"]["stream"]
    sig = parse_qs(urlsplit(url).query)["sig"][0]
    other = create(client, MODEL_PATH, input={"prompt": "other"})
    borrowed = other["urls"]["stream"].replace(other["id"], finished["id"])
    exp = parse_qs(urlsplit(url).query)["exp"][0]
    for refused in (
        _with(url, sig=("A" if sig[0] != "A" else "B") + sig[1:]),
        _with(url, exp=str(int(exp) + 3600)),  # a longer life is not for the taking
        borrowed,  # another prediction's signature
        url.split("&sig=")[0],  # no signature
        url.split("?")[0],  # the plain URL, and no bearer
    ):
        body = assert_problem(_stream(refused), 401)
        assert body.get("code") in ("invalid_signature", None), refused
    assert assert_problem(_stream(_with(url, sig="x" * 43)), 401)["code"] == "invalid_signature"


def test_an_expired_signature_is_403(
    finished: dict[str, Any], redis_url: str, stack: Stack
) -> None:
    # Signed with the very key the stack uses (made in Redis at its start), an hour ago.
    with redis.Redis.from_url(redis_url) as r:
        stored = r.get(keys.STREAM_SIGNING_KEY)
    assert isinstance(stored, bytes)
    past = StreamSigner(ttl=60, key=base64.b64decode(stored), clock=lambda: time.time() - 3600)
    root = finished["urls"]["stream"].split("?")[0]
    body = assert_problem(_stream(f"{root}?{past.query(finished['id'])}"), 403)
    assert body["code"] == "expired_signature"


def test_a_bearer_token_decides_when_the_signature_does_not(
    client: httpx.Client, finished: dict[str, Any], admin: Admin, stack: Stack
) -> None:
    url = finished["urls"]["stream"]
    tampered = _with(url, sig="x" * 43)
    owner = dict(client.headers)
    assert _outputs(tampered, owner) == ["cap-0", "cap-1", "cap-2"]
    assert _outputs(url.split("?")[0], owner) == ["cap-0", "cap-1", "cap-2"]
    stranger = _as(admin.create_account(f"stranger-{uuid.uuid4().hex[:8]}"))
    assert_problem(_stream(tampered, stranger), 404)
    # A valid signature is enough whoever asks.
    assert _outputs(url, stranger) == ["cap-0", "cap-1", "cap-2"]
