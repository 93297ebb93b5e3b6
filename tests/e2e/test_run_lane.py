"""The synchronous lane (``/run``) on a live stack: runners known from the fleet registry,
the answer in the body, the run recorded afterwards, 429 ``out_of_capacity`` when capacity is
gone, a refusing runner's request moved to another runner, a client that leaves freeing its
place, and two api replicas sharing a runner's permits."""

from __future__ import annotations

import asyncio
import functools
import re
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
import pytest
from aiohttp import web
from redis.asyncio import Redis

from core.ports import free_port
from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem
from tests.fixtures.metrics import value
from tests.fixtures.processes import Launcher
from tests.fixtures.sse import events
from tests.fixtures.waiting import wait_for
from tracker.fleet import FleetEntry, FleetRegistry, RunnerState
from tracker.keys import LANE_MEMBERS

pytestmark = pytest.mark.e2e

RUN = f"/v1/deployments/{ECHO}/run"


def _ready_run(client: httpx.Client, path: str, body: dict[str, Any]) -> httpx.Response:
    """The first answer that is not "no runner yet" (the fleet view takes a heartbeat or
    two to see a newly registered runner)."""

    def probe() -> httpx.Response | None:
        response = client.post(path, json=body)
        if response.status_code == 429 and "No runner" in response.json().get("detail", ""):
            return None
        return response

    return wait_for(probe, f"a runner for {path}")


def test_run_answers_the_output_with_timing_headers(client: httpx.Client) -> None:
    response = _ready_run(client, RUN, {"input": {"prompt": "hi", "n": 2}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"id", "status", "output", "error", "metrics"}
    assert body["status"] == "succeeded"
    assert body["output"] == ["hi-0", "hi-1"]
    assert body["error"] is None
    assert body["metrics"]["predict_time"] >= 0
    assert body["metrics"]["total_time"] >= body["metrics"]["predict_time"]
    headers = response.headers
    assert headers["X-Conduit-Attempts"] == "1"
    assert int(headers["X-Queue-Wait-Ms"]) >= 0
    assert float(headers["X-Processing-Time"]) > 0
    assert float(headers["X-Remote-Processing-Time"]) > 0  # the runner's own
    assert headers["X-Cache-Hit"] == "false"  # forwarded from the runner


def test_the_run_is_recorded_in_the_list_and_usage(client: httpx.Client) -> None:
    response = _ready_run(client, RUN, {"input": {"prompt": "kept"}})
    assert response.status_code == 200, response.text
    run_id = response.json()["id"]

    def listed() -> dict[str, Any] | None:
        page = client.get("/v1/predictions").json()["results"]
        return next((p for p in page if p["id"] == run_id), None)

    prediction = wait_for(listed, "the run in the account's list")
    assert prediction["source"] == "sync"
    assert prediction["status"] == "succeeded"
    assert prediction["output"] == ["kept-0"]
    assert prediction["input"] == {"prompt": "kept"}
    assert prediction["started_at"] and prediction["completed_at"]
    assert client.get(f"/v1/predictions/{run_id}").json()["source"] == "sync"
    usage = client.get("/v1/usage").json()
    assert usage["predictions"] == 1
    (item,) = usage["by_deployable"]
    assert item["deployable"] == ECHO


def test_bad_input_is_refused_as_predictions_refuse_it(client: httpx.Client) -> None:
    _ready_run(client, RUN, {"input": {}})
    for body in ({"input": {"n": "many"}}, {"input": "text"}, {}, {"input": {"prompt": "a\x00"}}):
        ran = assert_problem(client.post(RUN, json=body), 422)
        created = assert_problem(client.post(f"/v1/deployments/{ECHO}/predictions", json=body), 422)
        for problem in (ran, created):
            problem.pop("instance")
        assert ran == created
    broken = {"content": b'{"input": ', "headers": {"Content-Type": "application/json"}}
    ran = assert_problem(client.post(RUN, **broken), 400)  # type: ignore[arg-type]
    created = assert_problem(
        client.post(f"/v1/deployments/{ECHO}/predictions", **broken),  # type: ignore[arg-type]
        400,
    )
    assert ran["errors"] == created["errors"]


def test_a_body_that_is_not_utf8_is_a_400_problem_as_on_create(client: httpx.Client) -> None:
    _ready_run(client, RUN, {"input": {}})
    for raw in (b"\xff\xfe\x00{", b'{"input": {"prompt": "\xc3\x28"}}', b"\x80"):
        broken = {"content": raw, "headers": {"Content-Type": "application/json"}}
        ran = assert_problem(client.post(RUN, **broken), 400)  # type: ignore[arg-type]
        created = assert_problem(
            client.post(f"/v1/deployments/{ECHO}/predictions", **broken),  # type: ignore[arg-type]
            400,
        )
        assert ran["errors"] == created["errors"]


def test_a_body_nested_past_any_parser_is_a_400_problem_as_on_create(client: httpx.Client) -> None:
    _ready_run(client, RUN, {"input": {}})
    deep = b'{"input": {"extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    broken = {"content": deep, "headers": {"Content-Type": "application/json"}}
    ran = assert_problem(client.post(RUN, **broken), 400)  # type: ignore[arg-type]
    created = assert_problem(
        client.post(f"/v1/deployments/{ECHO}/predictions", **broken),  # type: ignore[arg-type]
        400,
    )
    assert ran["detail"] == created["detail"]


def test_a_private_deployment_is_not_found(
    stack: Stack, launcher: Launcher, admin: Admin, client: httpx.Client
) -> None:
    name = f"private-{uuid.uuid4().hex[:8]}/echo"
    admin.create_model(name, stack.runner_url, visibility="private")
    admin.create_deployment(name, name)
    assert_problem(client.post(f"/v1/deployments/{name}/run", json={"input": {}}), 404)
    assert_problem(client.post(f"/v1/deployments/{name}-not/run", json={"input": {}}), 404)
    assert_problem(client.post(f"/v1/models/{name}/run", json={"input": {}}), 404)


def test_a_model_runs_on_the_runners_of_its_version(client: httpx.Client) -> None:
    response = _ready_run(client, f"/v1/models/{ECHO}/run", {"input": {"prompt": "m"}})
    assert response.status_code == 200, response.text
    assert response.json()["output"] == ["m-0"]


def test_run_streams_output_events_then_done(client: httpx.Client) -> None:
    _ready_run(client, RUN, {"input": {}})
    body = {"input": {"prompt": "s", "n": 3}}
    headers = {"Accept": "text/event-stream"}
    with client.stream("POST", RUN, json=body, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["X-Conduit-Attempts"] == "1"
        seen = list(events(response, deadline=time.monotonic() + 30))
    outputs = [e.data for e in seen if e.event == "output"]
    assert outputs == ["s-0", "s-1", "s-2"]
    assert [e.data for e in seen if e.event == "logs"] == ["echo s-0", "echo s-1", "echo s-2"]
    assert seen[-1].event == "done" and seen[-1].data == "{}"
    assert [e.event for e in seen].count("done") == 1
    assert {e.event for e in seen} <= {"output", "logs", "error", "done"}


def test_a_failing_model_streams_an_error_before_done(client: httpx.Client) -> None:
    _ready_run(client, RUN, {"input": {}})
    body = {"input": {"prompt": "f", "fail": True}}
    with client.stream("POST", RUN, json=body, headers={"Accept": "text/event-stream"}) as r:
        seen = list(events(r, deadline=time.monotonic() + 30))
    kinds = [e.event for e in seen]
    assert kinds[-2:] == ["error", "done"]
    assert "echo failed as requested" in seen[-2].data
    assert [e.data for e in seen if e.event == "output"] == ["f-0"]


# --- capacity: runners registered in the fleet by the test, sized to the replicas -----------


def _members(redis_url: str) -> int:
    async def read() -> int:
        redis = Redis.from_url(redis_url)
        try:
            return int(await redis.zcard(LANE_MEMBERS))
        finally:
            await redis.aclose()

    return asyncio.run(read())


@contextmanager
def _registered(redis_url: str, *entries: FleetEntry) -> Iterator[None]:
    """Fleet entries written by the test as a director would (long-lived: no heartbeats)."""

    async def write(register: bool) -> None:
        redis = Redis.from_url(redis_url)
        registry = FleetRegistry(redis, ttl=300)
        try:
            for entry in entries:
                if register:
                    await registry.register(replace(entry, heartbeat_at=time.time()))
                else:
                    await registry.deregister(entry.id)
        finally:
            await redis.aclose()

    asyncio.run(write(True))
    try:
        yield
    finally:
        asyncio.run(write(False))


def _entry(entry_id: str, url: str, deployment: str, version: str, slots: int) -> FleetEntry:
    return FleetEntry(
        id=entry_id,
        url=url,
        deployment=deployment,
        version_id=version,
        concurrency=slots,
        state=RunnerState.READY,
        hardware="cpu",
        heartbeat_at=0.0,
        director="test",
        kind="conduit-echo",
    )


def _lane(api_url: str, deployment: str) -> dict[str, float]:
    """This api's lane counters for a deployment (its /metrics)."""
    text = httpx.get(f"{api_url}/metrics", timeout=10).text
    permits = {
        state: value(text, "lane_permits", deployment=deployment, state=state) or 0.0
        for state in ("free", "used", "full")
    }
    return {
        **permits,
        "permits": sum(permits.values()),
        "queued": value(text, "lane_queue_depth", deployment=deployment) or 0.0,
    }


def _shows(api_url: str, deployment: str, **expected: float) -> bool:
    lane = _lane(api_url, deployment)
    return all(lane[key] == number for key, number in expected.items())


@dataclass
class Deployment:
    name: str
    version: str
    runner_url: str


@pytest.fixture
def slow_deployment(stack: Stack, launcher: Launcher, admin: Admin) -> Iterator[Deployment]:
    """A public echo deployment on a runner of its own (registered by each test)."""
    proc, url = launcher.runner("echo", concurrency=8)
    name = f"lane-{uuid.uuid4().hex[:8]}/echo"
    version = admin.create_model(name, url)
    admin.create_deployment(name, name, visibility="public")
    yield Deployment(name, version, url)
    proc.stop()


def _post(api_url: str, token: str, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.post(f"{api_url}{path}", json=body, headers=headers, timeout=60)


def test_overload_is_answered_429_out_of_capacity_with_retry_after(
    launcher: Launcher, redis_url: str, slow_deployment: Deployment, token: str
) -> None:
    # A queue of one place per permit; this api's share of the runner: one permit.
    proc, api_url = launcher.api({"CONDUIT_API_LANE_QUEUE_FACTOR": "1"})
    try:
        members = wait_for(lambda: _members(redis_url) or None, "the lane's members")
        entry = _entry(
            "r-overload",
            slow_deployment.runner_url,
            slow_deployment.name,
            slow_deployment.version,
            members,
        )
        with _registered(redis_url, entry):
            wait_for(lambda: _lane(api_url, slow_deployment.name)["permits"] == 1, "one permit")
            path = f"/v1/deployments/{slow_deployment.name}/run"
            body = {"input": {"prompt": "slow", "delay": 1.5}}
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda _: _post(api_url, token, path, body), range(8)))
    finally:
        proc.stop()
    statuses = sorted(r.status_code for r in answers)
    assert statuses.count(200) >= 1, statuses
    refused = [r for r in answers if r.status_code == 429]
    assert len(refused) >= 5, statuses  # one runs, one waits, the rest are refused
    for response in refused:
        problem = assert_problem(response, 429)
        assert problem["code"] == "out_of_capacity"
        assert 1 <= int(response.headers["Retry-After"]) <= 30


class RefusingRunner:
    """A runner that answers every ``POST /predictions`` 409 (all slots busy), on loopback."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.calls = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None

    async def _refuse(self, request: web.Request) -> web.Response:
        await request.read()
        self.calls += 1
        body = {"error": "At capacity - all prediction slots busy", "status": "failed"}
        return web.json_response(body, status=409, headers={"Retry-After": "1"})

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/predictions", self._refuse)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def __enter__(self) -> RefusingRunner:
        self._loop.run_until_complete(self._start())
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def test_a_refusing_runner_moves_the_request_to_another(
    stack: Stack, redis_url: str, slow_deployment: Deployment, client: httpx.Client
) -> None:
    members = _members(redis_url)
    with RefusingRunner() as refusing:
        # Ids in that order: the refusing runner comes first in the lane's order.
        entries = (
            _entry(
                "r-0-refusing", refusing.url, slow_deployment.name, slow_deployment.version, members
            ),
            _entry(
                "r-1-echo",
                slow_deployment.runner_url,
                slow_deployment.name,
                slow_deployment.version,
                members,
            ),
        )
        with _registered(redis_url, *entries):
            wait_for(lambda: _lane(stack.api_url, slow_deployment.name)["permits"] == 2, "permits")
            response = client.post(
                f"/v1/deployments/{slow_deployment.name}/run", json={"input": {"prompt": "x"}}
            )
        assert response.status_code == 200, response.text
        assert response.json()["output"] == ["x-0"]
        assert response.headers["X-Conduit-Attempts"] == "2"
        assert refusing.calls == 1


def test_a_client_that_leaves_the_queue_frees_its_place(
    stack: Stack, redis_url: str, slow_deployment: Deployment, client: httpx.Client
) -> None:
    name = slow_deployment.name
    entry = _entry(
        "r-leave", slow_deployment.runner_url, name, slow_deployment.version, _members(redis_url)
    )
    path = f"/v1/deployments/{name}/run"
    with _registered(redis_url, entry), ThreadPoolExecutor(3) as pool:
        wait_for(lambda: _lane(stack.api_url, name)["permits"] == 1, "one permit")
        # Long enough to still run once the second has left, on a loaded machine too.
        first = pool.submit(client.post, path, json={"input": {"prompt": "a", "delay": 10}})
        wait_for(lambda: _lane(stack.api_url, name)["used"] == 1, "the first one running")
        leaving = pool.submit(
            client.post, path, json={"input": {"prompt": "b"}}, timeout=httpx.Timeout(30, read=1)
        )
        wait_for(lambda: _lane(stack.api_url, name)["queued"] == 1, "the second one queued")
        with pytest.raises(httpx.ReadTimeout):
            leaving.result()
        wait_for(lambda: _lane(stack.api_url, name)["queued"] == 0, "its place freed")
        assert _lane(stack.api_url, name)["used"] == 1  # the first one still runs
        third = client.post(path, json={"input": {"prompt": "c"}})
        assert first.result().status_code == 200
    assert third.status_code == 200, third.text
    assert third.json()["output"] == ["c-0"]

    def listed() -> list[str] | None:
        runs = client.get("/v1/predictions").json()["results"]
        outputs = sorted(str(p["output"]) for p in runs if p["source"] == "sync")
        return outputs if len(outputs) >= 2 else None

    # The one that left never ran: only the other two are recorded.
    assert wait_for(listed, "both runs recorded") == ["['a-0']", "['c-0']"]


def test_two_replicas_share_a_runners_permits(
    stack: Stack, launcher: Launcher, redis_url: str, slow_deployment: Deployment, token: str
) -> None:
    proc, other_url = launcher.api()
    name = slow_deployment.name
    try:
        wait_for(lambda: _members(redis_url) >= 2 or None, "two replicas")
        members = _members(redis_url)  # one permit each (2 with just these two replicas)
        entry = _entry(
            "r-shared", slow_deployment.runner_url, name, slow_deployment.version, members
        )
        path = f"/v1/deployments/{name}/run"
        body = {"input": {"prompt": "p", "delay": 2}}
        with _registered(redis_url, entry), ThreadPoolExecutor(4) as pool:
            for api in (stack.api_url, other_url):
                wait_for(functools.partial(_shows, api, name, permits=1), "a slice of one")
            calls = [
                pool.submit(_post, api, token, path, body)
                for api in (stack.api_url, other_url, stack.api_url, other_url)
            ]
            for api in (stack.api_url, other_url):
                # Each replica runs one and queues the other: its slice is one permit.
                wait_for(
                    functools.partial(_shows, api, name, used=1, queued=1),
                    "one running and one queued on each replica",
                )
            answers = [call.result() for call in calls]
    finally:
        proc.stop()
    assert [r.status_code for r in answers] == [200] * 4
    assert {r.headers["X-Conduit-Attempts"] for r in answers} == {"1"}  # nothing was refused


def test_replicas_outnumbering_a_runners_permits_all_serve(
    stack: Stack, launcher: Launcher, redis_url: str, admin: Admin, token: str
) -> None:
    """Two replicas in front of a concurrency-1 runner: neither owns its one permit (it is
    shared through Redis), and calls one after the other through each replica all run."""
    runner, url = launcher.runner("echo", concurrency=1)
    name = f"lane-{uuid.uuid4().hex[:8]}/one"
    version = admin.create_model(name, url)
    admin.create_deployment(name, name, visibility="public")
    path = f"/v1/deployments/{name}/run"
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with (
            launcher.own_api() as other_url,
            _registered(redis_url, _entry(f"r-one-{uuid.uuid4().hex[:6]}", url, name, version, 1)),
        ):
            wait_for(lambda: _members(redis_url) >= 2 or None, "two replicas")
            for n, api in enumerate((stack.api_url, other_url, stack.api_url, other_url)):
                with httpx.Client(base_url=api, headers=headers, timeout=30) as client:
                    response = _ready_run(client, path, {"input": {"prompt": f"p{n}"}})
                assert response.status_code == 200, (api, response.text)
                assert response.json()["output"] == [f"p{n}-0"]
    finally:
        runner.stop()


def _ops_workers(api_url: str, operator_token: str) -> str:
    """``/ops/workers`` as an operator who signed in over plain HTTP."""
    with httpx.Client(base_url=api_url, timeout=30) as http:
        form = http.get("/ops/login?next=/ops/workers")
        found = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert found is not None, form.text
        signed = http.post(
            "/ops/login",
            data={"token": operator_token, "csrf": found.group(1), "next": "/ops/workers"},
            headers={"Origin": api_url},
        )
        assert signed.status_code == 303, signed.text
        page = http.get("/ops/workers")
        assert page.status_code == 200, page.text
        return page.text


def test_a_runner_refusing_the_api_token_is_out_of_service_not_a_failed_run(
    stack: Stack,
    launcher: Launcher,
    redis_url: str,
    slow_deployment: Deployment,
    client: httpx.Client,
    admin: Admin,
) -> None:
    """A runner started with a token of its own refuses the api's: the ``/run`` is a 503
    ``runner_unavailable`` with Retry-After (the platform's fault), no failed prediction is
    recorded for the caller, the runner is out of service on the lane (the next request is
    refused at once, not sent to it) and ``/ops`` says so."""
    members = _members(redis_url)
    proc, wrong_url = launcher.runner(
        "echo", concurrency=2, env={"CONDUIT_RUNNER_TOKEN": "a-token-of-its-own-not-the-apis"}
    )
    path = f"/v1/deployments/{slow_deployment.name}/run"
    name, version = slow_deployment.name, slow_deployment.version
    try:
        entry = _entry("r-wrong-token", wrong_url, name, version, members)
        with _registered(redis_url, entry):
            wait_for(lambda: _lane(stack.api_url, name)["free"] == 1, "the runner's permit")
            for _ in range(2):  # the second is refused at once: the runner is out of service
                response = client.post(path, json={"input": {"prompt": "x"}})
                problem = assert_problem(response, 503)
                assert problem["code"] == "runner_unavailable", problem
                assert "runner token" in problem["detail"], problem
                assert 1 <= int(response.headers["Retry-After"]) <= 30
            assert _lane(stack.api_url, name)["free"] == 0  # its permit is not shown free
            operator = admin.create_account(f"ops-{uuid.uuid4().hex[:8]}", admin_flag=True)
            workers = _ops_workers(stack.api_url, operator)
            assert "r-wrong-token: refused the runner token" in workers
    finally:
        proc.stop()

    # A run on a good runner is recorded after the refused ones would have been: only it is.
    good = _entry("r-good-token", slow_deployment.runner_url, name, version, members)
    with _registered(redis_url, good):

        def ran() -> httpx.Response | None:  # once the lane's view lists the good runner
            response = client.post(path, json={"input": {"prompt": "ok"}})
            return response if response.status_code == 200 else None

        run_id = wait_for(ran, "a run on the good runner").json()["id"]

        def recorded() -> list[dict[str, Any]] | None:
            page: list[dict[str, Any]] = client.get("/v1/predictions").json()["results"]
            return page if any(p["id"] == run_id for p in page) else None

        listed = wait_for(recorded, "the good run in the account's list")
    assert [(p["id"], p["status"]) for p in listed] == [(run_id, "succeeded")]
