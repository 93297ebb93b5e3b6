"""The recorder of finished ``/run``s without a database: runs wait for the linger (or a full
batch) and then share one write, one write is in flight at a time, a failed batch is written
again run by run, and closing writes what waits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from lane.run_recorder import SyncRecorder
from protocol.capabilities import UNKNOWN_HARDWARE
from protocol.timings import RunnerTimes
from tests.fixtures.waiting import until
from tracker.states import Status
from tracker.sync_runs import SyncRun

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _run(run_id: str) -> SyncRun:
    return SyncRun(
        id=run_id,
        account_id=1,
        model="o/m",
        version_id="v" * 64,
        deployment_id=None,
        deployment=None,
        target="t",
        input={},
        status=Status.SUCCEEDED,
        output=None,
        logs=None,
        error=None,
        times=RunnerTimes.from_metrics({}),
        hardware=UNKNOWN_HARDWARE,
        created_at=NOW,
        started_at=NOW,
        completed_at=NOW,
    )


class Writes:
    """Each write's run ids; ``gate`` holds writes until it is set; ids in ``bad`` fail."""

    def __init__(self, bad: frozenset[str] = frozenset()) -> None:
        self.batches: list[list[str]] = []
        self.started: list[list[str]] = []
        self.bad = bad
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, runs: list[SyncRun]) -> None:
        ids = [run.id for run in runs]
        self.started.append(ids)
        await self.gate.wait()
        if self.bad.intersection(ids):
            raise RuntimeError("constraint violated")
        self.batches.append(ids)


async def test_runs_wait_for_the_linger_then_share_one_write() -> None:
    writes = Writes()
    recorder = SyncRecorder(None, linger=0.0, write=writes)  # type: ignore[arg-type]
    for i in range(3):
        recorder.record(_run(f"r{i}"))
    assert writes.batches == [] and recorder.pending == 3  # nothing written in the handler
    await until(_recorded(recorder, 3), "the three runs recorded")
    assert writes.batches == [["r0", "r1", "r2"]]
    assert recorder.failures == 0 and recorder.pending == 0


async def test_a_full_batch_is_written_without_waiting_for_the_linger() -> None:
    writes = Writes()
    recorder = SyncRecorder(None, linger=3600.0, max_batch=2, write=writes)  # type: ignore[arg-type]
    recorder.record(_run("a"))
    recorder.record(_run("b"))
    await until(_recorded(recorder, 2), "the full batch recorded")
    assert writes.batches == [["a", "b"]]


async def test_runs_that_end_during_a_write_go_into_the_next_one() -> None:
    writes = Writes()
    writes.gate.clear()
    recorder = SyncRecorder(None, linger=0.0, write=writes)  # type: ignore[arg-type]
    recorder.record(_run("a"))
    await until(_started(writes), "the first write in flight")
    recorder.record(_run("b"))
    recorder.record(_run("c"))
    writes.gate.set()
    await until(_recorded(recorder, 3), "all three recorded")
    assert writes.batches == [["a"], ["b", "c"]]


async def test_a_failed_batch_is_written_run_by_run_and_only_the_bad_run_is_lost() -> None:
    writes = Writes(bad=frozenset({"bad"}))
    recorder = SyncRecorder(None, linger=0.0, write=writes)  # type: ignore[arg-type]
    for run_id in ("a", "bad", "c"):
        recorder.record(_run(run_id))
    await until(_settled(recorder, 3), "every run written or failed")
    assert writes.batches == [["a"], ["c"]]
    assert (recorder.recorded, recorder.failures) == (2, 1)


async def test_close_writes_what_waits() -> None:
    writes = Writes()
    recorder = SyncRecorder(None, linger=3600.0, write=writes)  # type: ignore[arg-type]
    recorder.record(_run("a"))
    await recorder.close()
    assert writes.batches == [["a"]] and recorder.pending == 0


async def test_close_gives_up_on_a_write_that_does_not_land() -> None:
    writes = Writes()
    writes.gate.clear()
    recorder = SyncRecorder(None, linger=3600.0, write=writes)  # type: ignore[arg-type]
    recorder.record(_run("a"))
    await recorder.close(timeout=0.01)
    assert writes.started == [["a"]] and writes.batches == [] and recorder.recorded == 0


def _recorded(recorder: SyncRecorder, n: int) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return recorder.recorded == n

    return probe


def _settled(recorder: SyncRecorder, n: int) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return recorder.recorded + recorder.failures == n

    return probe


def _started(writes: Writes) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return bool(writes.started)

    return probe
