"""Memory accounting: per-device budgets, the leases held by slots, and pinned reservations.

A lease is taken when the core decides to load (not when the backend reports), counts while
LOADING, READY and STOPPING, and is released at ``UnloadDone``. A pinned model reserves its
bytes on its home devices for good, loaded or not, so nothing else can take its room.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MemoryLease:
    devices: tuple[int, ...]
    per_device: int


def split(total: int, parts: int) -> int:
    """Bytes per device of a model spread over ``parts`` devices (rounded up)."""
    return -(-total // parts)


class MemoryLedger:
    def __init__(self, budgets: dict[int, int]) -> None:
        self.budgets = dict(budgets)
        self._leases: dict[str, MemoryLease] = {}
        self._pins: dict[str, MemoryLease] = {}

    def lease(self, model: str) -> MemoryLease | None:
        return self._leases.get(model)

    def take(self, model: str, devices: tuple[int, ...], per_device: int) -> None:
        self._leases[model] = MemoryLease(devices, per_device)

    def release(self, model: str) -> None:
        self._leases.pop(model, None)

    def used(self, device: int) -> int:
        return sum(x.per_device for x in self._leases.values() if device in x.devices)

    def _reserved(self, device: int, excluding: str | None) -> int:
        """Pinned room on ``device`` not already counted as a lease."""
        total = 0
        for model, pin in self._pins.items():
            if model == excluding or device not in pin.devices:
                continue
            held = self._leases.get(model)
            held_here = held.per_device if held and device in held.devices else 0
            total += max(0, pin.per_device - held_here)
        return total

    def free_for(self, device: int, model: str) -> int:
        """What ``model`` may lease on ``device`` now, without evicting anything."""
        return self.budgets[device] - self.used(device) - self._reserved(device, model)

    def ceiling(self, device: int, model: str) -> int:
        """The most ``model`` could ever lease on ``device``: its budget less other pins."""
        pinned = sum(
            max(pin.per_device, self._held(other, device))
            for other, pin in self._pins.items()
            if other != model and device in pin.devices
        )
        return self.budgets[device] - pinned

    def _held(self, model: str, device: int) -> int:
        held = self._leases.get(model)
        return held.per_device if held and device in held.devices else 0

    # --- pins -----------------------------------------------------------------------------

    def home(self, model: str) -> MemoryLease | None:
        return self._pins.get(model)

    def pin_headroom(self, device: int) -> int:
        return self.budgets[device] - sum(
            max(p.per_device, self._held(m, device))
            for m, p in self._pins.items()
            if device in p.devices
        )

    def place_pin(self, model: str, per_device: int, count: int) -> bool:
        """Reserve room for a pinned model on ``count`` devices (best fit, or where it is
        loaded); False when the pins would exceed a budget."""
        held = self._leases.get(model)
        if held is not None:
            devices = held.devices
            per_device = max(per_device, held.per_device)
            if min(self.pin_headroom(d) for d in devices) < per_device:
                return False
        else:
            fitting = sorted(
                (self.pin_headroom(d) - per_device, d)
                for d in self.budgets
                if self.pin_headroom(d) >= per_device
            )
            if len(fitting) < count:
                return False
            devices = tuple(sorted(d for _, d in fitting[:count]))
        self._pins[model] = MemoryLease(devices, per_device)
        return True

    def unpin(self, model: str) -> None:
        self._pins.pop(model, None)
