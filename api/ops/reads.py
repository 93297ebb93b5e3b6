"""What the operator page reads from Postgres: each query bounded, each served by an index
(migration 0019), so that a page answers in milliseconds at a million predictions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.ops.filters import PredictionFilter
from tracker.keys import Kind, Target

#: Counts on the predictions page stop here ("10,000+").
COUNT_CAP = 10_000
#: Failures grouped by error on the failed page: the newest this many.
FAILED_WINDOW = 10_000

_LIST_COLUMNS = (
    "p.id, p.kind, p.status, p.model, p.version_id, p.deployment, p.target, p.source, p.error, "
    "p.created_at, p.started_at, p.completed_at, p.account_id, a.name AS account"
)


@dataclass(frozen=True, slots=True)
class PageKey:
    created_at: datetime
    id: str


async def gate_open(engine: AsyncEngine) -> bool:
    """Whether any account may sign in to ``/ops``: an active admin or viewer with a token."""
    async with engine.connect() as conn:
        found = await conn.scalar(
            text(
                "SELECT EXISTS (SELECT 1 FROM accounts a JOIN api_tokens t ON t.account_id = a.id"
                " WHERE a.active AND (a.is_admin OR a.ops_role IS NOT NULL))"
            )
        )
    return bool(found)


async def ops_role(engine: AsyncEngine, account_id: int) -> tuple[bool, str | None]:
    """(``is_admin``, ``ops_role``) of an account."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT is_admin, ops_role FROM accounts WHERE id = :id AND active"),
                {"id": account_id},
            )
        ).first()
    return (bool(row[0]), row[1]) if row is not None else (False, None)


async def _filter_sql(
    conn: AsyncConnection, where_filter: PredictionFilter
) -> tuple[list[str], dict[str, Any]]:
    account = None
    if where_filter.account:
        found = await conn.scalar(
            text("SELECT id FROM accounts WHERE name = :n"), {"n": where_filter.account}
        )
        account = int(found) if found is not None else -1
    return where_filter.sql(account)


async def list_predictions(
    engine: AsyncEngine, where_filter: PredictionFilter, after: PageKey | None, limit: int
) -> list[RowMapping]:
    """Newest first, ``limit`` rows after the cursor ``after`` (keyset paging)."""
    async with engine.connect() as conn:
        where, params = await _filter_sql(conn, where_filter)
        if after is not None:
            where.append("(p.created_at, p.id) < (:after_at, :after_id)")
            params.update(after_at=after.created_at, after_id=after.id)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = (
            f"SELECT {_LIST_COLUMNS} FROM predictions p JOIN accounts a ON a.id = p.account_id "
            f"{clause} ORDER BY p.created_at DESC, p.id DESC LIMIT :limit"
        )
        result = await conn.execute(text(sql), {**params, "limit": limit})
        return list(result.mappings())


async def count_predictions(
    engine: AsyncEngine, where_filter: PredictionFilter, cap: int = COUNT_CAP
) -> int:
    """How many match, counting up to ``cap`` + 1 (a page shows "10,000+" past the cap)."""
    async with engine.connect() as conn:
        where, params = await _filter_sql(conn, where_filter)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = f"SELECT count(*) FROM (SELECT 1 FROM predictions p {clause} LIMIT :cap) AS m"
        return int(await conn.scalar(text(sql), {**params, "cap": cap + 1}) or 0)


async def matching_page(
    conn: AsyncConnection,
    where_filter: PredictionFilter,
    before: datetime,
    after: PageKey | None,
    limit: int,
) -> list[RowMapping]:
    """A bulk action's next batch: matching predictions created before it started (so what
    it creates itself is never taken up), newest first after ``after``."""
    where, params = await _filter_sql(conn, where_filter)
    where.append("p.created_at <= :before")
    params["before"] = before
    if after is not None:
        where.append("(p.created_at, p.id) < (:after_at, :after_id)")
        params.update(after_at=after.created_at, after_id=after.id)
    sql = (
        "SELECT p.id, p.created_at, p.status, p.account_id FROM predictions p "
        f"WHERE {' AND '.join(where)} ORDER BY p.created_at DESC, p.id DESC LIMIT :limit"
    )
    return list((await conn.execute(text(sql), {**params, "limit": limit})).mappings())


async def prediction(engine: AsyncEngine, prediction_id: str) -> RowMapping | None:
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT p.*, a.name AS account FROM predictions p "
                "JOIN accounts a ON a.id = p.account_id WHERE p.id = :id"
            ),
            {"id": prediction_id},
        )
        return result.mappings().first()


async def relatives(engine: AsyncEngine, row: RowMapping) -> dict[str, list[RowMapping]]:
    """Its retries, and the other steps of its graph run (when it is one), newest first."""
    async with engine.connect() as conn:
        retries = await conn.execute(
            text(
                "SELECT id, status, created_at FROM predictions WHERE retry_of = :id "
                "ORDER BY created_at DESC LIMIT 100"
            ),
            {"id": row["id"]},
        )
        found = {"retries": list(retries.mappings()), "graph": []}
        if row["graph"] and row["graph"].get("id"):
            steps = await conn.execute(
                text(
                    "SELECT id, status, created_at, graph FROM predictions "
                    "WHERE graph->>'id' = :run AND graph IS NOT NULL "
                    "ORDER BY created_at LIMIT 100"
                ),
                {"run": row["graph"]["id"]},
            )
            found["graph"] = list(steps.mappings())
    return found


async def deliveries_of(engine: AsyncEngine, prediction_id: str) -> list[RowMapping]:
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT id, url, event, status, attempts, next_attempt_at, last_status, "
                "last_error, created_at, delivered_at FROM webhook_deliveries "
                "WHERE prediction_id = :id ORDER BY created_at"
            ),
            {"id": prediction_id},
        )
        return list(result.mappings())


async def unfinished_by_target(engine: AsyncEngine) -> dict[str, dict[str, int]]:
    """``starting`` and ``processing`` counts per deployable (the partial unfinished index)."""
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT target, status, count(*) AS n FROM predictions "
                "WHERE status IN ('starting', 'processing') GROUP BY target, status"
            )
        )
        counts: dict[str, dict[str, int]] = {}
        for target, status, n in result:
            counts.setdefault(target or "", {})[status] = int(n)
    return counts


async def last_hour_by_target(engine: AsyncEngine) -> dict[str, dict[str, int]]:
    """Finished in the last hour per deployable: succeeded, failed, all."""
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT target, count(*) AS finished, "
                "count(*) FILTER (WHERE status = 'succeeded') AS succeeded, "
                "count(*) FILTER (WHERE status = 'failed') AS failed FROM predictions "
                "WHERE completed_at IS NOT NULL AND completed_at >= now() - interval '1 hour' "
                "GROUP BY target"
            )
        )
        return {
            row.target or "": {
                "finished": row.finished,
                "succeeded": row.succeeded,
                "failed": row.failed,
            }
            for row in result
        }


async def deployables(engine: AsyncEngine) -> list[RowMapping]:
    """Every deployment (``dp-…``) and version (``vp-…``), and the training streams
    (``tp-…``) of each version that can be trained (its schema has a ``TrainingInput``), with
    its shard count and label; deployments first, then versions, then trainings."""
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT target, label, shards, version_id FROM ("
                "SELECT 0 AS rank, 'dp-' || d.owner || '/' || d.name AS target, d.owner || '/' "
                "|| d.name AS label, d.shards, d.version_id FROM deployments d "
                "UNION ALL SELECT 1, 'vp-' || v.id, m.owner || '/' || m.name || ':' || "
                "left(v.id, 12), v.shards, v.id FROM versions v JOIN models m "
                "ON m.id = v.model_id "
                "UNION ALL SELECT 2, 'tp-' || v.id, m.owner || '/' || m.name || ':' || "
                "left(v.id, 12) || ' trainings', v.shards, v.id FROM versions v JOIN models m "
                "ON m.id = v.model_id "
                "WHERE v.openapi_schema #> '{components,schemas,TrainingInput}' IS NOT NULL"
                ") AS t ORDER BY rank, target LIMIT 2000"
            )
        )
        return list(result.mappings())


async def waiting_by_account(engine: AsyncEngine, targets: list[str]) -> list[RowMapping]:
    """Predictions not started yet per deployable and account, biggest first: counted from
    the unfinished index alone (migration 0022), the accounts' names joined to the counts."""
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT w.target, w.account_id, a.name AS account, w.waiting FROM ("
                "SELECT target, account_id, count(*) AS waiting FROM predictions "
                "WHERE status = 'starting' AND target = ANY(CAST(:targets AS text[])) "
                "GROUP BY 1, 2 ORDER BY waiting DESC LIMIT 5000) AS w "
                "JOIN accounts a ON a.id = w.account_id ORDER BY w.waiting DESC"
            ),
            {"targets": targets},
        )
        return list(result.mappings())


async def failed_groups(engine: AsyncEngine, window: int = FAILED_WINDOW) -> list[RowMapping]:
    """The newest ``window`` failures grouped by their error's first line, biggest first."""
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT split_part(coalesce(f.error, ''), E'\\n', 1) AS error, count(*) AS n, "
                "max(f.created_at) AS newest, min(f.created_at) AS oldest, "
                "(array_agg(f.id ORDER BY f.created_at DESC))[1] AS example FROM ("
                "  SELECT error, created_at, id FROM predictions WHERE status = 'failed'"
                "  ORDER BY created_at DESC, id DESC LIMIT :window) AS f "
                "GROUP BY 1 ORDER BY n DESC, newest DESC LIMIT 100"
            ),
            {"window": window},
        )
        return list(result.mappings())


async def webhook_deliveries(
    engine: AsyncEngine, status: str, limit: int = 200
) -> list[RowMapping]:
    """Terminal webhooks still pending (soonest first) or failed (newest first)."""
    order = "d.next_attempt_at" if status == "pending" else "d.created_at DESC"
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT d.id, d.prediction_id, d.url, d.status, d.attempts, d.next_attempt_at, "
                "d.last_status, d.last_error, d.created_at, a.name AS account "
                "FROM webhook_deliveries d JOIN accounts a ON a.id = d.account_id "
                f"WHERE d.status = :status ORDER BY {order} LIMIT :limit"
            ),
            {"status": status, "limit": limit},
        )
        return list(result.mappings())


async def recent_actions(engine: AsyncEngine, limit: int = 50) -> list[RowMapping]:
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT o.*, a.name AS account FROM ops_actions o "
                "JOIN accounts a ON a.id = o.account_id ORDER BY o.id DESC LIMIT :limit"
            ),
            {"limit": limit},
        )
        return list(result.mappings())


async def action(engine: AsyncEngine, action_id: int) -> RowMapping | None:
    async with engine.connect() as conn:
        result = await conn.execute(
            text("SELECT * FROM ops_actions WHERE id = :id"), {"id": action_id}
        )
        return result.mappings().first()


async def targets(engine: AsyncEngine, names: set[str]) -> dict[str, Target]:
    """The queue targets named (``dp-owner/name``, ``vp-<id>``), with their shard counts."""
    deployments = [n[3:] for n in names if n.startswith("dp-")]
    versions = [n[3:] for n in names if n.startswith("vp-")]
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT 'dp', owner || '/' || name, shards FROM deployments "
                "WHERE owner || '/' || name = ANY(CAST(:d AS text[])) "
                "UNION ALL SELECT 'vp', id, shards FROM versions WHERE id = ANY(CAST(:v AS text[]))"
            ),
            {"d": deployments, "v": versions},
        )
        return {f"{kind}-{key}": Target(Kind(kind), key, int(shards)) for kind, key, shards in rows}
