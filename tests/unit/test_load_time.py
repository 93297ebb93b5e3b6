"""Cold-load time, from the pool core's grant to the prediction's ``metrics``: the core says
how much of a request's wait was its model's cold start, and the director records it only
as far as its own view of the run allows."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from protocol.timings import RunnerTimes
from runners.pool import (
    FixedProbe,
    Grant,
    LoadDone,
    ModelSpec,
    PoolConfig,
    PoolCore,
    Request,
    ServeDone,
    Start,
    StartLoad,
    StartUnload,
    UnloadDone,
)
from tracker.usage import remote_times

GiB = 2**30


def _core() -> PoolCore:
    models = (ModelSpec("a", 6 * GiB), ModelSpec("b", 6 * GiB))
    config = PoolConfig(models=models, budget_bytes=10 * GiB, min_resident=0.0)
    core = PoolCore(config, FixedProbe((10 * GiB,)))
    core.handle(Start(0.0))
    return core


def _grant(effects: Sequence[object]) -> Grant:
    return next(e for e in effects if isinstance(e, Grant))


def test_a_request_that_waits_for_a_load_is_told_its_cold_start() -> None:
    core = _core()
    assert any(isinstance(e, StartLoad) for e in core.handle(Request("r1", "a", None, 1.0)))
    # A second request joins the same load later: its cold start is only what it sat through,
    # and its wait for the one permit after the load is queueing, not loading.
    core.handle(Request("r2", "a", None, 3.0))
    first = _grant(core.handle(LoadDone("a", 6 * GiB, 5.0)))
    assert first.request_id == "r1"
    assert (first.waited_s, first.load_s) == pytest.approx((4.0, 4.0))
    second = _grant(core.handle(ServeDone("r1", 6.0)))
    assert second.request_id == "r2"
    assert (second.waited_s, second.load_s) == pytest.approx((3.0, 2.0))


def test_a_warm_hit_has_no_cold_start() -> None:
    core = _core()
    core.handle(Request("r1", "a", None, 1.0))
    first = _grant(core.handle(LoadDone("a", 6 * GiB, 2.0)))
    core.handle(ServeDone(first.request_id, 3.0))
    warm = _grant(core.handle(Request("r2", "a", None, 4.0)))
    assert (warm.waited_s, warm.load_s) == (0.0, 0.0)


def test_the_cold_start_counts_the_eviction_it_waited_for() -> None:
    core = _core()
    core.handle(Request("r1", "a", None, 1.0))
    core.handle(ServeDone(_grant(core.handle(LoadDone("a", 6 * GiB, 2.0))).request_id, 3.0))
    effects = core.handle(Request("r2", "b", None, 10.0))  # "a" must go first
    assert any(isinstance(e, StartUnload) and e.model == "a" for e in effects)
    assert any(isinstance(e, StartLoad) for e in core.handle(UnloadDone("a", 12.0)))
    grant = _grant(core.handle(LoadDone("b", 6 * GiB, 15.0)))
    assert grant.load_s == pytest.approx(5.0)


def test_start_headers_are_read_as_seconds_and_junk_is_dropped() -> None:
    assert RunnerTimes.from_start("1.5", "0.25") == RunnerTimes(queue_wait_time=0.25, load_time=1.5)
    assert RunnerTimes.from_start(None, None) == RunnerTimes()
    assert RunnerTimes.from_start("nan", "-1") == RunnerTimes()
    assert RunnerTimes.from_start("soon", "inf") == RunnerTimes()


def test_the_start_adds_its_load_and_its_queueing_to_the_snapshot() -> None:
    snapshot = RunnerTimes.from_metrics({"predict_time": 2.0, "queue_wait_time": 0.5})
    joined = snapshot.with_start(RunnerTimes.from_start("3", "1"))
    assert joined == RunnerTimes(predict_time=2.0, queue_wait_time=1.5, load_time=3.0)
    assert joined.public_metrics() == {
        "predict_time": 2.0,
        "queue_wait_time": 1.5,
        "load_time": 3.0,
    }
    assert snapshot.with_start(RunnerTimes()) == snapshot
    assert "load_time" not in snapshot.public_metrics()
    assert remote_times(joined.public_metrics()) == [6.5]


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        (10.0, RunnerTimes(2.0, 1.0, None, 3.0)),  # an honest report fits: kept whole
        (5.0, RunnerTimes(2.0, 1.0, None, 2.0)),  # the load gets what run and queue left
        (2.5, RunnerTimes(2.0, 0.5, None, 0.0)),
        (1.0, RunnerTimes(1.0, 0.0, None, 0.0)),
        (-1.0, RunnerTimes(0.0, 0.0, None, 0.0)),
    ],
)
def test_load_time_is_bounded_by_what_the_director_saw(
    observed: float, expected: RunnerTimes
) -> None:
    reported = RunnerTimes(predict_time=2.0, queue_wait_time=1.0, load_time=3.0)
    assert reported.within(observed) == expected


def test_a_load_time_alone_is_bounded_by_the_whole_window() -> None:
    assert RunnerTimes(load_time=3600.0).within(4.0) == RunnerTimes(load_time=4.0)


def test_a_pool_wide_keep_alive_of_minus_one_never_idle_unloads() -> None:
    """``keep_alive: -1`` for the whole pool means what it means for one model: a model stays
    loaded after its last request (until it is evicted), rather than expiring at once."""
    config = PoolConfig(models=(ModelSpec("a", GiB),), budget_bytes=10 * GiB, keep_alive=-1)
    core = PoolCore(config, FixedProbe((10 * GiB,)))
    core.handle(Start(0.0))
    core.handle(Request("r1", "a", None, 1.0))
    core.handle(LoadDone("a", GiB, 2.0))
    effects = core.handle(ServeDone("r1", 3.0))
    assert not any(isinstance(e, StartUnload) for e in effects)
    assert next(v for v in core.slots() if v.model == "a").expires_at is None
