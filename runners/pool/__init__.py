"""The model pool: many models on one runner host within a memory budget.

:class:`PoolCore` is the sans-IO scheduler (slots, leases, eviction, warm-promotion queue);
the host process feeds it events and carries out its effects. :mod:`runners.pool.simulate`
replays a request trace through it on a fake clock.
"""

from runners.pool.config import (
    DeviceMemory,
    FixedProbe,
    MemoryProbe,
    ModelSpec,
    Policy,
    PoolConfig,
    PoolConfigError,
    QueueMode,
)
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
    Pin,
    Refuse,
    RejectCode,
    Request,
    ServeDone,
    Start,
    StartLoad,
    StartUnload,
    UnloadDone,
)
from runners.pool.slots import IllegalTransition, SlotState, SlotView

__all__ = [
    "AdminDone",
    "AdminLoad",
    "AdminUnload",
    "Cancel",
    "DeviceMemory",
    "Effect",
    "Event",
    "FixedProbe",
    "Grant",
    "IllegalTransition",
    "LoadDone",
    "LoadFailed",
    "MemoryProbe",
    "ModelSpec",
    "Pin",
    "Policy",
    "PoolConfig",
    "PoolConfigError",
    "PoolCore",
    "QueueMode",
    "Refuse",
    "RejectCode",
    "Request",
    "ServeDone",
    "SlotState",
    "SlotView",
    "Start",
    "StartLoad",
    "StartUnload",
    "UnloadDone",
]
