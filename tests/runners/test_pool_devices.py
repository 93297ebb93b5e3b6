"""A pool host on GPUs, with a fake GPU probe standing in for NVML (``tests/fixtures/fake_gpu.py``)
and real backends: a stock Cog server whose memory on the GPU is seen per process and which is
told its GPU, an in-process model told its device, memory the ledger does not know of evicted
for, and a load that runs out of memory retried once after evicting."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from runners.config import RunnerConfig
from runners.pool.config_file import parse
from runners.pool.http import create_app
from tests.fixtures.fake_gpu import BYTES_ENV, ROOT_ENV, FakeGpu
from tests.fixtures.pool_device_models import OomModel

GiB = 2**30
COG_GPU_MODEL = Path(__file__).resolve().parent.parent / "fixtures" / "cog_gpu_model"
CUDA_ECHO = "tests.fixtures.pool_device_models:CudaEcho"
OOM_MODEL = "tests.fixtures.pool_device_models:OomModel"
needs_cog = pytest.mark.skipif(importlib.util.find_spec("cog") is None, reason="no cog")


class Pool:
    def __init__(self, url: str, http: aiohttp.ClientSession) -> None:
        self.url = url
        self.http = http

    async def predict(self, model: str, **inputs: Any) -> tuple[int, dict[str, Any]]:
        async with self.http.post(
            f"{self.url}/models/{model}/predictions", json={"input": inputs}
        ) as response:
            return response.status, await response.json(content_type=None)

    async def capabilities(self) -> dict[str, Any]:
        async with self.http.get(f"{self.url}/v1/capabilities") as response:
            body: dict[str, Any] = await response.json()
            return body

    async def slots(self) -> dict[str, dict[str, Any]]:
        return {slot["model"]: slot for slot in (await self.capabilities())["slots"]}

    async def metrics(self) -> str:
        async with self.http.get(f"{self.url}/metrics") as response:
            return await response.text()


@asynccontextmanager
async def serving(config: dict[str, Any], probe: FakeGpu) -> AsyncIterator[Pool]:
    app = create_app(parse(config), RunnerConfig(token=None), probe=probe)
    async with TestServer(app, host="127.0.0.1", port=0) as server:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
            yield Pool(str(server.make_url("")).rstrip("/"), http)


def _cog(name: str, declared: int, holds: int, root: Path) -> dict[str, Any]:
    env = {
        "COG_PREDICT_TYPE_STUB": "predict.py:Predictor",
        ROOT_ENV: str(root),
        BYTES_ENV: str(holds),
    }
    return {
        "name": name,
        "size": declared,
        "load_timeout": 120,
        "backend": {"cog": {"cwd": str(COG_GPU_MODEL), "env": env}},
    }


def _echo(name: str, size: int, target: str = "echo") -> dict[str, Any]:
    return {"name": name, "size": size, "backend": {"conduit": target}}


@needs_cog
@pytest.mark.parametrize("per_process", [True, False], ids=["per-process", "growth"])
async def test_a_cog_server_is_placed_on_a_gpu_told_so_and_leased_what_it_holds_there(
    tmp_path: Path, per_process: bool
) -> None:
    """Per process where NVML lists its pids; where it cannot (a container), by the growth of
    the device's used memory over the load."""
    probe = FakeGpu((10 * GiB, 10 * GiB), tmp_path, per_process=per_process)
    models = [_echo("big", 7 * GiB), _cog("cogged", 3 * GiB, 4 * GiB, tmp_path)]
    async with serving({"min_resident": 0, "models": models}, probe) as pool:
        assert (await pool.predict("big", prompt="x"))[0] == 200  # device 0: 2 GiB left
        status, body = await pool.predict("cogged")
        assert status == 200, body
        assert body["output"] == "1"  # CUDA_VISIBLE_DEVICES: the device it was placed on
        slot = (await pool.slots())["cogged"]
        caps = await pool.capabilities()
        [(pid, device, held)] = probe.allocations()
        if per_process:
            assert any(pid in asked for asked in probe.asked)  # its worker, in its tree
    assert (device, held) == (1, 4 * GiB)
    assert (slot["device"], slot["devices"]) == ("cuda", [1])
    assert slot["observedBytes"] == slot["leaseBytes"] == 4 * GiB  # raised from 3 declared
    assert caps["used"] == {"0": 7 * GiB, "1": 4 * GiB}
    assert not probe.allocations()  # stopped with the pool: its memory is free


async def test_an_in_process_model_is_given_the_device_it_is_placed_on() -> None:
    probe = FakeGpu((10 * GiB, 10 * GiB))
    models = [_echo("big", 7 * GiB), _echo("cuda", 3 * GiB, CUDA_ECHO)]
    async with serving({"models": models}, probe) as pool:
        assert (await pool.predict("big", prompt="x"))[0] == 200
        status, body = await pool.predict("cuda", prompt="x")
        slot = (await pool.slots())["cuda"]
    assert status == 200 and body["output"] == ["cuda:1"], body
    assert (slot["device"], slot["devices"]) == ("cuda", [1])


async def test_memory_the_ledger_does_not_know_of_is_evicted_for() -> None:
    probe = FakeGpu((10 * GiB,))  # budget 9 GiB, 1 GiB kept free
    models = [_echo("a", 4 * GiB), _echo("b", 4 * GiB)]
    async with serving({"min_resident": 0, "models": models}, probe) as pool:
        assert (await pool.predict("a", prompt="x"))[0] == 200
        probe.outside[0] = 6 * GiB  # a, and 2 GiB that a cache or another process holds
        # the ledger has 5 GiB free for b's 4; the device has 3
        assert (await pool.predict("b", prompt="y"))[0] == 200
        slots = await pool.slots()
    assert slots["a"]["state"] == "idle"
    assert slots["a"]["lastUnload"]["reason"] == "evicted:lru"
    assert slots["b"]["state"] == "ready"


def _oom(key: str, failures: int) -> dict[str, Any]:
    args = {"key": key, "failures": failures}
    return {"name": "big", "size": 3 * GiB, "backend": {"conduit": OOM_MODEL, "args": args}}


async def test_a_load_out_of_memory_evicts_and_is_retried_once(tmp_path: Path) -> None:
    probe = FakeGpu((10 * GiB,))
    models = [_echo("idle", 2 * GiB), _oom(str(tmp_path), failures=1)]
    async with serving({"min_resident": 0, "models": models}, probe) as pool:
        assert (await pool.predict("idle", prompt="x"))[0] == 200
        status, body = await pool.predict("big", prompt="y")
        slots, metrics = await pool.slots(), await pool.metrics()
    assert status == 200, body
    assert OomModel.failed[str(tmp_path)] == 1
    assert slots["idle"]["state"] == "idle"
    assert slots["idle"]["lastUnload"]["reason"] == "evicted:oom-retry"
    assert slots["big"]["state"] == "ready"
    assert 'conduit_pool_loads_total{reason="oom-retry"} 1.0' in metrics
    assert 'conduit_pool_evictions_total{reason="oom-retry"} 1.0' in metrics


async def test_a_load_out_of_memory_twice_fails_with_the_reason(tmp_path: Path) -> None:
    probe = FakeGpu((10 * GiB,))
    models = [_echo("idle", 2 * GiB), _oom(str(tmp_path), failures=2)]
    async with serving({"min_resident": 0, "models": models}, probe) as pool:
        assert (await pool.predict("idle", prompt="x"))[0] == 200
        status, body = await pool.predict("big", prompt="y")
        slots = await pool.slots()
    assert status == 503, body
    assert body["code"] == "load_failed"
    assert "CUDA out of memory" in body["detail"]
    assert OomModel.failed[str(tmp_path)] == 2
    assert slots["idle"]["lastUnload"]["reason"] == "evicted:oom-retry"
    assert slots["big"]["state"] == "failed"
    assert "out of memory" in slots["big"]["lastTransition"]["reason"]
