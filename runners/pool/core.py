"""The model pool's scheduler: one object owns every slot, lease, waiter and timer.

The host process (one asyncio task) feeds it :data:`~runners.pool.events.Event`s through
:meth:`PoolCore.handle` and carries out the :data:`~runners.pool.events.Effect`s it returns, in
order. It never blocks, never reads a clock and never locks: each call runs to completion.

Every request ends exactly once: ``Grant`` then the host's ``ServeDone``, a ``Reject``, or the
caller's ``Cancel`` while queued (no effect). After each event the core runs one scheduling
pass: cooldowns that ended, deadlines that passed, loads past their deadline, then the queue
in order (grant, join a load, wait, or plan memory for a load), then draining and keep-alive
unloads; finally it arms the one timer at the next instant anything could change.

Memory: a load leases max(declared, last observed peak) per device at decision time, and is
started only when the lease fits beside every other lease (LOADING, READY, STOPPING) and the
room reserved for pins. Otherwise the first request that needs memory (the "head") plans a
minimal victim set: victims idle now are unloaded and the load waits for their ``UnloadDone``;
busy or young victims are waited for (no force-eviction) until the head's deadline, and once
the head has waited ``starvation_after`` they get no new grants. Loads behind the head wait
(nothing overtakes it for memory), while requests for READY models are still granted at once.

On a GPU the probe reads live (:attr:`DeviceMemory.gpu`), the ledger is not the only word: a
load must also fit the device's measured free memory, less the reserve and the leases of loads
still under way. Memory the ledger does not know of (a cache a model left behind, another
process) counts as taken, so the head evicts for it as for a lease. When even evicting every
candidate could not make that room and no load under way can change it, the ledger decides (the
memory is not the pool's to free). A load that fails out of memory anyway is retried once, after
every idle victim on its devices is unloaded; a second failure fails its waiters.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from runners.pool.config import (
    DeviceMemory,
    MemoryProbe,
    ModelSpec,
    PoolConfig,
    PoolConfigError,
    QueueMode,
)
from runners.pool.events import (
    AdminDone,
    AdminLoad,
    AdminUnload,
    ArmTimer,
    Cancel,
    Effect,
    Event,
    Grant,
    LoadDone,
    LoadFailed,
    Pin,
    Reject,
    RejectCode,
    Request,
    ServeDone,
    Start,
    StartLoad,
    StartUnload,
    Tick,
    UnloadDone,
)
from runners.pool.eviction import Candidate, choose
from runners.pool.leases import Ledger, split
from runners.pool.queue import Waiter, WaitQueue
from runners.pool.slots import IllegalTransition, Slot, SlotState
from runners.pool.stats import PoolStats


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot as the capabilities list and the metrics show it."""

    model: str
    state: SlotState
    pinned: bool
    devices: tuple[int, ...]
    lease_bytes: int
    """Per device; 0 when the slot holds no memory."""
    observed_bytes: int | None
    in_flight: int
    last_used: float
    expires_at: float | None
    load_ewma: float
    last_state: SlotState
    last_reason: str
    """Why the last transition happened: ``loaded``, ``ttl``, ``evicted:lru``, ``admin``…"""
    last_at: float
    cooldown_until: float | None


class _Status(enum.Enum):
    DONE = "done"
    """Granted or ended."""
    WAITING = "waiting"
    """Joins a load, waits for a permit or an unload of its own model."""
    BLOCKED = "blocked"
    """Needs memory that is not free yet: the head of the memory line."""


@dataclass(frozen=True, slots=True)
class _Plan:
    devices: tuple[int, ...]
    tier: int
    """0: fits now; 1: waits for unloads already under way; 2: victims idle now;
    3: victims busy or young (waited for); 4: no victim set yet (loads under way)."""
    victims: tuple[str, ...]


_WAIT_LOADS = 4
_BEHIND = 1 << 62
"""The cost of a device that fits only by the ledger: any device with measured room first."""


@dataclass(frozen=True, slots=True)
class _Granted:
    model: str
    at: float


class PoolCore:
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
        self._ledger = Ledger(budgets)
        self._probe = probe
        self._gpus = frozenset(d.index for d in devices if d.gpu)
        self._headroom = {d.index: _headroom(d, budgets[d.index], config) for d in devices}
        self._reading: dict[int, int] | None = None
        """Measured free bytes of each GPU, read once per event when a load is planned."""
        self._specs = {spec.name: spec for spec in config.models}
        self._slots = {
            spec.name: Slot(spec.name, pinned=spec.pinned, load_ewma=spec.load_seconds)
            for spec in config.models
        }
        for spec in config.models:
            self._check(spec, len(budgets))
        self._queue = WaitQueue(config.queue_mode, config.max_queue_depth, config.starvation_after)
        self._granted: dict[str, _Granted] = {}
        self._admin_unloads: dict[str, list[str]] = {}
        self._reserved: set[str] = set()
        self._started = False
        self._seq = 0
        self._timer: float | None = None
        self.stats = PoolStats(window=config.thrash_window)

    def _check(self, spec: ModelSpec, devices: int) -> None:
        if spec.concurrency < 1 or not 1 <= spec.tensor_parallel <= devices:
            raise PoolConfigError(f"models.{spec.name}: concurrency or tensor_parallel")
        per = split(spec.declared_bytes, spec.tensor_parallel)
        if spec.pinned and not self._ledger.place_pin(spec.name, per, spec.tensor_parallel):
            raise PoolConfigError(f"models.{spec.name}: the pinned models exceed the budget")

    # --- public -------------------------------------------------------------------------------

    def handle(self, event: Event) -> list[Effect]:
        out: list[Effect] = []
        self._reading = None
        if self._timer is not None and event.now >= self._timer:
            self._timer = None
        self._apply(event, out)
        self._schedule(event.now, out)
        self._arm(event.now, out)
        return out

    def slots(self) -> list[SlotView]:
        return [self._view(slot) for slot in self._slots.values()]

    def budgets(self) -> dict[int, int]:
        return dict(self._ledger.budgets)

    def gpu_devices(self) -> frozenset[int]:
        """The devices that are GPUs: a model placed there is told which."""
        return self._gpus

    def used(self, device: int) -> int:
        """Bytes leased on ``device`` (LOADING, READY and STOPPING slots)."""
        return self._ledger.used(device)

    def queued(self) -> int:
        return len(self._queue)

    def waiting(self, request_id: str) -> bool:
        """True while the request (or admin load) is queued, not yet granted nor ended."""
        return request_id in self._queue

    def _view(self, slot: Slot) -> SlotView:
        return SlotView(
            model=slot.model,
            state=slot.state,
            pinned=slot.pinned,
            devices=slot.devices,
            lease_bytes=slot.lease_bytes,
            observed_bytes=slot.observed_bytes,
            in_flight=slot.in_flight,
            last_used=slot.last_used,
            expires_at=slot.expires_at,
            load_ewma=slot.load_ewma,
            last_state=slot.last.state,
            last_reason=slot.last.reason,
            last_at=slot.last.at,
            cooldown_until=slot.cooldown_until if slot.state is SlotState.FAILED else None,
        )

    # --- events -------------------------------------------------------------------------------

    def _apply(self, event: Event, out: list[Effect]) -> None:
        match event:
            case Request():
                self._on_request(event, out)
            case Cancel():
                self._queue.remove(event.request_id)
            case ServeDone():
                self._on_serve_done(event)
            case LoadDone():
                self._on_load_done(event, out)
            case LoadFailed():
                self._on_load_failed(event, out)
            case UnloadDone():
                self._on_unload_done(event, out)
            case Start():
                self._started = True
            case Tick():
                pass
            case _:
                self._apply_admin(event, out)

    def _apply_admin(self, event: Event, out: list[Effect]) -> None:
        match event:
            case AdminLoad():
                self._on_admin_load(event, out)
            case AdminUnload():
                self._on_admin_unload(event, out)
            case Pin():
                self._on_pin(event, out)

    def _on_request(self, e: Request, out: list[Effect]) -> None:
        self.stats.request(e.model, e.now)
        spec = self._specs.get(e.model)
        if spec is None:
            out.append(Reject(e.request_id, RejectCode.UNKNOWN_MODEL))
            return
        slot = self._slots[e.model]
        if self._too_large(spec, slot):
            out.append(Reject(e.request_id, RejectCode.MODEL_TOO_LARGE))
            return
        if slot.state is SlotState.FAILED and e.now < slot.cooldown_until:
            out.append(Reject(e.request_id, RejectCode.COOLDOWN, slot.cooldown_until - e.now))
            return
        self._seq += 1
        waiter = Waiter(
            e.request_id, e.model, e.deadline, e.priority, e.now, self._seq, self._cap(e.keep_alive)
        )
        warm = self.config.queue_mode is QueueMode.WARM or not len(self._queue)
        if warm and self._grantable(slot):
            self._grant(waiter, slot, e.now, out)
        elif self._queue.full():
            out.append(
                Reject(e.request_id, RejectCode.QUEUE_FULL, self.config.queue_full_retry_after)
            )
        else:
            self._queue.add(waiter)

    def _cap(self, keep_alive: float | None) -> float | None:
        if keep_alive is None:
            return None
        cap = self.config.keep_alive_cap
        return cap if keep_alive < 0 else min(keep_alive, cap)

    def _on_serve_done(self, e: ServeDone) -> None:
        granted = self._granted.pop(e.request_id, None)
        if granted is None:
            return
        slot = self._slots[granted.model]
        slot.in_flight -= 1
        slot.runs.append(e.now - granted.at)
        slot.last_used = e.now
        if slot.in_flight == 0:
            self._start_keep_alive(slot, e.now)

    def _start_keep_alive(self, slot: Slot, now: float) -> None:
        ttl = slot.keep_alive
        slot.expires_at = None if ttl is None or slot.pinned else now + ttl

    def _on_load_done(self, e: LoadDone, out: list[Effect]) -> None:
        slot = self._slots[e.model]
        if slot.state is SlotState.STOPPING:
            return  # a load past its deadline, already being stopped
        slot.to(SlotState.READY, "loaded", e.now)
        seconds = e.now - slot.load_started
        alpha = self.config.load_ewma_alpha
        slot.load_ewma = alpha * seconds + (1 - alpha) * slot.load_ewma if slot.loads else seconds
        slot.loads += 1
        self.stats.load_seconds.append(seconds)
        slot.observed_bytes = e.observed_bytes
        slot.peak_bytes = max(slot.peak_bytes, e.observed_bytes)
        slot.lease_bytes = split(e.observed_bytes, len(slot.devices))
        self._ledger.take(slot.model, slot.devices, slot.lease_bytes)
        slot.ready_at = slot.last_used = e.now
        slot.failures = 0
        slot.oom_retry = slot.oom_retried = False
        self._start_keep_alive(slot, e.now)
        self._reconcile(slot, e.now, out)

    def _on_load_failed(self, e: LoadFailed, out: list[Effect]) -> None:
        slot = self._slots[e.model]
        if slot.state is SlotState.STOPPING:
            return
        if e.out_of_memory and not slot.oom_retried:
            # Its waiters stay queued: the next pass makes room, then loads it once more.
            slot.to(SlotState.IDLE, f"oom-retry: {e.error}", e.now)
            self._release(slot)
            slot.oom_retry = True
            return
        slot.to(SlotState.FAILED, f"load_failed: {e.error}", e.now)
        self._release(slot)
        self._cool_down(slot, e.now, out)

    def _cool_down(self, slot: Slot, now: float, out: list[Effect]) -> None:
        slot.oom_retry = slot.oom_retried = False
        slot.failures += 1
        cooldown = min(
            self.config.cooldown_initial * 2 ** (slot.failures - 1), self.config.cooldown_max
        )
        slot.cooldown_until = now + cooldown
        self._fail_waiters(slot.model, RejectCode.LOAD_FAILED, cooldown, out)

    def _on_unload_done(self, e: UnloadDone, out: list[Effect]) -> None:
        slot = self._slots[e.model]
        if slot.state is not SlotState.STOPPING:  # LOADING -> IDLE is an out-of-memory retry's
            raise IllegalTransition(slot.model, slot.state, SlotState.IDLE)
        failed = slot.fail_after_stop
        slot.to(SlotState.FAILED if failed else SlotState.IDLE, "unloaded", e.now)
        self._release(slot)
        slot.draining = slot.fail_after_stop = False
        if failed:
            self._cool_down(slot, e.now, out)
        for op_id in self._admin_unloads.pop(slot.model, []):
            out.append(AdminDone(op_id, slot.model))

    def _release(self, slot: Slot) -> None:
        self._ledger.release(slot.model)
        slot.devices = ()
        slot.lease_bytes = 0
        slot.expires_at = None

    # --- admin --------------------------------------------------------------------------------

    def _on_admin_load(self, e: AdminLoad, out: list[Effect]) -> None:
        error = self._admin_error(e.model) or (self._admin_error(e.evict) if e.evict else None)
        if error is None and e.evict and self._slots[e.evict].pinned:
            error = "pinned"
        spec = self._specs.get(e.model)
        if error is None and spec is not None and self._too_large(spec, self._slots[e.model]):
            error = RejectCode.MODEL_TOO_LARGE.value
        if error is not None:
            out.append(AdminDone(e.op_id, e.model, error))
            return
        if e.evict:
            self._drain(self._slots[e.evict])
        if self._slots[e.model].state is SlotState.READY:
            out.append(AdminDone(e.op_id, e.model))
            return
        self._seq += 1
        self._queue.add(Waiter(e.op_id, e.model, None, 0, e.now, self._seq, None, admin=True))

    def _admin_error(self, model: str) -> str | None:
        return None if model in self._specs else RejectCode.UNKNOWN_MODEL.value

    def _drain(self, slot: Slot) -> None:
        if slot.state in (SlotState.READY, SlotState.LOADING):
            slot.draining = True

    def _on_admin_unload(self, e: AdminUnload, out: list[Effect]) -> None:
        error = self._admin_error(e.model)
        if error is None and self._slots[e.model].pinned:
            error = "pinned"
        if error is not None:
            out.append(AdminDone(e.op_id, e.model, error))
            return
        slot = self._slots[e.model]
        if slot.state in (SlotState.IDLE, SlotState.FAILED):
            out.append(AdminDone(e.op_id, e.model))
            return
        self._drain(slot)
        self._admin_unloads.setdefault(e.model, []).append(e.op_id)

    def _on_pin(self, e: Pin, out: list[Effect]) -> None:
        error = self._admin_error(e.model)
        if error is None and e.pinned:
            spec, slot = self._specs[e.model], self._slots[e.model]
            per = self._predicted(spec, slot)
            if not self._ledger.place_pin(e.model, per, spec.tensor_parallel):
                error = "pins_exceed_budget"
        if error is None:
            slot = self._slots[e.model]
            slot.pinned = e.pinned
            if not e.pinned:
                self._ledger.unpin(e.model)
            if slot.state is SlotState.READY and slot.in_flight == 0:
                self._start_keep_alive(slot, e.now)
        out.append(AdminDone(e.op_id, e.model, error))

    # --- the scheduling pass ------------------------------------------------------------------

    def _schedule(self, now: float, out: list[Effect]) -> None:
        self._end_cooldowns(now)
        self._expire_waiters(now, out)
        self._expire_loads(now, out)
        self._unload_drained(now, out)
        self._load_pinned(now, out)
        self._dispatch(now, out)
        self._unload_drained(now, out)
        self._expire_keep_alive(now, out)

    def _end_cooldowns(self, now: float) -> None:
        for slot in self._slots.values():
            if slot.state is SlotState.FAILED and now >= slot.cooldown_until:
                slot.to(SlotState.IDLE, "cooldown_over", now)

    def _expire_waiters(self, now: float, out: list[Effect]) -> None:
        for waiter in self._queue.ordered(now):
            if waiter.deadline is not None and now >= waiter.deadline:
                self._end(waiter, RejectCode.DEADLINE_EXCEEDED, None, out)

    def _expire_loads(self, now: float, out: list[Effect]) -> None:
        for slot in self._slots.values():
            timeout = self._specs[slot.model].load_timeout
            if slot.state is SlotState.LOADING and now >= slot.load_started + timeout:
                slot.fail_after_stop = True
                self._unload(slot, "load_timeout", None, now, out)
                self._fail_waiters(slot.model, RejectCode.LOAD_FAILED, None, out)

    def _load_pinned(self, now: float, out: list[Effect]) -> None:
        """Pinned models are loaded at ``Start`` and again whenever they fall IDLE."""
        if not self._started:
            return
        for slot in self._slots.values():
            if not slot.pinned or slot.state is not SlotState.IDLE:
                continue
            spec = self._specs[slot.model]
            plan = self._plan(spec, slot, now)
            if plan is not None and plan.tier == 0:
                if slot.oom_retry and self._make_room(slot, plan.devices, now, out):
                    continue
                slot.load_reason = "pin"
                self._start_load(slot, spec, plan.devices, now, out)

    def _dispatch(self, now: float, out: list[Effect]) -> None:
        self._reserved = set()
        head_blocked = False
        for waiter in self._queue.ordered(now):
            status = self._serve(waiter, now, out, head_blocked)
            head_blocked = head_blocked or status is _Status.BLOCKED
            if status is not _Status.DONE and self.config.queue_mode is QueueMode.FIFO:
                break

    def _serve(self, w: Waiter, now: float, out: list[Effect], head_blocked: bool) -> _Status:
        slot = self._slots[w.model]
        if slot.state is SlotState.READY:
            if not (w.admin or self._grantable(slot)):
                return _Status.WAITING
            self._queue.remove(w.request_id)
            self._grant(w, slot, now, out)
            return _Status.DONE
        if slot.state is SlotState.FAILED:
            self._end(w, RejectCode.COOLDOWN, slot.cooldown_until - now, out)
            return _Status.DONE
        if slot.state is not SlotState.IDLE or head_blocked:
            return _Status.WAITING
        return self._load_for(w, slot, now, out)

    def _load_for(self, w: Waiter, slot: Slot, now: float, out: list[Effect]) -> _Status:
        spec = self._specs[w.model]
        if w.deadline is not None and w.deadline - now < slot.load_ewma + slot.run_p50():
            self._end(w, RejectCode.DEADLINE_UNMEETABLE, None, out)
            return _Status.DONE
        plan = self._plan(spec, slot, now)
        if plan is None:
            self._end(w, RejectCode.MODEL_TOO_LARGE, None, out)
            return _Status.DONE
        if plan.tier == 0:
            if slot.oom_retry and self._make_room(slot, plan.devices, now, out):
                return _Status.BLOCKED
            if w.admin and slot.load_reason == "request":
                slot.load_reason = "admin"
            self._start_load(slot, spec, plan.devices, now, out)
            return _Status.WAITING
        if plan.tier <= 2:
            for victim in plan.victims:
                reason = self.config.policy.value
                self._unload(self._slots[victim], f"evicted:{reason}", reason, now, out)
        elif self._queue.aged(w, now):
            self._reserved.update(plan.victims)
        return _Status.BLOCKED

    def _grantable(self, slot: Slot) -> bool:
        return (
            slot.state is SlotState.READY
            and slot.in_flight < self._specs[slot.model].concurrency
            and not slot.draining
            and slot.model not in self._reserved
        )

    def _grant(self, w: Waiter, slot: Slot, now: float, out: list[Effect]) -> None:
        if w.admin:
            out.append(AdminDone(w.request_id, w.model))
            return
        slot.in_flight += 1
        slot.last_used = now
        slot.expires_at = None
        slot.keep_alive = self._ttl(w.keep_alive, self._specs[slot.model])
        self._granted[w.request_id] = _Granted(slot.model, now)
        cold = max(0.0, slot.ready_at - w.arrived)  # ready since it arrived: a warm hit
        out.append(Grant(w.request_id, w.model, now - w.arrived, cold))

    def _ttl(self, requested: float | None, spec: ModelSpec) -> float | None:
        """Seconds of keep-alive (None: never idle-unload): request > model > pool."""
        if requested is not None:
            return requested
        ttl = spec.keep_alive if spec.keep_alive is not None else self.config.keep_alive
        return None if ttl < 0 else ttl

    def _end(
        self, w: Waiter, code: RejectCode, retry_after: float | None, out: list[Effect]
    ) -> None:
        self._queue.remove(w.request_id)
        if w.admin:
            out.append(AdminDone(w.request_id, w.model, code.value))
        else:
            out.append(Reject(w.request_id, code, retry_after))

    def _fail_waiters(
        self, model: str, code: RejectCode, retry_after: float | None, out: list[Effect]
    ) -> None:
        for waiter in self._queue.ordered(math.inf):
            if waiter.model == model:
                self._end(waiter, code, retry_after, out)

    def _unload_drained(self, now: float, out: list[Effect]) -> None:
        for slot in self._slots.values():
            if slot.draining and slot.state is SlotState.READY and slot.in_flight == 0:
                self._unload(slot, "admin", "admin", now, out)

    def _expire_keep_alive(self, now: float, out: list[Effect]) -> None:
        for slot in self._slots.values():
            expires = slot.expires_at
            if (
                slot.state is SlotState.READY
                and slot.in_flight == 0
                and not slot.pinned
                and expires is not None
                and now >= expires
                and not self._queue.for_model(slot.model)
            ):
                self._unload(slot, "ttl", None, now, out)

    # --- loads, unloads, memory ---------------------------------------------------------------

    def _start_load(
        self, slot: Slot, spec: ModelSpec, devices: tuple[int, ...], now: float, out: list[Effect]
    ) -> None:
        per = self._predicted(spec, slot)
        if slot.oom_retry:
            slot.load_reason = "oom-retry"
            slot.oom_retry, slot.oom_retried = False, True
        slot.to(SlotState.LOADING, f"load:{slot.load_reason}", now)
        slot.devices = devices
        slot.lease_bytes = per
        slot.load_started = now
        slot.keep_alive = self._ttl(None, spec)
        self._ledger.take(slot.model, devices, per)
        self.stats.load_started(slot.load_reason, now)
        slot.load_reason = "request"
        out.append(StartLoad(slot.model, per, devices))

    def _unload(
        self, slot: Slot, reason: str, eviction: str | None, now: float, out: list[Effect]
    ) -> None:
        slot.to(SlotState.STOPPING, reason, now)
        slot.expires_at = None
        self.stats.unloads_total[reason] += 1
        if eviction is not None:
            self.stats.evictions_total[eviction] += 1
        out.append(StartUnload(slot.model, reason))

    def _predicted(self, spec: ModelSpec, slot: Slot) -> int:
        """Per device: max(declared, last observed peak) over its ``tensor_parallel`` devices."""
        return split(max(spec.declared_bytes, slot.peak_bytes), spec.tensor_parallel)

    def _devices_for(self, slot: Slot) -> list[int]:
        home = self._ledger.home(slot.model) if slot.pinned else None
        return list(home.devices) if home else list(self._ledger.budgets)

    def _too_large(self, spec: ModelSpec, slot: Slot) -> bool:
        per = self._predicted(spec, slot)
        fitting = [d for d in self._devices_for(slot) if self._ledger.ceiling(d, slot.model) >= per]
        return len(fitting) < spec.tensor_parallel

    def _plan(self, spec: ModelSpec, slot: Slot, now: float) -> _Plan | None:
        """Where the load goes: the ``tensor_parallel`` best devices (fits now, best fit; then
        the fewest bytes to evict), never fewer; None when it can never fit."""
        per = self._predicted(spec, slot)
        options = []
        for device in self._devices_for(slot):
            option = self._device_option(device, slot.model, per, now)
            if option is not None:
                options.append((option[0], option[1], device, option[2]))
        if len(options) < spec.tensor_parallel:
            return None
        chosen = sorted(options, key=lambda o: o[:3])[: spec.tensor_parallel]
        victims = tuple(dict.fromkeys(v for o in chosen for v in o[3]))
        return _Plan(tuple(sorted(o[2] for o in chosen)), max(o[0] for o in chosen), victims)

    def _device_option(
        self, device: int, model: str, per: int, now: float
    ) -> tuple[int, int, tuple[str, ...]] | None:
        """(tier, cost, victims) of placing ``per`` bytes on ``device`` (see :class:`_Plan`):
        within the ledger and, on a GPU, the device's measured room."""
        if self._ledger.ceiling(device, model) < per:
            return None
        ledger = self._ledger.free_for(device, model)
        room = self._room(device)
        option = self._option(device, model, per, min(ledger, room), now)
        if option[0] == _WAIT_LOADS and room < ledger and not self._loading_on(device):
            # Memory outside the ledger holds more than evicting could free, and no load under
            # way will change that: the ledger decides (an out-of-memory load is retried once).
            option = self._option(device, model, per, ledger, now)
            if option[0] == 0:
                option = (0, _BEHIND, ())
        return option

    def _option(
        self, device: int, model: str, per: int, free: int, now: float
    ) -> tuple[int, int, tuple[str, ...]]:
        if free >= per:
            return (0, free - per, ())
        deficit = per - free - self._stopping_bytes(device)
        if deficit <= 0:
            return (1, 0, ())
        try:
            victims = choose(self._candidates(device, model, now), deficit, self.config.policy)
        except LookupError:
            return (_WAIT_LOADS, deficit, ())
        tier = 2 if all(v.evictable_now for v in victims) else 3
        return (tier, sum(v.bytes_freed for v in victims), tuple(v.model for v in victims))

    def _room(self, device: int) -> int:
        """What the device can still take by measure: its free memory less the reserve and
        the leases of loads under way (their memory is not all taken yet); unbounded where
        nothing is measured."""
        free = self._measured().get(device)
        if free is None:
            return _BEHIND
        return free - self._headroom[device] - self._loading_bytes(device)

    def _measured(self) -> dict[int, int]:
        if self._reading is None:
            self._reading = {}
            if self._gpus:
                try:
                    devices = self._probe.devices()
                except Exception:  # no reading this time: the ledger alone decides
                    devices = []
                self._reading = {d.index: d.free_bytes for d in devices if d.index in self._gpus}
        return self._reading

    def _loading_bytes(self, device: int) -> int:
        return sum(
            s.lease_bytes
            for s in self._slots.values()
            if s.state is SlotState.LOADING and device in s.devices
        )

    def _loading_on(self, device: int) -> bool:
        return any(
            s.state is SlotState.LOADING and device in s.devices for s in self._slots.values()
        )

    def _make_room(
        self, slot: Slot, devices: tuple[int, ...], now: float, out: list[Effect]
    ) -> bool:
        """Before the one retry of a load that ran out of memory: unload every idle victim on
        its devices. True while memory there is still being freed (the load waits for it)."""
        victims = {
            c.model
            for device in devices
            for c in self._candidates(device, slot.model, now)
            if c.evictable_now
        }
        for victim in sorted(victims):
            self._unload(self._slots[victim], "evicted:oom-retry", "oom-retry", now, out)
        return any(self._stopping_bytes(device) for device in devices)

    def _stopping_bytes(self, device: int) -> int:
        return sum(
            s.lease_bytes
            for s in self._slots.values()
            if s.state is SlotState.STOPPING and device in s.devices
        )

    def _candidates(self, device: int, model: str, now: float) -> list[Candidate]:
        """READY, unpinned slots on ``device`` other than ``model``; idle and resident for
        ``min_resident`` ones are evictable now, the others only after waiting."""
        return [
            Candidate(
                model=s.model,
                bytes_freed=s.lease_bytes,
                priority=self._specs[s.model].priority,
                last_used=s.last_used,
                cost=s.load_ewma * self.stats.recent_requests(s.model, now),
                evictable_now=s.in_flight == 0
                and s.resident_since(now) >= self.config.min_resident,
            )
            for s in self._slots.values()
            if s.model != model
            and not s.pinned
            and s.state is SlotState.READY
            and device in s.devices
        ]

    def _reconcile(self, slot: Slot, now: float, out: list[Effect]) -> None:
        """After a load: lease = observed. Over a device's ceiling, it can never fit; over the
        budget, evict idle victims for the excess, else unload it to reload at its true size."""
        if any(self._ledger.ceiling(d, slot.model) < slot.lease_bytes for d in slot.devices):
            self._unload(slot, "too_large", "too_large", now, out)
            self._fail_waiters(slot.model, RejectCode.MODEL_TOO_LARGE, None, out)
            return
        victims: dict[str, None] = {}
        for device in slot.devices:
            excess = -self._ledger.free_for(device, slot.model) - self._stopping_bytes(device)
            idle = [c for c in self._candidates(device, slot.model, now) if c.evictable_now]
            try:
                chosen = choose(idle, excess, self.config.policy)
            except LookupError:
                slot.load_reason = "oom-retry"
                self._unload(slot, "oom-retry", "oom-retry", now, out)
                return
            victims.update(dict.fromkeys(c.model for c in chosen))
        for victim in victims:
            self._unload(self._slots[victim], "evicted:reconcile", "reconcile", now, out)

    # --- the timer ----------------------------------------------------------------------------

    def _arm(self, now: float, out: list[Effect]) -> None:
        times = self._queue.wakeups(now)
        for slot in self._slots.values():
            times += self._slot_wakeups(slot)
        ahead = [t for t in times if t > now]
        if ahead and min(ahead) != self._timer:
            self._timer = min(ahead)
            out.append(ArmTimer(self._timer))

    def _slot_wakeups(self, slot: Slot) -> list[float]:
        if slot.state is SlotState.LOADING:
            return [slot.load_started + self._specs[slot.model].load_timeout]
        if slot.state is SlotState.FAILED:
            return [slot.cooldown_until]
        if slot.state is not SlotState.READY:
            return []
        times = [slot.ready_at + self.config.min_resident] if len(self._queue) else []
        if slot.expires_at is not None and slot.in_flight == 0 and not slot.pinned:
            times.append(slot.expires_at)
        return times


def _headroom(device: DeviceMemory, budget: int, config: PoolConfig) -> int:
    """What a GPU keeps free by measure: the reserve, or less where an explicit budget leaves
    less of the device outside it."""
    reserve = int(device.total_bytes * config.reserve_fraction)
    return max(0, min(reserve, device.total_bytes - budget))
