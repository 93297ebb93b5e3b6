"""Drills 6 and 7: heartbeats keep a long job with its live director; a dead director's job is
reclaimed in time; a paused-then-resumed (zombie) director changes nothing."""

from __future__ import annotations

import signal
import time

import httpx
import redis

from tests.faults.conftest import register_faulty
from tests.faults.harness import FAST_DIRECTOR, TERMINAL, Drill, Submitted, verify
from tests.fixtures.receiver import webhook_receiver
from tests.fixtures.waiting import wait_for
from tracker.events import events_key

VISIBILITY = float(FAST_DIRECTOR["visibility_timeout"])
CLAIM = float(FAST_DIRECTOR["claim_interval"])
HEARTBEAT = float(FAST_DIRECTOR["heartbeat_interval"])


def _events(drill: Drill, prediction_id: str) -> list[str]:
    """Types of the prediction's events, in order."""
    with redis.Redis.from_url(drill.redis_url) as r:
        entries = r.xrange(events_key(prediction_id))
    return [fields[b"type"].decode() for _, fields in entries]


def test_long_job_keeps_its_director_and_a_dead_ones_job_is_reclaimed(drill: Drill) -> None:
    (_, url_a), (_, url_b) = (drill.launcher.runner("faulty", 1) for _ in range(2))
    register_faulty(drill, url_a)
    name = drill.deployment("long")
    [token] = drill.accounts(1)
    owner = drill.director(name, url_a, concurrency=1)
    started = time.monotonic()
    long_id = drill.submit(token, name, {"n": 1, "delay": 3 * VISIBILITY})
    assert long_id
    wait_for(lambda: drill.status(long_id) == "processing", "long job running")
    rival = drill.director(name, url_b, concurrency=1)  # would reclaim it, were it idle
    wait_for(lambda: drill.status(long_id) in TERMINAL, "long job done", timeout=30)
    assert drill.status(long_id) == "succeeded"
    assert drill.invocations()[long_id] == 1  # never stolen while its director lived

    rival.stop()  # so the next job surely goes to the owner
    doomed = drill.submit(token, name, {"n": 1, "delay": 30})
    assert doomed
    wait_for(lambda: drill.status(doomed) == "processing", "second long job running")
    drill.director(name, url_b, concurrency=1)
    owner.kill()
    killed_at = time.monotonic()
    wait_for(lambda: drill.status(doomed) in TERMINAL, "reclaimed", timeout=VISIBILITY + 30)
    reclaim_seconds = time.monotonic() - killed_at
    state, _, error = drill.statuses([doomed])[doomed]
    assert state == "failed" and "interrupted" in (error or "")
    # Never taken from a director before its entry idled past the visibility timeout (counted
    # from its last heartbeat, at most one interval before the kill). How soon after that is a
    # figure for the table, not a check: a loaded machine only makes it later.
    assert reclaim_seconds >= VISIBILITY - HEARTBEAT
    verify(
        drill,
        "6 long job 3x visibility; owner killed",
        started,
        note=f"reclaimed in {reclaim_seconds:.1f}s "
        f"(visibility timeout {VISIBILITY:.1f}s + claim interval {CLAIM:.1f}s)",
    )


def test_zombie_director_changes_nothing(drill: Drill) -> None:
    (_, url_a), (_, url_b) = (drill.launcher.runner("faulty", 1) for _ in range(2))
    register_faulty(drill, url_a)
    name = drill.deployment("zombie", max_attempts=2)
    [token] = drill.accounts(1)
    zombie = drill.director(name, url_a, concurrency=1)
    started = time.monotonic()
    with webhook_receiver() as receiver:
        response = httpx.post(
            f"{drill.api_url}/v1/deployments/{name}/predictions",
            json={"input": {"n": 8, "delay": 0.5}, "webhook": receiver.url + "/z"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 201
        prediction_id = response.json()["id"]
        drill.submitted.append(Submitted(prediction_id, token, name, time.monotonic()))
        wait_for(lambda: drill.status(prediction_id) == "processing", "running on A")
        assert zombie.popen is not None
        zombie.popen.send_signal(signal.SIGSTOP)
        try:
            drill.director(name, url_b, concurrency=1)
            # B reclaims past the visibility timeout and runs it again (max_attempts=2).
            wait_for(
                lambda: drill.status(prediction_id) in TERMINAL,
                "finished by the second director",
                timeout=40,
            )
            # B's webhooks are delivered after its terminal write, the last one by then: what
            # arrives after the zombie resumes is the zombie's, had it sent anything.
            wait_for(
                lambda: any(r.json()["status"] in TERMINAL for r in receiver.to("/z")),
                "the second director's completed webhook",
                timeout=30,
            )
        finally:
            resumed_at = time.monotonic()
            zombie.popen.send_signal(signal.SIGCONT)
        final = drill.statuses([prediction_id])[prediction_id]
        assert final[0] == "succeeded" and final[1] == 2
        # The zombie resumes, its runner's webhooks arrive, its heartbeat finds the prediction
        # taken: it must say so, and nothing it does may change the outcome.
        wait_for(lambda: "no longer owns it" in zombie.log(), "the zombie noticed", timeout=10)
        wait_for(lambda: drill.invocations()[prediction_id] == 2, "both runs recorded")
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}) as client:
            after = client.get(f"{drill.api_url}/v1/predictions/{prediction_id}").json()
        assert after["status"] == "succeeded"
        assert after["output"] == [f"hello-{i}" for i in range(8)]
        completed = [r for r in receiver.to("/z") if r.json()["status"] in TERMINAL]
        assert [r.json()["status"] for r in completed] == ["succeeded"]
        assert all(r.json()["status"] in ("processing", "succeeded") for r in receiver.to("/z"))
        late = [r.json()["status"] for r in receiver.to("/z") if r.at > resumed_at]
        assert set(late) <= {"succeeded"}, f"webhooks after the zombie resumed: {late}"
        events = _events(drill, prediction_id)
        assert events.count("done") == 1 and events[-1] == "done", events
    verify(drill, "7 SIGSTOP director past visibility, SIGCONT", started)
