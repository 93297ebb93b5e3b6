"""Entry ids are unique per stream, not across a deployment's shards: two shards that append in
the same millisecond hand out the same id. A director must run both entries at once, not take
the second for a redelivery of the first (and leave it waiting for a reclaim)."""

from __future__ import annotations

import time
import uuid

import httpx
import redis

from director.queue import GROUP, deployment_stream
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, wait_status
from tests.fixtures.processes import Launcher


def _move_to(redis_url: str, name: str, prediction_id: str, shard: int, entry_id: str) -> None:
    """Put ``prediction_id``'s only entry on ``shard`` of ``name``, under ``entry_id``."""
    with redis.Redis.from_url(redis_url) as r:
        for old_shard in range(2):
            stream = deployment_stream(name, old_shard)
            for old_id, fields in r.xrange(stream):
                if fields[b"id"].decode() == prediction_id:
                    r.xdel(stream, old_id)
        stream = deployment_stream(name, shard)
        r.xgroup_create(stream, GROUP, id="0", mkstream=True)
        r.xadd(stream, {"id": prediction_id}, id=entry_id)


def test_same_entry_id_on_two_shards_runs_both(
    client: httpx.Client, launcher: Launcher, admin: Admin, redis_url: str
) -> None:
    runner, url = launcher.runner("echo", concurrency=2)
    name = f"test/keys-{uuid.uuid4().hex[:8]}"
    admin.create_model(name, url)
    admin.create_deployment(name, name, shards=2, visibility="public")
    path = f"/v1/deployments/{name}/predictions"
    # No director yet: the predictions wait in their streams while they are rearranged.
    first = create(client, path, input={"prompt": "a"})["id"]
    second = create(client, path, input={"prompt": "b"})["id"]
    same_id = f"{int(time.time() * 1000) + 60_000}-0"  # past both streams' last ids
    _move_to(redis_url, name, first, 0, same_id)
    _move_to(redis_url, name, second, 1, same_id)

    began = time.monotonic()
    # Retries and reclaims come only after 30 s or more: an entry dropped or held back as a
    # supposed redelivery cannot be rescued within the time allowed here.
    director = launcher.director(
        name, url, concurrency=2, visibility_timeout="60", retry_interval="30"
    )
    try:
        for prediction_id, prompt in ((first, "a"), (second, "b")):
            done = wait_status(client, prediction_id, timeout=20)
            assert done["status"] == "succeeded" and done["output"] == [f"{prompt}-0"]
        assert time.monotonic() - began < 20
    finally:
        director.stop()
        runner.stop()
