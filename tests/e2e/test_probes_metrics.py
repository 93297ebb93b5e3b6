"""Liveness and readiness of the api and the director, and their Prometheus metrics."""

from __future__ import annotations

import threading
import uuid

import httpx

from core.ports import free_port
from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem
from tests.fixtures.metrics import value
from tests.fixtures.processes import Launcher, Proc
from tests.fixtures.waiting import wait_for


def _answers(proc: Proc, url: str) -> bool:
    proc.check_alive()
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _director(
    launcher: Launcher, admin: Admin, runner_url: str, env: dict[str, str] | None = None
) -> tuple[Proc, str, str]:
    """A director for a new deployment of the echo model, with its receiver on a known port."""
    name = f"test/probe-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(name, ECHO, visibility="public")
    port = free_port()
    proc = launcher.director(name, runner_url, env=env, receiver_port=str(port))
    return proc, f"http://127.0.0.1:{port}", f"/v1/deployments/{name}/predictions"


def test_api_live_and_ready_with_its_backends(stack: Stack) -> None:
    live = httpx.get(f"{stack.api_url}/livez")
    assert live.status_code == 200 and live.json()["status"] == "ok"
    ready = httpx.get(f"{stack.api_url}/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "accepting": "ok", "redis": "ok"}


def test_api_stays_ready_with_redis_away_and_says_so(launcher: Launcher) -> None:
    # Nothing listens there: Redis is away from the start.
    away = {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    port = free_port()
    api = launcher.spawn("api-no-redis", "api", "--port", str(port), env=away)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(api, f"{url}/livez"), "api live")
    ready = httpx.get(f"{url}/readyz")
    assert ready.status_code == 200, ready.text
    checks = ready.json()["checks"]
    assert checks["database"] == "ok" and checks["redis"].startswith("error")
    # /health still asks for both.
    assert httpx.get(f"{url}/health").status_code == 503
    api.stop()


def test_api_not_ready_without_postgres(launcher: Launcher) -> None:
    away = {"DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/conduit"}
    port = free_port()
    api = launcher.spawn("api-no-postgres", "api", "--port", str(port), env=away)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(api, f"{url}/livez"), "api live")
    ready = httpx.get(f"{url}/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["database"].startswith("error")
    api.stop()


def test_api_metrics_by_route_template_with_waiters_and_pools(
    stack: Stack, client: httpx.Client, launcher: Launcher, admin: Admin
) -> None:
    missing = f"nosuch{uuid.uuid4().hex[:8]}"
    assert_problem(client.get(f"/v1/predictions/{missing}"), 404)
    # A deployment no director serves: a Prefer: wait create waits its whole wait.
    name = f"test/idle-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(name, ECHO, visibility="public")
    answers: list[httpx.Response] = []

    def waiter() -> None:
        answers.append(
            client.post(
                f"/v1/deployments/{name}/predictions",
                json={"input": {"prompt": "m"}},
                headers={"Prefer": "wait=2"},
            )
        )

    def waiters() -> float | None:
        text = httpx.get(f"{stack.api_url}/metrics").text
        found = value(text, "conduit_api_waiters")
        return found if found else None

    thread = threading.Thread(target=waiter)
    thread.start()
    assert wait_for(waiters, "a waiter counted") >= 1
    thread.join(timeout=30)
    assert answers and answers[0].status_code == 201

    response = httpx.get(f"{stack.api_url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert missing not in text  # ids are never label values
    route = "/v1/predictions/{prediction_id}"
    count = value(text, "conduit_api_requests_total", method="GET", route=route, status="404")
    assert count is not None and count >= 1
    hist = value(text, "conduit_api_request_duration_seconds_count", method="GET", route=route)
    assert hist is not None and hist >= 1
    for gauge in (
        "conduit_api_db_pool_checked_out",
        "conduit_api_db_pool_size",
        "conduit_api_redis_pool_in_use",
        "conduit_api_redis_pool_max",
        "conduit_api_max_waiters",
    ):
        assert value(text, gauge) is not None, gauge
    assert (value(text, "conduit_api_db_pool_size") or 0) > 0


def test_api_metrics_on_a_port_of_their_own(launcher: Launcher) -> None:
    metrics_port = free_port()
    api, url = launcher.api(env={"CONDUIT_API_METRICS_PORT": str(metrics_port)})
    assert httpx.get(f"{url}/livez").status_code == 200
    assert_problem(httpx.get(f"{url}/metrics"), 404)
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    assert value(text, "conduit_api_requests_total", method="GET", route="/livez", status="200")
    api.stop()


def test_director_live_ready_and_metrics_on_its_receiver_port(
    stack: Stack, launcher: Launcher, admin: Admin
) -> None:
    runner, runner_url = launcher.runner("echo", concurrency=1)
    director, url, _ = _director(launcher, admin, runner_url)

    def ready() -> dict[str, str] | None:
        director.check_alive()
        try:
            response = httpx.get(f"{url}/readyz", timeout=5)
        except httpx.HTTPError:
            return None
        return response.json()["checks"] if response.status_code == 200 else None

    checks = wait_for(ready, "director ready")
    assert checks == {"redis": "ok", "database": "ok", "runner": "ok", "accepting": "ok"}
    live = httpx.get(f"{url}/livez")
    assert live.status_code == 200 and live.json()["checks"] == {"loop": "ok"}
    metrics = httpx.get(f"{url}/metrics").text
    assert value(metrics, "conduit_director_inflight") is not None
    assert httpx.get(f"{url}/health").status_code == 200  # the earlier route stays

    runner.stop()

    def runner_gone() -> httpx.Response | None:
        response = httpx.get(f"{url}/readyz", timeout=5)
        return response if response.status_code == 503 else None

    gone = wait_for(runner_gone, "director not ready without its runner")
    assert gone.json()["checks"]["runner"].startswith("error")
    assert httpx.get(f"{url}/livez").status_code == 200  # its loop still turns
    director.stop()


def test_director_not_live_when_its_loop_stalls(
    stack: Stack, launcher: Launcher, admin: Admin
) -> None:
    # The loop turns every block_ms (1 s): a 1 ms limit is always past between two turns.
    runner, runner_url = launcher.runner("echo", concurrency=1)
    director, url, _ = _director(
        launcher, admin, runner_url, env={"CONDUIT_DIRECTOR_LOOP_STALL_AFTER": "0.001"}
    )

    def stalled() -> httpx.Response | None:
        director.check_alive()
        try:
            response = httpx.get(f"{url}/livez", timeout=5)
        except httpx.HTTPError:
            return None
        return response if response.status_code == 503 else None

    body = wait_for(stalled, "livez failing on a stalled loop").json()
    assert body["status"] == "unavailable" and body["checks"]["loop"].startswith("no turn")
    director.stop()
    runner.stop()
