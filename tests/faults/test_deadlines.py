"""Drill 8: deadlines. Queued past its deadline → aborted, the runner never called; running
past it → canceled in time; a runner that ignores the cancel is set aside until it recovers."""

from __future__ import annotations

import time

import httpx

from tests.faults.conftest import register_faulty
from tests.faults.harness import FAST_DIRECTOR, TERMINAL, Drill, Submitted, verify
from tests.fixtures.waiting import wait_for

GRACE = float(FAST_DIRECTOR["cancel_grace"])


def _create(drill: Drill, token: str, name: str, input: dict[str, object], after: str) -> str:
    response = httpx.post(
        f"{drill.api_url}/v1/deployments/{name}/predictions",
        json={"input": input},
        headers={"Authorization": f"Bearer {token}", "Cancel-After": after},
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["deadline"]
    drill.submitted.append(Submitted(body["id"], token, name, time.monotonic()))
    return str(body["id"])


def test_deadlines(drill: Drill) -> None:
    runner, url = drill.launcher.runner("faulty", 1)
    register_faulty(drill, url)
    name = drill.deployment("deadline")
    [token] = drill.accounts(1)
    started = time.monotonic()

    # Queued past its deadline: no director yet, so it waits in the stream until too late.
    stale = _create(drill, token, name, {"prompt": "stale"}, "1s")
    expires = time.monotonic() + 1.0
    wait_for(lambda: time.monotonic() > expires, "the deadline to pass")
    director = drill.director(name, url, concurrency=1)
    wait_for(lambda: drill.status(stale) in TERMINAL, "stale prediction handled")
    assert drill.status(stale) == "aborted"
    assert drill.invocations()[stale] == 0

    # Running past its deadline: the runner is told to cancel and confirms.
    began = time.monotonic()
    running = _create(drill, token, name, {"n": 100, "delay": 0.1}, "2s")
    wait_for(lambda: drill.status(running) in TERMINAL, "deadline cancel", timeout=15)
    assert drill.status(running) == "canceled"
    assert time.monotonic() - began < 2 + GRACE + 2

    # A wedged runner ignores the cancel: the director records "canceled" after its grace and
    # takes no more work until the runner's health check says READY again.
    began = time.monotonic()
    wedged = _create(drill, token, name, {"n": 40, "delay": 0.1, "ignore_cancel": True}, "1s")
    wait_for(lambda: drill.status(wedged) in TERMINAL, "wedged cancel", timeout=15)
    assert drill.status(wedged) == "canceled"
    assert time.monotonic() - began < 1 + GRACE + 2
    follow = _create(drill, token, name, {"prompt": "after"}, "60s")
    wait_for(lambda: drill.status(follow) in TERMINAL, "follow-up", timeout=20)
    assert drill.status(follow) == "succeeded"
    assert "runner ignored a cancel" in director.log()
    verify(drill, "8 deadlines: aborted, canceled, wedged runner", started)
    runner.stop()
