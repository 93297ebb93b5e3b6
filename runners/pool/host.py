"""The pool's driver: feeds :class:`PoolCore` events from the asyncio loop and carries out its
effects.

The core runs on :class:`core.shell.Shell`, fed from request handlers, backend tasks and the
shell's one timer (``ArmTimer``); events raised while effects are being carried out queue in its
inbox and are handled after, never re-entrantly. Effects that take time (starting or stopping a
backend) become tasks that answer with an event when they end; ``Grant``/``Refuse``/
``AdminDone`` resolve the future their caller awaits.

The clock is the loop's (monotonic seconds), the one every ``now`` and deadline uses.

A backend is started on the GPUs the core placed it on (none when the core's devices are not
GPUs). A load that fails out of memory (``torch.OutOfMemoryError``, CUDA's "out of memory", a
``MemoryError``) says so in its ``LoadFailed``: the core then evicts and retries it once.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from core.shell import ArmTimer, Shell, Tick
from runners.pool.backends import Backend
from runners.pool.core import PoolCore
from runners.pool.events import (
    AdminDone,
    AdminLoad,
    AdminUnload,
    Cancel,
    Effect,
    Event,
    Grant,
    LoadDone,
    LoadFailed,
    Refuse,
    Request,
    ServeDone,
    Start,
    StartLoad,
    StartUnload,
    UnloadDone,
)

log = logging.getLogger(__name__)

_OOM = re.compile(r"out of memory|OutOfMemoryError|\bOOM\b", re.IGNORECASE)


def out_of_memory(error: BaseException) -> bool:
    """Whether a failed load ran out of memory: by its type (torch's ``OutOfMemoryError``,
    without importing torch; ``MemoryError``) or by its text, through its causes."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError) or any(
            cls.__name__ == "OutOfMemoryError" for cls in type(current).__mro__
        ):
            return True
        if _OOM.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


@dataclass(frozen=True, slots=True)
class Ask:
    """What a prediction request asks of the pool beyond its model."""

    deadline_in: float | None = None
    """Seconds from now covering queue + load + run; None: no deadline."""
    priority: int = 0
    keep_alive: float | None = None


class PoolHost:
    def __init__(self, core: PoolCore, backends: Mapping[str, Backend]) -> None:
        self.core = core
        self.backends = dict(backends)
        self._loop = asyncio.get_running_loop()
        self._shell: Shell[Event, Effect] = Shell(
            core.handle, self._carry_out, timer=ArmTimer, tick=Tick, clock=self._loop
        )
        self._waiters: dict[str, asyncio.Future[Grant | Refuse]] = {}
        self._admin: dict[str, asyncio.Future[AdminDone]] = {}
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.load_errors: dict[str, str] = {}
        """The last load error of each model, for the capabilities list."""
        self.last_unload: dict[str, tuple[str, float]] = {}
        """Why and when each model was last told to unload (``evicted:lru``, ``ttl``...): its
        slot's last transition says only ``unloaded`` once the unload is done."""
        self.closing = False

    def now(self) -> float:
        return self._loop.time()

    def start(self) -> None:
        self.handle(Start(self.now()))

    # --- the event loop of the core -----------------------------------------------------------

    def handle(self, event: Event) -> None:
        """Give ``event`` to the core and carry out its effects (after the current event's,
        when called while those are being carried out)."""
        self._shell.feed(event)

    def _carry_out(self, effect: Effect) -> None:
        match effect:
            case Grant() | Refuse():
                waiter = self._waiters.get(effect.request_id)
                if waiter is not None and not waiter.done():
                    waiter.set_result(effect)
                elif isinstance(effect, Grant):  # its caller left meanwhile
                    self.handle(ServeDone(effect.request_id, self.now()))
            case AdminDone():
                admin = self._admin.get(effect.op_id)
                if admin is not None and not admin.done():
                    admin.set_result(effect)
            case StartLoad():
                gpus = self.core.gpu_devices()
                devices = tuple(d for d in effect.devices if d in gpus)
                task = self._spawn(self._load(effect.model, devices))
                self._loads[effect.model] = task
            case StartUnload():
                self.last_unload[effect.model] = (effect.reason, self.now())
                self._spawn(self._unload(effect.model, effect.reason))
            case ArmTimer():  # the shell arms its timer itself: never seen here
                pass

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _load(self, model: str, devices: tuple[int, ...]) -> None:
        backend = self.backends[model]
        try:
            observed = await backend.start(devices)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            reason = str(error) or type(error).__name__
            log.warning("loading %s failed: %s", model, reason)
            self.load_errors[model] = reason
            await self._stop(model, backend)
            self.handle(LoadFailed(model, reason, self.now(), out_of_memory(error)))
            return
        finally:
            self._loads.pop(model, None)
        log.info("%s loaded (%d bytes observed)", model, observed)
        self.handle(LoadDone(model, observed, self.now()))

    async def _unload(self, model: str, reason: str) -> None:
        load = self._loads.pop(model, None)
        if load is not None:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
        await self._stop(model, self.backends[model])
        log.info("%s unloaded (%s)", model, reason)
        self.handle(UnloadDone(model, self.now()))

    async def _stop(self, model: str, backend: Backend) -> None:
        try:
            await backend.stop()
        except Exception:
            log.exception("stopping %s failed; its memory is counted as free", model)

    # --- what the HTTP shell calls ------------------------------------------------------------

    async def acquire(self, model: str, ask: Ask) -> Grant | Refuse:
        """Wait for a permit on ``model`` (its load, an eviction, the queue); a ``Grant`` must
        be given back with :meth:`release`."""
        request_id = uuid.uuid4().hex
        future: asyncio.Future[Grant | Refuse] = self._loop.create_future()
        self._waiters[request_id] = future
        now = self.now()
        deadline = None if ask.deadline_in is None else now + ask.deadline_in
        try:
            self.handle(Request(request_id, model, deadline, now, ask.priority, ask.keep_alive))
            return await future
        except asyncio.CancelledError:
            # A Grant that reached a caller already gone is given back by _carry_out.
            self.handle(Cancel(request_id, self.now()))
            raise
        finally:
            del self._waiters[request_id]

    def release(self, grant: Grant) -> None:
        self.handle(ServeDone(grant.request_id, self.now()))

    async def admin_load(self, model: str, evict: str | None) -> AdminDone:
        op_id = uuid.uuid4().hex
        return await self._admin_op(op_id, AdminLoad(op_id, model, self.now(), evict))

    async def admin_unload(self, model: str) -> AdminDone:
        op_id = uuid.uuid4().hex
        return await self._admin_op(op_id, AdminUnload(op_id, model, self.now()))

    async def _admin_op(self, op_id: str, event: Event) -> AdminDone:
        future: asyncio.Future[AdminDone] = self._loop.create_future()
        self._admin[op_id] = future
        try:
            self.handle(event)
            return await asyncio.shield(future)
        finally:
            del self._admin[op_id]

    async def close(self) -> None:
        """Stop every backend (the process is going away; the core is not asked)."""
        self.closing = True
        self._shell.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(
            *(self._stop(name, backend) for name, backend in self.backends.items()),
            return_exceptions=True,
        )
