"""The lane's IO shell and its early refusal, without sockets: the core's early verdict agrees
with what an ``Arrive`` would get, the shell answers each request's future, gives back a
permit nobody waits for, and fires its one timer; snapshots become stream events."""

from __future__ import annotations

import asyncio
import random

import pytest

from lane import (
    Arrive,
    Dispatch,
    LaneConfig,
    LaneCore,
    Outcome,
    Reject,
    RejectReason,
    RunnersChanged,
    RunnerSlot,
)
from lane.shell import LaneShell
from lane.stream_events import SnapshotEvents
from protocol.documents import PredictionResponse
from protocol.values import RunnerStatus


def _core(**config: float) -> LaneCore:
    core = LaneCore(LaneConfig(**config), random.Random(1))  # type: ignore[arg-type]
    core.handle(RunnersChanged("d", (RunnerSlot("r", 1),), 0.0))
    return core


def test_refuse_early_names_no_runner_for_an_unknown_deployment() -> None:
    reject = _core().refuse_early("other", "a", 1, 0.0)
    assert reject is not None and reject.reason is RejectReason.NO_RUNNER


def test_refuse_early_admits_while_the_queue_has_room_and_agrees_with_arrive() -> None:
    core = _core(queue_factor=2)  # one permit: two places, one per account
    for i in range(3):
        verdict = core.refuse_early("d", "a", 1, 0.0)
        effects = core.handle(Arrive(f"q{i}", "d", "a", 1, None, 0.0))
        rejected = any(isinstance(e, Reject) for e in effects)
        assert (verdict is not None) == rejected, (i, verdict, effects)
    # q0 runs, q1 queued (account a's share), q2 refused: the early verdict said so too.
    assert core.refuse_early("d", "b", 1, 0.0) is None  # b still has a place
    high = core.refuse_early("d", "a", 0, 0.0)
    assert high is not None and high.reason is RejectReason.OUT_OF_CAPACITY
    assert 1 <= high.retry_after_s <= 30
    counted = core.snapshot()["d"].rejections_total[RejectReason.OUT_OF_CAPACITY]
    assert counted == 3  # q2 twice (early, then its arrival), and the high one


async def test_the_shell_answers_requests_and_gives_back_unclaimed_permits() -> None:
    shell = LaneShell(LaneConfig(queue_ttl_s=0.05))
    shell.runners_changed("d", (RunnerSlot("r", 1),))
    first = shell.arrive("one", "d", "a", 1, None)
    second = shell.arrive("two", "d", "b", 1, None)
    granted = await first.answer
    assert isinstance(granted, Dispatch) and granted.runner_id == "r"
    assert not second.answer.done()
    # The first ends; the permit goes to the second, whose handler has left meanwhile: the
    # shell hands it straight back.
    shell._answers.pop("two")  # its handler is gone without a word
    assert shell.done(granted, Outcome.OK, first_byte_sent=True) is None
    assert shell.snapshot()["d"].permits_used == 0
    assert shell.core.tracked == 0
    # A queued request expires by the shell's timer.
    third = shell.arrive("three", "d", "a", 1, None)
    blocker = await third.answer
    fourth = shell.arrive("four", "d", "b", 1, None)
    expired = await asyncio.wait_for(fourth.answer, 5)
    assert isinstance(expired, Reject) and expired.reason is RejectReason.EXPIRED
    assert isinstance(blocker, Dispatch)
    shell.done(blocker, Outcome.OK, first_byte_sent=True)
    shell.close()


async def test_leaving_the_queue_cancels_and_a_granted_leave_releases() -> None:
    shell = LaneShell()
    shell.runners_changed("d", (RunnerSlot("r", 1),))
    running = shell.arrive("one", "d", "a", 1, None)
    queued = shell.arrive("two", "d", "a", 1, None)
    assert shell.snapshot()["d"].queue_depth == 1
    shell.leave(queued)
    assert shell.snapshot()["d"].queue_depth == 0
    await running.answer
    shell.leave(running)  # granted, never used: the permit goes back
    assert shell.snapshot()["d"].permits_free == 1
    assert shell.core.tracked == 0


@pytest.mark.parametrize("final_output", [["x", "y", "z"], "whole"])
def test_snapshots_become_output_and_log_events_once(final_output: object) -> None:
    events = SnapshotEvents()
    taken = []
    partial = ["x"] if isinstance(final_output, list) else None
    for snapshot in (
        PredictionResponse(status=RunnerStatus.PROCESSING, output=partial, logs="one\n"),
        PredictionResponse(status=RunnerStatus.SUCCEEDED, output=final_output, logs="one\ntwo\n"),
    ):
        taken += events.take(snapshot)
    taken += events.end("succeeded", None)
    kinds = [(kind, data) for kind, data, _ in taken]
    outputs = [data for kind, data in kinds if kind == "output"]
    assert outputs == (final_output if isinstance(final_output, list) else ["whole"])
    assert [data for kind, data in kinds if kind == "logs"] == ["one", "two"]
    assert kinds[-1] == ("done", "{}")
    assert [event_id for *_, event_id in taken] == [f"0-{i}" for i in range(1, len(taken) + 1)]
