"""Where a load goes: the devices with room for its lease, and what must be unloaded first.

A load leases max(declared, last observed peak) per device at decision time, and is started
only when the lease fits beside every other lease (LOADING, READY, STOPPING) and the room
reserved for pins; otherwise the plan names the victims whose unloads make room
(:mod:`runners.pool.eviction`), or says that it must wait for loads under way.

On a GPU the probe reads live (:attr:`DeviceMemory.gpu`), the ledger is not the only word: a
load must also fit the device's measured free memory, less the reserve and the leases of loads
still under way. Memory the ledger does not know of (a cache a model left behind, another
process) counts as taken, so the head evicts for it as for a lease. When even evicting every
candidate could not make that room and no load under way can change it, the ledger decides (the
memory is not the pool's to free).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from runners.pool.config import DeviceMemory, MemoryProbe, ModelSpec, PoolConfig
from runners.pool.eviction import Evictions, choose
from runners.pool.leases import MemoryLedger, split
from runners.pool.slots import Slot, SlotState

WAIT_LOADS = 4
"""The tier of a plan with no victim set yet: it waits for loads under way."""
_BEHIND = 1 << 62
"""The cost of a device that fits only by the ledger: any device with measured room first."""


@dataclass(frozen=True, slots=True)
class Plan:
    devices: tuple[int, ...]
    tier: int
    """0: fits now; 1: waits for unloads already under way; 2: victims idle now;
    3: victims busy or young (waited for); 4: no victim set yet (loads under way)."""
    victims: tuple[str, ...]


def predicted(spec: ModelSpec, slot: Slot) -> int:
    """Per device: max(declared, last observed peak) over its ``tensor_parallel`` devices."""
    return split(max(spec.declared_bytes, slot.peak_bytes), spec.tensor_parallel)


def headroom(device: DeviceMemory, budget: int, config: PoolConfig) -> int:
    """What a GPU keeps free by measure: the reserve, or less where an explicit budget leaves
    less of the device outside it."""
    reserve = int(device.total_bytes * config.reserve_fraction)
    return max(0, min(reserve, device.total_bytes - budget))


class Placement:
    """Plans over the core's slots and ledger (read, never changed here)."""

    def __init__(
        self,
        config: PoolConfig,
        probe: MemoryProbe,
        devices: Sequence[DeviceMemory],
        ledger: MemoryLedger,
        slots: Mapping[str, Slot],
        evictions: Evictions,
    ) -> None:
        self._config = config
        self._probe = probe
        self._ledger = ledger
        self._slots = slots
        self._evictions = evictions
        self.gpus = frozenset(d.index for d in devices if d.gpu)
        """The devices that are GPUs: a model placed there is told which."""
        self._headroom = {d.index: headroom(d, ledger.budgets[d.index], config) for d in devices}
        self._reading: dict[int, int] | None = None
        """Measured free bytes of each GPU, read once per event when a load is planned."""

    def forget_reading(self) -> None:
        """A new event: the next plan reads the GPUs again."""
        self._reading = None

    def devices_for(self, slot: Slot) -> list[int]:
        home = self._ledger.home(slot.model) if slot.pinned else None
        return list(home.devices) if home else list(self._ledger.budgets)

    def too_large(self, spec: ModelSpec, slot: Slot) -> bool:
        per = predicted(spec, slot)
        ledger = self._ledger
        fitting = [d for d in self.devices_for(slot) if ledger.ceiling(d, slot.model) >= per]
        return len(fitting) < spec.tensor_parallel

    def plan(self, spec: ModelSpec, slot: Slot, now: float) -> Plan | None:
        """Where the load goes: the ``tensor_parallel`` best devices (fits now, best fit; then
        the fewest bytes to evict), never fewer; None when it can never fit."""
        per = predicted(spec, slot)
        options = []
        for device in self.devices_for(slot):
            option = self._device_option(device, slot.model, per, now)
            if option is not None:
                options.append((option[0], option[1], device, option[2]))
        if len(options) < spec.tensor_parallel:
            return None
        chosen = sorted(options, key=lambda o: o[:3])[: spec.tensor_parallel]
        victims = tuple(dict.fromkeys(v for o in chosen for v in o[3]))
        return Plan(tuple(sorted(o[2] for o in chosen)), max(o[0] for o in chosen), victims)

    def _device_option(
        self, device: int, model: str, per: int, now: float
    ) -> tuple[int, int, tuple[str, ...]] | None:
        """(tier, cost, victims) of placing ``per`` bytes on ``device`` (see :class:`Plan`):
        within the ledger and, on a GPU, the device's measured room."""
        if self._ledger.ceiling(device, model) < per:
            return None
        ledger = self._ledger.free_for(device, model)
        room = self._room(device)
        option = self._option(device, model, per, min(ledger, room), now)
        if option[0] == WAIT_LOADS and room < ledger and not self._loading_on(device):
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
        evictions = self._evictions
        deficit = per - free - evictions.stopping_bytes(device)
        if deficit <= 0:
            return (1, 0, ())
        try:
            victims = choose(evictions.candidates(device, model, now), deficit, self._config.policy)
        except LookupError:
            return (WAIT_LOADS, deficit, ())
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
            if self.gpus:
                try:
                    devices = self._probe.devices()
                except Exception:  # no reading this time: the ledger alone decides
                    devices = []
                self._reading = {d.index: d.free_bytes for d in devices if d.index in self.gpus}
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
