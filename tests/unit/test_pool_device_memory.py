"""The pool core against what a GPU measures, not only its ledger: memory the ledger does not
know of counts as taken, loads under way count against the device's room, a load that runs out of
memory is retried once after evicting, then fails. A fake GPU probe stands in for NVML."""

from __future__ import annotations

from typing import TypeVar

from runners.pool import (
    Effect,
    FixedProbe,
    Grant,
    LoadDone,
    LoadFailed,
    ModelSpec,
    PoolConfig,
    PoolCore,
    Refuse,
    RejectCode,
    Request,
    ServeDone,
    SlotState,
    SlotView,
    StartLoad,
    StartUnload,
    UnloadDone,
)
from runners.pool.backends import LoadError
from runners.pool.config import MemoryProbe
from runners.pool.host import out_of_memory
from runners.pool.nvml import placement_env, visible_gpus
from tests.fixtures.fake_gpu import FakeGpu

GiB = 2**30
E = TypeVar("E")
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


def spec(name: str, gib: float, **kw: object) -> ModelSpec:
    return ModelSpec(name, int(gib * GiB), **kw)  # type: ignore[arg-type]


def pool(probe: MemoryProbe, *models: ModelSpec, **cfg: object) -> PoolCore:
    """Budget: the probe's total less 10 %; a GPU keeps that 10 % free by measure too."""
    return PoolCore(PoolConfig(models=models, min_resident=0, **cfg), probe)  # type: ignore[arg-type]


def gpu(*gib: float) -> FakeGpu:
    return FakeGpu(tuple(int(g * GiB) for g in gib))


def of(effects: list[Effect], kind: type[E]) -> list[E]:
    return [e for e in effects if isinstance(e, kind)]


def view(core: PoolCore, model: str) -> SlotView:
    return next(v for v in core.slots() if v.model == model)


def ready(core: PoolCore, model: str, now: float) -> StartLoad:
    rid = f"warm-{model}"
    [load] = of(core.handle(Request(rid, model, None, now)), StartLoad)
    core.handle(LoadDone(model, load.lease_bytes * len(load.devices), now))
    core.handle(ServeDone(rid, now))
    return load


def test_memory_outside_the_ledger_counts_as_taken_and_is_evicted_for() -> None:
    device = gpu(10)  # budget 9 GiB
    core = pool(device, spec("a", 4), spec("b", 4))
    ready(core, "a", 0.0)
    device.outside[0] = 4 * GiB + 2 * GiB  # a's memory, and 2 GiB a cache left behind
    # The ledger has 5 GiB free for b's 4; the device has 10 - 6 - 1 (reserve) = 3.
    effects = core.handle(Request("r", "b", None, 10.0))
    assert of(effects, StartUnload) == [StartUnload("a", "evicted:lru")]
    assert not of(effects, StartLoad)
    device.outside[0] = 2 * GiB  # a's memory is back; the cache is not
    assert of(core.handle(UnloadDone("a", 11.0)), StartLoad) == [StartLoad("b", 4 * GiB, (0,))]


def test_the_ledger_alone_would_have_loaded_without_evicting() -> None:
    core = pool(FixedProbe((10 * GiB,)), spec("a", 4), spec("b", 4))
    ready(core, "a", 0.0)
    effects = core.handle(Request("r", "b", None, 10.0))
    assert of(effects, StartLoad) == [StartLoad("b", 4 * GiB, (0,))]
    assert not of(effects, StartUnload)


def test_a_load_under_way_counts_against_the_measured_room() -> None:
    device = gpu(10)
    device.outside[0] = 2 * GiB  # another process
    core = pool(device, spec("x", 5), spec("y", 4))
    assert of(core.handle(Request("rx", "x", None, 0.0)), StartLoad)
    # The ledger fits both (5 + 4 = 9); the device, 2 GiB short of x's lease, does not: y waits.
    assert not of(core.handle(Request("ry", "y", None, 0.0)), StartLoad)
    device.outside[0] = 7 * GiB
    effects = core.handle(LoadDone("x", 5 * GiB, 5.0))
    assert [g.request_id for g in of(effects, Grant)] == ["rx"]
    assert not of(effects, StartLoad)
    assert StartUnload("x", "evicted:lru") in core.handle(ServeDone("rx", 6.0))


def test_measured_memory_steers_placement_to_the_device_with_room() -> None:
    device = gpu(10, 10)
    device.outside[0] = 6 * GiB
    core = pool(device, spec("x", 4))
    # Best fit by the ledger alone is device 0 (the two are equal); only device 1 has room.
    assert of(core.handle(Request("r", "x", None, 0.0)), StartLoad) == [
        StartLoad("x", 4 * GiB, (1,))
    ]
    assert core.gpu_devices() == {0, 1}


def test_memory_the_pool_cannot_free_leaves_the_decision_to_the_ledger() -> None:
    device = gpu(10)
    core = pool(device, spec("a", 2), spec("x", 4))
    ready(core, "a", 0.0)
    device.outside[0] = 8 * GiB  # evicting a (2 GiB) could not make x's 4 GiB of room
    effects = core.handle(Request("r", "x", None, 10.0))
    assert of(effects, StartLoad) == [StartLoad("x", 4 * GiB, (0,))]
    assert not of(effects, StartUnload)


def test_out_of_memory_evicts_every_idle_victim_and_retries_once() -> None:
    core = pool(gpu(10), spec("a", 2), spec("b", 2), spec("x", 3))
    ready(core, "a", 0.0)
    ready(core, "b", 1.0)
    assert of(core.handle(Request("r", "x", None, 10.0)), StartLoad)
    effects = core.handle(LoadFailed("x", OOM, 11.0, out_of_memory=True))
    assert not of(effects, Refuse)
    assert sorted(of(effects, StartUnload), key=lambda u: u.model) == [
        StartUnload("a", "evicted:oom-retry"),
        StartUnload("b", "evicted:oom-retry"),
    ]
    x = view(core, "x")
    assert (x.state, x.last_reason, x.lease_bytes) == (SlotState.IDLE, f"oom-retry: {OOM}", 0)
    assert not of(core.handle(UnloadDone("a", 12.0)), StartLoad)  # b's memory is not free yet
    assert of(core.handle(UnloadDone("b", 12.5)), StartLoad) == [StartLoad("x", 3 * GiB, (0,))]
    assert [g.request_id for g in of(core.handle(LoadDone("x", 3 * GiB, 13.0)), Grant)] == ["r"]
    assert core.stats.loads_total["oom-retry"] == 1
    assert core.stats.evictions_total["oom-retry"] == 2


def test_out_of_memory_twice_fails_with_the_reason() -> None:
    core = pool(gpu(10), spec("x", 3), cooldown_initial=10)
    core.handle(Request("r", "x", None, 0.0))
    effects = core.handle(LoadFailed("x", OOM, 1.0, out_of_memory=True))
    assert of(effects, StartLoad) == [StartLoad("x", 3 * GiB, (0,))]  # nothing to evict
    effects = core.handle(LoadFailed("x", OOM, 2.0, out_of_memory=True))
    assert of(effects, Refuse) == [Refuse("r", RejectCode.LOAD_FAILED, 10.0)]
    x = view(core, "x")
    assert (x.state, x.last_reason) == (SlotState.FAILED, f"load_failed: {OOM}")
    # After its cooldown, the next load has its one retry again.
    core.handle(Request("r2", "x", None, 12.0))
    assert of(core.handle(LoadFailed("x", OOM, 13.0, out_of_memory=True)), StartLoad)


def test_a_failure_that_is_not_out_of_memory_is_not_retried() -> None:
    core = pool(gpu(10), spec("a", 2), spec("x", 3))
    ready(core, "a", 0.0)
    core.handle(Request("r", "x", None, 10.0))
    effects = core.handle(LoadFailed("x", "weights not found", 11.0))
    assert of(effects, Refuse)[0].code is RejectCode.LOAD_FAILED
    assert not of(effects, StartUnload) and not of(effects, StartLoad)


# --- what the host tells a backend, and what it reads from a failure -------------------------


class OutOfMemoryError(RuntimeError):
    """Named as torch's is (``torch.OutOfMemoryError``): recognised without importing torch."""


def _raised_from(cause: BaseException) -> BaseException:
    try:
        raise LoadError("setup failed") from cause
    except LoadError as error:
        return error


def test_out_of_memory_is_told_by_type_text_or_cause() -> None:
    assert out_of_memory(OutOfMemoryError("Tried to allocate 2.00 GiB"))
    assert out_of_memory(MemoryError())
    assert out_of_memory(LoadError("torch.OutOfMemoryError: CUDA out of memory. Tried to ..."))
    assert out_of_memory(LoadError("cog server setup failed: RuntimeError: CUDA error: OOM"))
    assert out_of_memory(_raised_from(OutOfMemoryError("x")))
    assert not out_of_memory(LoadError("weights not found"))
    assert not out_of_memory(LoadError("the pod was OOMKilled"))  # not a load's own failure


def test_a_subprocess_is_confined_to_its_gpus_numbered_as_nvml_numbers_them() -> None:
    assert placement_env((1,)) == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert placement_env((0, 2))["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert placement_env(()) == {}


def test_the_pools_own_visible_gpus_limit_and_renumber_its_devices() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
    assert visible_gpus({}) is None
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-5d2c"}) is None  # UUIDs: every GPU


def test_an_explicit_budget_keeps_less_of_the_gpu_free_when_less_is_outside_it() -> None:
    device = gpu(10)
    core = pool(device, spec("a", 1), spec("x", 6.8), budget_bytes=int(9.5 * GiB))
    ready(core, "a", 0.0)
    device.outside[0] = int(2.5 * GiB)  # a's 1 GiB and 1.5 GiB of another process
    # 7.5 GiB free less the 0.5 GiB outside the budget (not the 10 % reserve): x fits beside a
    effects = core.handle(Request("r", "x", None, 10.0))
    assert of(effects, StartLoad) == [StartLoad("x", int(6.8 * GiB), (0,))]
    assert not of(effects, StartUnload)
