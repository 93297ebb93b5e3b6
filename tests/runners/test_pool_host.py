"""``conduit runner pool``: a real pool process, its slots loaded, evicted and refused by the
core, each slot a Cog runner under ``/models/<name>``, the control API at the root."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.ports import free_port
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, wait_status
from tests.fixtures.pool_host import MIB, answers, slots, start_pool
from tests.fixtures.processes import RUNNER_AUTH, RUNNER_TOKEN, Launcher, Proc
from tests.fixtures.waiting import wait_for
from tests.runners.lifecycle_calls import configure

GATED = "tests.fixtures.pool_models:GatedEcho"
COG_MODEL = Path(__file__).resolve().parent.parent / "fixtures" / "cog_model"
TRAINER = COG_MODEL.parent / "cog_trainer"


def _models() -> list[dict[str, Any]]:
    """a and b cannot both fit beside the pinned p (100 MiB budget)."""
    return [
        {"name": "a", "backend": {"conduit": GATED}, "size": 60 * MIB},
        {"name": "b", "backend": {"conduit": "echo"}, "size": "60MiB"},
        {"name": "p", "backend": {"conduit": "echo"}, "size": "30MiB", "pinned": True},
        {
            "name": "broken",
            "backend": {"conduit": "tests.fixtures.pool_models:FailingModel"},
            "size": "10MiB",
        },
        {"name": "huge", "backend": {"conduit": "echo"}, "size": "1GiB"},
        {"name": "slow", "backend": {"conduit": "echo"}, "size": "5MiB", "load_seconds": 60},
    ]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    env.pop("REDIS_URL", None)
    return {**env, "CONDUIT_RUNNER_TOKEN": RUNNER_TOKEN}


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[str]:
    config = {"budget": "100MiB", "min_resident": 0, "models": _models()}
    proc, url = start_pool(config, _env(), tmp_path)
    yield url
    _stop(proc)


def _stop(proc: Proc) -> None:
    proc.stop()
    assert proc.popen is not None and proc.popen.returncode == 0, proc.log()[-3000:]


def _predict(url: str, model: str, **inputs: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/models/{model}/predictions",
        json={"input": inputs},
        headers=RUNNER_AUTH,
        timeout=60,
    )


def _capabilities(url: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{url}/v1/capabilities", headers=RUNNER_AUTH).json()
    return body


def _state(url: str, model: str) -> str:
    state: str = slots(url)[model]["state"]
    return state


def test_a_request_loads_its_model_and_another_evicts_it_when_idle(pool: str) -> None:
    assert _state(pool, "p") == "ready"  # pinned: loaded at start
    assert _state(pool, "a") == "idle"

    answer = _predict(pool, "a", prompt="x")
    assert answer.status_code == 200 and answer.json()["output"] == ["x-gated"]
    assert _state(pool, "a") == "ready"

    answer = _predict(pool, "b", prompt="y")
    assert answer.status_code == 200 and answer.json()["output"] == ["y-0"]
    after = slots(pool)
    assert after["b"]["state"] == "ready"
    assert after["a"]["state"] == "idle"
    assert after["a"]["lastTransition"]["reason"] == "unloaded"
    assert after["a"]["lastUnload"]["reason"] == "evicted:lru"
    assert after["p"]["state"] == "ready"  # the pinned model was never a victim
    assert after["p"]["lastTransition"]["reason"] == "loaded"
    metrics = httpx.get(f"{pool}/metrics", headers=RUNNER_AUTH).text
    assert 'conduit_pool_evictions_total{reason="lru"} 1.0' in metrics
    assert 'conduit_pool_loads_total{reason="request"} 2.0' in metrics
    assert 'conduit_pool_slot_state{model="a",state="idle"} 1.0' in metrics


def test_a_busy_model_is_not_evicted_the_other_waits_for_it(pool: str, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    with ThreadPoolExecutor(2) as threads:
        first = threads.submit(_predict, pool, "a", prompt="slow", gate=str(gate))
        wait_for(lambda: slots(pool)["a"]["inFlight"] == 1, "a busy")
        second = threads.submit(_predict, pool, "b", prompt="next")
        caps = wait_for(lambda: (c := _capabilities(pool))["queue"]["depth"] == 1 and c, "queued")
        now = {slot["model"]: slot for slot in caps["slots"]}
        assert (now["a"]["state"], now["b"]["state"]) == ("ready", "idle")
        assert caps["queue"]["slotsInUse"] == 1
        assert not second.done()
        gate.touch()
        assert first.result().json()["output"] == ["slow-gated"]
        assert second.result().json()["output"] == ["next-0"]
    assert _state(pool, "a") == "idle" and _state(pool, "b") == "ready"


def test_a_failed_load_answers_503_with_retry_after_then_cools_down(pool: str) -> None:
    failed = _predict(pool, "broken")
    assert failed.status_code == 503
    assert failed.headers["Content-Type"].startswith("application/problem+json")
    assert failed.json()["code"] == "load_failed"
    assert "weights not found" in failed.json()["detail"]
    assert int(failed.headers["Retry-After"]) >= 1

    cooling = _predict(pool, "broken")
    assert cooling.status_code == 503 and cooling.json()["code"] == "cooldown"
    assert int(cooling.headers["Retry-After"]) >= 1
    slot = slots(pool)["broken"]
    assert slot["state"] == "failed" and slot["cooldownUntil"] is not None
    assert slot["lastTransition"]["reason"].startswith("load_failed")
    health = httpx.get(f"{pool}/models/broken/health-check").json()
    assert health["status"] == "SETUP_FAILED"
    spec_health = httpx.get(f"{pool}/models/broken/health")  # a runner's GET /health
    assert spec_health.status_code == 503
    assert spec_health.json()["reasons"] == ["model failed"]


def test_what_can_never_be_served_is_refused_at_once(pool: str) -> None:
    answer = _predict(pool, "huge")
    assert answer.status_code == 422
    assert answer.json()["code"] == "model_too_large"
    assert _state(pool, "huge") == "idle"
    assert _state(pool, "p") == "ready"

    # Its load is guessed at 60 s: a deadline 5 s away cannot be met, so no load starts.
    for header in ({"X-Conduit-Deadline": "5"}, {"Prefer": "respond-async, wait=5"}):
        late = httpx.post(
            f"{pool}/models/slow/predictions", json={}, headers={**RUNNER_AUTH, **header}
        )
        assert late.status_code == 422 and late.json()["code"] == "deadline_unmeetable"
    assert _state(pool, "slow") == "idle"
    bad = httpx.post(
        f"{pool}/models/slow/predictions",
        json={},
        headers={**RUNNER_AUTH, "X-Conduit-Deadline": "soon"},
    )
    assert bad.status_code == 422 and bad.json()["field"] == "X-Conduit-Deadline"


def test_each_slot_is_a_cog_runner_under_its_prefix(pool: str) -> None:
    assert httpx.get(f"{pool}/models/b/health-check").json()["status"] == "READY"  # no token
    assert httpx.post(f"{pool}/models/b/predictions", json={}).status_code == 401
    assert httpx.get(f"{pool}/v1/capabilities").status_code == 401
    discovery = httpx.get(f"{pool}/models/b/", headers=RUNNER_AUTH).json()
    assert discovery["predictions_url"] == "/models/b/predictions"
    schema = httpx.get(f"{pool}/models/b/openapi.json", headers=RUNNER_AUTH).json()
    assert "Input" in schema["components"]["schemas"]
    assert _state(pool, "b") == "idle"  # an in-process model's schema needs no load

    put = httpx.put(
        f"{pool}/models/b/predictions/p1",
        json={"input": {"prompt": "z", "n": 2}},
        headers={**RUNNER_AUTH, "Accept": "application/x-ndjson", "Prefer": "respond-async"},
        timeout=30,
    )
    assert put.status_code == 200 and put.headers["Content-Type"].startswith("application/x-ndjson")
    assert put.text.strip().splitlines()[-1].count('"succeeded"') == 1
    assert httpx.get(f"{pool}/models/nope/health-check").status_code == 404
    per_slot = httpx.get(f"{pool}/models/b/v1/capabilities", headers=RUNNER_AUTH).json()
    assert [s["model"] for s in per_slot["slots"]] == ["b"]
    assert per_slot["queue"]["slots"] == 1


def test_each_slot_answers_health_as_a_single_runner_does(pool: str) -> None:
    """``GET /models/<name>/health``: the spec's document for the slot, without the token; an
    idle slot (loaded on demand) is healthy, as a director pointed at it needs."""
    idle = httpx.get(f"{pool}/models/b/health")
    assert idle.status_code == 200
    body = idle.json()
    assert (body["status"], body["modelsLoaded"], body["reasons"]) == ("healthy", 0, [])
    assert body["model"] == {"id": "b", "state": "idle"}
    assert body["queue"] == {"depth": 0, "maxDepth": 64}
    assert _predict(pool, "b", prompt="h").status_code == 200
    loaded = httpx.get(f"{pool}/models/b/health").json()
    assert (loaded["modelsLoaded"], loaded["model"]["state"]) == (1, "ready")
    assert httpx.get(f"{pool}/models/nope/health").status_code == 404


def test_admin_load_with_evict_and_unload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mint = configure(tmp_path, monkeypatch, "b")
    config = {"budget": "100MiB", "min_resident": 0, "models": _models()}
    proc, url = start_pool(config, _env(), tmp_path)
    try:
        assert _predict(url, "a").status_code == 200
        body = {"modelId": "b", "evictModel": "a", "verifiedOpToken": mint("model-load")}
        started = httpx.post(f"{url}/v1/models/load", json=body, headers=RUNNER_AUTH)
        assert started.status_code == 202
        task = started.headers["Location"]
        done = wait_for(
            lambda: (
                (t := httpx.get(url + task, headers=RUNNER_AUTH).json())["status"] != "loading"
                and t
            ),
            "load task",
        )
        assert done["status"] == "completed"
        now = slots(url)
        assert (now["a"]["state"], now["b"]["state"]) == ("idle", "ready")
        assert now["a"]["lastUnload"]["reason"] == "admin"

        unpinned = {"modelId": "b", "verifiedOpToken": mint("model-unload")}
        unloaded = httpx.post(f"{url}/v1/models/unload", json=unpinned, headers=RUNNER_AUTH)
        assert unloaded.status_code == 200 and unloaded.json()["freedBytes"] == 60 * MIB
        assert _state(url, "b") == "idle"
        pinned = {"modelId": "p", "verifiedOpToken": mint("model-unload", "p")}
        refused = httpx.post(f"{url}/v1/models/unload", json=pinned, headers=RUNNER_AUTH)
        assert refused.status_code == 409 and _state(url, "p") == "ready"
        no_token = httpx.post(f"{url}/v1/models/unload", json={"modelId": "p"}, headers=RUNNER_AUTH)
        assert no_token.status_code == 401
        metrics = httpx.get(f"{url}/metrics", headers=RUNNER_AUTH).text
        assert 'conduit_pool_evictions_total{reason="admin"} 2.0' in metrics
    finally:
        _stop(proc)


def test_a_bad_config_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text('{"models": [{"name": "a", "backend": {"conduit": "echo"}, "size": "1QB"}]}')
    done = subprocess.run(
        [sys.executable, "-m", "conduit", "runner", "pool", "--config", str(path)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
    )
    assert done.returncode != 0
    assert "models.0.size" in done.stderr and "unknown unit" in done.stderr


@pytest.mark.skipif(importlib.util.find_spec("cog") is None, reason="cog is not installed")
def test_a_stock_cog_server_slot_loads_and_answers(tmp_path: Path) -> None:
    config = {
        "models": [
            {
                "name": "cogged",
                "size": "1GiB",
                "load_timeout": 120,
                "backend": {
                    "cog": {
                        "cwd": str(COG_MODEL),
                        "env": {"COG_PREDICT_TYPE_STUB": "predict.py:Predictor"},
                    }
                },
            }
        ],
        "budget": "8GiB",
    }
    proc, url = start_pool(config, _env(), tmp_path)
    try:
        with ThreadPoolExecutor(1) as threads:
            answer: Future[httpx.Response] = threads.submit(
                _predict, url, "cogged", prompt="c", n=2
            )
            wait_for(lambda: _seen_loading(url, answer), "cogged loading")
            response = answer.result()
        assert response.status_code == 200, response.text
        assert response.json()["output"] == ["c-0", "c-1"]
        slot = slots(url)["cogged"]
        assert slot["state"] == "ready" and slot["observedBytes"] > 0
        assert slot["lastTransition"]["reason"] == "loaded"
        schema = httpx.get(f"{url}/models/cogged/openapi.json", headers=RUNNER_AUTH).json()
        assert "Input" in schema["components"]["schemas"]
        assert proc.popen is not None
        servers = [pid for pid, line in _children(proc.popen.pid) if "cog.server.http" in line]
        assert servers
    finally:
        _stop(proc)
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in servers), "cog stopped")


@contextmanager
def _serving(directory: Path) -> Iterator[str]:
    """A plain HTTP server on loopback serving ``directory``'s files: where weights live."""
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(directory))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(importlib.util.find_spec("cog") is None, reason="cog is not installed")
def test_a_cog_slot_starts_with_a_trained_versions_weights(tmp_path: Path) -> None:
    """``weights`` reach the slot's ``setup(weights)`` as ``COG_WEIGHTS``: the trainer
    fixture's model says what its weights hold."""
    stored = tmp_path / "store"
    stored.mkdir()
    (stored / "weights.txt").write_text("guten tag")
    with _serving(stored) as files:
        config = {
            "models": [
                {
                    "name": "tuned",
                    "size": "1GiB",
                    "load_timeout": 120,
                    "backend": {
                        "cog": {
                            "cwd": str(TRAINER),
                            "env": {"COG_PREDICT_TYPE_STUB": "predict.py:Predictor"},
                            "weights": f"{files}/weights.txt",
                        }
                    },
                }
            ],
            "budget": "8GiB",
        }
        proc, url = start_pool(config, _env(), tmp_path)
        try:
            response = _predict(url, "tuned", prompt="c")
        finally:
            _stop(proc)
    assert response.status_code == 200, response.text
    assert response.json()["output"] == "guten tag: c"


def _seen_loading(url: str, answer: Future[httpx.Response]) -> bool:
    assert not answer.done(), "answered before the slot was seen loading"
    return _state(url, "cogged") == "loading"


def _children(parent: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                    found.append((int(entry.name), (entry / "cmdline").read_text()))
            except (OSError, ValueError, IndexError):
                continue
    return found


def test_a_director_runs_a_prediction_on_a_slot(
    launcher: Launcher, admin: Admin, client: httpx.Client, tmp_path: Path
) -> None:
    config = {"budget": "100MiB", "min_resident": 0, "models": _models()}
    path = tmp_path / "pool.yaml"
    path.write_text(json.dumps(config))
    port = free_port()
    proc = launcher.spawn("pool", "runner", "pool", "--config", str(path), "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers(proc, url), "pool answering")
    name = "test/pooled-b"
    admin.create_model(name, f"{url}/models/b")
    admin.create_deployment(name, name, shards=2, visibility="public")
    receiver = free_port()
    director = launcher.director(
        name, f"{url}/models/b", concurrency=1, receiver_port=str(receiver)
    )

    def ready() -> dict[str, str] | None:
        director.check_alive()
        try:
            response = httpx.get(f"http://127.0.0.1:{receiver}/readyz", timeout=5)
        except httpx.HTTPError:
            return None
        return response.json()["checks"] if response.status_code == 200 else None

    try:
        assert wait_for(ready, "director ready")["runner"] == "ok"
        created = create(
            client, f"/v1/deployments/{name}/predictions", input={"prompt": "d", "n": 2}
        )
        done = wait_status(client, created["id"], timeout=60)
        assert done["status"] == "succeeded", done
        assert done["output"] == ["d-0", "d-1"]
        assert _state(url, "b") == "ready"
    finally:
        director.stop()
        _stop(proc)
