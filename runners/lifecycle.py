"""Loading and unloading the runner's model, as tasks an operator can follow.

The first load is the runner's setup (Cog's ``setup`` result in ``/health-check`` comes from
it); later loads and unloads come from the control API. A load is a task with an id, a status
(``queued`` → ``running`` → ``completed`` | ``failed``), progress and an ETA. The ETA is the
previous successful load's duration minus the time spent so far (no previous load: unknown),
so it is measured, not invented. Only one load or unload runs at a time.

Memory is reported two ways, each named for what it is: the bytes the model says it holds
(its tensors: ``memoryUsedBytes``, ``freedBytes``) and the process's resident set measured just
before and after (``rssBeforeBytes``, ``rssAfterBytes``, ``rssDeltaBytes`` = after - before),
each after a garbage collection. The two differ for real reasons: weights mapped from a
file are resident only once touched, and an allocator may keep freed memory for reuse.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import time
import traceback
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from protocol import lifecycle as wire
from protocol.values import RunnerStatus
from runners.control_errors import LifecycleConflictError
from runners.model import Model
from runners.resources import MIB, process_rss

log = logging.getLogger(__name__)

_KEEP_TASKS = 100


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _settled_rss(generation: int = 2) -> int:
    """The process's RSS once garbage waiting for the collector is gone.

    A load collects only the young generations (what it allocates is young, and a full
    collection of a heap holding torch costs a quarter of a second on the event loop); an
    unload collects everything, since the model's objects are old.
    """
    gc.collect(generation)
    return process_rss()


@dataclass(frozen=True)
class RssChange:
    before: int
    after: int

    @property
    def delta(self) -> int:
        return self.after - self.before


@dataclass(frozen=True)
class Unloaded:
    """What an unload released: the model's own figure and the measured RSS change."""

    model_bytes: int
    rss: RssChange


class ModelState(StrEnum):
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADED = "unloaded"
    FAILED = "failed"


class TaskStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass
class LoadTask:
    model_id: str
    evict: str | None = None
    id: str = field(default_factory=lambda: f"load_{uuid.uuid4().hex[:16]}")
    status: TaskStatus = TaskStatus.QUEUED
    created_at: str = field(default_factory=_now)
    started: float | None = None
    completed_at: str | None = None
    load_time: float | None = None
    memory_used: int | None = None
    rss: RssChange | None = None
    freed_by_evict: int | None = None
    error: str | None = None
    logs: str = ""

    def document(
        self, progress: float, eta: float | None, stage: str | None, on_gpu: bool
    ) -> wire.LoadTask:
        """The task as the runner API spec writes it (``status`` loading, completed or failed;
        ``eta`` in seconds, ``gpuMemoryUsedMB`` and ``loadTimeMs`` once completed), with
        Conduit's finer ``phase`` and byte-exact figures beside them."""
        fields: dict[str, Any] = {}
        if self.status is TaskStatus.RUNNING:
            fields["stage"] = stage
        if self.evict is not None:
            fields |= {"evict_model": self.evict, "freed_bytes": self.freed_by_evict}
        if self.status is TaskStatus.COMPLETED:
            used, seconds = self.memory_used or 0, self.load_time or 0.0
            fields |= {
                "gpu_memory_used_mb": used // MIB if on_gpu else 0,
                "load_time_ms": round(seconds * 1000),
                "memory_used_bytes": self.memory_used,
                "load_time_seconds": self.load_time,
            }
            if self.rss is not None:
                rss = self.rss
                fields |= {
                    "rss_before_bytes": rss.before,
                    "rss_after_bytes": rss.after,
                    "rss_delta_bytes": rss.delta,
                }
        if self.status is TaskStatus.FAILED:
            fields["error"] = self.error
        if self.completed_at is not None:
            fields["completed_at"] = self.completed_at
        return wire.LoadTask(
            task_id=self.id,
            model_id=self.model_id,
            status=_SPEC_STATUS[self.status],
            phase=self.status.value,
            progress=round(progress, 4),
            eta=None if eta is None else math.ceil(eta),
            created_at=self.created_at,
            **fields,
        )


_SPEC_STATUS = {
    TaskStatus.QUEUED: wire.LoadStatus.LOADING,
    TaskStatus.RUNNING: wire.LoadStatus.LOADING,
    TaskStatus.COMPLETED: wire.LoadStatus.COMPLETED,
    TaskStatus.FAILED: wire.LoadStatus.FAILED,
}


class ModelLifecycle:
    def __init__(self, model: Model) -> None:
        self.model = model
        self.state = ModelState.UNLOADED
        self.setup_result: dict[str, str] = {"status": RunnerStatus.STARTING, "logs": ""}
        self.last_load_time: float | None = None
        #: When the model last finished loading (epoch seconds); None while not loaded.
        self.loaded_at: float | None = None
        self.tasks: dict[str, LoadTask] = {}
        self.current: LoadTask | None = None
        self._lock = asyncio.Lock()
        self._runs: set[asyncio.Task[None]] = set()

    @property
    def model_id(self) -> str:
        return self.model.name

    @property
    def loaded(self) -> bool:
        return self.state is ModelState.LOADED

    def start_setup(self) -> asyncio.Task[None]:
        """The first load, recorded as Cog's setup result."""
        task = self._new_task(self.model_id, None)
        return self._launch(task, setup=True)

    def start_load(self, evict: str | None = None) -> LoadTask:
        """Queue a load (after unloading ``evict`` first, when given); returns its task."""
        if self.loaded and evict is None:
            raise LifecycleConflictError(f"Model {self.model_id} is already loaded")
        task = self._new_task(self.model_id, evict)
        self._launch(task, setup=False)
        return task

    async def unload(self) -> Unloaded:
        """Unload the model; says what that released. Callers check nothing is running."""
        async with self._lock:
            return await self._unload()

    def progress(self, task: LoadTask) -> float:
        if task.status is TaskStatus.COMPLETED:
            return 1.0
        if task.status is TaskStatus.RUNNING:
            return max(0.0, min(1.0, self.model.load_progress()))
        return 0.0

    def eta(self, task: LoadTask) -> float | None:
        if task.status in (TaskStatus.COMPLETED, TaskStatus.FAILED):
            return 0.0
        if self.last_load_time is None:
            return None
        elapsed = 0.0 if task.started is None else time.monotonic() - task.started
        return max(0.0, self.last_load_time - elapsed)

    def describe(self, task: LoadTask) -> wire.LoadTask:
        on_gpu = self.model.device.startswith("cuda")
        return task.document(self.progress(task), self.eta(task), self.model.load_stage(), on_gpu)

    async def wait(self) -> None:
        """Wait for every load started so far to end."""
        if self._runs:
            await asyncio.wait(set(self._runs))

    def cancel(self) -> None:
        for run in self._runs:
            run.cancel()

    def _new_task(self, model_id: str, evict: str | None) -> LoadTask:
        task = LoadTask(model_id, evict)
        self.tasks[task.id] = task
        while len(self.tasks) > _KEEP_TASKS:
            del self.tasks[next(iter(self.tasks))]
        return task

    def _launch(self, task: LoadTask, setup: bool) -> asyncio.Task[None]:
        run = asyncio.create_task(self._load(task, setup))
        self._runs.add(run)
        run.add_done_callback(self._runs.discard)
        return run

    async def _load(self, task: LoadTask, setup: bool) -> None:
        async with self._lock:
            self.current = task
            task.status, task.started = TaskStatus.RUNNING, time.monotonic()
            if setup:
                self.setup_result["started_at"] = _now()
            try:
                if task.evict is not None and self.loaded:
                    task.freed_by_evict = (await self._unload()).model_bytes
                self.state = ModelState.LOADING
                rss_before = _settled_rss(1)
                await self.model.setup()
            except Exception as error:
                self._failed(task, error, setup)
            else:
                task.rss = RssChange(rss_before, _settled_rss(1))
                self._loaded(task, setup)
            finally:
                task.completed_at = _now()
                if setup:
                    self.setup_result["completed_at"] = task.completed_at
                self.current = None

    def _loaded(self, task: LoadTask, setup: bool) -> None:
        assert task.started is not None
        task.load_time = round(time.monotonic() - task.started, 6)
        task.memory_used = self.model.memory_bytes()
        task.status = TaskStatus.COMPLETED
        self.last_load_time = task.load_time
        self.state = ModelState.LOADED
        self.loaded_at = time.time()
        if setup:
            self.setup_result["status"] = RunnerStatus.SUCCEEDED
        log.info("model %s is ready (loaded in %.3fs)", self.model_id, task.load_time)

    def _failed(self, task: LoadTask, error: Exception, setup: bool) -> None:
        task.status, task.error = TaskStatus.FAILED, str(error) or type(error).__name__
        task.logs = "".join(traceback.format_exception(error))
        self.state = ModelState.FAILED
        if setup:
            self.setup_result["status"] = RunnerStatus.FAILED
            self.setup_result["logs"] += task.logs
        log.error("loading model %s failed: %s", self.model_id, task.error)

    async def _unload(self) -> Unloaded:
        held = self.model.memory_bytes()
        rss_before = _settled_rss()
        await self.model.unload()
        rss = RssChange(rss_before, _settled_rss())
        self.state = ModelState.UNLOADED
        self.loaded_at = None
        return Unloaded(max(0, held - self.model.memory_bytes()), rss)
