""" "Why is this waiting?": from what Postgres and Redis say of an unfinished prediction, the
facts an operator needs and a one-line verdict. Pure: the reads are the caller's
(``api.ops.queue_view``), the clock is passed in."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from api.ops.queue_view import Location
from tracker.keys import parse_input_stream


def seconds(ms: float) -> str:
    """A duration for people: ``850 ms``, ``12 s``, ``4 min 5 s``, ``3 h 2 min``."""
    if ms < 1000:
        return f"{int(ms)} ms"
    s = int(ms // 1000)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


@dataclass(frozen=True, slots=True)
class Waiting:
    """The facts (label, value) and the verdict."""

    verdict: str
    facts: list[tuple[str, str]] = field(default_factory=list)


def explain(
    *,
    status: str,
    created_at: datetime,
    deadline: datetime | None,
    cancel_requested: bool,
    attempt: int,
    location: Location | None,
    holder_ttl_ms: int | None,
    visibility_timeout_s: float,
    now: datetime,
) -> Waiting:
    """``holder_ttl_ms``: what is left of the holder's heartbeat key (None: it has none)."""
    facts: list[tuple[str, str]] = [("status", status), ("attempt", str(attempt))]
    age_ms = (now - created_at).total_seconds() * 1000
    facts.append(("created", f"{seconds(age_ms)} ago"))
    late = ""
    if deadline is not None:
        left_ms = (deadline - now).total_seconds() * 1000
        facts.append(("deadline", f"in {seconds(left_ms)}" if left_ms >= 0 else "passed"))
        if left_ms < 0:
            late = f"; its deadline passed {seconds(-left_ms)} ago: it is canceled at next look"
    if cancel_requested:
        late += "; a cancel was requested"
    if location is None:
        return Waiting(_unqueued(status) + late, facts)
    stream = parse_input_stream(location.stream)
    shard = str(stream.shard) if stream else "?"
    facts += [
        ("stream", location.stream),
        ("shard", shard),
        ("entry", location.entry_id),
        ("deliveries", str(location.deliveries)),
    ]
    if not location.holder:
        ahead = f"{location.ahead:,}" + ("+" if location.ahead >= 50_000 else "")
        facts += [("ahead", ahead), ("pending", "no: no director has read it yet")]
        verdict = (
            f"{ahead} ahead on shard {shard}; it has waited {seconds(location.wait_ms)}"
            if location.ahead
            else f"next on shard {shard}; it has waited {seconds(location.wait_ms)} for a "
            "director to read it"
        )
        return Waiting(verdict + late, facts)
    facts += [
        ("pending", f"yes, with {location.holder}"),
        ("holder idle", seconds(location.idle_ms)),
        (
            "holder heartbeat",
            "none (no heartbeat key: stopped or dead)"
            if holder_ttl_ms is None
            else f"alive, key expires in {seconds(holder_ttl_ms)}",
        ),
    ]
    reclaim_ms = visibility_timeout_s * 1000 - location.idle_ms
    if holder_ttl_ms is not None and reclaim_ms > 0:
        what = "running it" if status == "processing" else "starting it"
        verdict = (
            f"held by director {location.holder}, {what}; last heartbeat "
            f"{seconds(location.idle_ms)} ago"
        )
    elif reclaim_ms > 0:
        verdict = (
            f"held by director {location.holder}, which has stopped heartbeating "
            f"({seconds(location.idle_ms)} idle): reclaimed in {seconds(reclaim_ms)}"
        )
    else:
        verdict = (
            f"held by director {location.holder}, idle {seconds(location.idle_ms)}: past the "
            "visibility timeout, the next director to look reclaims it"
        )
    return Waiting(verdict + late, facts)


def _unqueued(status: str) -> str:
    if status == "processing":
        return (
            "processing, but no queue entry names it: its director acknowledged it early or "
            "Redis lost it; the reconciler settles it"
        )
    return (
        "in no shard stream: stored but not queued (Redis was away at create, or lost it); "
        "the reconciler queues it again at its next pass"
    )
