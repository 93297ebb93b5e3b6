"""A runner that refuses a start (busy, queue full, rate limited) delays a prediction, never
fails it: the director waits out ``Retry-After`` and offers it again while its limits allow."""

from __future__ import annotations

import collections
import re
import uuid

import httpx
import psycopg

from core.ports import free_port
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.scripted_runner import Put, Refusal, ScriptedRunner, scripted_runner
from tests.fixtures.waiting import wait_for


def _deploy(admin: Admin, runner: ScriptedRunner, prediction_timeout: float = 1800.0) -> str:
    name = f"test/{runner.name}"
    admin.create_model(name, runner.url)
    admin.create_deployment(
        name, name, shards=2, prediction_timeout=prediction_timeout, visibility="public"
    )
    return name


def _gaps(puts: list[Put]) -> list[float]:
    return [later.at - earlier.at for earlier, later in zip(puts, puts[1:], strict=False)]


def _counter(metrics_url: str, name: str, reason: str) -> float:
    text = httpx.get(metrics_url).text
    found = re.search(rf'^{name}_total{{reason="{reason}"}} (\S+)$', text, re.MULTILINE)
    return float(found[1]) if found else 0.0


def test_retry_after_is_obeyed_until_the_runner_takes_it(
    client: httpx.Client, launcher: Launcher, admin: Admin
) -> None:
    refusals = collections.deque(
        [
            Refusal(429, retry_after="1"),
            Refusal(503, retry_after_date=2.5),  # an HTTP-date, 1.5-2.5 s ahead once rounded
            Refusal(503, retry_after="1", queue_full=False),  # still setting up
        ]
    )
    with scripted_runner(f"backoff-{uuid.uuid4().hex[:8]}", refusals=refusals) as runner:
        name = _deploy(admin, runner)
        port = free_port()
        director = launcher.director(name, runner.url, receiver_port=str(port))
        try:
            created = create(client, f"/v1/deployments/{name}/predictions", input={"prompt": "x"})
            done = wait_status(client, created["id"], timeout=30)
            assert done["status"] == "succeeded", done
            assert done["output"] == ["ok"]

            puts = runner.puts_for(created["id"])
            assert [put.status for put in puts] == [429, 503, 503, 202]
            first, dated, setup = _gaps(puts)
            # Never earlier than asked; a little jitter (10%) and scheduling on top at most.
            assert 1.0 <= first < 2.0, first
            assert 1.5 <= dated < 3.5, dated
            assert 1.0 <= setup < 2.0, setup
            # The same tenant and priority on every attempt.
            assert len({put.headers["x-tenant-id"] for put in puts}) == 1
            assert {put.headers["x-priority"] for put in puts} == {"normal"}

            metrics = f"http://127.0.0.1:{port}/metrics"
            refusals_metric = "conduit_director_runner_refusals"
            assert _counter(metrics, refusals_metric, "rate_limited") == 1
            assert _counter(metrics, refusals_metric, "saturated") == 1
            assert _counter(metrics, refusals_metric, "not_ready") == 1
        finally:
            director.stop()


def test_busy_runner_without_retry_after_gets_exponential_backoff(
    client: httpx.Client, launcher: Launcher, admin: Admin
) -> None:
    refusals = collections.deque([Refusal(409)] * 5)
    with scripted_runner(f"busy-{uuid.uuid4().hex[:8]}", refusals=refusals) as runner:
        name = _deploy(admin, runner)
        director = launcher.director(name, runner.url)
        try:
            created = create(client, f"/v1/deployments/{name}/predictions", input={})
            assert wait_status(client, created["id"])["status"] == "succeeded"
            puts = runner.puts_for(created["id"])
            assert [put.status for put in puts] == [409] * 5 + [202]
            gaps = _gaps(puts)
            # Each wait is within [d/2, d] for d = 50 ms doubling: they grow, and stay short.
            assert sum(gaps) >= 0.025 + 0.05 + 0.1 + 0.2 + 0.4
            assert gaps[-1] > gaps[0]
        finally:
            director.stop()


def test_runner_saturated_past_the_limits(
    client: httpx.Client, launcher: Launcher, admin: Admin
) -> None:
    """Timeout first: failed, saying why; deadline first: aborted. The runner never ran it."""
    always = Refusal(503, retry_after="1")
    with scripted_runner(f"full-{uuid.uuid4().hex[:8]}", refuse_always=always) as runner:
        name = _deploy(admin, runner, prediction_timeout=2.0)
        director = launcher.director(name, runner.url, concurrency=2)
        path = f"/v1/deployments/{name}/predictions"
        try:
            # A director reads the runner's capabilities before its queue: once it has, a short
            # deadline is not spent waiting for the director to start.
            wait_for(lambda: runner.capability_reads > 0, "director up", timeout=30)
            timed_out = create(client, path, input={"prompt": "t"})
            response = client.post(path, json={"input": {}}, headers={"Cancel-After": "1s"})
            assert response.status_code == 201, response.text
            past_deadline = response.json()

            failed = wait_status(client, timed_out["id"], timeout=20)
            assert failed["status"] == "failed"
            assert failed["error"].startswith("runner stayed saturated (503 queue full) for ")
            assert failed["error"].endswith(
                "; prediction timed out after 2s before it could start"
            ), failed["error"]
            assert failed["started_at"] is None and failed["output"] is None

            aborted = wait_status(client, past_deadline["id"], timeout=20)
            assert aborted["status"] == "aborted"
            assert aborted["error"].startswith("runner stayed saturated (503 queue full)")
            assert aborted["error"].endswith("; prediction deadline passed before it could start")

            for prediction in (timed_out, past_deadline):
                puts = runner.puts_for(prediction["id"])
                assert puts and all(put.status == 503 for put in puts)
                assert all(gap >= 1.0 for gap in _gaps(puts))
            assert runner.accepted() == []
        finally:
            director.stop()


def test_limits_passing_while_queued_inside_the_runner(
    client: httpx.Client, launcher: Launcher, admin: Admin, database_url: str
) -> None:
    """Accepted but never started (the runner queued it): failed or aborted, never billed."""
    with scripted_runner(f"queued-{uuid.uuid4().hex[:8]}", hold=True) as runner:
        name = _deploy(admin, runner, prediction_timeout=1.5)
        director = launcher.director(name, runner.url, concurrency=2, cancel_grace="5")
        path = f"/v1/deployments/{name}/predictions"
        try:
            wait_for(lambda: runner.capability_reads > 0, "director up", timeout=30)
            timed_out = create(client, path, input={"prompt": "t"})
            response = client.post(path, json={"input": {}}, headers={"Cancel-After": "1s"})
            assert response.status_code == 201, response.text
            past_deadline = response.json()

            failed = wait_status(client, timed_out["id"], timeout=20)
            assert failed["status"] == "failed", failed
            assert failed["error"].startswith("it waited in the runner's queue for ")
            assert failed["error"].endswith("timed out after 1.5s before it could start")
            assert failed["metrics"]["queue_wait_time"] > 1.0
            assert "predict_time" not in failed["metrics"]

            aborted = wait_status(client, past_deadline["id"], timeout=20)
            assert aborted["status"] == "aborted", aborted
            assert aborted["error"].endswith("deadline passed before it could start")

            with psycopg.connect(database_url) as conn:
                billed = conn.execute(
                    "SELECT status, billable_seconds FROM usage_records "
                    "WHERE prediction_id = ANY(%s) ORDER BY status",
                    ([timed_out["id"], past_deadline["id"]],),
                ).fetchall()
            assert billed == [("aborted", 0.0), ("failed", 0.0)]
        finally:
            director.stop()
