"""A model pool on a real CUDA GPU, its memory read from the device, not only its ledger: a stock
Cog torch model counted at what NVML sees its processes hold and told its GPU, a torch model in
the pool's process whose cached memory goes back to the device when it unloads, memory held
outside the pool evicted for, and a load that runs out of memory retried once after evicting.

Skipped without torch (with CUDA), nvidia-ml-py and a GPU; no vLLM and no weights needed (the
models hold plain tensors). A few GiB of the first GPU, well under three minutes::

    pytest -m gpu tests/runners/test_pool_gpu_memory.py -p no:cacheprovider
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.pool_host import MIB, slots, start_pool
from tests.fixtures.processes import RUNNER_AUTH, RUNNER_TOKEN, Proc
from tests.fixtures.waiting import wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]

GiB = 1024 * MIB
TORCH_BLOCK = "tests.fixtures.pool_torch_models:TorchBlock"
COG_TORCH_MODEL = Path(__file__).resolve().parent.parent / "fixtures" / "cog_torch_model"
LOAD_TIMEOUT = 120
TOLERANCE = 0.10
GPU = 0
"""The GPU (NVML's index) the pool is confined to, and the tests measure."""


@pytest.fixture(scope="module")
def nvml() -> Iterator[Any]:
    """pynvml, initialised, or skip: no nvidia-ml-py, no torch with CUDA, no GPU."""
    if find_spec("pynvml") is None:
        pytest.skip("nvidia-ml-py is not installed (pip install nvidia-ml-py on a GPU host)")
    if find_spec("torch") is None:
        pytest.skip("torch is not installed")
    # The tests' own allocations must land on the GPU NVML numbers GPU, as the pool's do.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    torch = importlib.import_module("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch finds no CUDA device")
    pynvml = importlib.import_module("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        pytest.skip(f"NVML is not usable here: {error}")
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            pytest.skip("no CUDA device")
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def _memory(pynvml: Any) -> Any:
    return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(GPU))


def _used(pynvml: Any) -> int:
    return int(_memory(pynvml).used)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    env.pop("REDIS_URL", None)
    # One GPU for the pool: its probe and its models see only this one.
    return {**env, "CONDUIT_RUNNER_TOKEN": RUNNER_TOKEN, "CUDA_VISIBLE_DEVICES": str(GPU)}


def _torch_block(name: str, declared: int, mib: int, **extra: Any) -> dict[str, Any]:
    backend = {"conduit": TORCH_BLOCK, "args": {"mib": mib}}
    return {"name": name, "size": declared, "backend": backend, **extra}


def _pool(models: list[dict[str, Any]], tmp_path: Path) -> tuple[Proc, str]:
    config = {"device": "gpu", "min_resident": 0, "models": models}
    return start_pool(config, _env(), tmp_path)


def _predict(url: str, model: str) -> httpx.Response:
    return httpx.post(
        f"{url}/models/{model}/predictions",
        json={"input": {"prompt": "x"}},
        headers=RUNNER_AUTH,
        timeout=LOAD_TIMEOUT + 30,
    )


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "succeeded", response.text
    return response.json()["output"]


def _budget(url: str) -> int:
    caps = httpx.get(f"{url}/v1/capabilities", headers=RUNNER_AUTH, timeout=5).json()
    return int(caps["budgets"][str(GPU)])


def test_a_stock_cog_torch_model_is_told_its_gpu_and_leased_what_nvml_sees(
    nvml: Any, tmp_path: Path
) -> None:
    if find_spec("cog") is None:
        pytest.skip("cog is not installed")
    hold = 2 * GiB
    cog = {
        "name": "cogged",
        "size": 256 * MIB,  # declared far too small: the lease must come from the device
        "load_timeout": LOAD_TIMEOUT,
        "backend": {
            "cog": {
                "cwd": str(COG_TORCH_MODEL),
                "env": {"COG_PREDICT_TYPE_STUB": "predict.py:Predictor", "HOLD_MIB": "2048"},
            }
        },
    }
    before = _used(nvml)
    proc, url = _pool([cog], tmp_path)
    try:
        assert _ok(_predict(url, "cogged")) == str(GPU)  # its CUDA_VISIBLE_DEVICES
        grown = _used(nvml) - before
        slot = slots(url)["cogged"]
    finally:
        proc.stop()
    assert (slot["device"], slot["devices"]) == ("cuda", [GPU])
    assert slot["leaseBytes"] == slot["observedBytes"] >= hold
    assert abs(slot["leaseBytes"] - grown) <= TOLERANCE * grown, (slot["leaseBytes"], grown)
    wait_for(lambda: _used(nvml) <= before + 256 * MIB, "the cog server's GPU memory freed")


def test_a_torch_model_is_given_its_device_and_its_cache_goes_back_when_it_unloads(
    nvml: Any, tmp_path: Path
) -> None:
    before = _used(nvml)
    proc, url = _pool([_torch_block("block", 2 * GiB, 2048, keep_alive=0)], tmp_path)
    try:
        assert _ok(_predict(url, "block")) == [f"cuda:{GPU}"]  # the pool's only visible GPU
        slot = wait_for(lambda: (s := slots(url)["block"])["state"] == "idle" and s, "unloaded")
        residue = _used(nvml) - before  # the pool's CUDA context, not the model's 2 GiB
    finally:
        proc.stop()
    assert slot["observedBytes"] == 2 * GiB
    assert slot["lastUnload"]["reason"] == "ttl"
    assert residue < 1 * GiB, residue  # not left in PyTorch's cache


def _hold(torch: Any, size: int) -> Any:
    """Memory on the GPU held by this test's process: outside the pool and its ledger."""
    block = torch.empty(size, dtype=torch.uint8, device=f"cuda:{GPU}")
    block.fill_(1)
    torch.cuda.synchronize()
    return block


def _free_after_context(nvml: Any) -> tuple[Any, int]:
    """torch, with this process's CUDA context made, and the GPU's free bytes then."""
    torch = importlib.import_module("torch")
    torch.zeros(1, device=f"cuda:{GPU}")
    torch.cuda.synchronize()
    return torch, int(_memory(nvml).free)


def test_memory_held_outside_the_pool_is_evicted_for(nvml: Any, tmp_path: Path) -> None:
    models = [_torch_block("a", 2 * GiB, 2048), _torch_block("b", 2 * GiB, 2048)]
    proc, url = _pool(models, tmp_path)
    held: list[Any] = []
    try:
        _ok(_predict(url, "a"))
        torch, free = _free_after_context(nvml)
        headroom = int(_memory(nvml).total) - _budget(url)  # the 10 % reserve
        held.append(_hold(torch, free - headroom - 1 * GiB))  # by measure, 1 GiB of room left
        leased = sum(s["leaseBytes"] for s in slots(url).values())
        assert leased + 2 * GiB <= _budget(url)  # the ledger alone would load b beside a
        _ok(_predict(url, "b"))
        after = slots(url)
    finally:
        held.clear()
        importlib.import_module("torch").cuda.empty_cache()
        proc.stop()
    assert after["a"]["state"] == "idle"
    assert after["a"]["lastUnload"]["reason"] == "evicted:lru"
    assert after["b"]["state"] == "ready"


@pytest.mark.parametrize("retry_fits", [True, False], ids=["retried", "failed"])
def test_a_load_out_of_memory_is_retried_once_after_evicting(
    nvml: Any, tmp_path: Path, retry_fits: bool
) -> None:
    proc, url = None, ""
    room = 3 * GiB // 2
    held: list[Any] = []
    try:
        torch, _ = _free_after_context(nvml)
        total = int(_memory(nvml).total)
        headroom = total - int(total * 0.9)
        # b is declared at 1 GiB (it fits the measured room) but takes more than the device
        # has free: 1 GiB more (the retry, after a's 2 GiB are evicted, fits), or 4 GiB more.
        takes = headroom + room + (1 if retry_fits else 4) * GiB
        models = [_torch_block("a", 2 * GiB, 2048), _torch_block("b", 1 * GiB, takes // MIB)]
        proc, url = _pool(models, tmp_path)
        _ok(_predict(url, "a"))
        held.append(_hold(torch, int(_memory(nvml).free) - headroom - room))
        answer = _predict(url, "b")
        after = slots(url)
        metrics = httpx.get(f"{url}/metrics", headers=RUNNER_AUTH, timeout=5).text
    finally:
        held.clear()
        importlib.import_module("torch").cuda.empty_cache()
        if proc is not None:
            proc.stop()
    assert after["a"]["lastUnload"]["reason"] == "evicted:oom-retry"
    assert 'conduit_pool_loads_total{reason="oom-retry"} 1.0' in metrics
    if retry_fits:
        _ok(answer)
        assert after["b"]["state"] == "ready"
    else:
        assert answer.status_code == 503, answer.text
        assert answer.json()["code"] == "load_failed"
        assert "out of memory" in answer.json()["detail"]
        assert after["b"]["state"] == "failed"
