"""Synchronous runs (``lane``), recorded after they ran: a prediction row and its usage record
in one statement. Nothing about them is durable before the runner answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from protocol.timings import RunnerTimes
from tracker.batch_writes import ran
from tracker.db import autocommit
from tracker.states import Status
from tracker.usage import CPU


@dataclass(frozen=True, slots=True)
class SyncRun:
    """One finished ``/run``: what its prediction row and usage record say."""

    id: str
    account_id: int
    model: str
    version_id: str
    deployment_id: int | None
    deployment: str | None
    target: str
    input: Any
    status: Status
    output: Any
    logs: str | None
    error: str | None
    #: The runner's times, already bounded by what the api saw (``RunnerTimes.within``).
    times: RunnerTimes
    hardware: str
    #: Wall-clock instants (timezone-aware) of the request's arrival, its dispatch and its end.
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime
    priority: str | None = None
    request_id: str | None = None

    def record(self) -> dict[str, Any]:
        cpu = self.hardware == CPU
        gpu_time = self.times.gpu_time
        if gpu_time is None and cpu:
            gpu_time = 0.0
        ran_seconds = self.times.predict_time
        if ran_seconds is None and self.started_at is not None and ran(self.status, self.times):
            ran_seconds = (self.completed_at - self.started_at).total_seconds()
        total = (self.completed_at - self.created_at).total_seconds()
        return {
            "id": self.id,
            "account_id": self.account_id,
            "model": self.model,
            "version_id": self.version_id,
            "deployment_id": self.deployment_id,
            "deployment": self.deployment,
            "target": self.target,
            "input": self.input,
            "status": self.status.value,
            "output": self.output,
            "logs": self.logs or "",
            "error": self.error,
            "metrics": {**self.times.public_metrics(), "total_time": total},
            "created_at": self.created_at.isoformat(),
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "completed_at": self.completed_at.isoformat(),
            "priority": self.priority,
            "request_id": self.request_id,
            "runs": 1 if self.started_at is not None else 0,
            "ran_seconds": ran_seconds or 0.0,
            "queue_wait_time": self.times.queue_wait_time,
            "gpu_time": gpu_time,
            "hardware": self.hardware,
            "cpu": cpu,
        }


_INSERT_SYNC_RUNS = text(
    """
    WITH v AS (
      SELECT * FROM jsonb_to_recordset(CAST(:batch AS jsonb)) AS v(
        id text, account_id bigint, model text, version_id text, deployment_id bigint,
        deployment text, target text, input jsonb, status text, output jsonb, logs text,
        error text, metrics jsonb, created_at timestamptz, started_at timestamptz,
        completed_at timestamptz, priority text, request_id text, runs int,
        ran_seconds float8, queue_wait_time float8, gpu_time float8, hardware text,
        cpu boolean)
    ), rows AS (
      INSERT INTO predictions (id, account_id, model, version_id, deployment_id, deployment,
        input, output, logs, error, status, created_at, started_at, completed_at, metrics,
        target, source, priority, request_id, attempt, runs)
      SELECT id, account_id, model, version_id, deployment_id, deployment, input, output,
        logs, error, status, created_at, started_at, completed_at, metrics, target, 'sync',
        priority, request_id, 1, runs
      FROM v
      RETURNING id
    )
    INSERT INTO usage_records (prediction_id, account_id, model, version_id, deployment,
      status, hardware, predict_time, billable_seconds, cpu_time, gpu_time, queue_wait_time,
      created_at)
    SELECT v.id, v.account_id, v.model, v.version_id, v.deployment, v.status, v.hardware,
      v.ran_seconds, v.ran_seconds, CASE WHEN v.cpu THEN v.ran_seconds ELSE 0.0 END,
      v.gpu_time, v.queue_wait_time, v.completed_at
    FROM v JOIN rows ON rows.id = v.id
    """
)


async def insert_sync_runs(engine: AsyncEngine, runs: list[SyncRun]) -> list[None]:
    """Record finished synchronous runs, each as a ``source: sync`` prediction and its usage
    record, all in one statement (atomic). Through a :class:`tracker.group_commit.Batcher`: one
    per process."""
    batch = orjson.dumps([run.record() for run in runs]).decode()
    async with autocommit(engine).connect() as conn:
        await conn.execute(_INSERT_SYNC_RUNS, {"batch": batch})
    return [None] * len(runs)
