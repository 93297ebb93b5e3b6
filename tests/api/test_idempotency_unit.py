"""The key's parsing, the request fingerprint and the lock id; the claim against Postgres."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from api.errors import Conflict, InvalidInput, InvalidRequest
from api.idempotency import Idempotency, fingerprint, from_request, parse_key
from api.protocol import PredictionCreate
from catalog import writes
from core.ids import new_prediction_id
from tracker import store

VERSION = "a" * 64
SCHEMA = {"components": {"schemas": {"Input": {"type": "object", "properties": {}}}}}


def _body(**fields: object) -> PredictionCreate:
    return PredictionCreate.model_validate({"input": {"prompt": "p", "n": 2}, **fields})


def test_parse_key() -> None:
    assert parse_key(None) is None
    assert parse_key("k" * 255) == "k" * 255
    for bad in ("", "   ", "k" * 256):
        with pytest.raises(InvalidRequest) as raised:
            parse_key(bad)
        assert raised.value.errors == [
            {"field": "Idempotency-Key", "message": "must be 1 to 255 characters"}
        ]


def test_no_header_is_no_work() -> None:
    assert (
        from_request(None, 1, version_id=VERSION, deployment=None, body=_body(), cancel_after=None)
        is None
    )


def test_fingerprint_is_canonical_and_covers_what_defines_the_prediction() -> None:
    base = fingerprint(VERSION, "o/d", _body(), None)
    reordered = PredictionCreate.model_validate({"input": {"n": 2, "prompt": "p"}})
    assert fingerprint(VERSION, "o/d", reordered, None) == base
    # Defaults spelled out, ignored fields, and the deprecated ``stream`` flag change nothing.
    assert fingerprint(VERSION, "o/d", _body(webhook=None, stream=True, extra=1), None) == base
    assert fingerprint(VERSION, "o/d", _body(), timedelta(0)) != base
    others = {
        fingerprint("b" * 64, "o/d", _body(), None),
        fingerprint(VERSION, None, _body(), None),
        fingerprint(VERSION, "o/d", _body(input={"prompt": "q"}), None),
        fingerprint(VERSION, "o/d", _body(webhook="https://example.com/h"), None),
        fingerprint(VERSION, "o/d", _body(), timedelta(seconds=90)),
    }
    assert base not in others and len(others) == 5
    assert fingerprint(VERSION, None, _body(), timedelta(seconds=90)) == fingerprint(
        VERSION, None, _body(), timedelta(minutes=1, seconds=30)
    )


def test_lock_id_is_a_signed_bigint_per_account_and_key() -> None:
    ids = {Idempotency(account, key, "").lock_id for account in (1, 2) for key in ("a", "b")}
    assert len(ids) == 4
    assert all(-(2**63) <= i < 2**63 for i in ids)
    assert Idempotency(1, "a", "x").lock_id == Idempotency(1, "a", "y").lock_id


async def test_claim_replays_refuses_and_releases(engine: AsyncEngine) -> None:
    account, _ = await writes.create_account(engine, f"idem-{uuid.uuid4().hex[:8]}")
    version = await writes.create_version(engine, "idem", "model", SCHEMA, None)

    def new() -> store.NewPrediction:
        return store.NewPrediction(
            id=new_prediction_id(),
            account_id=account.id,
            model="idem/model",
            version_id=version,
            deployment_id=None,
            deployment=None,
            input={},
            webhook=None,
            webhook_events_filter=None,
            target="vp-" + version,
        )

    key = Idempotency(account.id, "k", "sha-a")
    async with engine.begin() as conn:
        first, replayed = await key.insert_once(conn, new())
    assert not replayed
    async with engine.begin() as conn:
        again, replayed = await key.insert_once(conn, new())
    assert replayed and again["id"] == first["id"]

    with pytest.raises(InvalidInput):
        async with engine.begin() as conn:
            await Idempotency(account.id, "k", "sha-b").insert_once(conn, new())

    # While one transaction holds the key, another is refused at once rather than queued.
    async with engine.begin() as holder:
        assert await store.try_xact_lock(holder, key.lock_id)
        with pytest.raises(Conflict) as raised:
            async with engine.begin() as conn:
                await key.insert_once(conn, new())
        assert raised.value.headers == {"Retry-After": "1"}
