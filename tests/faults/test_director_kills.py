"""Drill 1: SIGKILL a random director every 1-3 s (and restart it) under load."""

from __future__ import annotations

from tests.faults.drills import kill_directors
from tests.faults.harness import Drill
from tests.fixtures.sizing import sized


def test_killing_directors_loses_nothing(drill: Drill) -> None:
    jobs = sized(160, 320)
    outcome, kills = kill_directors(
        drill,
        "1 kill directors every 1-3 s",
        {"kill": {}, "kill-rerun": {"max_attempts": 2}, "kill-other": {}},
        ["kill", "kill", "kill-rerun", "kill-other"],
        accounts=4,
        seed=7,
        every=(1, 3),
        jobs=jobs,
        workers=6,
        pace=0.03,
        settle=150,
    )
    assert kills >= 3
    assert outcome.submitted >= jobs - jobs // 16
