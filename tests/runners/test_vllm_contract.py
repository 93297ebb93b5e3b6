"""The ``vllm`` model's contract, on the real runner server with a CPU fake engine.

The server, validation, webhooks, lifecycle and cache reporting are the ones a GPU runner
uses, driven over HTTP (lifecycle calls with operation tokens); only the engine is
:class:`tests.fixtures.fake_llm.FakeEngine`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import aiohttp
import pytest

from runners.model import PredictContext
from runners.models import get_model
from runners.models.llm_engine import Sampling
from runners.models.vllm import MODEL_ENV, VLLMEngine, VLLMModel
from tests.fixtures.fake_llm import (
    BLOCKS_TOTAL,
    KV_POOL_BYTES,
    WEIGHTS_BYTES,
    FakeEngine,
    Request,
    chat_template,
)
from tests.runners.lifecycle_calls import Mint, configure, wait_task

if TYPE_CHECKING:
    from conftest import Runner, StartRunner, WebhookReceiver

ASYNC = {"Prefer": "respond-async"}
PROMPT = "one two three four five"
REPLY = ["five", " four", " three", " two", " one"]
REUSED = 4  # a repeat of PROMPT (5 tokens) reuses its one whole 4-token block
ENGINE_BYTES = WEIGHTS_BYTES + KV_POOL_BYTES


@pytest.fixture
def op_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Mint:
    return configure(tmp_path, monkeypatch, "vllm")


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


async def flush(
    http: aiohttp.ClientSession, runner: Runner, op_tokens: Mint
) -> tuple[int, dict[str, Any]]:
    body = {"scope": "model", "model": "vllm", "verifiedOpToken": op_tokens("cache-flush")}
    status, answer, _ = await call(http, "POST", f"{runner.url}/v1/cache/flush", body)
    return status, answer


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
    assert (headers["X-Cache-Hit"], headers["X-Cache-Tokens-Reused"]) == ("true", str(REUSED))
    assert second["logs"] == f"prefix cache: reused {REUSED} prompt tokens\n"

    async with http.get(f"{runner.url}/metrics") as response:
        metrics = await response.text()
    assert 'conduit_runner_cache_lookups_total{cache="model",result="hit"} 1.0' in metrics
    assert 'conduit_runner_cache_lookups_total{cache="model",result="miss"} 1.0' in metrics
    assert "conduit_runner_cache_hit_ratio 0.5" in metrics.splitlines()


async def test_predict_reports_cache_use_on_its_context():
    model = VLLMModel(model="fake", engine_factory=FakeEngine)
    await model.setup()
    inputs = {"prompt": PROMPT, "messages": None, "max_tokens": 256, "temperature": 0.7}
    contexts = [PredictContext(f"p{i}", {}, lambda line: None) for i in range(2)]
    for ctx in contexts:
        assert [piece async for piece in model.predict(inputs, ctx)] == REPLY
    assert (contexts[0].cache_hit, contexts[0].tokens_reused) == (False, 0)
    assert (contexts[1].cache_hit, contexts[1].tokens_reused) == (True, REUSED)
    assert [(c.model_cache_hits, c.model_cache_misses) for c in contexts] == [(0, 1), (1, 0)]
    await model.unload()


async def test_flush_empties_the_prefix_cache(
    start_runner: StartRunner, http: aiohttp.ClientSession, op_tokens: Mint
):
    runner, _, engine = await start_llm(start_runner)
    await predict(http, runner, prompt=PROMPT)
    assert engine.prefix_cache == {PROMPT: 5}

    assert await flush(http, runner, op_tokens) == (
        200,
        {
            "flushed": True,
            "memoryFreedMB": None,  # the engine does not say what its blocks held
            "scope": "model",
            "model": "vllm",
            "entriesRemoved": 0,
            "freedBytes": 0,  # the result cache held nothing
            "modelCache": {"freedBytes": None, "freedBlocks": 1},  # blocks stay in the pool
        },
    )
    assert engine.prefix_cache == {}
    _, _, headers = await call(
        http, "POST", f"{runner.url}/predictions", {"input": {"prompt": PROMPT}}
    )
    assert headers["X-Cache-Hit"] == "false"


async def test_flush_is_refused_while_the_engine_runs_requests(
    start_runner: StartRunner,
    http: aiohttp.ClientSession,
    receiver: WebhookReceiver,
    op_tokens: Mint,
):
    runner, _, engine = await start_llm(start_runner, stall_after=2)
    request = {"input": {"prompt": PROMPT}, "webhook": receiver.url("f1")}
    await call(http, "PUT", f"{runner.url}/predictions/f1", request, ASYNC)
    await receiver.until("f1", lambda body: len(outputs(body)) == 2)

    status, body = await flush(http, runner, op_tokens)
    assert (status, body["code"]) == (409, "cache-busy")
    assert engine.prefix_cache == {PROMPT: 5}  # prefilled, and kept, as vLLM keeps it
    _, capabilities, _ = await call(http, "GET", f"{runner.url}/v1/capabilities")
    [loaded] = capabilities["models"]["loaded"]
    assert loaded["kv_cache"] == {
        "usage": 2 / BLOCKS_TOTAL,  # the running request's 5 tokens hold 2 blocks
        "blocks_total": BLOCKS_TOTAL,
        "blocks_used": 2,
        "blocks_cached": 1,
    }

    engine.resume()
    assert (await receiver.until_terminal("f1"))[-1].body["status"] == "succeeded"
    status, body = await flush(http, runner, op_tokens)
    assert (status, body["modelCache"]) == (200, {"freedBytes": None, "freedBlocks": 1})


async def test_capabilities_report_kv_cache_and_memory(
    start_runner: StartRunner, http: aiohttp.ClientSession
):
    runner, model, _ = await start_llm(start_runner)
    await predict(http, runner, prompt=PROMPT)  # 5 tokens prefilled: 1 whole block cached
    status, capabilities, _ = await call(http, "GET", f"{runner.url}/v1/capabilities")
    assert status == 200
    [loaded] = capabilities["models"]["loaded"]
    assert loaded["id"] == "vllm" and loaded["device"] == "cpu"
    assert loaded["model"] == "fake"
    assert loaded["max_model_len"] == 2048
    assert loaded["kv_cache"] == {
        "usage": 0.0,  # nothing running: cached prefix blocks are free to evict
        "blocks_total": BLOCKS_TOTAL,
        "blocks_used": 0,
        "blocks_cached": 1,
    }
    assert loaded["memoryBytes"] == model.memory_bytes() == ENGINE_BYTES  # the pool is fixed
    assert loaded["contextLength"] == 2048
    resources = capabilities["resources"]
    assert (resources["kvCacheSizeMB"], resources["kvCacheUtilization"]) == (None, 0.0)
    assert capabilities["capabilities"]["prefixCaching"] is True


async def test_unload_frees_memory_and_refuses_predictions_until_loaded_again(
    start_runner: StartRunner, http: aiohttp.ClientSession, op_tokens: Mint
):
    runner, model, engine = await start_llm(start_runner)
    assert model.memory_bytes() == ENGINE_BYTES
    assert model.load_progress() == 1.0

    unload = {"modelId": "vllm", "verifiedOpToken": op_tokens("model-unload")}
    status, body, _ = await call(http, "POST", f"{runner.url}/v1/models/unload", unload)
    assert status == 200, body
    assert (body["status"], body["freedBytes"], body["modelBytes"]) == (
        "unloaded",
        ENGINE_BYTES,
        ENGINE_BYTES,
    )
    assert body["rssDeltaBytes"] == body["rssAfterBytes"] - body["rssBeforeBytes"]
    assert model.memory_bytes() == 0 and not engine.running
    assert model.extra_capabilities() == {"model": "fake", "max_model_len": None, "kv_cache": None}
    status, body, headers = await call(
        http, "POST", f"{runner.url}/predictions", {"input": {"prompt": PROMPT}}
    )
    assert (status, body["status"], headers["Retry-After"]) == (503, "failed", "5")
    with pytest.raises(RuntimeError, match="model fake is not loaded"):
        await anext(model.predict({"prompt": PROMPT}, PredictContext("x", {}, lambda line: None)))
    assert engine.requests == []
    status, body = await flush(http, runner, op_tokens)
    assert (status, body["modelCache"]) == (200, None)  # nothing loaded, nothing to drop

    load = {"modelId": "vllm", "verifiedOpToken": op_tokens("model-load")}
    status, task, _ = await call(http, "POST", f"{runner.url}/v1/models/load", load)
    assert status == 202, task
    done = await wait_task(http, runner.url, task["taskId"])
    assert (done["status"], done["memoryUsedBytes"]) == ("completed", ENGINE_BYTES)
    assert engine.started == 2 and model.memory_bytes() == ENGINE_BYTES
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
