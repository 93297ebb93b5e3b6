"""The kill-a-director drill on a Redis Cluster (a smaller cut of ``tests/faults``' drill 1):
SIGKILL a random director every 1-2 s under load and restart it; nothing is lost and every
duplicate run is explained by a fenced claim of its own."""

from __future__ import annotations

import pytest

from tests.faults.drills import kill_directors
from tests.fixtures.sizing import sized
from tests.scale.conftest import ClusterDrill


@pytest.mark.timeout(300)
def test_killing_directors_on_a_cluster_loses_nothing(cluster_drill: ClusterDrill) -> None:
    jobs = sized(60, 120)
    outcome, kills = kill_directors(
        cluster_drill,
        "cluster: kill directors every 1-2 s",
        {"kill": {}, "kill-rerun": {"max_attempts": 2}},
        ["kill", "kill", "kill-rerun"],
        accounts=3,
        seed=11,
        every=(1, 2),
        jobs=jobs,
        workers=4,
        pace=0.04,
        settle=180,
    )
    print(
        f"\ncluster kill drill: {outcome.submitted} accepted, lost {outcome.lost}, "
        f"duplicate runs {outcome.duplicates} (explained {outcome.explained}), "
        f"{kills} kills, {outcome.seconds}s"
    )
    assert kills >= 2
    assert outcome.submitted == jobs
