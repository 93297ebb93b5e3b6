"""The runner's times in the terminal write: ``metrics`` and the usage record, per hardware."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import writes
from core.ids import new_prediction_id
from protocol.timings import RunnerTimes
from tracker import attempt_writes, store, usage
from tracker.states import Status
from tracker.usage import remote_times

SCHEMA = {"components": {"schemas": {"Input": {"type": "object", "properties": {}}}}}


async def _claimed(engine: AsyncEngine, account_id: int) -> str:
    version = await writes.create_version(engine, "usage", "model", SCHEMA, None)
    prediction = store.NewPrediction(
        id=new_prediction_id(),
        account_id=account_id,
        model="usage/model",
        version_id=version,
        deployment_id=None,
        deployment=None,
        input={},
        webhook=None,
        webhook_events_filter=None,
        target="vp-" + version,
    )
    async with engine.begin() as conn:
        await store.insert_prediction(conn, prediction)
    assert await attempt_writes.claim(engine, prediction.id, "director-a") is not None
    return prediction.id


async def _record(engine: AsyncEngine, prediction_id: str) -> dict[str, Any]:
    query = text(
        "SELECT hardware, predict_time, gpu_time, cpu_time, queue_wait_time, billable_seconds "
        "FROM usage_records WHERE prediction_id = :id"
    )
    async with engine.connect() as conn:
        return dict((await conn.execute(query, {"id": prediction_id})).mappings().one())


async def _account(engine: AsyncEngine) -> int:
    account, _ = await writes.create_account(engine, f"usage-{uuid.uuid4().hex[:8]}")
    return account.id


async def test_gpu_run_keeps_exactly_what_the_runner_reported(engine: AsyncEngine) -> None:
    pid = await _claimed(engine, await _account(engine))
    times = RunnerTimes(predict_time=1.5, queue_wait_time=0.25, gpu_time=1.25)
    row = await attempt_writes.finish(engine, pid, 1, Status.SUCCEEDED, times=times, hardware="gpu")
    assert row is not None
    metrics = row["metrics"]
    assert {k: metrics[k] for k in ("predict_time", "queue_wait_time", "gpu_time")} == {
        "predict_time": 1.5,
        "queue_wait_time": 0.25,
        "gpu_time": 1.25,
    }
    assert metrics["total_time"] >= 0
    assert await _record(engine, pid) == {
        "hardware": "gpu",
        "predict_time": 1.5,
        "gpu_time": 1.25,
        "cpu_time": 0.0,
        "queue_wait_time": 0.25,
        "billable_seconds": 1.5,
    }


async def test_cpu_runs_count_cpu_time_and_no_gpu_time(engine: AsyncEngine) -> None:
    account = await _account(engine)
    canceled = await _claimed(engine, account)
    times = RunnerTimes(predict_time=0.5)  # a CPU runner that says nothing of GPUs
    assert await attempt_writes.finish(
        engine, canceled, 1, Status.CANCELED, times=times, hardware="cpu"
    )
    assert await _record(engine, canceled) == {
        "hardware": "cpu",
        "predict_time": 0.5,
        "gpu_time": 0.0,
        "cpu_time": 0.5,  # a canceled run still used its slot
        "queue_wait_time": None,
        "billable_seconds": 0.5,
    }

    aborted = await _claimed(engine, account)
    assert await attempt_writes.finish(engine, aborted, 1, Status.ABORTED, hardware="cpu")
    record = await _record(engine, aborted)
    assert (record["cpu_time"], record["billable_seconds"]) == (0.0, 0.0)

    totals = await usage.summary(engine, account, None, None)
    assert (totals["cpu_time"], totals["gpu_time"], totals["billable_seconds"]) == (0.5, 0.0, 0.5)
    assert totals["by_deployable"][0]["cpu_time"] == 0.5


async def test_unknown_hardware_and_unreported_times(engine: AsyncEngine) -> None:
    pid = await _claimed(engine, await _account(engine))
    row = await attempt_writes.finish(
        engine, pid, 1, Status.FAILED, times=RunnerTimes(predict_time=2.0)
    )
    assert row is not None and set(row["metrics"]) == {"predict_time", "total_time"}
    assert await _record(engine, pid) == {
        "hardware": "runner",
        "predict_time": 2.0,
        "gpu_time": None,
        "cpu_time": 0.0,
        "queue_wait_time": None,
        "billable_seconds": 2.0,
    }


def test_runner_metrics_are_read_leniently() -> None:
    reported = {"predict_time": 1, "queue_wait_time": "3", "gpu_time": True, "other": 9}
    assert RunnerTimes.from_metrics(reported) == RunnerTimes(predict_time=1.0)
    assert RunnerTimes.from_metrics({"predict_time": -1}) == RunnerTimes()
    assert remote_times({"predict_time": 0.5, "queue_wait_time": 0.25, "total_time": 9}) == [0.75]
    assert remote_times({"predict_time": 0.5}) == [0.5]
    assert remote_times({"total_time": 1.0}) == []
