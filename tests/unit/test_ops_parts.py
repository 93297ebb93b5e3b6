"""The operator page's pure parts: the verdicts of "why is this waiting?", the filter read from
a query string (and the SQL it makes), redaction."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from api.ops.filters import PredictionFilter
from api.ops.queue_view import Location
from api.ops.redaction import redacted
from api.ops.why import explain, seconds

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
STREAM = "input:prediction:{dp-acme/chat}:3"


def _explain(location: Location | None, **overrides: object) -> str:
    args: dict[str, object] = {
        "status": "starting",
        "created_at": NOW - timedelta(seconds=12),
        "deadline": None,
        "cancel_requested": False,
        "attempt": 0,
        "location": location,
        "holder_ttl_ms": None,
        "visibility_timeout_s": 60.0,
        "now": NOW,
    }
    args.update(overrides)
    return explain(**args).verdict  # type: ignore[arg-type]


def test_a_queued_entry_says_how_many_are_ahead_on_which_shard() -> None:
    queued = Location(STREAM, "1-0", "", -1, 0, 37, 12_400)
    assert _explain(queued) == "37 ahead on shard 3; it has waited 12 s"
    first = Location(STREAM, "1-0", "", -1, 0, 0, 800)
    assert _explain(first).startswith("next on shard 3; it has waited 800 ms")


def test_a_held_entry_names_its_director_and_when_it_is_reclaimed() -> None:
    held = Location(STREAM, "1-0", "d2", 45_000, 1, 0, 50_000)
    assert _explain(held, status="processing", holder_ttl_ms=2_000).startswith(
        "held by director d2, running it; last heartbeat 45 s ago"
    )
    assert _explain(held, status="processing") == (
        "held by director d2, which has stopped heartbeating (45 s idle): reclaimed in 15 s"
    )
    overdue = Location(STREAM, "1-0", "d2", 61_000, 1, 0, 70_000)
    assert "the next director to look reclaims it" in _explain(overdue)


def test_unqueued_and_late_predictions() -> None:
    assert _explain(None).startswith("in no shard stream")
    late = _explain(
        Location(STREAM, "1-0", "", -1, 0, 2, 1_000), deadline=NOW - timedelta(seconds=5)
    )
    assert late.endswith("its deadline passed 5 s ago: it is canceled at next look")


def test_durations_read_as_people_say_them() -> None:
    assert [seconds(ms) for ms in (850, 12_000, 245_000, 3 * 3600_000 + 120_000)] == [
        "850 ms",
        "12 s",
        "4 min 5 s",
        "3 h 2 min",
    ]


def test_the_filter_keeps_what_it_understood_and_says_what_it_did_not() -> None:
    where, notes = PredictionFilter.parse(
        {"status": "exploded", "model": "acme/chat", "since": "yesterday", "error": "x" * 301}
    )
    assert where == PredictionFilter(model="acme/chat")
    assert len(notes) == 3
    assert where.query(cursor="c") == "model=acme%2Fchat&cursor=c"


def test_the_filter_is_bound_parameters_only() -> None:
    where, _ = PredictionFilter.parse({"error": "100%_done'; DROP TABLE x", "account": "a"})
    clauses, params = where.sql(account_id=7)
    assert clauses == ["p.status = :status", "p.account_id = :account_id", "p.error ILIKE :error"]
    assert params["status"] == "failed"  # searching error text means failed ones
    assert params["error"] == "%100\\%\\_done'; DROP TABLE x%"


def test_redaction_reaches_every_depth_in_any_case() -> None:
    value = {"prompt": "hi", "API_KEY": "k", "nested": [{"password": "p", "keep": 1}]}
    assert redacted(value, "api_key,password") == {
        "prompt": "hi",
        "API_KEY": "[redacted]",
        "nested": [{"password": "[redacted]", "keep": 1}],
    }
    assert redacted(value, "") == value
