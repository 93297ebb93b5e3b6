"""Drill 9: an input that kills the runner every time is dead-lettered after max_deliveries;
other predictions keep flowing."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
import redis

from tests.faults.conftest import register_faulty
from tests.faults.harness import TERMINAL, Drill, verify
from tests.fixtures.processes import Proc
from tests.fixtures.waiting import pace, wait_for
from tracker.keys import Target, dead_letter_stream


def _supervise(runners: list[Proc], stop: threading.Event) -> None:
    """What a process manager does: restart a runner that died."""
    while not stop.wait(0.2):
        for runner in runners:
            if not runner.alive:
                runner.restart()


# Its waits are bounded one by one; together, on a loaded machine, they pass pytest's default.
@pytest.mark.timeout(300)
def test_poison_input_is_dead_lettered(drill: Drill) -> None:
    runners = [drill.launcher.runner("faulty", 2) for _ in range(2)]
    register_faulty(drill, runners[0][1])
    name = drill.deployment("poison", max_attempts=5, shards=2)
    for _, url in runners:
        drill.director(name, url, concurrency=2, max_deliveries="3")
    victim, bystander = drill.accounts(2)
    started = time.monotonic()

    baseline = []
    for _ in range(10):  # paced like the load during the drill, for a like-for-like figure
        baseline.append(drill.submit(bystander, name, {"n": 2, "delay": 0.05}))
        pace(0.1)
    drill.settle()
    before = drill.completion_times([i for i in baseline if i])

    stop = threading.Event()
    supervisor = threading.Thread(target=_supervise, args=([r for r, _ in runners], stop))
    supervisor.start()
    try:
        poison = drill.submit(victim, name, {"crash": True})
        assert poison
        during = []
        for _ in range(30):
            during.append(drill.submit(bystander, name, {"n": 2, "delay": 0.05}))
            pace(0.1)
        wait_for(
            lambda: drill.statuses([poison])[poison][0] in TERMINAL, "poison settled", timeout=90
        )
        drill.settle(timeout=90)
    finally:
        stop.set()
        supervisor.join()

    state, _, error = drill.statuses([poison])[poison]
    assert state == "failed" and "dead-letter" in (error or ""), error
    with redis.Redis.from_url(drill.redis_url) as r:
        dead = [
            fields
            for stream in Target("dp", name, 2).all_streams()
            for _, fields in r.xrange(dead_letter_stream(stream))
        ]
    dead_ids = [f[b"id"].decode() for f in dead]
    assert dead_ids.count(poison) == 1
    assert int(dead[dead_ids.index(poison)][b"deliveries"]) >= 4
    assert 1 <= drill.invocations()[poison] <= 3  # never run more than max_deliveries times
    # A bystander running beside the poison on the runner it kills is interrupted with it; one
    # so unlucky three times over is dead-lettered too. Terminal either way, and rare.
    collateral = len(dead_ids) - 1
    assert collateral <= 3
    after = drill.completion_times([i for i in during if i])
    outcome = verify(
        drill,
        "9 poison input crashes its runner",
        started,
        note=(
            f"bystander p50 {statistics.median(before):.2f}s idle vs "
            f"{statistics.median(after):.2f}s during, "
            f"p95 {after[int(len(after) * 0.95) - 1]:.2f}s; "
            f"{collateral} bystanders dead-lettered, "
            f"poison ran {drill.invocations()[poison]}x"
        ),
    )
    assert outcome.statuses["succeeded"] >= 40 - collateral - 3
