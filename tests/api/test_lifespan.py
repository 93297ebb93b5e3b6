"""The api's startup opens its resources one after another; a step that fails closes what the
steps before it opened (the engine disposed, Redis connections closed, the lane's membership
left), so a process that retries startup in place leaks nothing."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import event
from sqlalchemy.engine import Engine

from api.app import CLIENT_NAME, HUB_CLIENT_NAME, create_app
from api.settings import ApiSettings
from tests.fixtures.servers import RedisServer
from tests.fixtures.waiting import wait_for
from tracker import keys
from tracker.redis_connect import EvictingRedis


@pytest.fixture
def disposed() -> Iterator[list[str]]:
    """The database names of the engines disposed while the test runs."""
    names: list[str] = []

    def record(engine: Any) -> None:
        names.append(engine.url.database)

    event.listen(Engine, "engine_disposed", record)
    try:
        yield names
    finally:
        event.remove(Engine, "engine_disposed", record)


def _api_clients(server: RedisServer) -> list[str]:
    with redis.Redis.from_url(server.url) as client:
        names = [c.get("name", "") for c in client.client_list()]
    return [name for name in names if name in (CLIENT_NAME, HUB_CLIENT_NAME)]


def _closed(server: RedisServer) -> bool:
    return not _api_clients(server)


def _database(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


async def test_a_refused_redis_disposes_the_engine(
    tmp_path: Path, database_url: str, disposed: list[str]
) -> None:
    with RedisServer(tmp_path / "redis") as server:
        with redis.Redis.from_url(server.url) as client:
            client.config_set("maxmemory-policy", "allkeys-lru")
        app = create_app(ApiSettings(database_url=database_url, redis_url=server.url))
        with pytest.raises(EvictingRedis):
            async with app.router.lifespan_context(app):
                pytest.fail("the api started against a Redis that may evict keys")
        assert _database(database_url) in disposed
        wait_for(lambda: _closed(server), "the api's Redis connections to close", timeout=10)


async def test_a_late_failure_closes_everything_opened_before(
    tmp_path: Path, database_url: str, disposed: list[str]
) -> None:
    # The last step fails: the metrics port is taken.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with RedisServer(tmp_path / "redis") as server:
            settings = ApiSettings(
                database_url=database_url, redis_url=server.url, metrics_port=port
            )
            app = create_app(settings)
            with pytest.raises(OSError):
                async with app.router.lifespan_context(app):
                    pytest.fail("the api started with its metrics port taken")
            assert _database(database_url) in disposed
            wait_for(lambda: _closed(server), "the api's Redis connections to close", timeout=10)
            with redis.Redis.from_url(server.url) as client:
                assert client.zcard(keys.LANE_MEMBERS) == 0, "the lane's member entry stayed"
    finally:
        taken.close()
