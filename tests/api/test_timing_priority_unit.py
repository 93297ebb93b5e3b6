"""``X-Priority`` parsing, its place in the idempotency fingerprint, and the timing headers."""

from __future__ import annotations

import pytest

from api.errors import InvalidInput
from api.idempotency import fingerprint
from api.priority import parse_priority_header
from api.protocol import PredictionCreate
from api.timing import timing_headers
from protocol.timings import decimal_seconds as seconds
from tracker.priority import Priority

VERSION = "a" * 64


def test_priority_header() -> None:
    assert parse_priority_header(None) is None
    assert parse_priority_header("high") is Priority.HIGH
    assert parse_priority_header("LOW") is Priority.LOW
    for bad in ("", "urgent", "1"):
        with pytest.raises(InvalidInput) as raised:
            parse_priority_header(bad)
        assert raised.value.errors == [
            {"field": "X-Priority", "message": "must be one of high, normal, low"}
        ]


def test_priority_changes_the_fingerprint_only_when_sent() -> None:
    body = PredictionCreate.model_validate({"input": {"prompt": "p"}})
    plain = fingerprint(VERSION, None, body, None)
    assert fingerprint(VERSION, None, body, None, None) == plain  # keys stored before still match
    assert fingerprint(VERSION, None, body, None, Priority.LOW) != plain
    assert fingerprint(VERSION, None, body, None, "low") == fingerprint(
        VERSION, None, body, None, Priority.LOW
    )


def test_seconds_format() -> None:
    assert [seconds(v) for v in (0.0, 0.375, 2.0, 1.23456789)] == ["0", "0.375", "2", "1.234568"]


def test_timing_headers() -> None:
    done = {"status": "succeeded", "metrics": {"predict_time": 0.5, "queue_wait_time": 0.25}}
    assert timing_headers(done, 1.5, forward_remote=False) == {"X-Processing-Time": "1.5"}
    assert timing_headers(done, 1.5, forward_remote=True) == {
        "X-Processing-Time": "1.5",
        "X-Remote-Processing-Time": "0.75",
        "X-Remote-Processing-Times": "0.75",
    }
    running = {"status": "starting", "metrics": {}}
    assert timing_headers(running, 1.0, forward_remote=True) == {"X-Processing-Time": "1"}
    unreported = {"status": "failed", "metrics": {"total_time": 1.0}}
    assert timing_headers(unreported, 1.0, forward_remote=True) == {"X-Processing-Time": "1"}
