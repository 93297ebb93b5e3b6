"""The runner control API against the runner API spec (seed 004), field for field.

Each test starts a real runner process (``python -m runners echo``) and checks that the
responses of one endpoint carry every field of the spec's example, by the spec's name and with
the JSON type of the example's value. Fields beyond the spec's are allowed; renamed or missing
ones are not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conduit.services import free_port
from runners.optokens import issue
from tests.fixtures.waiting import wait_for
from tests.runners.lifecycle_calls import KEY, SIGNERS

# The spec's examples, reduced to their JSON types: "string", "integer", "number", "boolean",
# a nested shape, or a one-item list giving the shape of every item.
Shape = str | dict[str, Any] | list[Any]

CAPABILITIES: dict[str, Shape] = {
    "runnerType": "string",
    "runnerId": "string",
    "models": {
        "loaded": [
            {
                "id": "string",
                "quantization": "string?",
                "contextLength": "integer?",
                "loadedAt": "integer",
                "gpuMemoryMB": "integer",
            }
        ],
        "loading": [{"id": "string", "progress": "number", "eta": "integer?"}],
        "available": ["string"],
    },
    "resources": {
        "gpuIds": ["integer"],
        "gpuMemoryTotalMB": "integer",
        "gpuMemoryUsedMB": "integer",
        "gpuMemoryFreeMB": "integer",
        "gpuUtilization": "number",
        "kvCacheSizeMB": "integer",
        "kvCacheUtilization": "number",
    },
    "queue": {
        "depth": "integer",
        "maxDepth": "integer",
        "avgWaitMs": "integer",
        "p95WaitMs": "integer",
    },
    "capabilities": {
        "streaming": "boolean",
        "prefixCaching": "boolean",
        "multiTenant": "boolean",
        "visionInput": "boolean",
        "audioInput": "boolean",
        "functionCalling": "boolean",
    },
    "health": "string",
}
LOAD_ACCEPTED: dict[str, Shape] = {
    "taskId": "string",
    "status": "string",
    "progress": "number",
    "eta": "integer",
}
LOAD_COMPLETED: dict[str, Shape] = {
    "taskId": "string",
    "status": "string",
    "modelId": "string",
    "gpuMemoryUsedMB": "integer",
    "loadTimeMs": "integer",
}
UNLOAD: dict[str, Shape] = {
    "modelId": "string",
    "gpuMemoryFreedMB": "integer",
    "kvCacheFlushed": "boolean",
}
FLUSH: dict[str, Shape] = {
    "flushed": "boolean",
    "entriesRemoved": "integer",
    "memoryFreedMB": "integer",
}
HEALTH: dict[str, Shape] = {
    "status": "string",
    "uptime": "integer",
    "modelsLoaded": "integer",
    "queueDepth": "integer",
}
QUEUE_FULL: dict[str, Shape] = {
    "error": {
        "code": "string",
        "message": "string",
        "queueDepth": "integer",
        "avgWaitMs": "integer",
    }
}
RATE_LIMITED: dict[str, Shape] = {
    "error": {
        "code": "string",
        "message": "string",
        "limit": "integer",
        "remaining": "integer",
        "resetAt": "integer",
    }
}
PROBLEM: dict[str, Shape] = {
    "type": "string",
    "title": "string",
    "status": "integer",
    "detail": "string",
}

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def conforms(value: Any, shape: Shape, where: str = "$") -> list[str]:
    """Where ``value`` departs from ``shape``; empty when it conforms."""
    if isinstance(shape, str):
        kind, optional = shape.rstrip("?"), shape.endswith("?")
        if value is None and optional:
            return []
        ok = isinstance(value, _TYPES[kind]) and (kind == "boolean") == isinstance(value, bool)
        return [] if ok else [f"{where}: {value!r} is not {kind}"]
    if isinstance(shape, list):
        if not isinstance(value, list):
            return [f"{where}: {value!r} is not an array"]
        return [
            issue
            for i, item in enumerate(value)
            for issue in conforms(item, shape[0], f"{where}[{i}]")
        ]
    if not isinstance(value, dict):
        return [f"{where}: {value!r} is not an object"]
    issues = [f"{where}.{key}: missing" for key in shape if key not in value]
    for key, inner in shape.items():
        if key in value:
            issues += conforms(value[key], inner, f"{where}.{key}")
    return issues


@dataclass
class RunnerProcess:
    url: str
    http: httpx.Client

    def token(self, operation: str) -> str:
        return issue(KEY, operation, "echo", SIGNERS[:2])

    def predict(self, prediction_id: str, tenant: str, **inputs: Any) -> httpx.Response:
        return self.http.put(
            f"{self.url}/predictions/{prediction_id}",
            json={"input": inputs},
            headers={"Prefer": "respond-async", "X-Tenant-ID": tenant},
        )


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[RunnerProcess]:
    key_file = tmp_path / "op.key"
    key_file.write_bytes(KEY)
    port = free_port()
    env = {
        **os.environ,
        "VERIFIED_OP_TOKEN_KEY_PATH": str(key_file),
        "OP_TOKEN_SIGNERS": ",".join(SIGNERS),
        "OP_TOKEN_MIN_SIGNERS": "2",
        "MAX_QUEUE_DEPTH": "1",
        "TENANT_RATE_LIMIT_limited": "1req/min",
        "CONDUIT_RUNNER_CAPABILITIES_TTL": "0",
    }
    args = ["echo", "--host", "127.0.0.1", "--port", str(port), "--concurrency", "1"]
    log = (tmp_path / "runner.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "runners", *args], env=env, stdout=log, stderr=log
    )
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=10) as http:

            def ready() -> bool:
                assert proc.poll() is None, (tmp_path / "runner.log").read_text()
                try:
                    return http.get(f"{url}/health-check").json()["status"] == "READY"
                except httpx.TransportError:
                    return False

            wait_for(ready, "runner ready")
            yield RunnerProcess(url, http)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_capabilities(runner: RunnerProcess) -> None:
    response = runner.http.get(f"{runner.url}/v1/capabilities")
    assert response.status_code == 200
    body = response.json()
    assert conforms(body, CAPABILITIES) == []
    assert body["health"] == "healthy" and body["models"]["available"] == ["echo"]
    # A CPU host: the GPU figures say there is none.
    resources = body["resources"]
    assert resources["gpuIds"] == [] and resources["gpuMemoryTotalMB"] == 0


def test_load_and_its_task(runner: RunnerProcess) -> None:
    load = {"modelId": "echo", "evictModel": "echo", "verifiedOpToken": runner.token("model-load")}
    accepted = runner.http.post(f"{runner.url}/v1/models/load", json=load)
    assert accepted.status_code == 202
    task = accepted.json()
    assert conforms(task, LOAD_ACCEPTED) == [] and task["status"] == "loading"

    def finished() -> dict[str, Any] | None:
        body: dict[str, Any] = runner.http.get(
            f"{runner.url}/v1/models/load/{task['taskId']}"
        ).json()
        return body if body["status"] != "loading" else None

    done = wait_for(finished, "load task finished")
    assert conforms(done, LOAD_COMPLETED) == [] and done["status"] == "completed"
    assert done["modelId"] == "echo" and done["gpuMemoryUsedMB"] == 0


def test_unload(runner: RunnerProcess) -> None:
    unload = {"modelId": "echo", "verifiedOpToken": runner.token("model-unload")}
    response = runner.http.post(f"{runner.url}/v1/models/unload", json=unload)
    assert response.status_code == 200
    assert conforms(response.json(), UNLOAD) == []


def test_cache_flush(runner: RunnerProcess) -> None:
    flush = {
        "scope": "tenant",
        "tenantId": "community-x",
        "modelId": None,
        "verifiedOpToken": runner.token("cache-flush"),
    }
    response = runner.http.post(f"{runner.url}/v1/cache/flush", json=flush)
    assert response.status_code == 200
    body = response.json()
    assert conforms(body, FLUSH) == [] and body["flushed"] is True


def test_health(runner: RunnerProcess) -> None:
    response = runner.http.get(f"{runner.url}/health")
    assert response.status_code == 200
    body = response.json()
    assert conforms(body, HEALTH) == [] and body["status"] == "healthy"
    assert (body["modelsLoaded"], body["queueDepth"]) == (1, 0)


def test_queue_full(runner: RunnerProcess) -> None:
    assert runner.predict("running", "a", delay=60).status_code == 202
    assert runner.predict("queued", "a", delay=60).status_code == 202
    refused = runner.predict("refused", "a")
    assert refused.status_code == 503
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.headers["Content-Type"].startswith("application/problem+json")
    body = refused.json()
    assert conforms(body, QUEUE_FULL) == [] and conforms(body, PROBLEM) == []
    assert (body["error"]["code"], body["error"]["queueDepth"]) == ("queue_full", 1)
    for prediction_id in ("queued", "running"):
        runner.http.post(f"{runner.url}/predictions/{prediction_id}/cancel")


def test_rate_limit(runner: RunnerProcess) -> None:
    assert runner.predict("first", "limited").status_code == 202
    refused = runner.predict("second", "limited")
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) >= 1
    body = refused.json()
    assert conforms(body, RATE_LIMITED) == [] and conforms(body, PROBLEM) == []
    error = body["error"]
    assert (error["code"], error["limit"], error["remaining"]) == ("rate_limit_exceeded", 1, 0)


@pytest.mark.parametrize(
    ("value", "shape", "issues"),
    [
        ({"a": 1}, {"a": "integer"}, []),
        ({"a": True}, {"a": "integer"}, ["$.a: True is not integer"]),
        ({"a": 1}, {"a": "boolean"}, ["$.a: 1 is not boolean"]),
        ({}, {"a": "string"}, ["$.a: missing"]),
        ({"a": [1, "x"]}, {"a": ["integer"]}, ["$.a[1]: 'x' is not integer"]),
        ({"a": None}, {"a": "integer?"}, []),
    ],
)
def test_the_shape_check_itself(value: Any, shape: Shape, issues: list[str]) -> None:
    assert conforms(value, shape) == issues
