"""The kill-a-director drill on a Redis Cluster (a smaller cut of ``tests/faults``' drill 1):
SIGKILL a random director every 1-2 s under load and restart it; nothing is lost and every
duplicate run is explained by a fenced claim of its own."""

from __future__ import annotations

import random
import threading
import time

from tests.faults.harness import verify
from tests.scale.conftest import ClusterDrill


def test_killing_directors_on_a_cluster_loses_nothing(cluster_drill: ClusterDrill) -> None:
    drill = cluster_drill
    runners = [drill.launcher.runner("faulty", concurrency=4) for _ in range(3)]
    drill.admin.create_model("drill/faulty", runners[0][1])
    plain = drill.deployment("kill")
    rerun = drill.deployment("kill-rerun", max_attempts=2)
    placement = [(plain, 0), (plain, 1), (rerun, 2)]
    directors = [drill.director(name, runners[i][1]) for name, i in placement]
    accounts = drill.accounts(3)
    rng = random.Random(11)
    started = time.monotonic()
    stop = threading.Event()
    kills = 0

    def chaos() -> None:
        nonlocal kills
        while not stop.wait(rng.uniform(1, 2)):
            i = rng.randrange(len(directors))
            directors[i].kill()
            kills += 1
            name, runner = placement[i]
            directors[i] = drill.director(name, runners[runner][1])

    killer = threading.Thread(target=chaos)
    killer.start()
    try:
        jobs = [
            (rng.choice(accounts), rng.choice([plain, rerun]), {"n": 3, "delay": 0.1})
            for _ in range(120)
        ]
        drill.load(jobs, workers=4, pace=lambda: time.sleep(0.04))
        drill.settle(timeout=90)
    finally:
        stop.set()
        killer.join()
    outcome = verify(drill, "cluster: kill directors every 1-2 s", started, note=f"{kills} kills")
    print(
        f"\ncluster kill drill: {outcome.submitted} accepted, lost {outcome.lost}, "
        f"duplicate runs {outcome.duplicates} (explained {outcome.explained}), "
        f"{kills} kills, {outcome.seconds}s"
    )
    assert kills >= 2
    assert outcome.submitted == len(jobs)
