"""What the create and stream routes read: anything unreadable or unstorable is refused (400 or
422), never a 500 or a 503."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from api.deadlines import parse_cancel_after
from api.errors import InvalidRequest
from api.prefer import parse_wait
from api.protocol import PredictionCreate
from api.routes.streams import parse_last_event_id


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e20", "99999999999999999999h", "0"])
def test_cancel_after_out_of_range_is_invalid(value: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_cancel_after(value)


@pytest.mark.parametrize("value", ["wait=\u00b2", "wait=\u0663", "wait=0", "wait=61", "wait=x"])
def test_prefer_wait_needs_ascii_seconds_in_range(value: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_wait(value)


def test_prefer_wait_reads_seconds() -> None:
    assert parse_wait("respond-async, wait=5") == (5, "wait=5")


@pytest.mark.parametrize(
    "value",
    ["1", "1-", "x-1", "\u0663-1", f"{2**64}-0", f"0-{2**64}", "08720-942726277892308337479"],
)
def test_last_event_id_must_be_a_redis_stream_id(value: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_last_event_id(value)


def test_last_event_id_accepts_stream_ids() -> None:
    assert parse_last_event_id(None) == "0"
    assert parse_last_event_id(f"{2**64 - 1}-{2**64 - 1}") == f"{2**64 - 1}-{2**64 - 1}"


@pytest.mark.parametrize(
    "body",
    [
        {"input": {"prompt": "a\x00b"}},
        {"input": {"a\x00": 1}},
        {"input": {"list": [["\x00"]]}},
        {"version": "owner/\x00", "input": {}},
        {"input": {}, "webhook": "http://127.0.0.1/\x00"},
    ],
)
def test_a_create_body_with_nul_is_refused_before_it_is_stored(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        PredictionCreate.model_validate(body)
