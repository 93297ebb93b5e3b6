"""The runner control API against the runner API spec (seed 004), field for field.

Each test starts a real runner process (``python -m runners echo``) and checks that the
responses of one endpoint carry every field of the spec's example (:mod:`spec_examples`), by
the spec's name and with the JSON type of the example's value. Fields beyond the spec's are
allowed; renamed or missing ones are not. The runner's other states (starting, stopping, a load
under way, a failed load) are in ``test_spec_states``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.ports import free_port
from runners.optokens import issue
from tests.fixtures.waiting import wait_for
from tests.runners.lifecycle_calls import KEY, SIGNERS
from tests.runners.spec_examples import EXAMPLES, check, conforms, parse_spec, spec_text

PROBLEM = {"type": "about:blank", "title": "...", "status": 503, "detail": "..."}


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
                    return bool(http.get(f"{url}/health-check").json()["status"] == "READY")
                except httpx.TransportError:
                    return False

            wait_for(ready, "runner ready")
            yield RunnerProcess(url, http)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_the_examples_here_are_the_specs() -> None:
    text = spec_text()
    if text is None:
        pytest.skip("the spec's text is not here; CONDUIT_RUNNER_SPEC names it")
    assert parse_spec(text) == EXAMPLES


def test_capabilities(runner: RunnerProcess) -> None:
    response = runner.http.get(f"{runner.url}/v1/capabilities")
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert check("capabilities", body) == []
    assert body["health"] == "healthy" and body["models"]["available"] == ["echo"]
    loaded = body["models"]["loaded"]
    assert [model["id"] for model in loaded] == ["echo"]
    assert isinstance(loaded[0]["loadedAt"], int) and loaded[0]["gpuMemoryMB"] == 0
    # A CPU host: the GPU figures say there is none.
    resources = body["resources"]
    assert resources["gpuIds"] == [] and resources["gpuMemoryTotalMB"] == 0


def test_load_and_its_task(runner: RunnerProcess) -> None:
    load = EXAMPLES["load_request"] | {
        "modelId": "echo",
        "evictModel": "echo",
        "verifiedOpToken": runner.token("model-load"),
    }
    accepted = runner.http.post(f"{runner.url}/v1/models/load", json=load)
    assert accepted.status_code == 202
    task = accepted.json()
    assert check("load_accepted", task) == [] and task["status"] == "loading"
    assert isinstance(task["eta"], int)  # the setup's load took a measured time
    assert accepted.headers["Location"] == f"/v1/models/load/{task['taskId']}"

    def finished() -> dict[str, Any] | None:
        body: dict[str, Any] = runner.http.get(
            f"{runner.url}/v1/models/load/{task['taskId']}"
        ).json()
        return body if body["status"] != "loading" else None

    done = wait_for(finished, "load task finished")
    assert check("load_completed", done) == [] and done["status"] == "completed"
    assert done["modelId"] == "echo" and done["gpuMemoryUsedMB"] == 0


def test_unload(runner: RunnerProcess) -> None:
    unload = EXAMPLES["unload_request"] | {
        "modelId": "echo",
        "verifiedOpToken": runner.token("model-unload"),
    }
    response = runner.http.post(f"{runner.url}/v1/models/unload", json=unload)
    assert response.status_code == 200
    body = response.json()
    assert check("unload", body) == []
    assert (body["modelId"], body["gpuMemoryFreedMB"], body["kvCacheFlushed"]) == ("echo", 0, True)


@pytest.mark.parametrize(
    "fields",
    [
        {"scope": "all"},
        {"scope": "model", "modelId": "echo"},
        {"scope": "tenant", "tenantId": "community-x", "modelId": None},
        {"scope": "tag", "tag": "session-abc123"},
    ],
    ids=lambda fields: fields["scope"],
)
def test_cache_flush(runner: RunnerProcess, fields: dict[str, Any]) -> None:
    flush = {"verifiedOpToken": runner.token("cache-flush"), **fields}
    if fields["scope"] == "tenant":
        flush = EXAMPLES["flush_request"] | flush
    response = runner.http.post(f"{runner.url}/v1/cache/flush", json=flush)
    assert response.status_code == 200
    body = response.json()
    assert check("flush", body) == [] and body["flushed"] is True
    # echo keeps no caches of its own: all the flush frees is measured
    assert isinstance(body["memoryFreedMB"], int) and body["scope"] == fields["scope"]


def test_health(runner: RunnerProcess) -> None:
    response = runner.http.get(f"{runner.url}/health")
    assert response.status_code == 200
    body = response.json()
    assert check("health", body) == [] and body["status"] == "healthy"
    assert (body["modelsLoaded"], body["queueDepth"]) == (1, 0)


def test_queue_full(runner: RunnerProcess) -> None:
    assert runner.predict("running", "a", delay=60).status_code == 202
    assert runner.predict("queued", "a", delay=60).status_code == 202
    refused = runner.predict("refused", "a")
    assert refused.status_code == 503
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.headers["Content-Type"].startswith("application/problem+json")
    body = refused.json()
    assert check("queue_full", body) == [] and conforms(body, PROBLEM) == []
    assert (body["error"]["code"], body["error"]["queueDepth"]) == ("queue_full", 1)
    assert body["status"] == 503
    for prediction_id in ("queued", "running"):
        runner.http.post(f"{runner.url}/predictions/{prediction_id}/cancel")


def test_rate_limit(runner: RunnerProcess) -> None:
    assert runner.predict("first", "limited").status_code == 202
    refused = runner.predict("second", "limited")
    assert refused.status_code == 429
    assert refused.headers["Content-Type"].startswith("application/problem+json")
    retry_after = int(refused.headers["Retry-After"])
    assert 1 <= retry_after <= 60  # the window is a minute
    body = refused.json()
    assert check("rate_limited", body) == [] and conforms(body, PROBLEM) == []
    error = body["error"]
    assert (error["code"], error["limit"], error["remaining"]) == ("rate_limit_exceeded", 1, 0)
    assert body["status"] == 429
    headers = refused.headers
    assert (headers["X-RateLimit-Limit"], headers["X-RateLimit-Remaining"]) == ("1", "0")
    assert int(headers["X-RateLimit-Reset"]) == error["resetAt"]


def test_op_token() -> None:
    token = issue(KEY, "model-load", "echo", SIGNERS[:2])
    envelope = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    assert check("op_token", envelope) == []
    assert isinstance(envelope["opToken"]["issuedAt"], int)  # epoch seconds


@pytest.mark.parametrize(
    ("value", "example", "issues"),
    [
        ({"a": 1}, {"a": 5}, []),
        ({"a": 1}, {"a": 0.5}, []),
        ({"a": 0.5}, {"a": 5}, ["$.a: 0.5 is not integer"]),
        ({"a": True}, {"a": 5}, ["$.a: True is not integer"]),
        ({"a": 1}, {"a": False}, ["$.a: 1 is not boolean"]),
        ({}, {"a": "x"}, ["$.a: missing"]),
        ({"a": None}, {"a": 5}, ["$.a: None is not integer"]),
        ({"a": [1, "x"]}, {"a": [0]}, ["$.a[]: 'x' is not integer"]),
        ({"a": {"b": None}}, {"a": {"b": 1}}, ["$.a.b: None is not integer"]),
    ],
)
def test_the_check_itself(value: Any, example: Any, issues: list[str]) -> None:
    assert conforms(value, example) == issues
    nullable = frozenset({"$.a", "$.a.b"})
    assert conforms({"a": None}, {"a": 5}, nullable) == []
    assert conforms({"a": {"b": None}}, {"a": {"b": 1}}, nullable) == []
