"""What the runner's hardware has and uses, read from the system, never estimated.

CPU runners: the process's RSS (``/proc/self/statm``), the machine's memory
(``/proc/meminfo``: MemTotal, MemAvailable) and the process's CPU utilisation between two
readings (``os.times``). GPU runners: per-device memory and utilisation from ``nvidia-smi`` when
it is installed, else from torch (memory only) when the model already imported it. Figures that
cannot be measured are ``None``, not zero.

Reading the GPUs runs a subprocess that can take a good part of a second, so it never runs on
the event loop: :class:`GpuMonitor` reads them in a thread and keeps the reading for a few
seconds, so ``/health`` probes and capabilities polls share one ``nvidia-smi`` run.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_rss() -> int:
    """Resident set size of this process in bytes."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * _PAGE
    except (OSError, IndexError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def system_memory() -> tuple[int | None, int | None]:
    """(total, available) bytes of the machine's memory, or Nones off Linux."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        total = int(fields["MemTotal"].split()[0]) * 1024
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None, None
    return total, available


@dataclass
class Device:
    id: str
    kind: str
    name: str
    memory_total: int | None
    memory_used: int | None
    memory_free: int | None
    utilization: float | None
    """Fraction 0-1 of the device busy since the last reading (or as the driver reports it)."""

    @property
    def index(self) -> int | None:
        """The CUDA index of a GPU (``cuda:1`` -> 1); None for the CPU."""
        prefix, _, number = self.id.partition(":")
        return int(number) if prefix == "cuda" and number.isdigit() else None

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "memoryTotalBytes": self.memory_total,
            "memoryUsedBytes": self.memory_used,
            "memoryFreeBytes": self.memory_free,
            "utilization": self.utilization,
        }


class CpuMeter:
    """The process's CPU use between successive readings, as a fraction of one core."""

    def __init__(self) -> None:
        self._last = (time.monotonic(), _cpu_seconds())

    def read(self) -> float | None:
        now, cpu = time.monotonic(), _cpu_seconds()
        then, cpu_then = self._last
        self._last = (now, cpu)
        if now - then < 0.01:
            return None
        return round((cpu - cpu_then) / (now - then), 4)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def gpus() -> list[Device]:
    """Visible NVIDIA GPUs, from nvidia-smi or torch; empty without either. Blocking: on the
    event loop use :class:`GpuMonitor`."""
    devices = _nvidia_smi()
    if devices is not None:
        return devices
    return _torch_devices()


class GpuMonitor:
    """The latest :func:`gpus` reading, refreshed in a thread at most every ``ttl`` seconds."""

    def __init__(self, ttl: float = 3.0, read: Callable[[], list[Device]] = gpus) -> None:
        self.ttl = ttl
        self._read = read
        self._reading: tuple[float, list[Device]] | None = None
        self._lock = asyncio.Lock()

    async def devices(self) -> list[Device]:
        async with self._lock:  # callers arriving during a read share it
            reading = self._reading
            if reading is None or time.monotonic() - reading[0] >= self.ttl:
                reading = (time.monotonic(), await asyncio.to_thread(self._read))
                self._reading = reading
            return reading[1]


_NVIDIA_SMI_QUERY = "index,name,memory.total,memory.used,memory.free,utilization.gpu"


def _nvidia_smi() -> list[Device] | None:
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        out = subprocess.run(
            [binary, f"--query-gpu={_NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(out)


def parse_nvidia_smi(out: str) -> list[Device]:
    """Devices from ``nvidia-smi --query-gpu=<_NVIDIA_SMI_QUERY> --format=csv,noheader,nounits``
    output: memory in MiB, utilisation in percent; ``[N/A]`` and the like become ``None``."""
    devices = []
    mib = MIB
    for line in out.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 6:
            continue  # a warning line, or a format this parser does not know
        index, name, total, used, free, util = parts
        percent = _number(util, 1)
        devices.append(
            Device(
                f"cuda:{index}",
                "gpu",
                name,
                _number(total, mib),
                _number(used, mib),
                _number(free, mib),
                None if percent is None else percent / 100,
            )
        )
    return devices


def _number(text: str, scale: int) -> int | None:
    try:
        return int(float(text) * scale)
    except ValueError:
        return None


def _torch_devices() -> list[Device]:
    torch = sys.modules.get("torch")  # only if the model already imported it: never import here
    if torch is None or not torch.cuda.is_available():
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(index)
        name = torch.cuda.get_device_name(index)
        devices.append(Device(f"cuda:{index}", "gpu", name, total, total - free, free, None))
    return devices


def _mb(figures: list[int | None]) -> int | None:
    """The sum in MiB (the spec's MB), or None if any figure is unknown."""
    if any(figure is None for figure in figures):
        return None
    return sum(figure or 0 for figure in figures) // MIB


def gpu_resources(gpu_devices: list[Device]) -> dict[str, Any]:
    """The GPU half of the spec's ``resources``: summed over the visible GPUs; on a host
    without one, no ids, 0 MB and 0.0 utilisation (measured: there is none)."""
    utilizations = [device.utilization for device in gpu_devices]
    utilization: float | None = 0.0
    if gpu_devices:
        known = [u for u in utilizations if u is not None]
        utilization = round(sum(known) / len(known), 4) if len(known) == len(utilizations) else None
    return {
        "gpu_ids": [device.index for device in gpu_devices if device.index is not None],
        "gpu_memory_total_mb": _mb([device.memory_total for device in gpu_devices]),
        "gpu_memory_used_mb": _mb([device.memory_used for device in gpu_devices]),
        "gpu_memory_free_mb": _mb([device.memory_free for device in gpu_devices]),
        "gpu_utilization": utilization,
    }


def host_resources(cpu: CpuMeter, gpu_devices: list[Device]) -> dict[str, Any]:
    """Conduit's additions to ``resources``: every device (the CPU first), the process and
    the machine's memory, in bytes."""
    total, available = system_memory()
    used = None if total is None or available is None else total - available
    cpu_device = Device(
        "cpu", "cpu", f"{os.cpu_count() or 0} cores", total, used, available, cpu.read()
    )
    devices = [cpu_device, *gpu_devices]
    return {
        "deviceIds": [device.id for device in devices],
        "devices": [device.as_json() for device in devices],
        "process": {"rssBytes": process_rss(), "pid": os.getpid()},
        "memory": {"totalBytes": total, "usedBytes": used, "freeBytes": available},
    }
