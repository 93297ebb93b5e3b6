"""The model pool's scheduler: one object owns every slot, lease, waiter and timer.

The host process (one asyncio task) feeds it :data:`~runners.pool.events.Event`s through
:meth:`PoolCore.handle` and carries out the :data:`~runners.pool.events.Effect`s it returns, in
order. It never blocks, never reads a clock and never locks: each call runs to completion.

Every request ends exactly once: ``Grant`` then the host's ``ServeDone``, a ``Refuse``, or the
caller's ``Cancel`` while queued (no effect). After each event the core runs one scheduling
pass (:mod:`runners.pool.scheduling`) and arms the one timer at the next instant anything
could change.

Its parts: what it holds and the moves it makes (:mod:`runners.pool.moves`), where a load goes
and the GPUs' measured memory (:mod:`runners.pool.placement`), which models are unloaded for
it (:mod:`runners.pool.eviction`), the pass (:mod:`runners.pool.scheduling`). This module
applies each event to them. A load that fails out of memory is retried once, after every idle
victim on its devices is unloaded; a second failure fails its waiters.
"""

from __future__ import annotations

from core.shell import Tick
from runners.pool.config import MemoryProbe, PoolConfig, QueueMode
from runners.pool.events import (
    AdminDone,
    AdminLoad,
    AdminUnload,
    Cancel,
    Effect,
    Event,
    LoadDone,
    LoadFailed,
    Pin,
    Refuse,
    RejectCode,
    Request,
    ServeDone,
    Start,
    UnloadDone,
)
from runners.pool.leases import split
from runners.pool.moves import Moves
from runners.pool.placement import predicted
from runners.pool.queue import Waiter
from runners.pool.scheduling import SchedulingPass
from runners.pool.slots import IllegalTransition, SlotState, SlotView

__all__ = ["PoolCore", "SlotView"]


class PoolCore:
    """Raises :class:`~runners.pool.config.PoolConfigError` when the configuration cannot start
    (pins over the budget, ``tensor_parallel`` over the device count, a concurrency below 1)."""

    def __init__(self, config: PoolConfig, probe: MemoryProbe) -> None:
        self.config = config
        self._m = Moves(config, probe)
        self._pass = SchedulingPass(self._m)
        self.stats = self._m.stats

    # --- public -------------------------------------------------------------------------------

    def handle(self, event: Event) -> list[Effect]:
        out: list[Effect] = []
        self._m.placement.forget_reading()
        self._pass.timer_passed(event.now)
        self._apply(event, out)
        self._pass.run(event.now, out)
        self._pass.arm(event.now, out)
        return out

    def slots(self) -> list[SlotView]:
        return [SlotView.of(slot) for slot in self._m.slots.values()]

    def budgets(self) -> dict[int, int]:
        return dict(self._m.ledger.budgets)

    def gpu_devices(self) -> frozenset[int]:
        """The devices that are GPUs: a model placed there is told which."""
        return self._m.placement.gpus

    def used(self, device: int) -> int:
        """Bytes leased on ``device`` (LOADING, READY and STOPPING slots)."""
        return self._m.ledger.used(device)

    def queued(self) -> int:
        return len(self._m.queue)

    def waiting(self, request_id: str) -> bool:
        """True while the request (or admin load) is queued, not yet granted nor ended."""
        return request_id in self._m.queue

    # --- events -------------------------------------------------------------------------------

    def _apply(self, event: Event, out: list[Effect]) -> None:
        match event:
            case Request():
                self._on_request(event, out)
            case Cancel():
                self._m.queue.remove(event.request_id)
            case ServeDone():
                self._on_serve_done(event)
            case LoadDone():
                self._on_load_done(event, out)
            case LoadFailed():
                self._on_load_failed(event, out)
            case UnloadDone():
                self._on_unload_done(event, out)
            case Start():
                self._pass.started = True
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
        m = self._m
        m.stats.request(e.model, e.now)
        spec = m.specs.get(e.model)
        if spec is None:
            out.append(Refuse(e.request_id, RejectCode.UNKNOWN_MODEL))
            return
        slot = m.slots[e.model]
        if m.placement.too_large(spec, slot):
            out.append(Refuse(e.request_id, RejectCode.MODEL_TOO_LARGE))
            return
        if slot.state is SlotState.FAILED and e.now < slot.cooldown_until:
            out.append(Refuse(e.request_id, RejectCode.COOLDOWN, slot.cooldown_until - e.now))
            return
        waiter = Waiter(
            e.request_id, e.model, e.deadline, e.priority, e.now, m.next_seq(), m.cap(e.keep_alive)
        )
        warm = self.config.queue_mode is QueueMode.WARM or not len(m.queue)
        if warm and m.grantable(slot):
            m.grant(waiter, slot, e.now, out)
        elif m.queue.full():
            out.append(
                Refuse(e.request_id, RejectCode.QUEUE_FULL, self.config.queue_full_retry_after)
            )
        else:
            m.queue.add(waiter)

    def _on_serve_done(self, e: ServeDone) -> None:
        granted = self._m.granted.pop(e.request_id, None)
        if granted is None:
            return
        slot = self._m.slots[granted.model]
        slot.in_flight -= 1
        slot.runs.append(e.now - granted.at)
        slot.last_used = e.now
        if slot.in_flight == 0:
            self._m.start_keep_alive(slot, e.now)

    def _on_load_done(self, e: LoadDone, out: list[Effect]) -> None:
        m = self._m
        slot = m.slots[e.model]
        if slot.state is SlotState.STOPPING:
            return  # a load past its deadline, already being stopped
        slot.to(SlotState.READY, "loaded", e.now)
        seconds = e.now - slot.load_started
        alpha = self.config.load_ewma_alpha
        slot.load_ewma = alpha * seconds + (1 - alpha) * slot.load_ewma if slot.loads else seconds
        slot.loads += 1
        m.stats.load_seconds.append(seconds)
        slot.observed_bytes = e.observed_bytes
        slot.peak_bytes = max(slot.peak_bytes, e.observed_bytes)
        slot.lease_bytes = split(e.observed_bytes, len(slot.devices))
        m.ledger.take(slot.model, slot.devices, slot.lease_bytes)
        slot.ready_at = slot.last_used = e.now
        slot.failures = 0
        slot.oom_retry = slot.oom_retried = False
        m.start_keep_alive(slot, e.now)
        m.reconcile(slot, e.now, out)

    def _on_load_failed(self, e: LoadFailed, out: list[Effect]) -> None:
        m = self._m
        slot = m.slots[e.model]
        if slot.state is SlotState.STOPPING:
            return
        if e.out_of_memory and not slot.oom_retried:
            # Its waiters stay queued: the next pass makes room, then loads it once more.
            slot.to(SlotState.IDLE, f"oom-retry: {e.error}", e.now)
            m.release(slot)
            slot.oom_retry = True
            return
        slot.to(SlotState.FAILED, f"load_failed: {e.error}", e.now)
        m.release(slot)
        m.cool_down(slot, e.now, out)

    def _on_unload_done(self, e: UnloadDone, out: list[Effect]) -> None:
        m = self._m
        slot = m.slots[e.model]
        if slot.state is not SlotState.STOPPING:  # LOADING -> IDLE is an out-of-memory retry's
            raise IllegalTransition(slot.model, slot.state, SlotState.IDLE)
        failed = slot.fail_after_stop
        slot.to(SlotState.FAILED if failed else SlotState.IDLE, "unloaded", e.now)
        m.release(slot)
        slot.draining = slot.fail_after_stop = False
        if failed:
            m.cool_down(slot, e.now, out)
        for op_id in m.admin_unloads.pop(slot.model, []):
            out.append(AdminDone(op_id, slot.model))

    # --- admin --------------------------------------------------------------------------------

    def _admin_error(self, model: str) -> str | None:
        return None if model in self._m.specs else RejectCode.UNKNOWN_MODEL.value

    def _on_admin_load(self, e: AdminLoad, out: list[Effect]) -> None:
        m = self._m
        error = self._admin_error(e.model) or (self._admin_error(e.evict) if e.evict else None)
        if error is None and e.evict and m.slots[e.evict].pinned:
            error = "pinned"
        spec = m.specs.get(e.model)
        if error is None and spec is not None and m.placement.too_large(spec, m.slots[e.model]):
            error = RejectCode.MODEL_TOO_LARGE.value
        if error is not None:
            out.append(AdminDone(e.op_id, e.model, error))
            return
        if e.evict:
            m.drain(m.slots[e.evict])
        if m.slots[e.model].state is SlotState.READY:
            out.append(AdminDone(e.op_id, e.model))
            return
        m.queue.add(Waiter(e.op_id, e.model, None, 0, e.now, m.next_seq(), None, admin=True))

    def _on_admin_unload(self, e: AdminUnload, out: list[Effect]) -> None:
        m = self._m
        error = self._admin_error(e.model)
        if error is None and m.slots[e.model].pinned:
            error = "pinned"
        if error is not None:
            out.append(AdminDone(e.op_id, e.model, error))
            return
        slot = m.slots[e.model]
        if slot.state in (SlotState.IDLE, SlotState.FAILED):
            out.append(AdminDone(e.op_id, e.model))
            return
        m.drain(slot)
        m.admin_unloads.setdefault(e.model, []).append(e.op_id)

    def _on_pin(self, e: Pin, out: list[Effect]) -> None:
        m = self._m
        error = self._admin_error(e.model)
        if error is None and e.pinned:
            spec, slot = m.specs[e.model], m.slots[e.model]
            per = predicted(spec, slot)
            if not m.ledger.place_pin(e.model, per, spec.tensor_parallel):
                error = "pins_exceed_budget"
        if error is None:
            slot = m.slots[e.model]
            slot.pinned = e.pinned
            if not e.pinned:
                m.ledger.unpin(e.model)
            if slot.state is SlotState.READY and slot.in_flight == 0:
                m.start_keep_alive(slot, e.now)
        out.append(AdminDone(e.op_id, e.model, error))
