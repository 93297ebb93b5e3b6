"""Drill bodies run on more than one topology (``tests/faults`` on a single Redis,
``tests/scale`` on a cluster)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tests.faults.harness import Drill, verify
from tests.faults.report import Outcome
from tests.fixtures import waiting


def kill_directors(
    drill: Drill,
    scenario: str,
    deployments: Mapping[str, Mapping[str, Any]],
    placement: Sequence[str],
    *,
    accounts: int,
    seed: int,
    every: tuple[float, float],
    jobs: int,
    workers: int,
    pace: float,
    settle: float,
) -> tuple[Outcome, int]:
    """SIGKILL a random director every ``every`` seconds (uniform between the two) and restart
    it, while ``jobs`` creates go to the ``deployments`` (prefix -> options) from ``workers``
    threads, one every ``pace`` seconds; one runner and its director per entry of
    ``placement`` (a deployment prefix). The checks of :func:`verify`; the outcome and the
    number of kills."""
    runners = [drill.launcher.runner("faulty", concurrency=4) for _ in placement]
    drill.admin.create_model("drill/faulty", runners[0][1])
    names = {prefix: drill.deployment(prefix, **options) for prefix, options in deployments.items()}
    served = [names[prefix] for prefix in placement]
    directors = [drill.director(name, runners[i][1]) for i, name in enumerate(served)]
    tokens = drill.accounts(accounts)
    rng = random.Random(seed)
    started = time.monotonic()
    stop = threading.Event()
    kills = 0

    def chaos() -> None:
        nonlocal kills
        while not stop.wait(rng.uniform(*every)):
            i = rng.randrange(len(directors))
            directors[i].kill()
            kills += 1
            directors[i] = drill.director(served[i], runners[i][1])

    killer = threading.Thread(target=chaos)
    killer.start()
    try:
        targets = list(names.values())
        load = [
            (rng.choice(tokens), rng.choice(targets), {"n": 3, "delay": 0.1}) for _ in range(jobs)
        ]
        drill.load(load, workers=workers, pace=lambda: waiting.pace(pace))
        drill.settle(timeout=settle)
    finally:
        stop.set()
        killer.join()
    return verify(drill, scenario, started, note=f"{kills} kills"), kills
