"""The director's hot state writes, grouped: many predictions' claims, starts or ends in one
statement.

A director running dozens of predictions at once would otherwise pay one pool checkout and one
round trip per start and per end. Here concurrent calls share a statement through
:class:`tracker.group_commit.Batcher`; the rows travel as one JSON parameter
(``jsonb_to_recordset``), and every row keeps its own fence: a row is written only if it still
has the attempt and a status its write may leave. Callers see exactly what the one-row
statements gave them: their row, or None when they were fenced out. Only calls through one
:class:`StateWrites` are grouped: a process builds one at start and passes it down.

A terminal write also inserts the usage record (same statement) and, for predictions that want
it, the ``completed`` webhook (same transaction). The synchronous lane's runs are recorded
after the fact, by ``tracker.sync_runs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
from sqlalchemy import Table, text
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from protocol.timings import RunnerTimes
from tracker.db import autocommit
from tracker.deliveries import enqueue_completed
from tracker.group_commit import Batcher
from tracker.render import PredictionLinks
from tracker.states import UNFINISHED, Status, sources_of, sql_list
from tracker.tables import Prediction
from tracker.usage import CPU

predictions = cast(Table, Prediction.__table__)


@dataclass(frozen=True, slots=True)
class Claim:
    id: str
    owner: str
    #: Other owners whose claim may be taken over (found dead by the caller).
    takeable: tuple[str, ...] = ()
    #: The version the claimer's runner serves: a prediction made on a deployment runs on
    #: it, whichever version the deployment ran when the prediction was made
    #: (``director.release_watch``); None leaves the row's.
    version: str | None = None


@dataclass(frozen=True, slots=True)
class Start:
    id: str
    attempt: int
    #: Seconds the run had been going when its start is written (a start written late, see
    #: ``director.following``): ``started_at`` is when it began, not when it was written.
    ran_for: float = 0.0


@dataclass(frozen=True, slots=True)
class Finish:
    id: str
    attempt: int
    status: Status
    output: Any
    logs: str | None
    error: str | None
    times: RunnerTimes
    hardware: str
    webhook_links: PredictionLinks | None

    @property
    def ran(self) -> bool:
        """Whether the model ran. A run whose start was never recorded (its terminal snapshot
        came first, or with it) gets its start time and run count here."""
        return ran(self.status, self.times)

    def record(self) -> dict[str, Any]:
        cpu = self.hardware == CPU
        gpu_time = self.times.gpu_time
        if gpu_time is None and cpu:
            gpu_time = 0.0  # a CPU runner used no GPU, whether or not it said so
        return {
            "id": self.id,
            "attempt": self.attempt,
            "status": self.status.value,
            "sources": list(sources_of(self.status)),
            "set_output": self.output is not None,
            "output": self.output,
            "logs": self.logs,
            "error": self.error,
            "reported": self.times.public_metrics(),
            "predict_time": self.times.predict_time,
            "queue_wait_time": self.times.queue_wait_time,
            "gpu_time": gpu_time,
            "hardware": self.hardware,
            "cpu": cpu,
            "aborted": self.status is Status.ABORTED,
            "ran": self.ran,
        }


def ran(status: Status, times: RunnerTimes) -> bool:
    """Whether a terminal state means the model ran: it succeeded, or the runner reports time
    spent running it (a run canceled while queued in the runner reports none)."""
    return status is Status.SUCCEEDED or bool(times.predict_time)


# Every statement names its rows twice: joined to the batch (``p.id = v.id``), which gives each
# row its values, and by ``p.id = ANY(:ids)``, which the planner can look up in the primary key.
# Without the second, it knows nothing of how many rows ``jsonb_to_recordset`` yields and joins
# by hashing every unfinished prediction (or, once analyzed, the whole table): a claim then
# costs time in proportion to the backlog (1.1 ms at 5,000 queued rows against 0.05 ms).
# Status lists in these statements come from the transition table (``tracker.states``). Rows
# come back by the model's column names, never ``*``: the table may hold columns the model does
# not (one kept for processes of the previous release during an upgrade), and ``.columns()``
# maps the result by position.
RETURNED = ", ".join(column.name for column in predictions.c)
ROW = ", ".join(f"p.{column.name}" for column in predictions.c)

_CLAIM = text(
    f"""
    UPDATE predictions AS p
    SET attempt = p.attempt + 1, claim_owner = v.owner,
        version_id = CASE WHEN p.deployment_id IS NOT NULL AND v.version IS NOT NULL
                          THEN v.version ELSE p.version_id END
    FROM jsonb_to_recordset(CAST(:batch AS jsonb))
      AS v(id text, owner text, owners text[], version text)
    WHERE p.id = ANY(CAST(:ids AS text[])) AND p.id = v.id AND p.status IN {sql_list(UNFINISHED)}
      AND (p.claim_owner IS NULL OR p.claim_owner = ANY(v.owners))
    RETURNING {ROW}
    """
).columns(*predictions.c)

_START = text(
    f"""
    UPDATE predictions AS p
    SET status = '{Status.PROCESSING.value}', runs = p.runs + 1,
        started_at = greatest(p.created_at, now() - make_interval(secs => v.ran_for))
    FROM jsonb_to_recordset(CAST(:batch AS jsonb)) AS v(id text, attempt int, ran_for float8)
    WHERE p.id = ANY(CAST(:ids AS text[])) AND p.id = v.id AND p.attempt = v.attempt
      AND p.status IN {sql_list(sources_of(Status.PROCESSING))}
    RETURNING p.id, p.started_at, p.cancel_requested
    """
).columns(predictions.c.id, predictions.c.started_at, predictions.c.cancel_requested)

_FINISH = text(
    f"""
    WITH v AS (
      SELECT * FROM jsonb_to_recordset(CAST(:batch AS jsonb)) AS v(
        id text, attempt int, status text, sources text[], set_output boolean, output jsonb,
        logs text, error text, reported jsonb, predict_time float8, queue_wait_time float8,
        gpu_time float8, hardware text, cpu boolean, aborted boolean, ran boolean)
    ), done AS (
      UPDATE predictions AS p SET
        status = v.status,
        error = v.error,
        completed_at = now(),
        metrics = v.reported
          || jsonb_build_object('total_time', extract(epoch FROM now() - p.created_at)),
        -- A run whose start was not written (coglet's start webhook may come after its
        -- terminal one; a fast run's start and end are written as one) began predict_time ago.
        started_at = CASE WHEN v.ran THEN coalesce(p.started_at, greatest(p.created_at,
                            now() - make_interval(secs => coalesce(v.predict_time, 0.0))))
                          ELSE p.started_at END,
        runs = p.runs
          + CASE WHEN v.ran AND p.status = '{Status.STARTING.value}' THEN 1 ELSE 0 END,
        output = CASE WHEN v.set_output THEN v.output ELSE p.output END,
        logs = coalesce(v.logs, p.logs)
      FROM v
      WHERE p.id = ANY(CAST(:ids AS text[])) AND p.id = v.id AND p.attempt = v.attempt
        AND p.status = ANY(v.sources)
      RETURNING {ROW}
    ), ran AS (
      -- A runner that did not report predict_time is charged the wall clock since the start.
      SELECT d.*, v.hardware, v.cpu, v.aborted, v.gpu_time AS reported_gpu_time,
             v.queue_wait_time AS reported_queue_wait_time,
             coalesce(v.predict_time, extract(epoch FROM now() - d.started_at)::float8, 0.0)
               AS ran_seconds
      FROM done AS d JOIN v ON v.id = d.id
    ), usage AS (
      INSERT INTO usage_records (prediction_id, account_id, model, version_id, deployment,
        status, hardware, predict_time, billable_seconds, cpu_time, gpu_time, queue_wait_time)
      SELECT id, account_id, model, version_id, deployment, status, hardware, ran_seconds,
             CASE WHEN aborted THEN 0.0 ELSE ran_seconds END,
             CASE WHEN cpu AND NOT aborted THEN ran_seconds ELSE 0.0 END,
             reported_gpu_time, reported_queue_wait_time
      FROM ran
    )
    SELECT {RETURNED} FROM done
    """
).columns(*predictions.c)


def _unique_rounds(ids: Sequence[str]) -> list[list[int]]:
    """Indexes split so that no round names a prediction twice (one UPDATE changes a row once)."""
    rounds: list[list[int]] = []
    seen: list[set[str]] = []
    for index, id in enumerate(ids):
        for number, names in enumerate(seen):
            if id not in names:
                names.add(id)
                rounds[number].append(index)
                break
        else:
            seen.append({id})
            rounds.append([index])
    return rounds


async def _run_rounds(
    conn: AsyncConnection, statement: Any, records: list[dict[str, Any]]
) -> list[RowMapping | None]:
    results: list[RowMapping | None] = [None] * len(records)
    for indexes in _unique_rounds([record["id"] for record in records]):
        batch = orjson.dumps([records[i] for i in indexes]).decode()
        ids = [records[i]["id"] for i in indexes]
        rows = (await conn.execute(statement, {"batch": batch, "ids": ids})).mappings().all()
        by_id = {row["id"]: row for row in rows}
        for i in indexes:
            results[i] = by_id.get(records[i]["id"])
    return results


class StateWrites:
    """Grouped ``claim``, ``mark_processing`` and ``finish`` for one engine: one per process,
    built where the engine is, handed to ``tracker.attempt_writes``' writes in place of the
    engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.claims: Batcher[Claim, RowMapping | None] = Batcher(self._write_claims)
        self.starts: Batcher[Start, RowMapping | None] = Batcher(self._write_starts)
        self.finishes: Batcher[Finish, RowMapping | None] = Batcher(self._write_finishes)

    async def _write_claims(self, items: list[Claim]) -> list[RowMapping | None]:
        records = [
            {
                "id": item.id,
                "owner": item.owner,
                "owners": [item.owner, *item.takeable],
                "version": item.version,
            }
            for item in items
        ]
        async with autocommit(self.engine).connect() as conn:
            return await _run_rounds(conn, _CLAIM, records)

    async def _write_starts(self, items: list[Start]) -> list[RowMapping | None]:
        records = [
            {"id": item.id, "attempt": item.attempt, "ran_for": item.ran_for} for item in items
        ]
        async with autocommit(self.engine).connect() as conn:
            return await _run_rounds(conn, _START, records)

    async def _write_finishes(self, items: list[Finish]) -> list[RowMapping | None]:
        records = [item.record() for item in items]
        if all(item.webhook_links is None for item in items):
            async with autocommit(self.engine).connect() as conn:
                return await _run_rounds(conn, _FINISH, records)
        async with self.engine.begin() as conn:
            rows = await _run_rounds(conn, _FINISH, records)
            for item, row in zip(items, rows, strict=True):
                if row is not None and item.webhook_links is not None:
                    await enqueue_completed(conn, row, item.webhook_links)
        return rows
