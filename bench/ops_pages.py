"""The operator page's server time at 10 k and 1 M predictions: every page, the filters the
migrations index, deep cursors, the why-is-this-waiting panel and the bulk confirm count.

``.venv/bin/python -m bench.ops_pages [--sizes 10000,1000000] [--rounds 30]`` from the repo
root, on throwaway servers (:func:`conduit.services.local_services`), a fresh migrated
database and an api subprocess (``conduit api``).

The table is grown to each size with a realistic mix: 40 deployments (8 shards each), 200
accounts, 85 % succeeded, 10 % failed (20 distinct errors), 5 % still ``starting`` and queued
in Redis (each entry's id stamped with its row's ``created_at``, as an append at create time
is), created one every 2.6 s over a month, so that the last hour holds about 1,400 finished
ones. After ``VACUUM ANALYZE``, each page is fetched ``--rounds`` times signed in as an admin;
the figures are the page's own ``Server-Timing`` (what the api spent: the queries, Redis,
rendering; not the loopback transport), p50 and p99 in ms. The 10 k column is the baseline
of the same run: a page whose cost grows with the table shows it there.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import uuid
from urllib.parse import quote

import httpx
import psycopg
import redis

from conduit.runtime import migrate
from conduit.services import local_services
from director.queue import GROUP
from tests.fixtures.servers import create_database
from tracker import keys

DEPLOYMENTS = 40
SHARDS = 8
ACCOUNTS = 200
ERRORS = 20
SCHEMA = '{"components": {"schemas": {"Input": {"type": "object", "properties": {}}}}}'


def setup_catalog(url: str) -> str:
    """Accounts, a model and its version, the deployments; an admin's token."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO accounts (name, webhook_secret) SELECT 'acct-' || n, 'x' "
            "FROM generate_series(1, %s) n",
            (ACCOUNTS,),
        )
        conn.execute(
            "INSERT INTO models (owner, name) VALUES ('acct-1', 'model');"
            "INSERT INTO versions (id, model_id, openapi_schema) SELECT repeat('ab', 32), id, "
            f"'{SCHEMA}'::jsonb FROM models"
        )
        conn.execute(
            "INSERT INTO deployments (owner, name, model_id, version_id, shards) "
            "SELECT 'acct-1', 'dep-' || n, m.id, repeat('ab', 32), %s "
            "FROM generate_series(1, %s) n, models m",
            (SHARDS, DEPLOYMENTS),
        )
    from conduit import admin
    from tracker.db import make_engine

    async def make() -> str:
        engine = make_engine(url, pool_size=1)
        try:
            return await admin.create_account(engine, "bench-operator", True)
        finally:
            await engine.dispose()

    import asyncio

    return asyncio.run(make())


def grow(url: str, start: int, end: int) -> None:
    """Rows ``start`` to ``end``: one every 2.6 s back from now, the newest last."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO predictions (id, account_id, model, version_id, deployment_id,
              deployment, input, output, status, error, created_at, started_at, completed_at,
              attempt, runs, target, source)
            SELECT 'ops-' || n, a.id, 'acct-1/model', repeat('ab', 32), d.id,
              'acct-1/dep-' || (n %% %(deployments)s + 1),
              jsonb_build_object('prompt', 'row ' || n, 'seed', n),
              CASE WHEN n %% 20 < 17 THEN jsonb_build_array('out ' || n) END,
              CASE WHEN n %% 20 < 17 THEN 'succeeded' WHEN n %% 20 < 19 THEN 'failed'
                ELSE 'starting' END,
              CASE WHEN n %% 20 BETWEEN 17 AND 18
                THEN 'RuntimeError: failure kind ' || (n %% %(errors)s) || E'\nTraceback ...' END,
              t.at, CASE WHEN n %% 20 < 19 THEN t.at END,
              CASE WHEN n %% 20 < 19 THEN t.at + interval '1 second' END,
              CASE WHEN n %% 20 < 19 THEN 1 ELSE 0 END, CASE WHEN n %% 20 < 19 THEN 1 ELSE 0 END,
              'dp-acct-1/dep-' || (n %% %(deployments)s + 1), 'api'
            FROM generate_series(%(start)s, %(end)s - 1) n
            CROSS JOIN LATERAL (SELECT now() - (%(total)s - n) * interval '2.6 second' AS at) t
            JOIN accounts a ON a.name = 'acct-' || (n %% %(accounts)s + 1)
            JOIN deployments d
              ON d.owner = 'acct-1' AND d.name = 'dep-' || (n %% %(deployments)s + 1)
            """,
            {
                "start": start,
                "end": end,
                "total": TOTAL,
                "deployments": DEPLOYMENTS,
                "errors": ERRORS,
                "accounts": ACCOUNTS,
            },
        )
        conn.execute("VACUUM ANALYZE predictions")


def queue(url: str, redis_url: str) -> None:
    """Queue every ``starting`` row in Redis as the api would have, in created order (the
    streams are made anew: rows older than those queued before were added)."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT id, account_id, target, (extract(epoch FROM created_at) * 1000)::bigint "
            "FROM predictions WHERE status = 'starting' ORDER BY created_at, id"
        ).fetchall()
    seq: dict[str, int] = {}
    pipe = client.pipeline(transaction=False)
    for prediction_id, account_id, target, ms in rows:
        name = target[3:]
        shard = keys.account_shards(account_id, target, SHARDS)[0]
        stream = keys.input_stream("dp", name, shard)
        key = f"{stream}|{ms}"
        seq[key] = seq.get(key, -1) + 1
        pipe.xadd(stream, {"id": prediction_id}, id=f"{ms}-{seq[key]}")
        if len(pipe) >= 2000:
            pipe.execute()
    pipe.execute()
    for n in range(1, DEPLOYMENTS + 1):
        for shard in range(SHARDS):
            stream = keys.input_stream("dp", f"acct-1/dep-{n}", shard)
            try:
                client.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except redis.ResponseError:
                pass
    client.close()


TOTAL = 0


def sign_in(http: httpx.Client, token: str) -> None:
    form = http.get("/ops/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None, form.text[:500]
    answer = http.post("/ops/login", data={"token": token, "csrf": csrf.group(1), "next": "/ops"})
    assert answer.status_code == 303, answer.text[:500]


def server_ms(http: httpx.Client, path: str, rounds: int) -> tuple[float, float]:
    samples = []
    for _ in range(rounds + 1):
        answer = http.get(path)
        assert answer.status_code == 200, (path, answer.status_code, answer.text[:300])
        timing = re.search(r"dur=([0-9.]+)", answer.headers["server-timing"])
        assert timing is not None
        samples.append(float(timing.group(1)))
    samples = sorted(samples[1:])
    return statistics.median(samples), samples[max(0, int(len(samples) * 0.99) - 1)]


def pages(url: str, size: int) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        newest_waiting = conn.execute(
            "SELECT id FROM predictions WHERE status = 'starting' ORDER BY created_at DESC LIMIT 1"
        ).fetchone()
        deep = conn.execute(
            "SELECT created_at, id FROM predictions ORDER BY created_at DESC, id DESC "
            "OFFSET %s LIMIT 1",
            (min(5000, size // 2),),
        ).fetchone()
        failed = conn.execute(
            "SELECT id FROM predictions WHERE status = 'failed' ORDER BY created_at DESC LIMIT 1"
        ).fetchone()
    assert newest_waiting and deep and failed
    cursor = quote(f"{deep[0].isoformat()}~{deep[1]}")
    return [
        ("overview", "/ops"),
        ("directors and runners", "/ops/workers"),
        ("fairness (8 × 40 shards sampled)", "/ops/fairness"),
        ("predictions, newest", "/ops/predictions"),
        ("predictions, 5,000 deep (cursor)", f"/ops/predictions?cursor={cursor}"),
        ("filter status=failed", "/ops/predictions?status=failed"),
        ("filter deployment", "/ops/predictions?target=dp-acct-1/dep-7"),
        ("filter model", "/ops/predictions?model=acct-1/model"),
        ("filter account", "/ops/predictions?account=acct-17"),
        ("filter error text", "/ops/predictions?error=failure+kind+13"),
        ("filter last hour", "/ops/predictions?since=" + quote(_hour_ago())),
        ("prediction detail (failed)", f"/ops/predictions/{failed[0]}"),
        ("why is this waiting? (newest queued)", f"/ops/predictions/{newest_waiting[0]}/why"),
        ("failures grouped (newest 10,000)", "/ops/failed"),
        ("webhooks", "/ops/webhooks"),
        (
            "confirm: retry all failed (count)",
            "/ops/predictions/confirm?action=retry_all&status=failed",
        ),
    ]


_all_failed = "action=retry_all&status=failed"


def _hour_ago() -> str:
    from datetime import UTC, datetime, timedelta

    return (datetime.now(UTC) - timedelta(hours=1)).isoformat(timespec="seconds")


def main() -> None:
    global TOTAL
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,1000000")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    TOTAL = sizes[-1]
    results: dict[str, dict[int, tuple[float, float]]] = {}
    with local_services() as services:
        url = create_database(services.database_url, f"bench_ops_{uuid.uuid4().hex[:8]}")
        migrate(url)
        token = setup_catalog(url)
        port = 18000 + uuid.uuid4().int % 2000
        env = {
            "DATABASE_URL": url,
            "REDIS_URL": services.redis_url,
            "PATH": "/usr/bin:/bin",
        }
        api = subprocess.Popen(
            [sys.executable, "-m", "conduit", "api", "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                _wait_healthy(http)
                filled = 0
                for size in sizes:
                    # Rows are numbered from the oldest; a smaller size is the newest rows.
                    grow(url, TOTAL - size, TOTAL - filled)
                    queue(url, services.redis_url)
                    filled = size
                    sign_in(http, token)
                    for name, path in pages(url, size):
                        results.setdefault(name, {})[size] = server_ms(http, path, args.rounds)
                    print(f"measured at {size:,} rows", flush=True)
        finally:
            api.terminate()
            api.wait(30)
    header = f"{'page (server time, ms)':<40}" + "".join(
        f"{f'{s:,} p50':>15}{f'{s:,} p99':>15}" for s in sizes
    )
    print(header)
    for name, by_size in results.items():
        cells = "".join(f"{by_size[s][0]:15.2f}{by_size[s][1]:15.2f}" for s in sizes)
        print(f"{name:<40}{cells}")


def _wait_healthy(http: httpx.Client) -> None:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if http.get("/health").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the api did not become healthy")


if __name__ == "__main__":
    main()
