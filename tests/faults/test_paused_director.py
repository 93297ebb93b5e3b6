"""Drill 17: a director paused (SIGSTOP: a VM or GC stall) while its blocking read is handed an
entry runs that prediction once it resumes, not a visibility timeout later."""

from __future__ import annotations

import signal
import time
from typing import Any

import psycopg

from director.queue import GROUP
from tests.faults.conftest import register_faulty
from tests.faults.harness import TERMINAL, Drill, verify
from tests.fixtures.waiting import hold, wait_for

#: Long enough that a takeover (an entry left pending, reclaimed once idle this long) cannot
#: pass for a prompt pickup: the pause plus the run take a fraction of it.
VISIBILITY = 30.0
#: The pause: longer than redis-py's default read timeout (5 s), which a resumed process finds
#: expired with the reply already in its socket.
PAUSE = 8.0
#: The blocking read outlasts the pause, so the entry reaches the paused director's read.
BLOCK_MS = 60_000


def _blocked_readers(drill: Drill) -> int:
    """Connections blocked in XREADGROUP (only the director reads with a group)."""
    with drill.redis_client() as r:
        clients: list[dict[str, Any]] = r.client_list()
    return sum(1 for c in clients if c.get("cmd") == "xreadgroup" and "b" in c.get("flags", ""))


def _pending_for_directors(drill: Drill, deployment: str) -> int:
    with drill.redis_client() as r:
        streams = [key.decode() for key in r.keys(f"input:prediction:{{dp-{deployment}}}:*")]
        return sum(int(r.xpending(stream, GROUP)["pending"]) for stream in streams)


def _completed_epoch(drill: Drill, prediction_id: str) -> float:
    with psycopg.connect(drill.database_url) as conn:
        row = conn.execute(
            "SELECT extract(epoch from completed_at) FROM predictions WHERE id = %s",
            (prediction_id,),
        ).fetchone()
    assert row is not None and row[0] is not None
    return float(row[0])


def test_a_paused_director_runs_what_its_blocking_read_was_handed(drill: Drill) -> None:
    _, runner = drill.launcher.runner("faulty", 1)
    register_faulty(drill, runner)
    name = drill.deployment("paused")
    [token] = drill.accounts(1)
    director = drill.director(
        name,
        runner,
        concurrency=1,
        visibility_timeout=str(VISIBILITY),
        block_ms=str(BLOCK_MS),
    )
    started = time.monotonic()
    warm = drill.submit(token, name, {"n": 1, "delay": 0.05})
    assert warm
    wait_for(lambda: drill.status(warm) in TERMINAL, "the director serves")
    wait_for(lambda: _blocked_readers(drill) == 1, "the director waits in its blocking read")

    assert director.popen is not None
    director.popen.send_signal(signal.SIGSTOP)
    try:
        prediction_id = drill.submit(token, name, {"n": 1, "delay": 0.05})
        assert prediction_id
        wait_for(
            lambda: _pending_for_directors(drill, name) == 1,
            "Redis handed the entry to the paused director's read",
        )
        hold(PAUSE)
    finally:
        director.popen.send_signal(signal.SIGCONT)
        resumed_at = time.time()

    wait_for(
        lambda: drill.status(prediction_id) in TERMINAL,
        "the prediction ends",
        timeout=2 * VISIBILITY,
    )
    after_resume = _completed_epoch(drill, prediction_id) - resumed_at
    verify(
        drill,
        f"17 SIGSTOP director {PAUSE:g}s in its blocking read",
        started,
        note=f"ended {after_resume:.1f}s after SIGCONT (visibility timeout {VISIBILITY:g}s)",
    )
    assert drill.status(prediction_id) == "succeeded"
    assert drill.invocations()[prediction_id] == 1
    # A reply dropped on resume leaves the entry pending until it has been idle VISIBILITY
    # seconds (since its delivery, PAUSE seconds before SIGCONT): taken over no sooner than
    # VISIBILITY - PAUSE after it.
    assert after_resume < (VISIBILITY - PAUSE) / 2, after_resume
