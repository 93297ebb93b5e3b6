"""Drill 16: a director killed mid-run and started again beside the same runner follows the
run the runner kept going (the runner's snapshot stream, attach-only): no second run, no
"interrupted" failure, even with ``max_attempts`` 1."""

from __future__ import annotations

import time

import httpx
import psycopg

from tests.faults.conftest import register_faulty
from tests.faults.harness import TERMINAL, Drill, verify
from tests.fixtures.waiting import wait_for

OUTPUTS = 12
DELAY = 1.0  # seconds per output: a 12 s run, longer than a director's restart and reclaim


def test_restarted_director_follows_the_run_its_runner_kept(drill: Drill) -> None:
    _, url = drill.launcher.runner("faulty", 1)
    register_faulty(drill, url)
    name = drill.deployment("reattach")
    [token] = drill.accounts(1)
    first = drill.director(name, url, concurrency=1)
    started = time.monotonic()
    prediction_id = drill.submit(token, name, {"n": OUTPUTS, "delay": DELAY})
    assert prediction_id
    wait_for(lambda: drill.status(prediction_id) == "processing", "running")
    first.kill()
    killed_at = time.monotonic()
    # Same deployment and runner: the same director name, which takes its own claim back.
    second = drill.director(name, url, concurrency=1)
    wait_for(
        lambda: drill.status(prediction_id) in TERMINAL, "finished", timeout=OUTPUTS * DELAY + 60
    )
    assert time.monotonic() - killed_at < OUTPUTS * DELAY + 10

    status, claims, error = drill.statuses([prediction_id])[prediction_id]
    assert (status, error) == ("succeeded", None)
    assert claims == 2  # the second director claimed it ...
    assert drill.invocations()[prediction_id] == 1  # ... and followed the one run
    assert "still running on the runner: following it" in second.log()
    with psycopg.connect(drill.database_url) as conn:
        (runs,) = conn.execute(
            "SELECT runs FROM predictions WHERE id = %s", (prediction_id,)
        ).fetchone() or (None,)
    assert runs == 1
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}) as client:
        prediction = client.get(f"{drill.api_url}/v1/predictions/{prediction_id}").json()
    assert prediction["output"] == [f"hello-{i}" for i in range(OUTPUTS)]
    verify(drill, "16 director killed mid-run, restarted beside its runner", started)


def test_restarted_director_follows_a_run_whose_start_it_had_not_written(drill: Drill) -> None:
    """The same, killed before the start was written (``start_write_delay``): the prediction
    still reads ``starting``, and the director that claims it again asks the runner first."""
    _, url = drill.launcher.runner("faulty", 1)
    register_faulty(drill, url)
    name = drill.deployment("reattach-early")
    [token] = drill.accounts(1)
    # A start written only after a minute: the run is killed well inside that window.
    first = drill.director(name, url, concurrency=1, start_write_delay="60")
    started = time.monotonic()
    prediction_id = drill.submit(token, name, {"n": OUTPUTS, "delay": DELAY})
    assert prediction_id
    wait_for(lambda: drill.invocations()[prediction_id] == 1, "running on the runner")
    assert drill.status(prediction_id) == "starting"  # its start not written yet
    first.kill()
    second = drill.director(name, url, concurrency=1)
    wait_for(
        lambda: drill.status(prediction_id) in TERMINAL, "finished", timeout=OUTPUTS * DELAY + 60
    )
    status, claims, error = drill.statuses([prediction_id])[prediction_id]
    assert (status, error) == ("succeeded", None)
    assert claims == 2
    assert drill.invocations()[prediction_id] == 1  # followed, not run again
    assert "still running on the runner: following it" in second.log()
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}) as client:
        prediction = client.get(f"{drill.api_url}/v1/predictions/{prediction_id}").json()
    assert prediction["output"] == [f"hello-{i}" for i in range(OUTPUTS)]
    verify(drill, "16b director killed before writing the start, restarted", started)
