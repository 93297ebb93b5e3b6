"""What the pool core holds (slots, leases, waiters, grants) and the moves every part of it makes
on them: grant, end a waiter, start a load, unload, release, cool down, keep alive. Each move
appends the effects it implies to ``out``; none reads a clock (``now`` is the event's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.backoff import backoff_delay
from runners.pool.config import MemoryProbe, ModelSpec, PoolConfig, PoolConfigError
from runners.pool.events import AdminDone, Effect, Grant, Refuse, RejectCode, StartLoad, StartUnload
from runners.pool.eviction import Evictions, Fit
from runners.pool.leases import MemoryLedger, split
from runners.pool.placement import Placement, predicted
from runners.pool.queue import Waiter, WaitQueue
from runners.pool.slots import Slot, SlotState
from runners.pool.stats import PoolStats


@dataclass(frozen=True, slots=True)
class Granted:
    model: str
    at: float


class Moves:
    """Raises :class:`PoolConfigError` when the configuration cannot start (pins over the
    budget, ``tensor_parallel`` over the device count, a concurrency below 1)."""

    def __init__(self, config: PoolConfig, probe: MemoryProbe) -> None:
        self.config = config
        devices = probe.devices()
        budgets = {
            d.index: config.budget_bytes
            if config.budget_bytes is not None
            else int(d.total_bytes * (1 - config.reserve_fraction))
            for d in devices
        }
        if not budgets or min(budgets.values()) <= 0:
            raise PoolConfigError("the memory budget must be positive on every device")
        self.ledger = MemoryLedger(budgets)
        self.specs = {spec.name: spec for spec in config.models}
        self.slots = {
            spec.name: Slot(spec.name, pinned=spec.pinned, load_ewma=spec.load_seconds)
            for spec in config.models
        }
        for spec in config.models:
            self._check(spec, len(budgets))
        self.queue = WaitQueue(config.queue_mode, config.max_queue_depth, config.starvation_after)
        self.stats = PoolStats(window=config.thrash_window)
        self.evictions = Evictions(config, self.specs, self.slots, self.ledger, self.stats)
        self.placement = Placement(config, probe, devices, self.ledger, self.slots, self.evictions)
        self.granted: dict[str, Granted] = {}
        self.admin_unloads: dict[str, list[str]] = {}
        """Admin unloads waiting for each model's ``UnloadDone``."""
        self.reserved: set[str] = set()
        """Models that take no new grant in this pass: an aged head waits for them."""
        self._seq = 0

    def _check(self, spec: ModelSpec, devices: int) -> None:
        if spec.concurrency < 1 or not 1 <= spec.tensor_parallel <= devices:
            raise PoolConfigError(f"models.{spec.name}: concurrency or tensor_parallel")
        per = split(spec.declared_bytes, spec.tensor_parallel)
        if spec.pinned and not self.ledger.place_pin(spec.name, per, spec.tensor_parallel):
            raise PoolConfigError(f"models.{spec.name}: the pinned models exceed the budget")

    def next_seq(self) -> int:
        """The arrival order of a new waiter."""
        self._seq += 1
        return self._seq

    # --- grants and waiters -------------------------------------------------------------------

    def grantable(self, slot: Slot) -> bool:
        return (
            slot.state is SlotState.READY
            and slot.in_flight < self.specs[slot.model].concurrency
            and not slot.draining
            and slot.model not in self.reserved
        )

    def grant(self, w: Waiter, slot: Slot, now: float, out: list[Effect]) -> None:
        if w.admin:
            out.append(AdminDone(w.request_id, w.model))
            return
        slot.in_flight += 1
        slot.last_used = now
        slot.expires_at = None
        slot.keep_alive = self.ttl(w.keep_alive, self.specs[slot.model])
        self.granted[w.request_id] = Granted(slot.model, now)
        cold = max(0.0, slot.ready_at - w.arrived)  # ready since it arrived: a warm hit
        out.append(Grant(w.request_id, w.model, now - w.arrived, cold))

    def end(
        self, w: Waiter, code: RejectCode, retry_after: float | None, out: list[Effect]
    ) -> None:
        self.queue.remove(w.request_id)
        if w.admin:
            out.append(AdminDone(w.request_id, w.model, code.value))
        else:
            out.append(Refuse(w.request_id, code, retry_after))

    def fail_waiters(
        self, model: str, code: RejectCode, retry_after: float | None, out: list[Effect]
    ) -> None:
        for waiter in self.queue.ordered(math.inf):
            if waiter.model == model:
                self.end(waiter, code, retry_after, out)

    # --- keep-alive ---------------------------------------------------------------------------

    def cap(self, keep_alive: float | None) -> float | None:
        """A request's keep-alive, capped (negative: the cap)."""
        if keep_alive is None:
            return None
        cap = self.config.keep_alive_cap
        return cap if keep_alive < 0 else min(keep_alive, cap)

    def ttl(self, requested: float | None, spec: ModelSpec) -> float | None:
        """Seconds of keep-alive (None: never idle-unload): request > model > pool."""
        if requested is not None:
            return requested
        ttl = spec.keep_alive if spec.keep_alive is not None else self.config.keep_alive
        return None if ttl < 0 else ttl

    def start_keep_alive(self, slot: Slot, now: float) -> None:
        ttl = slot.keep_alive
        slot.expires_at = None if ttl is None or slot.pinned else now + ttl

    # --- loads and unloads --------------------------------------------------------------------

    def start_load(
        self, slot: Slot, spec: ModelSpec, devices: tuple[int, ...], now: float, out: list[Effect]
    ) -> None:
        per = predicted(spec, slot)
        if slot.oom_retry:
            slot.load_reason = "oom-retry"
            slot.oom_retry, slot.oom_retried = False, True
        slot.to(SlotState.LOADING, f"load:{slot.load_reason}", now)
        slot.devices = devices
        slot.lease_bytes = per
        slot.load_started = now
        slot.keep_alive = self.ttl(None, spec)
        self.ledger.take(slot.model, devices, per)
        self.stats.load_started(slot.load_reason, now)
        slot.load_reason = "request"
        out.append(StartLoad(slot.model, per, devices))

    def unload(
        self, slot: Slot, reason: str, eviction: str | None, now: float, out: list[Effect]
    ) -> None:
        slot.to(SlotState.STOPPING, reason, now)
        slot.expires_at = None
        self.stats.unloads_total[reason] += 1
        if eviction is not None:
            self.stats.evictions_total[eviction] += 1
        out.append(StartUnload(slot.model, reason))

    def release(self, slot: Slot) -> None:
        self.ledger.release(slot.model)
        slot.devices = ()
        slot.lease_bytes = 0
        slot.expires_at = None

    def drain(self, slot: Slot) -> None:
        """No new grants: an admin unload (or evict) waits for its requests to end."""
        if slot.state in (SlotState.READY, SlotState.LOADING):
            slot.draining = True

    def cool_down(self, slot: Slot, now: float, out: list[Effect]) -> None:
        slot.oom_retry = slot.oom_retried = False
        slot.failures += 1
        cooldown = backoff_delay(
            slot.failures - 1, initial=self.config.cooldown_initial, cap=self.config.cooldown_max
        )
        slot.cooldown_until = now + cooldown
        self.fail_waiters(slot.model, RejectCode.LOAD_FAILED, cooldown, out)

    def make_room(
        self, slot: Slot, devices: tuple[int, ...], now: float, out: list[Effect]
    ) -> bool:
        """Before the one retry of a load that ran out of memory: unload every idle victim on
        its devices. True while memory there is still being freed (the load waits for it)."""
        for victim in self.evictions.idle_victims(slot.model, devices, now):
            self.unload(self.slots[victim], "evicted:oom-retry", "oom-retry", now, out)
        return any(self.evictions.stopping_bytes(device) for device in devices)

    def reconcile(self, slot: Slot, now: float, out: list[Effect]) -> None:
        """After a load: lease = observed. Over a device's ceiling, it can never fit; over the
        budget, evict idle victims for the excess, else unload it to reload at its true size."""
        plan = self.evictions.reconcile(slot, now)
        if plan.fit is Fit.TOO_LARGE:
            self.unload(slot, "too_large", "too_large", now, out)
            self.fail_waiters(slot.model, RejectCode.MODEL_TOO_LARGE, None, out)
        elif plan.fit is Fit.RELOAD:
            slot.load_reason = "oom-retry"
            self.unload(slot, "oom-retry", "oom-retry", now, out)
        for victim in plan.victims:
            self.unload(self.slots[victim], "evicted:reconcile", "reconcile", now, out)
