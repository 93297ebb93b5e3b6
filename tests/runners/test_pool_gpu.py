"""A model pool on a CUDA GPU: two small vLLM models in one pool host, whose budget comes from
NVML (``device: gpu``), and whose leases, reconciled to what each load took, add up to within
10 % of what NVML sees the device use. Skipped anywhere else (no nvidia-ml-py, no GPU, no vLLM,
no model named).

``CONDUIT_VLLM_TEST_MODEL`` names the weights (a local path, or a hub id already in the cache),
as for ``test_vllm_gpu``; ``CONDUIT_VLLM_TEST_MODEL_2`` the second model's (default: the same
weights, as a second engine), e.g.
``CONDUIT_VLLM_TEST_MODEL=Qwen/Qwen2.5-0.5B-Instruct pytest -m gpu tests/runners/test_pool_gpu.py``.
"""

from __future__ import annotations

import importlib
import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import httpx
import pytest

from runners.pool.nvml import SystemProbe
from tests.fixtures.pool_host import start_pool
from tests.fixtures.processes import RUNNER_AUTH, RUNNER_TOKEN

pytestmark = pytest.mark.gpu

TEST_MODEL_ENV = "CONDUIT_VLLM_TEST_MODEL"
SECOND_MODEL_ENV = "CONDUIT_VLLM_TEST_MODEL_2"
LOAD_DEADLINE = 600.0
SHARE = 0.3
"""Of the device each engine may take (``gpu_memory_utilization``): both fit in the budget."""
TOLERANCE = 0.10


def _nvml() -> Any:
    """pynvml (nvidia-ml-py), initialised, or skip: not installed, or no GPU it can see."""
    if find_spec("pynvml") is None:
        pytest.skip("nvidia-ml-py is not installed (pip install nvidia-ml-py on a GPU host)")
    pynvml = importlib.import_module("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        pytest.skip(f"NVML is not usable here: {error}")
    if pynvml.nvmlDeviceGetCount() == 0:
        pynvml.nvmlShutdown()
        pytest.skip("no CUDA device")
    return pynvml


def _used(pynvml: Any, index: int = 0) -> int:
    """Bytes NVML sees in use on the device, by every process."""
    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used)


def _weights() -> tuple[str, str]:
    if find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install .[vllm] on a GPU host)")
    first = os.environ.get(TEST_MODEL_ENV)
    if not first:
        pytest.skip(f"set {TEST_MODEL_ENV} to a small model to run the GPU tests")
    return first, os.environ.get(SECOND_MODEL_ENV) or first


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    env.pop("REDIS_URL", None)
    return {**env, "CONDUIT_RUNNER_TOKEN": RUNNER_TOKEN}


@pytest.mark.timeout(2 * LOAD_DEADLINE + 120)
def test_two_vllm_models_lease_what_nvml_sees_them_take(tmp_path: Path) -> None:
    pynvml = _nvml()
    try:
        weights = _weights()
        [device] = SystemProbe("gpu").devices()[:1]  # the pool's own probe: NVML
        declared = int(device.total_bytes * SHARE)
        models = [
            {
                "name": name,
                "backend": {
                    "conduit": "vllm",
                    "args": {
                        "model": model,
                        "gpu_memory_utilization": SHARE,
                        "max_model_len": 1024,
                        "enforce_eager": True,
                    },
                },
                "size": declared,
                "load_timeout": LOAD_DEADLINE,
            }
            for name, model in zip(("first", "second"), weights, strict=True)
        ]
        before = _used(pynvml)
        proc, url = start_pool(
            {"device": "gpu", "min_resident": 0, "models": models}, _env(), tmp_path
        )
        try:
            for name in ("first", "second"):  # one after the other: each load's delta is its own
                response = httpx.post(
                    f"{url}/models/{name}/predictions",
                    json={"input": {"prompt": "Name a planet:", "max_tokens": 4}},
                    headers=RUNNER_AUTH,
                    timeout=LOAD_DEADLINE + 60,
                )
                assert response.status_code == 200, response.text
                assert response.json()["status"] == "succeeded", response.text
            capabilities = httpx.get(f"{url}/v1/capabilities", headers=RUNNER_AUTH).json()
            measured = _used(pynvml) - before
        finally:
            proc.stop()
    finally:
        pynvml.nvmlShutdown()
    slots = {slot["model"]: slot for slot in capabilities["slots"]}
    assert all(slot["state"] == "ready" and slot["device"] == "cuda" for slot in slots.values())
    # The budget is NVML's total less the 10 % reserve, on the device the probe found.
    assert capabilities["budgets"]["0"] == int(device.total_bytes * 0.9)
    leased = capabilities["used"]["0"]
    assert leased == sum(slot["leaseBytes"] for slot in slots.values())
    assert all(slot["leaseBytes"] == slot["observedBytes"] for slot in slots.values())
    assert abs(leased - measured) <= TOLERANCE * measured, (leased, measured)
