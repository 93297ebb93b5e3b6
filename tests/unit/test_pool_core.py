"""The model pool's sans-IO core, driven with plain clock values: the slot state machine as a
table, one test per scheduler rule, Hypothesis properties over random event sequences, and a
thrash test."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.shell import ArmTimer, Tick
from runners.pool import (
    AdminDone,
    AdminLoad,
    AdminUnload,
    Cancel,
    Effect,
    Event,
    FixedProbe,
    Grant,
    IllegalTransition,
    LoadDone,
    LoadFailed,
    ModelSpec,
    Pin,
    Policy,
    PoolConfig,
    PoolConfigError,
    PoolCore,
    QueueMode,
    Refuse,
    RejectCode,
    Request,
    ServeDone,
    SlotState,
    SlotView,
    Start,
    StartLoad,
    StartUnload,
    UnloadDone,
)
from runners.pool.slots import Slot
from tests.fixtures.fake_gpu import FakeGpu

GiB = 2**30
E = TypeVar("E")


def spec(name: str, gib: float, **kw: object) -> ModelSpec:
    return ModelSpec(name, int(gib * GiB), **kw)  # type: ignore[arg-type]


def pool(*models: ModelSpec, budget: float = 10, devices: int = 1, **cfg: object) -> PoolCore:
    config = PoolConfig(models=models, budget_bytes=int(budget * GiB), **cfg)  # type: ignore[arg-type]
    return PoolCore(config, FixedProbe((int(budget * GiB),) * devices))


def of(effects: list[Effect], kind: type[E]) -> list[E]:
    return [e for e in effects if isinstance(e, kind)]


def state(core: PoolCore, model: str) -> SlotState:
    return next(v.state for v in core.slots() if v.model == model)


def view(core: PoolCore, model: str) -> SlotView:
    return next(v for v in core.slots() if v.model == model)


def ready(core: PoolCore, model: str, now: float, rid: str | None = None) -> None:
    """Load ``model`` with one request and finish that request."""
    rid = rid or f"warm-{model}-{now}"
    effects = core.handle(Request(rid, model, None, now))
    load = of(effects, StartLoad)
    if load:
        core.handle(LoadDone(model, load[0].lease_bytes * len(load[0].devices), now))
    core.handle(ServeDone(rid, now))
    assert state(core, model) is SlotState.READY


# --- the slot state machine -----------------------------------------------------------------

LEGAL = {
    (SlotState.IDLE, SlotState.LOADING),
    (SlotState.LOADING, SlotState.READY),
    (SlotState.LOADING, SlotState.FAILED),
    (SlotState.LOADING, SlotState.STOPPING),
    (SlotState.LOADING, SlotState.IDLE),
    (SlotState.READY, SlotState.STOPPING),
    (SlotState.STOPPING, SlotState.IDLE),
    (SlotState.STOPPING, SlotState.FAILED),
    (SlotState.FAILED, SlotState.IDLE),
}


@pytest.mark.parametrize(("source", "target"), list(itertools.product(SlotState, SlotState)))
def test_slot_transitions(source: SlotState, target: SlotState) -> None:
    slot = Slot("m", pinned=False, load_ewma=0.0, state=source)
    if (source, target) in LEGAL:
        slot.to(target, "why", 1.0)
        assert (slot.state, slot.last.reason, slot.last.at) == (target, "why", 1.0)
    else:
        with pytest.raises(IllegalTransition):
            slot.to(target, "why", 1.0)


def _in(core: PoolCore, target: SlotState) -> PoolCore:
    """Bring model ``a`` to ``target``."""
    if target is SlotState.IDLE:
        return core
    core.handle(Request("r0", "a", None, 0.0))
    if target is SlotState.LOADING:
        return core
    core.handle(LoadDone("a", GiB, 1.0))
    core.handle(ServeDone("r0", 2.0))
    if target is SlotState.STOPPING:
        core.handle(AdminUnload("op", "a", 3.0))
    return core


@pytest.mark.parametrize(
    ("source", "event"),
    [
        (SlotState.IDLE, LoadDone("a", GiB, 5.0)),
        (SlotState.IDLE, LoadFailed("a", "boom", 5.0)),
        (SlotState.IDLE, UnloadDone("a", 5.0)),
        (SlotState.LOADING, UnloadDone("a", 5.0)),
        (SlotState.READY, LoadDone("a", GiB, 5.0)),
        (SlotState.READY, LoadFailed("a", "boom", 5.0)),
        (SlotState.READY, UnloadDone("a", 5.0)),
    ],
)
def test_events_that_do_not_fit_the_slot_raise(source: SlotState, event: Event) -> None:
    core = _in(pool(spec("a", 1)), source)
    assert state(core, "a") is source
    with pytest.raises(IllegalTransition):
        core.handle(event)


@pytest.mark.parametrize(
    ("source", "event", "after", "kinds"),
    [
        (SlotState.IDLE, Request("r1", "a", None, 5.0), SlotState.LOADING, [StartLoad]),
        (SlotState.LOADING, Request("r1", "a", None, 5.0), SlotState.LOADING, []),
        (SlotState.LOADING, LoadDone("a", GiB, 5.0), SlotState.READY, [Grant]),
        (SlotState.LOADING, LoadFailed("a", "boom", 5.0), SlotState.FAILED, [Refuse]),
        (SlotState.READY, Request("r1", "a", None, 5.0), SlotState.READY, [Grant]),
        (SlotState.STOPPING, Request("r1", "a", None, 5.0), SlotState.STOPPING, []),
        (SlotState.STOPPING, UnloadDone("a", 5.0), SlotState.IDLE, [AdminDone]),
        (SlotState.STOPPING, LoadDone("a", GiB, 5.0), SlotState.STOPPING, []),
    ],
)
def test_state_event_table(
    source: SlotState, event: Event, after: SlotState, kinds: list[type]
) -> None:
    core = _in(pool(spec("a", 1)), source)
    effects = [e for e in core.handle(event) if not isinstance(e, ArmTimer)]
    assert state(core, "a") is after
    assert [type(e) for e in effects] == kinds


# --- rules ----------------------------------------------------------------------------------


def test_a_request_during_stopping_waits_then_loads_exactly_once() -> None:
    core = _in(pool(spec("a", 1)), SlotState.STOPPING)
    for n in range(3):
        assert not of(core.handle(Request(f"w{n}", "a", None, 4.0)), StartLoad)
    effects = core.handle(UnloadDone("a", 5.0))
    assert len(of(effects, StartLoad)) == 1
    assert [g.request_id for g in of(core.handle(LoadDone("a", GiB, 6.0)), Grant)] == ["w0"]


def test_failed_load_errors_every_waiter_then_cools_down_doubling_to_the_cap() -> None:
    core = pool(spec("a", 1), cooldown_initial=10, cooldown_max=25)
    now, cooldowns = 0.0, []
    for n in range(3):
        core.handle(Request(f"x{n}", "a", None, now))
        core.handle(Request(f"y{n}", "a", None, now))
        rejects = of(core.handle(LoadFailed("a", "oom", now + 1)), Refuse)
        assert {(r.request_id, r.code) for r in rejects} == {
            (f"x{n}", RejectCode.LOAD_FAILED),
            (f"y{n}", RejectCode.LOAD_FAILED),
        }
        early = of(core.handle(Request(f"z{n}", "a", None, now + 2)), Refuse)
        assert early[0].code is RejectCode.COOLDOWN
        assert early[0].retry_after is not None
        cooldowns.append(early[0].retry_after + 1)
        until = view(core, "a").cooldown_until
        assert until is not None
        now = until
    assert cooldowns == [10, 20, 25]
    assert of(core.handle(Request("ok", "a", None, now)), StartLoad)


def test_a_load_past_its_deadline_is_stopped_and_fails_its_waiters() -> None:
    core = pool(spec("a", 1, load_timeout=60))
    core.handle(Request("r", "a", None, 0.0))
    assert core.handle(Tick(30.0)) == [ArmTimer(60.0)]  # the aging instant, then the deadline
    effects = core.handle(Tick(60.0))
    assert StartUnload("a", "load_timeout") in effects
    assert of(effects, Refuse)[0].code is RejectCode.LOAD_FAILED
    assert core.handle(LoadDone("a", GiB, 61.0)) == []  # the race: ignored
    core.handle(UnloadDone("a", 62.0))
    assert state(core, "a") is SlotState.FAILED


def test_lease_is_the_larger_of_declared_and_observed_peak() -> None:
    core = pool(spec("a", 2), spec("b", 1), budget=10)
    assert of(core.handle(Request("r", "a", None, 0.0)), StartLoad)[0].lease_bytes == 2 * GiB
    assert core.used(0) == 2 * GiB  # counted while LOADING
    core.handle(LoadDone("a", 3 * GiB, 1.0))
    assert core.used(0) == 3 * GiB  # reconciled
    core.handle(ServeDone("r", 2.0))
    core.handle(AdminUnload("op", "a", 3.0))
    core.handle(UnloadDone("a", 4.0))
    assert of(core.handle(Request("r2", "a", None, 5.0)), StartLoad)[0].lease_bytes == 3 * GiB


def test_reconcile_over_budget_evicts_an_idle_victim() -> None:
    core = pool(spec("a", 4), spec("b", 4), budget=10)
    ready(core, "a", 0.0)
    core.handle(Request("r", "b", None, 40.0))
    effects = core.handle(LoadDone("b", 7 * GiB, 41.0))  # 4 + 7 > 10
    assert StartUnload("a", "evicted:reconcile") in effects
    assert view(core, "a").last_reason == "evicted:reconcile"


def test_reconcile_without_an_idle_victim_unloads_the_newcomer_to_reload_at_its_size() -> None:
    core = pool(spec("pin", 3, pinned=True), spec("busy", 3), spec("b", 3), budget=10)
    core.handle(Start(0.0))
    core.handle(LoadDone("pin", 3 * GiB, 1.0))
    core.handle(Request("c", "busy", None, 1.0))
    core.handle(LoadDone("busy", 3 * GiB, 2.0))
    core.handle(Request("r", "b", None, 40.0))
    effects = core.handle(LoadDone("b", 5 * GiB, 41.0))  # 3 + 3 + 5 > 10, busy is busy
    assert effects[0] == StartUnload("b", "oom-retry")
    assert not of(effects, Grant)
    assert view(core, "b").last_reason == "oom-retry"
    assert not of(core.handle(UnloadDone("b", 42.0)), StartLoad)  # 5 GiB waits for busy
    assert StartUnload("busy", "evicted:lru") in core.handle(ServeDone("c", 43.0))
    load = of(core.handle(UnloadDone("busy", 44.0)), StartLoad)
    assert load == [StartLoad("b", 5 * GiB, (0,))]
    assert core.stats.loads_total["oom-retry"] == 1
    assert core.stats.evictions_total["oom-retry"] == 1


def test_model_too_large_fails_at_once() -> None:
    core = pool(spec("big", 11), budget=10)
    assert core.handle(Request("r", "big", None, 0.0)) == [Refuse("r", RejectCode.MODEL_TOO_LARGE)]


def test_budget_is_the_probe_total_less_the_reserve() -> None:
    core = PoolCore(PoolConfig(models=[spec("a", 1)]), FixedProbe((100 * GiB, 50 * GiB)))
    assert core.budgets() == {0: 90 * GiB, 1: 45 * GiB}


def _three_ready(core: PoolCore) -> None:
    ready(core, "low-old", 0.0)
    ready(core, "low-new", 10.0)
    ready(core, "high-old", 20.0)


def test_eviction_takes_the_lowest_class_then_the_least_recently_used() -> None:
    models = [spec("low-old", 3), spec("low-new", 3), spec("high-old", 3, priority=1)]
    core = pool(*models, spec("x", 3), budget=10)
    _three_ready(core)
    assert of(core.handle(Request("r", "x", None, 100.0)), StartUnload) == [
        StartUnload("low-old", "evicted:lru")
    ]
    assert view(core, "low-old").last_reason == "evicted:lru"


def test_victim_set_is_minimal() -> None:
    core = pool(spec("small", 2), spec("large", 6), spec("x", 6), budget=10)
    ready(core, "small", 0.0)  # least recently used, but not enough alone
    ready(core, "large", 1.0)
    # 4 GiB short: LRU takes small (2) then large (6); large alone suffices, small stays
    assert of(core.handle(Request("r", "x", None, 100.0)), StartUnload) == [
        StartUnload("large", "evicted:lru")
    ]


def test_pinned_busy_and_young_slots_are_never_victims() -> None:
    models = [spec("pin", 3, pinned=True), spec("busy", 3), spec("young", 3), spec("x", 3)]
    core = pool(*models, budget=10, min_resident=30)
    core.handle(Start(0.0))
    core.handle(LoadDone("pin", 3 * GiB, 1.0))
    core.handle(Request("b", "busy", None, 0.0))
    core.handle(LoadDone("busy", 3 * GiB, 1.0))  # b keeps it busy
    ready(core, "young", 40.0)
    effects = core.handle(Request("r", "x", None, 50.0))
    assert not of(effects, StartUnload) and not of(effects, StartLoad)
    # young becomes evictable at 70 (armed timer), before busy drains
    assert ArmTimer(70.0) in effects
    assert of(core.handle(Tick(70.0)), StartUnload) == [StartUnload("young", "evicted:lru")]


def test_busy_victims_are_waited_for_within_the_deadline_never_force_evicted() -> None:
    core = pool(spec("busy", 6), spec("x", 6), budget=10)
    core.handle(Request("b", "busy", None, 0.0))
    core.handle(LoadDone("busy", 6 * GiB, 1.0))
    core.handle(Request("r", "x", 100.0, 50.0))
    assert not of(core.handle(Tick(99.0)), StartUnload)
    assert of(core.handle(Tick(100.0)), Refuse) == [Refuse("r", RejectCode.DEADLINE_EXCEEDED)]
    core.handle(Request("r2", "x", None, 110.0))
    effects = core.handle(ServeDone("b", 120.0))
    assert StartUnload("busy", "evicted:lru") in effects


def test_keep_alive_starts_when_the_last_request_finishes() -> None:
    core = pool(spec("a", 1, concurrency=2), keep_alive=60)
    core.handle(Request("r1", "a", None, 0.0))
    core.handle(LoadDone("a", GiB, 1.0))
    core.handle(Request("r2", "a", None, 1.0))
    core.handle(ServeDone("r1", 50.0))
    assert view(core, "a").expires_at is None  # r2 still in flight
    core.handle(ServeDone("r2", 100.0))
    assert view(core, "a").expires_at == 160.0
    assert not of(core.handle(Tick(159.0)), StartUnload)
    assert of(core.handle(Tick(160.0)), StartUnload) == [StartUnload("a", "ttl")]


@pytest.mark.parametrize(
    ("request_ka", "model_ka", "expires"),
    [
        (None, None, 300.0 + 10),  # global
        (None, 20.0, 30.0),  # model
        (5.0, 20.0, 15.0),  # request beats model
        (10_000.0, 20.0, 3600.0 + 10),  # capped
        (-1.0, 20.0, 3600.0 + 10),  # "forever" from a header is the cap
        (None, -1.0, None),  # model -1: never idle-unloaded
        (0.0, None, 10.0),  # 0: unload after the last request
    ],
)
def test_keep_alive_precedence(
    request_ka: float | None, model_ka: float | None, expires: float | None
) -> None:
    core = pool(spec("a", 1, keep_alive=model_ka))
    core.handle(Request("r", "a", None, 0.0, keep_alive=request_ka))
    core.handle(LoadDone("a", GiB, 1.0))
    effects = core.handle(ServeDone("r", 10.0))
    if expires == 10.0:
        assert StartUnload("a", "ttl") in effects
    else:
        assert view(core, "a").expires_at == expires


def test_keep_alive_forever_is_still_evictable() -> None:
    core = pool(spec("a", 6, keep_alive=-1), spec("b", 6), budget=10)
    ready(core, "a", 0.0)
    assert StartUnload("a", "evicted:lru") in core.handle(Request("r", "b", None, 100.0))


def test_pins_over_the_budget_refuse_to_start() -> None:
    with pytest.raises(PoolConfigError, match="pinned"):
        pool(spec("a", 6, pinned=True), spec("b", 5, pinned=True), budget=10)


def test_pinned_models_load_at_start_keep_their_room_and_never_idle_unload() -> None:
    core = pool(spec("pin", 4, pinned=True, keep_alive=0), spec("x", 7), budget=10)
    assert of(core.handle(Start(0.0)), StartLoad) == [StartLoad("pin", 4 * GiB, (0,))]
    core.handle(LoadDone("pin", 4 * GiB, 1.0))
    core.handle(Request("r", "pin", None, 2.0))
    assert not of(core.handle(ServeDone("r", 3.0)), StartUnload)
    assert of(core.handle(Request("x", "x", None, 4.0)), Refuse)[0].code is (
        RejectCode.MODEL_TOO_LARGE
    )
    assert core.handle(Pin("op", "x", True, 5.0)) == [AdminDone("op", "x", "pins_exceed_budget")]


def test_warm_promotion_never_waits_behind_another_models_load() -> None:
    for mode, granted in ((QueueMode.WARM, True), (QueueMode.FIFO, False)):
        core = pool(spec("warm", 2), spec("cold", 2), queue_mode=mode)
        ready(core, "warm", 0.0)
        core.handle(Request("c", "cold", None, 1.0))
        core.handle(Request("c2", "cold", None, 1.0))  # queued behind c's load
        effects = core.handle(Request("w", "warm", None, 2.0))
        assert bool(of(effects, Grant)) is granted, mode


def test_ready_drains_its_queue_up_to_concurrency() -> None:
    core = pool(spec("a", 1, concurrency=2))
    for n in range(4):
        core.handle(Request(f"r{n}", "a", None, 0.0))
    assert [g.request_id for g in of(core.handle(LoadDone("a", GiB, 5.0)), Grant)] == [
        "r0",
        "r1",
    ]
    assert [g.request_id for g in of(core.handle(ServeDone("r0", 6.0)), Grant)] == ["r2"]


def test_priority_then_fifo_and_the_starvation_guard() -> None:
    core = pool(spec("a", 1), starvation_after=30)
    core.handle(Request("busy", "a", None, 0.0))
    core.handle(LoadDone("a", GiB, 0.0))
    core.handle(Request("low", "a", None, 1.0, priority=0))
    core.handle(Request("high", "a", None, 2.0, priority=5))
    assert of(core.handle(ServeDone("busy", 3.0)), Grant)[0].request_id == "high"
    core.handle(Request("high2", "a", None, 20.0, priority=5))
    # low has waited 30 s by now: no longer overtaken
    assert of(core.handle(ServeDone("high", 31.0)), Grant)[0].request_id == "low"


def test_an_aged_head_stops_new_grants_to_its_busy_victim() -> None:
    core = pool(spec("victim", 6, concurrency=4), spec("x", 6), budget=10, starvation_after=30)
    core.handle(Request("v1", "victim", None, 0.0))
    core.handle(LoadDone("victim", 6 * GiB, 0.0))
    core.handle(Request("r", "x", None, 40.0))
    assert of(core.handle(Request("v2", "victim", None, 50.0)), Grant)  # warm wins at first
    core.handle(Tick(70.0))  # r aged: its victim is reserved
    assert not of(core.handle(Request("v3", "victim", None, 71.0)), Grant)
    core.handle(ServeDone("v1", 72.0))
    assert StartUnload("victim", "evicted:lru") in core.handle(ServeDone("v2", 73.0))


def test_queue_full_answers_retry_after() -> None:
    core = pool(spec("a", 1), max_queue_depth=2, queue_full_retry_after=3)
    for n in range(2):
        core.handle(Request(f"r{n}", "a", None, 0.0))
    assert core.handle(Request("r9", "a", None, 0.0)) == [Refuse("r9", RejectCode.QUEUE_FULL, 3.0)]


def test_deadline_unmeetable_when_the_load_and_a_run_cannot_fit() -> None:
    core = pool(spec("a", 1, load_seconds=40))
    assert core.handle(Request("r", "a", 30.0, 0.0)) == [
        Refuse("r", RejectCode.DEADLINE_UNMEETABLE)
    ]
    assert of(core.handle(Request("r2", "a", 50.0, 0.0)), StartLoad)


def test_an_orphaned_load_completes_then_obeys_its_keep_alive() -> None:
    core = pool(spec("a", 1, keep_alive=60))
    core.handle(Request("r", "a", None, 0.0))
    assert not [e for e in core.handle(Cancel("r", 1.0)) if not isinstance(e, ArmTimer)]
    assert not of(core.handle(LoadDone("a", GiB, 10.0)), Grant)
    assert of(core.handle(Tick(70.0)), StartUnload) == [StartUnload("a", "ttl")]


def test_tensor_parallel_takes_n_devices_never_partial_and_best_fit() -> None:
    core = pool(
        spec("one", 3), spec("tp", 8, tensor_parallel=2), spec("s", 6), budget=10, devices=3
    )
    ready(core, "one", 0.0)  # device 0 now has 7 free
    assert of(core.handle(Request("s", "s", None, 1.0)), StartLoad) == [
        StartLoad("s", 6 * GiB, (0,))
    ]  # best fit: the fullest device that fits
    core.handle(LoadDone("s", 6 * GiB, 2.0))
    assert of(core.handle(Request("t", "tp", None, 3.0)), StartLoad) == [
        StartLoad("tp", 4 * GiB, (1, 2))
    ]
    # 8 GiB per device fits device 1 alone, never device 0 (its pin): no partial placement
    core2 = pool(spec("pin", 4, pinned=True), spec("tp", 16, tensor_parallel=2), devices=2)
    assert core2.handle(Request("x", "tp", None, 0.0)) == [Refuse("x", RejectCode.MODEL_TOO_LARGE)]
    with pytest.raises(PoolConfigError, match="tensor_parallel"):
        pool(spec("tp", 8, tensor_parallel=3), budget=10, devices=2)


def test_admin_load_with_evict_and_admin_unload() -> None:
    core = pool(spec("a", 6), spec("b", 6), budget=10)
    ready(core, "a", 0.0)
    effects = core.handle(AdminLoad("op1", "b", 100.0, evict="a"))
    assert StartUnload("a", "admin") in effects
    assert of(core.handle(UnloadDone("a", 101.0)), StartLoad)[0].model == "b"
    assert core.handle(LoadDone("b", 6 * GiB, 102.0))[0] == AdminDone("op1", "b")
    assert core.stats.loads_total["admin"] == 1
    assert StartUnload("b", "admin") in core.handle(AdminUnload("op2", "b", 103.0))
    assert AdminDone("op2", "b") in core.handle(UnloadDone("b", 104.0))


def test_observability_counters_and_thrash_ratio() -> None:
    core = pool(spec("a", 6), spec("b", 6), budget=10, min_resident=0)
    ready(core, "a", 0.0)
    assert of(core.handle(Request("r", "b", None, 10.0)), StartUnload) == [
        StartUnload("a", "evicted:lru")
    ]
    assert of(core.handle(UnloadDone("a", 11.0)), StartLoad)  # b waited for a's memory
    assert core.stats.loads_total["request"] == 2
    assert core.stats.evictions_total["lru"] == 1
    assert core.stats.unloads_total["evicted:lru"] == 1
    assert core.stats.thrash_ratio(20.0) == 1.0  # 2 loads, 2 requests
    a = view(core, "a")
    assert (a.state, a.last_reason, a.last_at, a.lease_bytes) == (
        SlotState.IDLE,
        "unloaded",
        11.0,
        0,
    )
    b = view(core, "b")
    assert (b.state, b.lease_bytes, b.devices) == (SlotState.LOADING, 6 * GiB, (0,))


# --- properties -----------------------------------------------------------------------------

MODELS = [
    spec("m0", 3, concurrency=2),
    spec("m1", 4),
    spec("m2", 5, keep_alive=0),
    spec("m3", 2, pinned=True),
    spec("tp", 6, tensor_parallel=2),
    spec("huge", 30),
]


class Host:
    """A fake host: carries out effects as pending completions the test then delivers."""

    def __init__(self, core: PoolCore, gpu: FakeGpu | None = None) -> None:
        self.core = core
        self.gpu = gpu
        self.now = 0.0
        self.timer: float | None = None
        self.loading: list[str] = []
        self.stopping: list[str] = []
        self.serving: list[str] = []
        self.ends: Counter[str] = Counter()
        self.sent: set[str] = set()

    def send(self, event: Event) -> None:
        before = {v.model: v for v in self.core.slots()}
        for effect in self.core.handle(event):
            self._carry_out(effect, before)
        self.check()

    def _carry_out(self, effect: Effect, before: dict) -> None:  # type: ignore[type-arg]
        match effect:
            case StartLoad(model=m):
                self.loading.append(m)
            case StartUnload(model=m, reason=reason):
                assert not before[m].pinned or reason == "load_timeout"
                if m in self.loading:
                    self.loading.remove(m)
                self.stopping.append(m)
            case Grant(request_id=rid):
                self.serving.append(rid)
                self.ends[rid] += 1
            case Refuse(request_id=rid):
                self.ends[rid] += 1
            case ArmTimer(at=at):
                self.timer = at

    def check(self) -> None:
        for device, budget in self.core.budgets().items():
            assert self.core.used(device) <= budget
        for v in self.core.slots():
            if v.state is SlotState.READY:
                assert v.lease_bytes > 0 and v.devices
            if v.state is SlotState.STOPPING:  # never a busy or pinned victim
                assert v.in_flight == 0
                assert not v.pinned or v.last_reason == "load_timeout"
            assert v.in_flight >= 0

    def advance(self, seconds: float) -> None:
        self.now += seconds
        if self.timer is not None and self.timer <= self.now:
            self.timer = None
            self.send(Tick(self.now))

    def settle(self) -> None:
        for _ in range(500):
            if self.stopping:
                self.send(UnloadDone(self.stopping.pop(0), self.now))
            elif self.loading:
                m = self.loading.pop(0)
                self.send(
                    LoadDone(m, next(s.declared_bytes for s in MODELS if s.name == m), self.now)
                )
            elif self.serving:
                self.send(ServeDone(self.serving.pop(0), self.now))
            elif self.timer is not None:
                self.now = max(self.now, self.timer)
                self.advance(0.0)
            else:
                return
        raise AssertionError("the pool did not settle")


OPS = st.one_of(
    st.tuples(
        st.just("request"),
        st.integers(0, len(MODELS) - 1),
        st.sampled_from([None, 5.0, 60.0, 600.0]),
        st.sampled_from([None, 0.0, 10.0, -1.0]),
        st.integers(0, 3),
    ),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 5.0, 31.0, 400.0])),
    st.tuples(st.just("load_done"), st.integers(0, 5), st.sampled_from([0.5, 1.0])),
    st.tuples(st.just("load_failed"), st.integers(0, 5)),
    st.tuples(st.just("load_oom"), st.integers(0, 5)),
    st.tuples(st.just("outside"), st.integers(0, 1), st.sampled_from([0, 2, 5, 12])),
    st.tuples(st.just("unload_done"), st.integers(0, 5)),
    st.tuples(st.just("serve_done"), st.integers(0, 20)),
    st.tuples(st.just("admin"), st.integers(0, len(MODELS) - 1), st.booleans()),
)


def _step(host: Host, op: tuple, n: int) -> None:  # type: ignore[type-arg]
    now = host.now
    match op:
        case ("request", m, deadline, keep_alive, priority):
            rid = f"r{n}"
            host.sent.add(rid)
            dl = None if deadline is None else now + deadline
            host.send(Request(rid, MODELS[m].name, dl, now, priority, keep_alive))
        case ("cancel", k):
            rid = f"r{k}"
            if host.core.waiting(rid):
                host.ends[rid] += 1
                host.send(Cancel(rid, now))
        case ("advance", seconds):
            host.advance(seconds)
        case ("load_done", k, fraction) if host.loading:
            m = host.loading.pop(k % len(host.loading))
            size = next(s.declared_bytes for s in MODELS if s.name == m)
            host.send(LoadDone(m, int(size * fraction), now))
        case ("load_failed" | "load_oom" | "outside", *_):
            _step_failures(host, op)
        case ("unload_done", k) if host.stopping:
            host.send(UnloadDone(host.stopping.pop(k % len(host.stopping)), now))
        case ("serve_done", k) if host.serving:
            host.send(ServeDone(host.serving.pop(k % len(host.serving)), now))
        case ("admin", m, load):
            event = AdminLoad if load else AdminUnload
            host.send(event(f"op{n}", MODELS[m].name, now))
        case _:
            pass


def _step_failures(host: Host, op: tuple) -> None:  # type: ignore[type-arg]
    """Loads that fail (out of memory or not), memory the ledger does not know of."""
    match op:
        case ("load_failed", k) if host.loading:
            host.send(LoadFailed(host.loading.pop(k % len(host.loading)), "boom", host.now))
        case ("load_oom", k) if host.loading:
            model = host.loading.pop(k % len(host.loading))
            host.send(LoadFailed(model, "CUDA out of memory", host.now, out_of_memory=True))
        case ("outside", device, gib) if host.gpu is not None:
            host.gpu.outside[device] = gib * GiB  # memory the ledger does not know of
        case _:
            pass


@pytest.mark.parametrize("on_gpu", [False, True], ids=["ledger", "gpu"])
@pytest.mark.parametrize("policy", list(Policy))
@pytest.mark.parametrize("mode", list(QueueMode))
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(OPS, max_size=60))
def test_random_event_sequences_keep_the_invariants(
    policy: Policy,
    mode: QueueMode,
    on_gpu: bool,
    ops: list[tuple],  # type: ignore[type-arg]
) -> None:
    """On a GPU, the devices also hold memory the ledger does not know of, and loads may run
    out of memory."""
    gpu = FakeGpu((11 * GiB, 11 * GiB)) if on_gpu else None
    config = PoolConfig(
        models=MODELS, budget_bytes=10 * GiB, policy=policy, queue_mode=mode, max_queue_depth=8
    )
    core = PoolCore(config, gpu or FixedProbe((10 * GiB,) * 2))
    host = Host(core, gpu)
    host.send(Start(0.0))
    for n, op in enumerate(ops):
        _step(host, op, n)
    host.settle()
    assert core.queued() == 0
    assert all(v.in_flight == 0 for v in core.slots())
    assert {rid: host.ends[rid] for rid in host.sent} == {rid: 1 for rid in host.sent}


# --- thrash -----------------------------------------------------------------------------------


def test_two_models_of_60_percent_alternating_load_at_most_once_per_min_resident() -> None:
    core = pool(spec("a", 6), spec("b", 6), budget=10, min_resident=30)
    host = Host(core)
    duration = 300.0
    n = 0
    while host.now < duration:
        n += 1
        host.send(Request(f"r{n}", "a" if n % 2 else "b", None, host.now))
        host.sent.add(f"r{n}")
        for _ in range(3):  # the host finishes what it can at once
            while host.stopping:
                host.send(UnloadDone(host.stopping.pop(0), host.now))
            while host.loading:
                host.send(LoadDone(host.loading.pop(0), 6 * GiB, host.now))
            while host.serving:
                host.send(ServeDone(host.serving.pop(0), host.now))
        host.advance(1.0)
    loads = sum(core.stats.loads_total.values())
    assert loads <= duration / 30 + 2
    assert core.stats.thrash_ratio(host.now) < 0.1
