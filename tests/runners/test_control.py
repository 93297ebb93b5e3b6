"""The runner control API over real HTTP: capabilities, load/unload with operation tokens, cache
flush, health, metrics, and the headers every prediction response carries."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from runners.config import RunnerConfig
from runners.optokens import sign
from runners.resources import process_rss
from tests.runners.control_model import WEIGHTS, ControlModel
from tests.runners.lifecycle_calls import KEY, configure, wait_task

if TYPE_CHECKING:
    from conftest import Runner, StartRunner, WebhookReceiver

ASYNC = {"Prefer": "respond-async"}
DEADLINE = 10.0
TIMING = (
    "X-Queue-Wait-Ms",
    "X-GPU-Time-Ms",
    "X-Processing-Time",
    "X-Cache-Hit",
    "X-Cache-Tokens-Reused",
)


async def call(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, Any]:
    async with http.request(method, url, json=body, headers=headers) as response:
        if response.content_type in ("application/json", "application/problem+json"):
            return response.status, await response.json(), response.headers
        return response.status, await response.text(), response.headers


@pytest.fixture
def op_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """Configure operation tokens (2 of 3 signers) and return a minting function."""
    return configure(tmp_path, monkeypatch, "control")


# capabilities


async def test_capabilities_report_real_figures(
    start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    runner = await start_runner(model=ControlModel(), concurrency=2)
    status, body, _ = await call(http, "GET", f"{runner.url}/v1/capabilities")
    assert status == 200
    assert body["runnerType"] == "conduit-control" and body["runnerId"]
    assert body["hardware"] == "cpu"
    [loaded] = body["models"]["loaded"]
    assert (loaded["id"], loaded["memoryBytes"], loaded["gpuMemoryMB"]) == ("control", WEIGHTS, 0)
    assert loaded["loadedAt"] <= time.time()
    assert body["models"]["loading"] == []
    assert body["models"]["available"] == ["control"]
    resources = body["resources"]
    # No GPU here: the spec's GPU figures say so, measured rather than made up.
    assert resources["gpuIds"] == [] and resources["deviceIds"] == ["cpu"]
    assert resources["gpuMemoryTotalMB"] == resources["gpuMemoryUsedMB"] == 0
    assert resources["kvCacheSizeMB"] == 0 and resources["kvCacheUtilization"] == 0.0
    meminfo = Path("/proc/meminfo").read_text()
    total_kib = int(meminfo.split("MemTotal:")[1].split()[0])
    assert resources["memory"]["totalBytes"] == total_kib * 1024
    assert 0 < resources["memory"]["freeBytes"] <= resources["memory"]["totalBytes"]
    assert resources["process"]["rssBytes"] == pytest.approx(process_rss(), rel=0.5)
    assert body["queue"] == {
        "depth": 0,
        "maxDepth": 16,
        "avgWaitMs": 0,
        "p95WaitMs": 0,
        "slots": 2,
        "slotsInUse": 0,
    }
    assert (body["health"], body["healthReasons"]) == ("healthy", [])
    assert body["capabilities"]["cacheFlushScopes"] == ["all", "model", "tenant", "tag"]
    assert body["capabilities"]["prefixCaching"] is False


async def test_capabilities_are_cached_for_at_most_the_ttl(
    start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    runner = await start_runner(model=ControlModel(), capabilities_ttl=5.0)
    first = (await call(http, "GET", f"{runner.url}/v1/capabilities"))[1]
    second = (await call(http, "GET", f"{runner.url}/v1/capabilities"))[1]
    assert second["generatedAt"] == first["generatedAt"]
    fresh = await start_runner(model=ControlModel(), capabilities_ttl=0.0)
    a = (await call(http, "GET", f"{fresh.url}/v1/capabilities"))[1]
    b = (await call(http, "GET", f"{fresh.url}/v1/capabilities"))[1]
    assert a["generatedAt"] != b["generatedAt"]
    with pytest.raises(ValueError, match="less than or equal to 5"):
        RunnerConfig(capabilities_ttl=6.0)


async def test_capabilities_503_while_starting_and_stopping(
    start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    model = ControlModel()
    model.gate = asyncio.Event()
    runner = await start_runner(model=model, wait_ready=False)
    status, body, headers = await call(http, "GET", f"{runner.url}/v1/capabilities")
    assert (status, body["code"], headers["Retry-After"]) == (503, "starting", "1")
    health = await call(http, "GET", f"{runner.url}/health")
    assert (health[0], health[1]["reasons"]) == (503, ["starting"])
    model.gate.set()
    assert await asyncio.wait_for(runner.service.wait_ready(), DEADLINE)
    assert (await call(http, "GET", f"{runner.url}/v1/capabilities"))[0] == 200
    runner.service._stopping = True  # what stop() sets first; the app is still serving
    status, body, _ = await call(http, "GET", f"{runner.url}/v1/capabilities")
    assert (status, body["code"]) == (503, "stopping")
    runner.service._stopping = False


# load / unload / flush


async def test_unload_then_load_with_progress_and_eta(
    start_runner: StartRunner, http: aiohttp.ClientSession, op_tokens: Callable[..., str]
) -> None:
    model = ControlModel()
    runner = await start_runner(model=model)
    url = runner.url
    status, body, _ = await call(
        http,
        "POST",
        f"{url}/v1/models/unload",
        {"modelId": "control", "verifiedOpToken": op_tokens("model-unload")},
    )
    assert status == 200
    rss = {key: body.pop(key) for key in ("rssBeforeBytes", "rssAfterBytes", "rssDeltaBytes")}
    assert body == {
        "modelId": "control",
        "gpuMemoryFreedMB": 0,  # the model was on the CPU
        "kvCacheFlushed": True,
        "status": "unloaded",
        "freedBytes": WEIGHTS,
        "modelBytes": WEIGHTS,
        "cacheBytes": 0,
    }
    assert rss["rssBeforeBytes"] > 0 and rss["rssAfterBytes"] > 0
    assert rss["rssDeltaBytes"] == rss["rssAfterBytes"] - rss["rssBeforeBytes"]
    status, body, headers = await call(http, "POST", f"{url}/predictions", {"input": {}})
    assert (status, body["status"], headers["Retry-After"]) == (503, "failed", "5")
    assert (await call(http, "GET", f"{url}/health"))[1]["reasons"] == ["model unloaded"]

    model.gate = asyncio.Event()
    token = op_tokens("model-load")
    status, task, headers = await call(
        http, "POST", f"{url}/v1/models/load", {"modelId": "control", "verifiedOpToken": token}
    )
    assert status == 202
    assert headers["Location"] == f"/v1/models/load/{task['taskId']}"
    assert task["status"] == "loading" and task["progress"] in (0.0, 0.5)
    assert "memoryUsedBytes" not in task and "rssDeltaBytes" not in task
    assert task["eta"] is not None  # the setup load's duration is known
    _, running, _ = await call(http, "GET", f"{url}/v1/models/load/{task['taskId']}")
    assert (running["status"], running["phase"], running["progress"]) == ("loading", "running", 0.5)
    capabilities = (await call(http, "GET", f"{url}/v1/capabilities"))[1]
    assert capabilities["models"]["loading"][0]["taskId"] == task["taskId"]
    model.gate.set()
    done = await wait_task(http, url, task["taskId"])
    assert done["status"] == "completed" and done["progress"] == 1.0
    assert done["memoryUsedBytes"] == WEIGHTS and done["loadTimeSeconds"] > 0
    assert done["rssBeforeBytes"] > 0 and done["rssAfterBytes"] > 0
    assert done["rssDeltaBytes"] == done["rssAfterBytes"] - done["rssBeforeBytes"]
    status, body, _ = await call(http, "POST", f"{url}/predictions", {"input": {"prompt": "a"}})
    assert (status, body["output"]) == (200, "a!")


async def test_failed_load_and_evict(
    start_runner: StartRunner, http: aiohttp.ClientSession, op_tokens: Callable[..., str]
) -> None:
    model = ControlModel()
    runner = await start_runner(model=model)
    load = {"modelId": "control", "verifiedOpToken": op_tokens("model-load")}
    status, body, _ = await call(http, "POST", f"{runner.url}/v1/models/load", load)
    assert (status, body["code"]) == (409, "lifecycle-conflict")  # already loaded

    model.fail_next_load = True
    evict = {
        "modelId": "control",
        "evictModel": "control",
        "verifiedOpToken": op_tokens("model-load"),
    }
    status, task, _ = await call(http, "POST", f"{runner.url}/v1/models/load", evict)
    assert status == 202
    failed = await wait_task(http, runner.url, task["taskId"])
    assert failed["status"] == "failed" and failed["error"] == "weights are corrupt"
    assert failed["freedBytes"] == WEIGHTS
    assert (await call(http, "GET", f"{runner.url}/health"))[1]["reasons"] == ["model failed"]
    retry = {"modelId": "control", "verifiedOpToken": op_tokens("model-load")}
    status, task, _ = await call(http, "POST", f"{runner.url}/v1/models/load", retry)
    assert (await wait_task(http, runner.url, task["taskId"]))["status"] == "completed"
    unknown = {"modelId": "other", "verifiedOpToken": op_tokens("model-load", "other")}
    status, body, _ = await call(http, "POST", f"{runner.url}/v1/models/load", unknown)
    assert (status, body["code"]) == (404, "unknown-model")
    status, body, _ = await call(http, "GET", f"{runner.url}/v1/models/load/load_nope")
    assert (status, body["code"]) == (404, "unknown-task")


async def test_unload_refused_while_predictions_run(
    start_runner: StartRunner,
    http: aiohttp.ClientSession,
    receiver: WebhookReceiver,
    op_tokens: Callable[..., str],
) -> None:
    runner = await start_runner(model=ControlModel())
    request = {"input": {"delay": 60}, "webhook": receiver.url("u1")}
    assert (await call(http, "PUT", f"{runner.url}/predictions/u1", request, ASYNC))[0] == 202
    await receiver.next("u1")
    unload = {"modelId": "control", "verifiedOpToken": op_tokens("model-unload")}
    status, body, _ = await call(http, "POST", f"{runner.url}/v1/models/unload", unload)
    assert (status, body["code"]) == (409, "lifecycle-conflict")
    assert "1 predictions" in body["detail"]
    await call(http, "POST", f"{runner.url}/predictions/u1/cancel")


async def _predict(
    http: aiohttp.ClientSession, runner: Runner, prompt: str, **headers: str
) -> tuple[str, Any]:
    headers = {k.replace("_", "-"): v for k, v in headers.items()}
    status, body, response_headers = await call(
        http, "POST", f"{runner.url}/predictions", {"input": {"prompt": prompt}}, headers
    )
    assert status == 200, body
    return response_headers["X-Cache-Hit"], response_headers


async def test_cache_modes_and_flush_scopes(
    start_runner: StartRunner, http: aiohttp.ClientSession, op_tokens: Callable[..., str]
) -> None:
    model = ControlModel()
    runner = await start_runner(model=model)
    tenant = {"X_Tenant_ID": "t1"}
    assert (await _predict(http, runner, "one two", **tenant))[0] == "false"
    hit, headers = await _predict(http, runner, "one two", **tenant)
    assert (hit, headers["X-Cache-Tokens-Reused"]) == ("true", "2")
    assert (await _predict(http, runner, "one two", X_Cache_Mode="bypass"))[0] == "false"
    assert (await _predict(http, runner, "one two", X_Cache_Mode="refresh"))[0] == "false"
    await _predict(http, runner, "tagged", X_Tenant_ID="t2", X_Cache_Tag="blue")
    await _predict(http, runner, "other", X_Tenant_ID="t2")
    assert len(runner.service.cache) == 3

    async def flush(scope: str, **extra: str) -> dict[str, Any]:
        body = {"scope": scope, **extra, "verifiedOpToken": op_tokens("cache-flush")}
        status, answer, _ = await call(http, "POST", f"{runner.url}/v1/cache/flush", body)
        assert status == 200, answer
        return dict(answer)

    assert await flush("tag", tag="blue") == {
        "flushed": True,
        "memoryFreedMB": 0,  # a few bytes
        "scope": "tag",
        "tag": "blue",
        "entriesRemoved": 1,
        "freedBytes": len("tagged!"),
        "modelCache": None,  # tags and tenants live only in the result cache
    }
    assert (await flush("tenant", tenantId="t2"))["entriesRemoved"] == 1  # the spec's name
    # "refresh" rewrote "one two" as tenant "default"; tenant t1 has nothing left
    assert (await flush("tenant", tenant="t1"))["entriesRemoved"] == 0
    model_cache = {"freedBytes": 0, "freedBlocks": None}
    assert await flush("model", model="control") == {
        "flushed": True,
        "memoryFreedMB": 0,
        "scope": "model",
        "model": "control",
        "entriesRemoved": 1,
        "freedBytes": len("one two!"),
        "modelCache": model_cache,
    }
    await _predict(http, runner, "again")
    assert await flush("all") == {
        "flushed": True,
        "memoryFreedMB": 0,
        "scope": "all",
        "entriesRemoved": 1,
        "freedBytes": 6,
        "modelCache": model_cache,
    }
    assert model.flushed == 2  # the model's own caches too, for "model" and "all"
    body = {"scope": "tenant", "verifiedOpToken": op_tokens("cache-flush")}
    status, answer, _ = await call(http, "POST", f"{runner.url}/v1/cache/flush", body)
    assert (status, answer["field"]) == (422, "tenantId")
    body = {"scope": "everything", "verifiedOpToken": op_tokens("cache-flush")}
    status, answer, _ = await call(http, "POST", f"{runner.url}/v1/cache/flush", body)
    assert (status, answer["field"]) == (422, "scope")
    status, answer, _ = await call(
        http, "POST", f"{runner.url}/predictions", {"input": {}}, {"X-Cache-Mode": "sometimes"}
    )
    assert status == 400


# operation tokens: every rejection reason


def _forged(body: dict[str, Any], signature: str) -> str:
    raw = json.dumps({"opToken": body, "signature": signature}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).rstrip(b"=").decode()


async def test_every_op_token_rejection_reason(
    start_runner: StartRunner, http: aiohttp.ClientSession, op_tokens: Callable[..., str]
) -> None:
    runner = await start_runner(model=ControlModel())
    url = f"{runner.url}/v1/models/unload"

    async def refused(token: str | None) -> tuple[int, str]:
        body: dict[str, Any] = {"modelId": "control"}
        if token is not None:
            body["verifiedOpToken"] = token
        status, answer, _ = await call(http, "POST", url, body)
        return status, answer["code"]

    assert await refused(None) == (401, "op-token-required")
    assert await refused("") == (401, "op-token-required")
    assert await refused("%%%") == (403, "malformed-op-token")
    status, answer, _ = await call(http, "POST", url, {"modelId": 7, "verifiedOpToken": "x"})
    assert (status, answer["code"], answer["field"]) == (422, "invalid-field", "modelId")
    assert await refused(op_tokens("model-unload", key=b"x" * 32)) == (403, "bad-signature")
    late = datetime.now(UTC) - timedelta(minutes=6)
    assert await refused(op_tokens("model-unload", now=late)) == (403, "outside-validity-window")
    assert await refused(op_tokens("model-load")) == (403, "operation-mismatch")
    assert await refused(op_tokens("model-unload", "other")) == (403, "model-mismatch")
    assert await refused(op_tokens("model-unload", signers=["alice", "mallory"])) == (
        403,
        "insufficient-signers",
    )
    body = json.loads(base64.urlsafe_b64decode(op_tokens("model-unload") + "=="))["opToken"]
    body["signers"] = ["alice", "bob", "carol"]  # tampered after signing
    assert await refused(_forged(body, "0" * 64)) == (403, "bad-signature")
    resigned = {"modelId": "control", "verifiedOpToken": _forged(body, sign(KEY, body))}
    assert (await call(http, "POST", url, resigned))[0] == 200  # signed by the key: accepted
    token = op_tokens("model-load")
    load = {"modelId": "control", "verifiedOpToken": token}
    assert (await call(http, "POST", f"{runner.url}/v1/models/load", load))[0] == 202
    status, answer, _ = await call(http, "POST", f"{runner.url}/v1/models/load", load)
    assert (status, answer["code"]) == (403, "replayed-nonce")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/models/load", {"modelId": "{model}"}),
        ("/v1/models/load", {"modelId": "control", "evictModel": "{model}"}),
        ("/v1/models/unload", {"modelId": "{model}"}),
        ("/v1/cache/flush", {"scope": "model", "model": "{model}"}),
    ],
)
async def test_lifecycle_calls_authorise_before_looking_at_the_model(
    start_runner: StartRunner,
    http: aiohttp.ClientSession,
    op_tokens: Callable[..., str],
    path: str,
    body: dict[str, str],
) -> None:
    """Without a valid token, a served and an unknown model get the same answer."""
    runner = await start_runner(model=ControlModel())
    operation = {"load": "model-load", "unload": "model-unload", "flush": "cache-flush"}
    answers = []
    for model in ("control", "other"):
        named = {key: value.replace("{model}", model) for key, value in body.items()}
        for token in (None, op_tokens(operation[path.rsplit("/", 1)[1]], model, key=b"x" * 32)):
            sent = named if token is None else {**named, "verifiedOpToken": token}
            status, answer, _ = await call(http, "POST", f"{runner.url}{path}", sent)
            answers.append((model, status, answer["code"]))
    assert answers == [
        (model, status, code)
        for model in ("control", "other")
        for status, code in ((401, "op-token-required"), (403, "bad-signature"))
    ]
    assert runner.service.ready  # nothing was unloaded or flushed


async def test_lifecycle_calls_disabled_without_a_key(
    start_runner: StartRunner, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VERIFIED_OP_TOKEN_KEY_PATH", raising=False)
    runner = await start_runner(model=ControlModel())
    status, body, _ = await call(
        http, "POST", f"{runner.url}/v1/models/unload", {"modelId": "control"}
    )
    assert (status, body["code"]) == (403, "op-tokens-not-configured")
    status, body, _ = await call(http, "POST", f"{runner.url}/predictions", {"input": {}})
    assert status == 200  # inference needs no token


# backpressure, priority, rate limits


async def test_queue_serves_by_priority_then_refuses_when_full(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
) -> None:
    model = ControlModel()
    runner = await start_runner(model=model, concurrency=1, max_queue_depth=3)
    hold = {"input": {"prompt": "hold", "delay": 60}, "webhook": receiver.url("hold")}
    await call(http, "PUT", f"{runner.url}/predictions/hold", hold, ASYNC)
    await receiver.next("hold")
    for key, priority in (("low", "low"), ("normal", "normal"), ("high", "high")):
        request = {"input": {"prompt": key}, "webhook": receiver.url(key)}
        headers = {**ASYNC, "X-Priority": priority}
        status, body, _ = await call(
            http, "PUT", f"{runner.url}/predictions/{key}", request, headers
        )
        assert (status, body) == (202, {"id": key, "status": "starting"})
    _, health, _ = await call(http, "GET", f"{runner.url}/health-check")
    assert health["status"] == "BUSY"
    status, body, headers = await call(http, "POST", f"{runner.url}/predictions", {"input": {}})
    assert (status, body["code"], int(headers["Retry-After"]) >= 1) == (503, "queue_full", True)
    assert (body["error"]["code"], body["error"]["queueDepth"]) == ("queue_full", 3)
    assert all(name in headers for name in TIMING)
    status, body, _ = await call(http, "GET", f"{runner.url}/health")
    assert (status, body["reasons"]) == (503, ["queue saturated"])

    await call(http, "POST", f"{runner.url}/predictions/normal/cancel")  # canceled while queued
    assert (await receiver.until_terminal("normal"))[-1].body["status"] == "canceled"
    await call(http, "POST", f"{runner.url}/predictions/hold/cancel")
    for key in ("high", "low"):
        final = (await receiver.until_terminal(key))[-1].body
        assert final["status"] == "succeeded"
        assert final["metrics"]["queue_wait_time"] > 0
    assert model.started == ["hold", "high", "low"]


async def test_every_prediction_response_carries_the_timing_headers(
    start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    runner = await start_runner(model=ControlModel())
    url = f"{runner.url}/predictions"
    cases: list[tuple[str, str, dict[str, Any], int]] = [
        ("POST", url, {"data": b"{nope"}, 400),  # malformed JSON
        ("POST", url, {"json": {"input": {}}, "headers": {"X-Cache-Mode": "sometimes"}}, 400),
        ("PUT", f"{url}/p1", {"json": {"id": "other", "input": {}}}, 422),  # id mismatch
        ("POST", url, {"json": {"input": [1]}}, 422),  # not a prediction request
        ("POST", url, {"json": {"input": {"delay": -1}}}, 422),  # fails the Input schema
        ("POST", url, {"json": {"input": {"prompt": "ok"}}}, 200),
    ]
    for method, target, options, expected in cases:
        async with http.request(method, target, **options) as response:
            headers = response.headers
            assert response.status == expected, await response.text()
            assert [name for name in TIMING if name not in headers] == [], expected
            assert float(headers["X-Processing-Time"]) > 0
            if expected != 200:  # refused before anything ran: zero, not absent
                assert [headers[name] for name in TIMING if name != "X-Processing-Time"] == [
                    "0",
                    "0",
                    "false",
                    "0",
                ]


async def test_sync_response_headers_report_the_queue_wait(
    start_runner: StartRunner, http: aiohttp.ClientSession, receiver: WebhookReceiver
) -> None:
    runner = await start_runner(model=ControlModel(), concurrency=1)
    hold = {"input": {"prompt": "hold", "delay": 0.3}, "webhook": receiver.url("h")}
    await call(http, "PUT", f"{runner.url}/predictions/h", hold, ASYNC)
    await receiver.next("h")
    status, body, headers = await call(http, "POST", f"{runner.url}/predictions", {"input": {}})
    assert status == 200
    waited = int(headers["X-Queue-Wait-Ms"])
    assert waited > 0 and waited == round(body["metrics"]["queue_wait_time"] * 1000)
    assert headers["X-GPU-Time-Ms"] == "0" and body["metrics"]["gpu_time"] == 0.0
    assert float(headers["X-Processing-Time"]) >= body["metrics"]["predict_time"] + waited / 1000
    assert (headers["X-Cache-Hit"], headers["X-Cache-Tokens-Reused"]) == ("false", "0")


async def test_tenant_rate_limits(
    start_runner: StartRunner, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENANT_RATE_LIMIT_acme", "2req/min")
    monkeypatch.setenv("TENANT_RATE_LIMIT_default", "3req/min")
    runner = await start_runner(model=ControlModel(), concurrency=2)

    async def predict(tenant: str) -> tuple[int, Any, Any]:
        headers = {"X-Tenant-ID": tenant}
        return await call(http, "POST", f"{runner.url}/predictions", {"input": {}}, headers)

    first = await predict("acme")
    assert first[0] == 200
    assert (first[2]["X-RateLimit-Limit"], first[2]["X-RateLimit-Remaining"]) == ("2", "1")
    assert (await predict("acme"))[0] == 200
    status, body, headers = await predict("acme")
    assert status == 429
    error = body["error"]
    assert (error["code"], error["limit"], error["remaining"]) == ("rate_limit_exceeded", 2, 0)
    assert body["tenant"] == "acme"
    assert 55 <= int(headers["Retry-After"]) <= 60
    reset = datetime.fromtimestamp(error["resetAt"], UTC)
    assert timedelta(seconds=55) < reset - datetime.now(UTC) <= timedelta(seconds=61)
    assert headers["X-RateLimit-Remaining"] == "0"
    assert [(await predict("other"))[0] for _ in range(4)] == [200, 200, 200, 429]
    _, metrics, _ = await call(http, "GET", f"{runner.url}/metrics")
    assert (
        'conduit_runner_requests_total{model="control",status="rate_limited",tenant="acme"} 1.0'
        in metrics
    )


# health and metrics


async def test_health_reports_out_of_memory(
    start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    runner = await start_runner(model=ControlModel(), memory_limit=1024)
    status, body, _ = await call(http, "GET", f"{runner.url}/health")
    assert (status, body["reasons"]) == (503, ["out of memory"])
    healthy = await start_runner(model=ControlModel())
    status, body, _ = await call(http, "GET", f"{healthy.url}/health")
    assert (status, body["status"], body["model"]) == (
        200,
        "healthy",
        {"id": "control", "state": "loaded"},
    )


async def test_metrics_follow_requests(
    start_runner: StartRunner, http: aiohttp.ClientSession
) -> None:
    runner = await start_runner(model=ControlModel())
    await _predict(http, runner, "m", X_Tenant_ID="t9")
    await _predict(http, runner, "m", X_Tenant_ID="t9")
    status, text, headers = await call(http, "GET", f"{runner.url}/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    lines = text.splitlines()

    def value(prefix: str) -> float:
        return float(next(line for line in lines if line.startswith(prefix)).split()[-1])

    assert (
        value('conduit_runner_requests_total{model="control",status="succeeded",tenant="t9"}') == 2
    )
    assert value('conduit_runner_inference_seconds_count{model="control"}') == 2
    assert value('conduit_runner_queue_wait_seconds_count{model="control"}') == 2
    assert value("conduit_runner_queue_depth") == 0
    assert value("conduit_runner_cache_hit_ratio") == 0.5
    assert value('conduit_runner_cache_lookups_total{cache="result",result="hit"}') == 1
    assert value('conduit_runner_memory_bytes{kind="model"}') == WEIGHTS
    assert value('conduit_runner_memory_bytes{kind="rss"}') > 0
