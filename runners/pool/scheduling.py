"""The pool core's scheduling pass, run after every event, and its one timer.

In order: cooldowns that ended, deadlines that passed, loads past their deadline, drained
slots, pinned models to load, then the queue in order (grant, join a load, wait, or plan memory
for a load), then draining and keep-alive unloads; finally the timer is armed at the next
instant anything could change.

Memory: the first request that needs memory (the "head") plans a minimal victim set
(:mod:`runners.pool.placement`): victims idle now are unloaded and the load waits for their
``UnloadDone``; busy or young victims are waited for (no force-eviction) until the head's
deadline, and once the head has waited ``starvation_after`` they get no new grants. Loads
behind the head wait (nothing overtakes it for memory), while requests for READY models are
still granted at once. A load that failed out of memory is retried once, after every idle
victim on its devices is unloaded.
"""

from __future__ import annotations

import enum

from core.shell import ArmTimer
from runners.pool.config import QueueMode
from runners.pool.events import Effect, RejectCode
from runners.pool.moves import Moves
from runners.pool.queue import Waiter
from runners.pool.slots import Slot, SlotState


class _Status(enum.Enum):
    DONE = "done"
    """Granted or ended."""
    WAITING = "waiting"
    """Joins a load, waits for a permit or an unload of its own model."""
    BLOCKED = "blocked"
    """Needs memory that is not free yet: the head of the memory line."""


class SchedulingPass:
    def __init__(self, moves: Moves) -> None:
        self._m = moves
        self.started = False
        """Pinned models are loaded from ``Start`` on."""
        self._timer: float | None = None

    def run(self, now: float, out: list[Effect]) -> None:
        self._end_cooldowns(now)
        self._expire_waiters(now, out)
        self._expire_loads(now, out)
        self._unload_drained(now, out)
        self._load_pinned(now, out)
        self._dispatch(now, out)
        self._unload_drained(now, out)
        self._expire_keep_alive(now, out)

    def _end_cooldowns(self, now: float) -> None:
        for slot in self._m.slots.values():
            if slot.state is SlotState.FAILED and now >= slot.cooldown_until:
                slot.to(SlotState.IDLE, "cooldown_over", now)

    def _expire_waiters(self, now: float, out: list[Effect]) -> None:
        for waiter in self._m.queue.ordered(now):
            if waiter.deadline is not None and now >= waiter.deadline:
                self._m.end(waiter, RejectCode.DEADLINE_EXCEEDED, None, out)

    def _expire_loads(self, now: float, out: list[Effect]) -> None:
        m = self._m
        for slot in m.slots.values():
            timeout = m.specs[slot.model].load_timeout
            if slot.state is SlotState.LOADING and now >= slot.load_started + timeout:
                slot.fail_after_stop = True
                m.unload(slot, "load_timeout", None, now, out)
                m.fail_waiters(slot.model, RejectCode.LOAD_FAILED, None, out)

    def _load_pinned(self, now: float, out: list[Effect]) -> None:
        """Pinned models are loaded at ``Start`` and again whenever they fall IDLE."""
        if not self.started:
            return
        m = self._m
        for slot in m.slots.values():
            if not slot.pinned or slot.state is not SlotState.IDLE:
                continue
            spec = m.specs[slot.model]
            plan = m.placement.plan(spec, slot, now)
            if plan is not None and plan.tier == 0:
                if slot.oom_retry and m.make_room(slot, plan.devices, now, out):
                    continue
                slot.load_reason = "pin"
                m.start_load(slot, spec, plan.devices, now, out)

    def _dispatch(self, now: float, out: list[Effect]) -> None:
        self._m.reserved = set()
        head_blocked = False
        for waiter in self._m.queue.ordered(now):
            status = self._serve(waiter, now, out, head_blocked)
            head_blocked = head_blocked or status is _Status.BLOCKED
            if status is not _Status.DONE and self._m.config.queue_mode is QueueMode.FIFO:
                break

    def _serve(self, w: Waiter, now: float, out: list[Effect], head_blocked: bool) -> _Status:
        m = self._m
        slot = m.slots[w.model]
        if slot.state is SlotState.READY:
            if not (w.admin or m.grantable(slot)):
                return _Status.WAITING
            m.queue.remove(w.request_id)
            m.grant(w, slot, now, out)
            return _Status.DONE
        if slot.state is SlotState.FAILED:
            m.end(w, RejectCode.COOLDOWN, slot.cooldown_until - now, out)
            return _Status.DONE
        if slot.state is not SlotState.IDLE or head_blocked:
            return _Status.WAITING
        return self._load_for(w, slot, now, out)

    def _load_for(self, w: Waiter, slot: Slot, now: float, out: list[Effect]) -> _Status:
        m = self._m
        spec = m.specs[w.model]
        if w.deadline is not None and w.deadline - now < slot.load_ewma + slot.run_p50():
            m.end(w, RejectCode.DEADLINE_UNMEETABLE, None, out)
            return _Status.DONE
        plan = m.placement.plan(spec, slot, now)
        if plan is None:
            m.end(w, RejectCode.MODEL_TOO_LARGE, None, out)
            return _Status.DONE
        if plan.tier == 0:
            if slot.oom_retry and m.make_room(slot, plan.devices, now, out):
                return _Status.BLOCKED
            if w.admin and slot.load_reason == "request":
                slot.load_reason = "admin"
            m.start_load(slot, spec, plan.devices, now, out)
            return _Status.WAITING
        if plan.tier <= 2:
            for victim in plan.victims:
                reason = m.config.policy.value
                m.unload(m.slots[victim], f"evicted:{reason}", reason, now, out)
        elif m.queue.aged(w, now):
            m.reserved.update(plan.victims)
        return _Status.BLOCKED

    def _unload_drained(self, now: float, out: list[Effect]) -> None:
        for slot in self._m.slots.values():
            if slot.draining and slot.state is SlotState.READY and slot.in_flight == 0:
                self._m.unload(slot, "admin", "admin", now, out)

    def _expire_keep_alive(self, now: float, out: list[Effect]) -> None:
        m = self._m
        for slot in m.slots.values():
            expires = slot.expires_at
            if (
                slot.state is SlotState.READY
                and slot.in_flight == 0
                and not slot.pinned
                and expires is not None
                and now >= expires
                and not m.queue.for_model(slot.model)
            ):
                m.unload(slot, "ttl", None, now, out)

    # --- the timer ----------------------------------------------------------------------------

    def timer_passed(self, now: float) -> None:
        """Forget the armed instant once an event reaches it (so it is armed again if due)."""
        if self._timer is not None and now >= self._timer:
            self._timer = None

    def arm(self, now: float, out: list[Effect]) -> None:
        times = self._m.queue.wakeups(now)
        for slot in self._m.slots.values():
            times += self._slot_wakeups(slot)
        ahead = [t for t in times if t > now]
        if ahead and min(ahead) != self._timer:
            self._timer = min(ahead)
            out.append(ArmTimer(self._timer))

    def _slot_wakeups(self, slot: Slot) -> list[float]:
        if slot.state is SlotState.LOADING:
            return [slot.load_started + self._m.specs[slot.model].load_timeout]
        if slot.state is SlotState.FAILED:
            return [slot.cooldown_until]
        if slot.state is not SlotState.READY:
            return []
        times = [slot.ready_at + self._m.config.min_resident] if len(self._m.queue) else []
        if slot.expires_at is not None and slot.in_flight == 0 and not slot.pinned:
            times.append(slot.expires_at)
        return times
