"""The pool's configuration (models and knobs) and its injected memory probe."""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol


class Policy(enum.StrEnum):
    LRU = "lru"
    """Least recently used first (within the lowest priority class)."""
    COST = "cost"
    """Lowest (load-time EWMA × requests in the last 5 min) per byte freed first."""


class QueueMode(enum.StrEnum):
    WARM = "warm"
    """Warm promotion: a request for a ready model never waits behind another model's load."""
    FIFO = "fifo"
    """Strict arrival order (priority first): the head blocks everything behind it."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    declared_bytes: int
    """Total over its devices; the lease is max(this, last observed peak)."""
    concurrency: int = 1
    keep_alive: float | None = None
    """Seconds after its last request; 0 unloads at once, negative never idle-unloads (still
    evictable). None: ``PoolConfig.keep_alive``."""
    pinned: bool = False
    priority: int = 0
    """Eviction class: the lowest classes are evicted first."""
    tensor_parallel: int = 1
    load_timeout: float = 300.0
    load_seconds: float = 0.0
    """A first guess of its load time, until a load has been measured."""


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    index: int
    total_bytes: int
    free_bytes: int
    gpu: bool = False
    """A GPU read live (NVML): the core weighs each load against its measured free memory as
    well as the ledger, and a model placed on it is told so (``CUDA_VISIBLE_DEVICES``, or its
    ``device`` in this process). False: a budget only (system memory, a fixed figure)."""


class MemoryProbe(Protocol):
    """NVML on a GPU host, process/system memory on CPU, a fixed list in tests."""

    def devices(self) -> Sequence[DeviceMemory]:
        """Every device with its total and its free memory now."""
        ...

    def process_memory(self, pids: Collection[int]) -> dict[int, int]:
        """Bytes the processes ``pids`` hold on each device (by index), from the device's own
        per-process accounting; empty where there is none (no GPU, a fixed probe)."""
        ...


@dataclass(frozen=True, slots=True)
class FixedProbe:
    """A probe answering fixed devices: for tests, the simulator and explicit budgets."""

    totals: tuple[int, ...]

    def devices(self) -> Sequence[DeviceMemory]:
        return [DeviceMemory(i, total, total) for i, total in enumerate(self.totals)]

    def process_memory(self, pids: Collection[int]) -> dict[int, int]:
        return {}


@dataclass(frozen=True, slots=True)
class PoolConfig:
    models: Sequence[ModelSpec]
    budget_bytes: int | None = None
    """Per device; None: the probe's total less ``reserve_fraction``."""
    reserve_fraction: float = 0.10
    keep_alive: float = 300.0
    keep_alive_cap: float = 3600.0
    """The most a request's keep-alive may ask for."""
    min_resident: float = 30.0
    max_queue_depth: int = 64
    queue_full_retry_after: float = 1.0
    starvation_after: float = 30.0
    cooldown_initial: float = 10.0
    cooldown_max: float = 300.0
    policy: Policy = Policy.LRU
    queue_mode: QueueMode = QueueMode.WARM
    load_ewma_alpha: float = 0.3
    thrash_window: float = 300.0


class PoolConfigError(ValueError):
    """The configuration cannot start (pins over the budget, a bad model entry)."""
