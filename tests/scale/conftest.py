"""Conduit on a real 3-master Redis Cluster, and drills against a Sentinel-watched pair.

Here ``redis_url`` is a ``redis+cluster://`` URL of a throwaway cluster on loopback, and the
session fixtures built on it (``database_url``, ``admin``, ``launcher``, ``stack``) are
declared again so they get a stack of their own: end-to-end tests imported from ``tests/e2e``
run unchanged against the cluster. The drills start their own topologies (they kill servers).
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from conduit.runtime import migrate
from conduit.services import ServiceUrls
from tests.conftest import admin, launcher, stack
from tests.faults.harness import Drill, drill_stack
from tests.fixtures.redis_topologies import RedisClusterTopology
from tests.fixtures.servers import create_database

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
    clustered = True

    def redis_client(self) -> RedisCluster:
        return cluster_client(self.topology)


@pytest.fixture
def cluster_drill(
    redis_cluster: RedisClusterTopology, services: ServiceUrls, tmp_path: Path
) -> Iterator[ClusterDrill]:
    """The faults drill's stack (faulty model, fast failure detection) on the cluster, with a
    database of its own."""
    database_url = create_database(services.database_url, f"drill_{uuid.uuid4().hex[:12]}")
    with drill_stack(ClusterDrill, database_url, redis_cluster.url, tmp_path) as drill:
        drill.topology = redis_cluster
        yield drill


def node_clients(topology: RedisClusterTopology) -> list[redis.Redis]:
    return [redis.Redis(host="127.0.0.1", port=node.port) for node in topology.nodes]
