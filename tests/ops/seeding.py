"""Deployments with no director, predictions queued on them, and failed rows in bulk: what the
operator page's tests look at."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import httpx
import psycopg
import redis

from director.queue import GROUP
from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tracker import keys


@dataclass(frozen=True)
class Idle:
    """A public deployment that no director reads: what is queued on it stays queued."""

    name: str
    shards: int
    #: Its model's version (what the deployment runs) and the owner's token.
    version: str = ""
    owner_token: str = ""

    @property
    def target(self) -> str:
        return keys.deployable("dp", self.name)

    def streams(self) -> list[str]:
        return [keys.input_stream("dp", self.name, shard) for shard in range(self.shards)]


def idle_deployment(admin: Admin, stack: Stack, shards: int = 2) -> Idle:
    owner = f"ops{uuid.uuid4().hex[:8]}"
    owner_token = admin.create_account(owner)
    version = admin.create_model(f"{owner}/model", stack.runner_url)
    admin.create_deployment(f"{owner}/idle", f"{owner}/model", shards=shards, visibility="public")
    return Idle(f"{owner}/idle", shards, version, owner_token)


def queue(client: httpx.Client, deployment: Idle, count: int, **input: object) -> list[str]:
    ids = []
    for i in range(count):
        answer = client.post(
            f"/v1/deployments/{deployment.name}/predictions",
            json={"input": {"prompt": f"p{i}", **input}},
        )
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    return ids


def take(r: redis.Redis, deployment: Idle, consumer: str, count: int) -> list[str]:
    """Read ``count`` entries as the directors' group would (pending, never acknowledged): a
    director that then died. Returns the prediction ids it took."""
    return take_from(r, deployment.streams(), consumer, count)


def take_from(r: redis.Redis, streams: list[str], consumer: str, count: int) -> list[str]:
    """``take`` on any shard streams (a version's, a training target's)."""
    taken: list[str] = []
    for stream in streams:
        try:
            r.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as error:
            assert "BUSYGROUP" in str(error)
    for stream in streams:
        if len(taken) >= count:
            break
        reply = r.xreadgroup(GROUP, consumer, {stream: ">"}, count=count - len(taken))
        for _, entries in reply or []:
            taken += [fields[b"id"].decode() for _, fields in entries]
    return taken


def seed_failed(database_url: str, deployment: Idle, account: str, count: int, error: str) -> None:
    """``count`` failed predictions of ``account`` on ``deployment``, each input its own."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO predictions (id, account_id, model, version_id, deployment_id,
              deployment, input, status, error, target, created_at, completed_at)
            SELECT 'seed' || left(md5(random()::text || g), 28), a.id, m.owner || '/' || m.name,
              d.version_id, d.id, d.owner || '/' || d.name,
              jsonb_build_object('prompt', 'seeded ' || g, 'n', g %% 7 + 1),
              'failed', %(error)s || ' #' || g, 'dp-' || d.owner || '/' || d.name,
              now() - make_interval(secs => g), now() - make_interval(secs => g)
            FROM generate_series(1, %(count)s) AS g, accounts a, deployments d
            JOIN models m ON m.id = d.model_id
            WHERE a.name = %(account)s AND d.owner || '/' || d.name = %(deployment)s
            """,
            {"count": count, "error": error, "account": account, "deployment": deployment.name},
        )
