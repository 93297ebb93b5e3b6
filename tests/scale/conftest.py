"""Conduit on a real 3-master Redis Cluster, and drills against a Sentinel-watched pair.

Here ``redis_url`` is a ``redis+cluster://`` URL of a throwaway cluster on loopback, and the
session fixtures built on it (``database_url``, ``admin``, ``launcher``, ``stack``) are
declared again so they get a stack of their own: end-to-end tests imported from ``tests/e2e``
run unchanged against the cluster. The drills start their own topologies (they kill servers).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from conduit.cli import migrate
from conduit.redis_topologies import RedisClusterTopology
from conduit.services import ServiceUrls, create_database
from tests.conftest import admin, launcher, stack
from tests.faults.harness import Drill
from tests.fixtures.admin import Admin
from tests.fixtures.faulty import REGISTRATION as FAULTY_MODEL
from tests.fixtures.processes import Launcher, base_env
from tracker.keys import events_key

__all__ = ["admin", "launcher", "stack"]  # the session's, declared again for the cluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterTopology]:
    with tempfile.TemporaryDirectory(prefix="conduit-cluster-", ignore_cleanup_errors=True) as tmp:
        with RedisClusterTopology(Path(tmp)) as cluster:
            yield cluster


@pytest.fixture(scope="session")
def redis_url(redis_cluster: RedisClusterTopology) -> str:
    return redis_cluster.url


@pytest.fixture(scope="session")
def database_url(services: ServiceUrls) -> str:
    url = create_database(services.database_url, f"conduit_scale_{uuid.uuid4().hex[:12]}")
    migrate(url)
    return url


def cluster_client(topology: RedisClusterTopology) -> RedisCluster:
    """A plain (synchronous) client of the topology, for a test's own looks."""
    nodes = [ClusterNode("127.0.0.1", node.port) for node in topology.nodes]
    return RedisCluster(startup_nodes=nodes)


class ClusterDrill(Drill):
    """A fault drill whose Redis is a cluster: event streams are read where a cluster keeps
    them (``events_key(id, clustered=True)``)."""

    topology: RedisClusterTopology

    def done_events(self, ids: list[str]) -> Counter[str]:
        counts: Counter[str] = Counter()
        with cluster_client(self.topology) as client:
            for prediction_id in ids:
                entries = client.xrange(events_key(prediction_id, clustered=True))
                counts[prediction_id] = sum(1 for _, f in entries if f.get(b"type") == b"done")
        return counts


@pytest.fixture
def cluster_drill(
    redis_cluster: RedisClusterTopology, services: ServiceUrls, tmp_path: Path
) -> Iterator[ClusterDrill]:
    """The faults drill's stack (faulty model, fast failure detection) on the cluster, with a
    database of its own."""
    database_url = create_database(services.database_url, f"drill_{uuid.uuid4().hex[:12]}")
    migrate(database_url)
    record = tmp_path / "invocations.txt"
    env = base_env(database_url, redis_cluster.url)
    env["CONDUIT_FAULTY_RECORD"] = str(record)
    env["CONDUIT_RUNNER_MODELS"] = FAULTY_MODEL
    launcher = Launcher(env, tmp_path)
    drill = ClusterDrill(launcher, Admin(database_url), database_url, redis_cluster.url, record)
    drill.topology = redis_cluster
    try:
        _, drill.api_url = launcher.api()
        launcher.env["CONDUIT_PUBLIC_URL"] = drill.api_url
        yield drill
    finally:
        launcher.kill_all()
        if os.environ.get("CONDUIT_DRILL_LOGS"):
            print(f"drill logs: {tmp_path}")


def node_clients(topology: RedisClusterTopology) -> list[redis.Redis]:
    return [redis.Redis(host="127.0.0.1", port=node.port) for node in topology.nodes]
