"""The ``vllm`` model with vLLM and real weights on a CUDA GPU; skipped anywhere else.

Point ``CONDUIT_VLLM_TEST_MODEL`` at a small model (a local path, or a hub id already in the
cache), e.g. ``CONDUIT_VLLM_TEST_MODEL=Qwen/Qwen2.5-0.5B-Instruct pytest -m gpu``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from protocol.values import FlushScope
from runners.models.vllm import VLLMModel

if TYPE_CHECKING:
    from conftest import StartRunner, WebhookReceiver

pytestmark = pytest.mark.gpu

TEST_MODEL_ENV = "CONDUIT_VLLM_TEST_MODEL"
LOAD_DEADLINE = 600.0
# Longer than one KV block (16 tokens), so a repeat can be served from the prefix cache.
PROMPT = (
    "Here is a list of the planets of the solar system in order of their distance from the "
    "sun, written out in full, one per line:"
)


def gpu_model() -> str:
    """The weights to test with, or skip: no vLLM, no CUDA device, or no model named."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install .[vllm] on a GPU host)")
    import torch

    if torch.cuda.device_count() == 0:  # NVML-based: creates no CUDA context before vLLM
        pytest.skip("no CUDA device")
    weights = os.environ.get(TEST_MODEL_ENV)
    if not weights:
        pytest.skip(f"set {TEST_MODEL_ENV} to a small model to run the GPU tests")
    return weights


async def post(
    http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any, dict[str, str]]:
    async with http.post(url, json=body, headers=headers) as response:
        return response.status, await response.json(), dict(response.headers)


@pytest.mark.timeout(LOAD_DEADLINE + 120)
async def test_streams_a_completion_and_reuses_the_prefix_cache(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
):
    weights = gpu_model()
    model = VLLMModel(model=weights, max_model_len=1024, enforce_eager=True)
    runner = await start_runner(model=model, wait_ready=False)
    try:
        ready = await asyncio.wait_for(runner.service.wait_ready(), LOAD_DEADLINE)
        assert ready, runner.service.health()
        assert model.memory_bytes() > 0

        inputs = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0}
        request = {"id": "g1", "input": inputs, "webhook": receiver.url("g1")}
        status, _, _ = await post(
            http, f"{runner.url}/predictions", request, {"Prefer": "respond-async"}
        )
        assert status == 202
        final = (await receiver.until_terminal("g1"))[-1].body
        assert final["status"] == "succeeded", final.get("error")
        assert final["output"] and "".join(final["output"]).strip()

        status, again, headers = await post(http, f"{runner.url}/predictions", {"input": inputs})
        assert status == 200 and again["output"] == final["output"]  # greedy: same text
        assert headers["X-Cache-Hit"] == "true"
        assert int(headers["X-Cache-Tokens-Reused"]) > 0

        extra = model.extra_capabilities()
        assert extra["max_model_len"] == 1024
        assert extra["kv_cache"]["blocks_total"] > 0

        flushed = await runner.service.flush(FlushScope.MODEL, "vllm")
        assert flushed.model is not None and flushed.model.bytes_freed is None
        _, _, headers = await post(http, f"{runner.url}/predictions", {"input": inputs})
        assert headers["X-Cache-Hit"] == "false"

        assert (await runner.service.unload("vllm")).freed_bytes > 0
        assert model.memory_bytes() == 0
    finally:
        await model.unload()
