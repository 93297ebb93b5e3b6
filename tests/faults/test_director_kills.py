"""Drill 1: SIGKILL a random director every 1-3 s (and restart it) under load."""

from __future__ import annotations

import random
import threading
import time

from tests.faults.conftest import register_faulty
from tests.faults.harness import Drill, verify


def test_killing_directors_loses_nothing(drill: Drill) -> None:
    runners = [drill.launcher.runner("faulty", concurrency=4) for _ in range(4)]
    register_faulty(drill, runners[0][1])
    plain = drill.deployment("kill")
    rerun = drill.deployment("kill-rerun", max_attempts=2)
    other = drill.deployment("kill-other")
    placement = [(plain, 0), (plain, 1), (rerun, 2), (other, 3)]
    directors = [drill.director(name, runners[i][1]) for name, i in placement]
    accounts = drill.accounts(4)
    rng = random.Random(7)
    started = time.monotonic()
    stop = threading.Event()
    kills = 0

    def chaos() -> None:
        nonlocal kills
        while not stop.wait(rng.uniform(1, 3)):
            i = rng.randrange(len(directors))
            directors[i].kill()
            kills += 1
            name, runner = placement[i]
            directors[i] = drill.director(name, runners[runner][1])

    killer = threading.Thread(target=chaos)
    killer.start()
    try:
        jobs = [
            (rng.choice(accounts), rng.choice([plain, rerun, other]), {"n": 3, "delay": 0.1})
            for _ in range(320)
        ]
        drill.load(jobs, workers=6, pace=lambda: time.sleep(0.03))
        drill.settle(timeout=150)
    finally:
        stop.set()
        killer.join()
    outcome = verify(drill, "1 kill directors every 1-3 s", started, note=f"{kills} kills")
    assert kills >= 3
    assert outcome.submitted >= 300
