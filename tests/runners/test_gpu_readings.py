"""GPU readings: nvidia-smi's CSV parsed, read off the event loop, shared for a few seconds."""

from __future__ import annotations

import asyncio
import threading

from runners.resources import Device, GpuMonitor, parse_nvidia_smi

MIB = 1024 * 1024

# nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free,utilization.gpu
#            --format=csv,noheader,nounits, on a two-GPU host (the second idle, no utilisation)
SAMPLE = """\
0, NVIDIA A100-SXM4-80GB, 81920, 4531, 76808, 87
1, NVIDIA A100-SXM4-80GB, 81920, 0, 81050, [N/A]
"""


def test_parses_nvidia_smi_csv() -> None:
    assert parse_nvidia_smi(SAMPLE) == [
        Device(
            "cuda:0",
            "gpu",
            "NVIDIA A100-SXM4-80GB",
            81920 * MIB,
            4531 * MIB,
            76808 * MIB,
            0.87,
        ),
        Device("cuda:1", "gpu", "NVIDIA A100-SXM4-80GB", 81920 * MIB, 0, 81050 * MIB, None),
    ]


def test_skips_lines_it_cannot_read() -> None:
    noisy = "WARNING: infoROM is corrupted at gpu 0000:00:04.0\n" + SAMPLE.splitlines()[0]
    assert [device.id for device in parse_nvidia_smi(noisy)] == ["cuda:0"]
    assert parse_nvidia_smi("") == []
    [device] = parse_nvidia_smi("0, Tesla T4, [N/A], [N/A], [N/A], [N/A]")
    assert (device.memory_total, device.memory_free, device.utilization) == (None, None, None)


async def test_reads_in_a_thread_and_shares_the_reading() -> None:
    threads: list[int] = []

    def read() -> list[Device]:
        threads.append(threading.get_ident())
        return parse_nvidia_smi(SAMPLE)

    monitor = GpuMonitor(ttl=60.0, read=read)
    readings = await asyncio.gather(*(monitor.devices() for _ in range(5)))
    assert all(reading == parse_nvidia_smi(SAMPLE) for reading in readings)
    assert len(threads) == 1  # five callers, one nvidia-smi run
    assert threads[0] != threading.get_ident()  # not on the event loop's thread

    fresh = GpuMonitor(ttl=0.0, read=read)
    await fresh.devices()
    await fresh.devices()
    assert len(threads) == 3  # a reading older than the ttl is taken again
