"""The ``vllm`` model's contract, on the real runner server with a CPU fake engine.

The server, validation, webhooks, lifecycle and cache reporting are the ones a GPU runner
uses; only the engine is :class:`tests.fixtures.fake_llm.FakeEngine`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import aiohttp
import pytest

from runners.cache import FlushScope
from runners.model import PredictContext
from runners.models import get_model
from runners.models.llm_engine import Sampling
from runners.models.vllm import MODEL_ENV, VLLMEngine, VLLMModel
from tests.fixtures.fake_llm import (
    KV_BYTES_PER_TOKEN,
    WEIGHTS_BYTES,
    FakeEngine,
    Request,
    chat_template,
)

if TYPE_CHECKING:
    from conftest import Runner, StartRunner, WebhookReceiver

ASYNC = {"Prefer": "respond-async"}
PROMPT = "one two three four five"
REPLY = ["five", " four", " three", " two", " one"]


async def start_llm(
    start_runner: StartRunner, **engine_options: Any
) -> tuple[Runner, VLLMModel, FakeEngine]:
    model = VLLMModel(model="fake", engine_factory=FakeEngine, **engine_options)
    runner = await start_runner(model=model)
    return runner, model, cast(FakeEngine, model.engine)


async def call(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    async with http.request(method, url, json=body, headers=headers) as response:
        return response.status, await response.json(), dict(response.headers)


async def predict(http: aiohttp.ClientSession, runner: Runner, **inputs: Any) -> dict[str, Any]:
    status, body, _ = await call(http, "POST", f"{runner.url}/predictions", {"input": inputs})
    assert status == 200, body
    return cast(dict[str, Any], body)


def outputs(body: dict[str, Any]) -> list[str]:
    return list(body.get("output") or [])


async def test_openapi_lists_the_inputs(start_runner: StartRunner, http: aiohttp.ClientSession):
    runner, _, _ = await start_llm(start_runner)
    status, doc, _ = await call(http, "GET", f"{runner.url}/openapi.json")
    assert status == 200
    schemas = doc["components"]["schemas"]
    props = schemas["Input"]["properties"]
    assert list(props) == ["prompt", "messages", "max_tokens", "temperature"]
    assert [prop["x-order"] for prop in props.values()] == [0, 1, 2, 3]
    assert props["prompt"]["type"] == "string" and props["prompt"]["nullable"] is True
    assert props["messages"]["type"] == "array"
    assert props["messages"]["items"]["required"] == ["role", "content"]
    assert props["max_tokens"] | {"x-order": 0} == {
        "x-order": 0,
        "title": "Max Tokens",
        "type": "integer",
        "default": 256,
        "minimum": 1,
        "description": "Most tokens to generate",
    }
    assert props["temperature"]["type"] == "number"
    assert (props["temperature"]["default"], props["temperature"]["minimum"]) == (0.7, 0)
    assert schemas["Input"]["anyOf"] == [{"required": ["prompt"]}, {"required": ["messages"]}]
    assert schemas["Output"]["items"] == {"type": "string"}
    assert schemas["Output"]["x-cog-array-type"] == "iterator"
    assert schemas["Output"]["x-cog-array-display"] == "concatenate"


@pytest.mark.parametrize(
    "inputs",
    [
        {},
        {"prompt": PROMPT, "max_tokens": 0},
        {"prompt": PROMPT, "temperature": -0.1},
        {"messages": [{"role": "user"}]},
        {"messages": []},
    ],
)
async def test_invalid_input_never_reaches_the_engine(
    start_runner: StartRunner, http: aiohttp.ClientSession, inputs: dict[str, Any]
):
    runner, _, engine = await start_llm(start_runner)
    status, body, _ = await call(http, "POST", f"{runner.url}/predictions", {"input": inputs})
    assert status == 422, body
    assert engine.requests == []


async def test_streams_each_delta_as_an_ordered_output_webhook(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
):
    runner, _, engine = await start_llm(start_runner, stall_after=2)
    request = {"input": {"prompt": PROMPT}, "webhook": receiver.url("s1")}
    status, _, _ = await call(http, "PUT", f"{runner.url}/predictions/s1", request, ASYNC)
    assert status == 202

    early = await receiver.until("s1", lambda body: len(outputs(body)) == 2)
    assert early[-1].body["status"] == "processing"
    assert outputs(early[-1].body) == REPLY[:2]
    engine.resume()
    late = await receiver.until_terminal("s1")

    final = late[-1].body
    assert final["status"] == "succeeded"
    assert final["output"] == REPLY
    assert "".join(final["output"]) == "five four three two one"
    seen = [outputs(delivery.body) for delivery in early + late]
    assert all(seen[i] == seen[i + 1][: len(seen[i])] for i in range(len(seen) - 1))
    assert engine.requests == [Request("s1", PROMPT, Sampling(256, 0.7), True)]


async def test_max_tokens_and_temperature_reach_the_engine(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner, _, engine = await start_llm(start_runner)
    body = await predict(http, runner, prompt=PROMPT, max_tokens=3, temperature=0)
    assert body["status"] == "succeeded"
    assert body["output"] == REPLY[:3]
    assert engine.requests[-1].sampling == Sampling(max_tokens=3, temperature=0)


async def test_messages_are_rendered_with_the_chat_template(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner, _, engine = await start_llm(start_runner)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello there"},
    ]
    body = await predict(http, runner, messages=messages)
    assert body["status"] == "succeeded"
    assert "".join(body["output"]) == "<|assistant|> there hello <|user|> brief be <|system|>"
    sent = engine.requests[-1]
    assert sent.prompt == chat_template(messages)
    assert sent.add_special_tokens is False  # the template already has its special tokens


async def test_prompt_and_messages_together_fail_the_prediction(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner, _, engine = await start_llm(start_runner)
    body = await predict(http, runner, prompt=PROMPT, messages=[{"role": "user", "content": "x"}])
    assert (body["status"], body["error"]) == ("failed", "give either prompt or messages, not both")
    assert engine.requests == []


async def test_cancel_mid_stream_aborts_the_engine_request(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
):
    runner, _, engine = await start_llm(start_runner, stall_after=2)
    request = {"input": {"prompt": PROMPT}, "webhook": receiver.url("c1")}
    await call(http, "PUT", f"{runner.url}/predictions/c1", request, ASYNC)
    await receiver.until("c1", lambda body: len(outputs(body)) == 2)

    status, _, _ = await call(http, "POST", f"{runner.url}/predictions/c1/cancel")
    assert status == 200
    final = (await receiver.until_terminal("c1"))[-1].body
    assert final["status"] == "canceled"
    assert final["output"] == REPLY[:2]
    assert engine.aborted == ["c1"]
    assert engine.active == set()


async def test_a_repeated_prompt_reports_prefix_cache_reuse(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner, _, _ = await start_llm(start_runner)
    url = f"{runner.url}/predictions"
    _, first, headers = await call(http, "POST", url, {"input": {"prompt": PROMPT}})
    assert (headers["X-Cache-Hit"], headers["X-Cache-Tokens-Reused"]) == ("false", "0")
    assert first["logs"] == ""

    _, second, headers = await call(http, "POST", url, {"input": {"prompt": PROMPT}})
    assert second["output"] == first["output"]
    assert (headers["X-Cache-Hit"], headers["X-Cache-Tokens-Reused"]) == ("true", "5")
    assert second["logs"] == "prefix cache: reused 5 prompt tokens\n"


async def test_predict_reports_cache_use_on_its_context():
    model = VLLMModel(model="fake", engine_factory=FakeEngine)
    await model.setup()
    inputs = {"prompt": PROMPT, "messages": None, "max_tokens": 256, "temperature": 0.7}
    contexts = [PredictContext(f"p{i}", {}, lambda line: None) for i in range(2)]
    for ctx in contexts:
        assert [piece async for piece in model.predict(inputs, ctx)] == REPLY
    assert (contexts[0].cache_hit, contexts[0].tokens_reused) == (False, 0)
    assert (contexts[1].cache_hit, contexts[1].tokens_reused) == (True, 5)
    await model.unload()


async def test_flush_empties_the_prefix_cache(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner, _, engine = await start_llm(start_runner)
    await predict(http, runner, prompt=PROMPT)
    assert engine.prefix_cache == {PROMPT: 5}

    flushed = await runner.service.flush(FlushScope.MODEL, "vllm")
    assert flushed.bytes_freed == 5 * KV_BYTES_PER_TOKEN
    assert engine.prefix_cache == {}
    _, _, headers = await call(
        http, "POST", f"{runner.url}/predictions", {"input": {"prompt": PROMPT}}
    )
    assert headers["X-Cache-Hit"] == "false"


async def test_capabilities_report_kv_cache_and_memory(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner, model, _ = await start_llm(start_runner)
    await predict(http, runner, prompt=PROMPT)  # 5 cached tokens: 2 blocks of 4
    [loaded] = runner.service.capabilities()["models"]["loaded"]
    assert loaded["id"] == "vllm" and loaded["device"] == "cpu"
    assert loaded["model"] == "fake"
    assert loaded["max_model_len"] == 2048
    assert loaded["kv_cache"] == {"usage": 2 / 256, "blocks_total": 256, "blocks_used": 2}
    assert loaded["memory_bytes"] == model.memory_bytes() == WEIGHTS_BYTES + 5 * KV_BYTES_PER_TOKEN


async def test_unload_frees_memory_and_refuses_predictions_until_loaded_again(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner, model, engine = await start_llm(start_runner)
    assert model.memory_bytes() == WEIGHTS_BYTES
    assert model.load_progress() == 1.0

    assert await runner.service.unload("vllm") == WEIGHTS_BYTES
    assert model.memory_bytes() == 0 and not engine.running
    assert model.extra_capabilities() == {"model": "fake", "max_model_len": None, "kv_cache": None}
    status, body, headers = await call(
        http, "POST", f"{runner.url}/predictions", {"input": {"prompt": PROMPT}}
    )
    assert (status, body["status"], headers["Retry-After"]) == (503, "failed", "5")
    with pytest.raises(RuntimeError, match="model fake is not loaded"):
        await anext(model.predict({"prompt": PROMPT}, PredictContext("x", {}, lambda line: None)))
    assert engine.requests == []

    runner.service.load("vllm", None)
    await runner.service.lifecycle.wait()
    assert engine.started == 2 and model.memory_bytes() == WEIGHTS_BYTES
    assert (await predict(http, runner, prompt=PROMPT))["output"] == REPLY


def test_the_cli_builds_the_vllm_model_without_vllm_installed(monkeypatch: pytest.MonkeyPatch):
    assert get_model("vllm") is VLLMModel
    model = VLLMModel(model="org/some-llm")
    assert isinstance(model.engine, VLLMEngine)
    assert (model.model_id, model.device, model.memory_bytes()) == ("org/some-llm", "cuda:0", 0)
    assert "messages" in model.openapi_schema()["components"]["schemas"]["Input"]["properties"]

    monkeypatch.setenv(MODEL_ENV, "/weights/llm")
    assert VLLMModel().model_id == "/weights/llm"
    monkeypatch.delenv(MODEL_ENV)
    with pytest.raises(ValueError, match=MODEL_ENV):
        VLLMModel()
