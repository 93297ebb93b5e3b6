"""The pool's view of its devices: NVML's GPUs (``nvidia-ml-py``, optional) or system memory.

A GPU is read live: each device's total and free memory, and the memory each process holds on it
(NVML's per-process accounting, ``nvmlDeviceGetComputeRunningProcesses``). NVML is initialised
once per probe, not once per reading: the core reads the devices each time it plans a load.

Device indices are NVML's (PCI bus order). A model placed on device ``n`` in a subprocess gets
``CUDA_VISIBLE_DEVICES=n`` with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (so CUDA numbers the GPUs as NVML
does); a model in this process gets ``cuda:<k>``, ``k`` being ``n``'s place among this
process's own ``CUDA_VISIBLE_DEVICES`` when that is set (a list of indices), else ``n``. Such a
list also limits which GPUs the pool budgets and places models on.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Collection, Sequence
from typing import Any

from runners.pool.config import DeviceMemory, PoolConfigError
from runners.resources import system_memory

log = logging.getLogger(__name__)

VISIBLE = "CUDA_VISIBLE_DEVICES"
ORDER = "CUDA_DEVICE_ORDER"


class NoDeviceError(PoolConfigError):
    """``device: gpu`` was asked for, but NVML finds no GPU."""


def visible_gpus(environ: dict[str, str] | None = None) -> list[int] | None:
    """This process's ``CUDA_VISIBLE_DEVICES`` as device indices; None when it is unset or is
    not a list of indices (UUIDs, MIG names: then every GPU counts)."""
    value = (os.environ if environ is None else environ).get(VISIBLE)
    if value is None:
        return None
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not all(part.isdigit() for part in parts):
        return None
    return [int(part) for part in parts]


def cuda_ordinal(index: int) -> int:
    """The ``cuda:<k>`` under which this process sees the GPU of device index ``index``."""
    visible = visible_gpus()
    return visible.index(index) if visible and index in visible else index


def placement_env(devices: Sequence[int]) -> dict[str, str]:
    """The environment that confines a subprocess to ``devices``, numbered as NVML numbers
    them; empty when it is placed on no GPU."""
    if not devices:
        return {}
    return {VISIBLE: ",".join(str(d) for d in devices), ORDER: "PCI_BUS_ID"}


class Nvml:
    """NVML, initialised at first use and kept; every reading is empty when ``nvidia-ml-py`` is
    missing or NVML fails (no driver, no GPU)."""

    def __init__(self) -> None:
        self._lib: Any = None
        self._tried = False

    def _nvml(self) -> Any:
        if not self._tried:
            self._tried = True
            try:
                lib = importlib.import_module("pynvml")  # nvidia-ml-py, optional
                lib.nvmlInit()
            except ImportError:
                return None
            except Exception as error:  # pynvml.NVMLError: no driver, no device
                log.info("NVML is not usable: %s", error)
                return None
            self._lib = lib
        return self._lib

    def _handles(self) -> list[tuple[int, Any]]:
        lib = self._nvml()
        if lib is None:
            return []
        try:
            indices = range(lib.nvmlDeviceGetCount())
            visible = visible_gpus()
            return [
                (i, lib.nvmlDeviceGetHandleByIndex(i))
                for i in indices
                if visible is None or i in visible
            ]
        except lib.NVMLError as error:
            log.warning("NVML could not list the GPUs: %s", error)
            return []

    def devices(self) -> list[DeviceMemory]:
        lib, found = self._lib, []
        for index, handle in self._handles():
            try:
                info = lib.nvmlDeviceGetMemoryInfo(handle)
            except lib.NVMLError as error:
                log.warning("NVML could not read GPU %d: %s", index, error)
                return []
            found.append(DeviceMemory(index, int(info.total), int(info.free), gpu=True))
        return found

    def process_memory(self, pids: Collection[int]) -> dict[int, int]:
        """Bytes the processes ``pids`` hold on each GPU, by device index (GPUs where they hold
        nothing are left out). Empty where NVML cannot tell, e.g. where it reports the host's
        process ids and this process runs in a pid namespace of its own (a container)."""
        lib, wanted, held = self._lib, set(pids), {}
        for index, handle in self._handles():
            try:
                processes = lib.nvmlDeviceGetComputeRunningProcesses(handle)
            except lib.NVMLError as error:
                log.warning("NVML could not list GPU %d's processes: %s", index, error)
                continue
            used = sum(int(p.usedGpuMemory or 0) for p in processes if p.pid in wanted)
            if used:
                held[index] = used
        return held

    def close(self) -> None:
        lib, self._lib = self._lib, None
        if lib is not None:
            try:
                lib.nvmlShutdown()
            except lib.NVMLError:
                pass


class SystemProbe:
    """The memory a budget is taken from when none is configured: NVML's GPUs when
    ``nvidia-ml-py`` is installed and finds any (unless ``device`` is ``cpu``), else this
    machine's memory as one device (a budget only: it is not read live)."""

    def __init__(self, device: str = "auto") -> None:
        self._device = device
        self._nvml = Nvml()

    def devices(self) -> Sequence[DeviceMemory]:
        if self._device != "cpu" and (gpus := self._nvml.devices()):
            return gpus
        if self._device == "gpu":
            raise NoDeviceError("device: gpu, but NVML finds no GPU (is nvidia-ml-py installed?)")
        total, available = system_memory()
        if total is None:
            return []
        return [DeviceMemory(0, total, available or 0)]

    def process_memory(self, pids: Collection[int]) -> dict[int, int]:
        return {} if self._device == "cpu" else self._nvml.process_memory(pids)

    def close(self) -> None:
        self._nvml.close()
