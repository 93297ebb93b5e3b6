"""The overview's rows: a deployment's row with its version's part, and what marks a row."""

from __future__ import annotations

from api.ops.overview import LATE_AFTER_MS, QueueRow
from tracker.keys import Kind


def _row(kind: Kind = Kind.DEPLOYMENT, **counts: int | None) -> QueueRow:
    return QueueRow(f"{kind}-x", "x", 2, kind, **counts)  # type: ignore[arg-type]


def test_a_deployment_row_includes_its_versions_part() -> None:
    own = _row(waiting=0, in_flight=1, oldest_wait_ms=None, consumers=1, starting=0)
    own.processing = 1
    part = _row(Kind.VERSION, waiting=29, in_flight=0, oldest_wait_ms=4_000, consumers=0)
    part.starting = 29
    own.include(part)
    assert (own.waiting, own.in_flight, own.oldest_wait_ms, own.consumers) == (29, 1, 4_000, 1)
    assert (own.starting, own.processing) == (29, 1)
    assert not own.mismatch


def test_unknown_stays_unknown_when_redis_could_not_be_read() -> None:
    own, part = _row(), _row(Kind.VERSION)
    part.starting = 3
    own.include(part)
    assert own.waiting is None and own.in_flight is None and own.consumers is None
    assert own.starting == 3 and own.attention == []


def test_what_marks_a_row() -> None:
    assert _row(waiting=0, consumers=0).attention == []
    assert _row(waiting=5, consumers=0).attention == ["waiting, no director reads it"]
    assert _row(waiting=5, consumers=1).attention == []
    late = _row(waiting=1, consumers=1, oldest_wait_ms=LATE_AFTER_MS)
    assert late.attention == [f"oldest waiting over {LATE_AFTER_MS // 1000} s"]
    failing = _row(waiting=0, consumers=1)
    failing.failed_hour = 2
    assert failing.attention == ["2 failed in the last hour"]
