"""Generated requests against a live api and director: hostile bodies and headers never get a
5xx while Postgres and Redis are up.

Every answer is 2xx or a 4xx problem+json; a 4xx stores nothing (rows of the account are
counted in Postgres before and after); every 201 reaches a terminal state; and the account's
GET and list stay 200 throughout. Derandomized, with a bounded number of examples.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import TERMINAL
from tests.fixtures.waiting import wait_for

PATHS = [f"/v1/deployments/{ECHO}/predictions", f"/v1/models/{ECHO}/predictions"]

# Text as a hostile client sends it: NUL, lone surrogates, non-BMP, controls, plain.
SPECIAL_TEXT = ["", "x\x00y", "\x00", "\ud800", "a\udfffb", "\U0001f600", "\u2028", "\\u0000"]
texts = st.one_of(st.sampled_from(SPECIAL_TEXT), st.text(max_size=12))
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e20, 1.7976931348623157e308, 5e-324, -0.0]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)),
    max_leaves=12,
)
# The echo model's own fields keep values that finish at once.
echo_fields = st.fixed_dictionaries(
    {},
    optional={
        "prompt": st.one_of(texts, numbers),
        # Not a huge integral float: JSON Schema counts 1e300 as an integer, and the echo
        # model would yield for ever.
        "n": st.one_of(
            st.integers(min_value=-2, max_value=3), st.sampled_from([1.5, 2**64, 2**70, "x"])
        ),
        "delay": st.sampled_from([0, 0.0, -1, "x", None]),
        "fail": st.one_of(st.booleans(), texts),
    },
)
inputs = st.one_of(
    st.builds(
        lambda extra, echo: {**extra, **echo},
        st.dictionaries(texts, values, max_size=3),
        echo_fields,
    ),
    values,  # not an object at all, mostly
)
bodies = st.fixed_dictionaries(
    {"input": inputs},
    optional={
        "webhook": st.one_of(texts, st.just("http://127.0.0.1:9/hook"), values),
        "webhook_events_filter": st.one_of(
            st.lists(st.sampled_from(["start", "output", "logs", "completed", "x"])), values
        ),
        "stream": values,
        "version": st.one_of(texts, st.just(ECHO)),
    },
)
# Header values as HTTP allows them to be sent: visible ASCII, no surrounding whitespace.
# What a well-behaved client sends, with the numbers at the edges of what may be stored.
storable_text = st.text(max_size=12).filter(lambda text: "\x00" not in text)
storable = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**64 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        storable_text,
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(storable_text, inner, max_size=3)
    ),
    max_leaves=8,
)
valid_bodies = st.fixed_dictionaries(
    {
        "input": st.fixed_dictionaries(
            {},
            optional={
                "prompt": storable_text,
                "n": st.integers(min_value=1, max_value=3),
                "fail": st.booleans(),
                "extra": storable,
            },
        )
    },
    optional={"webhook_events_filter": st.lists(st.sampled_from(["start", "completed"]))},
)
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20).map(
    str.strip
)
valid_headers = st.fixed_dictionaries(
    {},
    optional={
        "Prefer": st.sampled_from(["wait=1", "wait=5"]),
        "Cancel-After": st.sampled_from(["1m", "30s"]),
        "Idempotency-Key": st.sampled_from(["same-1", "same-2", "same-3"]),
        "X-Priority": st.sampled_from(["low", "normal", "high"]),
    },
)
hostile_headers = st.fixed_dictionaries(
    {},
    optional={
        "Prefer": st.one_of(
            st.sampled_from(["wait", "wait=1", "wait=0", "wait=61", "wait=x", "respond-async"]),
            header_text,
        ),
        "Cancel-After": st.one_of(
            st.sampled_from(["1s", "500ms", "5m", "0s", "-1s", "8d", "1h30m", "x"]), header_text
        ),
        "Idempotency-Key": st.one_of(st.sampled_from(["k1", "k2", "a b"]), header_text),
        "X-Priority": st.one_of(st.sampled_from(["low", "normal", "high", "urgent"]), header_text),
    },
)
headers = st.one_of(valid_headers, hostile_headers)
raw_bodies = st.one_of(
    st.builds(lambda body: json.dumps(body).encode(), valid_bodies),
    st.builds(lambda body: json.dumps(body, allow_nan=True).encode(), bodies),
    st.sampled_from(
        [
            b"",
            b"{",
            b"null",
            b"[]",
            b'{"input": {"a": 1e999}}',
            b'{"input": {"a": NaN}}',
            b'{"input": {"\\ud800": 1}}',
            b'{"input": ' + b"[" * 5000 + b"]" * 5000 + b"}",
            b'{"input": {}, "input": 1}',
            b"\xff\xfe",
        ]
    ),
)
reads = st.one_of(
    st.tuples(st.just("list"), st.one_of(st.none(), texts, header_text)),
    st.tuples(st.just("get"), st.one_of(texts, header_text).filter(bool)),
    st.tuples(st.just("stream"), header_text),
)


@pytest.fixture(scope="module")
def account(admin: Admin) -> tuple[str, str]:
    name = f"prop-{uuid.uuid4().hex[:10]}"
    return name, admin.create_account(name)


@pytest.fixture(scope="module")
def http(stack: Stack, account: tuple[str, str]) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {account[1]}"}
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=90) as client:
        yield client


@pytest.fixture(scope="module")
def db(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        yield conn


class Rows:
    def __init__(self, db: psycopg.Connection[Any], account: str) -> None:
        self.db, self.account = db, account

    def count(self) -> int:
        row = self.db.execute(
            "SELECT count(*) FROM predictions p JOIN accounts a ON a.id = p.account_id "
            "WHERE a.name = %s",
            (self.account,),
        ).fetchone()
        assert row is not None
        return int(row[0])


def _check_answer(response: httpx.Response) -> None:
    status = response.status_code
    if status in (307, 308) and response.request.method == "GET":
        return  # a path ending in "/" (an id with an encoded slash): redirected, as routed
    assert 200 <= status < 300 or 400 <= status < 500, (status, response.text[:500])
    if status >= 400:
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["status"] == status


def _quote(value: str) -> str:
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


def test_generated_requests_never_get_a_5xx(
    http: httpx.Client, db: psycopg.Connection[Any], account: tuple[str, str]
) -> None:
    rows = Rows(db, account[0])
    created: list[str] = []

    @settings(
        max_examples=300,
        derandomize=True,
        deadline=None,
        database=None,
        # No shrinking: a failure is reported as generated, within the test's time.
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(path=st.sampled_from(PATHS), body=raw_bodies, sent=headers, read=reads)
    def one_request(
        path: str, body: bytes, sent: dict[str, str], read: tuple[str, str | None]
    ) -> None:
        note(f"POST {path} {body[:300]!r} {sent!r}; then {read!r}")
        if b'"version"' in body:
            path = "/v1/predictions"
        before = rows.count()
        response = http.post(
            path, content=body, headers={**sent, "Content-Type": "application/json"}
        )
        _check_answer(response)
        stored = rows.count() - before
        if response.status_code == 201:
            replayed = response.headers.get("idempotent-replayed") == "true"
            assert stored == (0 if replayed else 1), response.text[:300]
            created.append(response.json()["id"])
        else:
            assert stored == 0, (response.status_code, response.text[:300])
        _read(http, read, created)
        assert http.get("/v1/predictions").status_code == 200
        if created:
            assert http.get(f"/v1/predictions/{created[-1]}").status_code == 200

    one_request()
    assert created, "no generated request was accepted"
    _all_terminal(http, created)


def _read(http: httpx.Client, read: tuple[str, str | None], created: list[str]) -> None:
    kind, value = read
    if kind == "list":
        query = "" if value is None else "?cursor=" + _quote(value)
        _check_answer(http.get("/v1/predictions" + query))
    elif kind == "get":
        _check_answer(http.get(f"/v1/predictions/{_quote(value or '')}"))
    elif created:
        # A finished prediction's stream replays and ends; a resumed one from any id too.
        target = created[-1]
        _wait_terminal(http, target)
        response = http.get(
            f"/v1/predictions/{target}/stream",
            headers={"Accept": "text/event-stream", "Last-Event-ID": value or ""},
            timeout=20,
        )
        _check_answer(response)


def _wait_terminal(http: httpx.Client, prediction_id: str, timeout: float = 30) -> None:
    def terminal() -> bool:
        response = http.get(f"/v1/predictions/{prediction_id}")
        assert response.status_code == 200, response.text
        return response.json()["status"] in TERMINAL

    wait_for(terminal, f"{prediction_id} terminal", timeout)


def _all_terminal(http: httpx.Client, ids: list[str]) -> None:
    for prediction_id in ids:
        _wait_terminal(http, prediction_id)
