"""Throwaway Redis topologies on loopback: a Redis Cluster and a Sentinel-watched pair.

For the scale tests and drills (``tests/scale``). Each topology lives in a temporary directory
of its own, runs ``redis-server`` processes (:class:`conduit.services.RedisServer` under the
hood, ``redis-server --sentinel`` for the sentinels: no ``redis-sentinel`` package needed) and
waits on conditions with deadlines: ``cluster_state:ok`` on every node, a sentinel quorum that
sees the master and its replica. Nothing here sleeps a fixed time.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis

from conduit.services import (
    HOST,
    RedisServer,
    ServerStartError,
    ServicesUnavailable,
    _port_is_free,
    ensure_binaries,
    free_port,
    install_hint,
)

#: The name the sentinels know their master by.
SERVICE = "conduit"


def wait_until(condition: Callable[[], bool], what: str, timeout: float) -> None:
    """Poll ``condition`` until it holds; raise :class:`ServerStartError` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise ServerStartError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def _answers(port: int, check: Callable[[redis.Redis], bool]) -> bool:
    try:
        with redis.Redis(host=HOST, port=port, socket_timeout=1) as client:
            return check(client)
    except redis.RedisError:
        return False


def _cluster_port() -> int:
    """A free port whose cluster bus port (10000 higher) is free too, so at most 55535."""
    for _ in range(200):
        port = free_port()
        if port <= 55535 and _port_is_free(port + 10000):
            return port
    raise ServerStartError("no free port pair for a cluster node")


class ClusterNode(RedisServer):
    """One ``redis-server --cluster-enabled yes`` node."""

    name = "cluster-node"

    def __init__(self, workdir: Path, node_timeout_ms: int) -> None:
        super().__init__(workdir, _cluster_port())
        self.node_timeout_ms = node_timeout_ms

    def _argv(self) -> list[str]:
        argv = super()._argv()
        config = str(self.data_dir / "nodes.conf")
        timeout = str(self.node_timeout_ms)
        return [*argv, "--cluster-enabled", "yes", "--cluster-config-file", config,
                "--cluster-node-timeout", timeout]  # fmt: skip


class _Topology:
    """Servers started together and stopped together (in :meth:`members` order); a context
    manager."""

    def members(self) -> list[RedisServer]:
        raise NotImplementedError

    def start(self, timeout: float = 30) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        for server in self.members():
            server.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class RedisClusterTopology(_Topology):
    """``masters`` cluster nodes on loopback, every slot assigned, no replicas.

    ``url`` is the ``redis+cluster://`` form Conduit's processes take.
    """

    def __init__(self, workdir: Path, masters: int = 3, node_timeout_ms: int = 2000) -> None:
        self.workdir = workdir
        self.nodes = [ClusterNode(workdir / f"node{i}", node_timeout_ms) for i in range(masters)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{HOST}:{node.port}" for node in self.nodes)

    def start(self, timeout: float = 30) -> Self:
        ensure_binaries(redis=True, postgres=False)
        cli = shutil.which("redis-cli")
        if cli is None:
            raise ServicesUnavailable(install_hint(["redis-server"]))
        try:
            for node in self.nodes:
                node.start()
            addresses = [f"{HOST}:{node.port}" for node in self.nodes]
            create = [cli, "--cluster", "create", *addresses, "--cluster-yes"]
            done = subprocess.run(create, capture_output=True, text=True, timeout=timeout)
            if done.returncode != 0:
                raise ServerStartError(f"redis-cli --cluster create failed:\n{done.stdout}")
            wait_until(self.ready, "cluster_state:ok on every node", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def ready(self) -> bool:
        """Every node says the cluster is ok and knows every other node."""

        def ok(client: redis.Redis) -> bool:
            info = client.cluster("INFO")
            return bool(
                info.get("cluster_state") == "ok"
                and int(info.get("cluster_known_nodes", 0)) == len(self.nodes)
            )

        return all(_answers(node.port, ok) for node in self.nodes)

    def members(self) -> list[RedisServer]:
        return list(self.nodes)


class SentinelServer(RedisServer):
    """One ``redis-server <conf> --sentinel`` process watching ``SERVICE``."""

    name = "sentinel"

    def __init__(self, workdir: Path, master_port: int, quorum: int, down_after_ms: int) -> None:
        super().__init__(workdir)
        self.master_port = master_port
        self.quorum = quorum
        self.down_after_ms = down_after_ms

    def _argv(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServicesUnavailable(install_hint(["redis-server"]))
        # A sentinel rewrites its config file (what it learnt of replicas and peers): it must be
        # a file of its own, writable.
        config = self.workdir / "sentinel.conf"
        if not config.exists():
            config.write_text(
                f"port {self.port}\nbind {HOST}\ndir {self.data_dir}\n"
                f"sentinel monitor {SERVICE} {HOST} {self.master_port} {self.quorum}\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} {self.down_after_ms * 10}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
        return [binary, str(config), "--sentinel"]

    def start(self, timeout: float | None = None) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        return super().start(timeout)

    def master(self) -> tuple[str, int] | None:
        """The master's address as this sentinel sees it."""
        try:
            with redis.Redis(host=HOST, port=self.port, socket_timeout=1) as client:
                address = client.sentinel_get_master_addr_by_name(SERVICE)
        except redis.RedisError:
            return None
        return (address[0].decode(), int(address[1])) if address else None


class SentinelTopology(_Topology):
    """A master, its replica and three sentinels (quorum 2), all on loopback.

    ``url`` is the ``redis+sentinel://`` form Conduit's processes take. ``kill_master`` crashes
    the current master; ``wait_for_failover`` waits until every sentinel names the promoted one.
    """

    def __init__(self, workdir: Path, down_after_ms: int = 1000) -> None:
        self.workdir = workdir
        self.servers = [RedisServer(workdir / "redis-a"), RedisServer(workdir / "redis-b")]
        master_port = self.servers[0].port
        self.sentinels = [
            SentinelServer(workdir / f"sentinel{i}", master_port, 2, down_after_ms)
            for i in range(3)
        ]

    @property
    def url(self) -> str:
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def master_port(self) -> int | None:
        """The master every sentinel agrees on (None while they disagree or know none)."""
        seen = {s.master() for s in self.sentinels}
        if len(seen) != 1:
            return None
        (address,) = seen
        return None if address is None else address[1]

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def start(self, timeout: float = 30) -> Self:
        ensure_binaries(redis=True, postgres=False)
        master, replica = self.servers
        try:
            master.start()
            replica.start()
            _answers(replica.port, lambda c: bool(c.replicaof(HOST, master.port)))
            for sentinel in self.sentinels:
                sentinel.start()
            wait_until(lambda: self.watched(master.port), "sentinels watching the pair", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def watched(self, master_port: int) -> bool:
        """Every sentinel names ``master_port``, knows the other two and one live replica, and
        that replica's link to its master is up."""
        if self.master_port() != master_port:
            return False
        replicas = [s for s in self.servers if s.port != master_port and s.running]

        def linked(client: redis.Redis) -> bool:
            return bool(client.info("replication").get("master_link_status") == "up")

        def sees_all(client: redis.Redis) -> bool:
            state: Any = client.sentinel_master(SERVICE)
            return bool(
                int(state["num-other-sentinels"]) == len(self.sentinels) - 1
                and int(state["num-slaves"]) >= len(replicas)
            )

        return all(_answers(r.port, linked) for r in replicas) and all(
            _answers(s.port, sees_all) for s in self.sentinels
        )

    def kill_master(self) -> int:
        """SIGKILL the current master; returns its port."""
        port = self.master_port()
        assert port is not None, "no agreed master to kill"
        self.server(port).kill()
        return port

    def wait_for_failover(self, old_port: int, timeout: float = 30) -> int:
        """Wait until every sentinel names a master other than ``old_port``, and it accepts
        writes; returns its port."""

        def promoted() -> bool:
            port = self.master_port()
            return (
                port is not None
                and port != old_port
                and _answers(port, lambda c: c.info("replication")["role"] == "master")
            )

        wait_until(promoted, "a replica promoted to master", timeout)
        port = self.master_port()
        assert port is not None
        return port

    def members(self) -> list[RedisServer]:
        return [*self.sentinels, *self.servers]
