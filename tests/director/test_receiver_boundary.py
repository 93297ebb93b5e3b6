"""The director's receiver is an internal surface: a runner's snapshot is taken only on the
URL the director handed it for that attempt, at most 16 MiB of it, and the times it reports
are billed only as far as the director saw the run take.

The first tests serve a real receiver on loopback and talk real HTTP to it; the last ones run
a real director process beside a scripted runner, through the api.
"""

from __future__ import annotations

import io
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import psycopg
import pytest

from core.ports import free_port
from director.attempts import Attempt, Attempts
from director.leases import Lease
from director.metrics import DirectorMetrics
from director.queue import Entry
from director.receiver import MAX_BODY, Receiver
from director.settings import DirectorSettings
from protocol.timings import RunnerTimes
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, fetch, wait_status
from tests.fixtures.processes import Launcher, Proc
from tests.fixtures.scripted_runner import ScriptedRunner, scripted_runner
from tests.fixtures.waiting import wait_for

SUCCEEDED = {"status": "succeeded", "output": ["forged"], "logs": "", "metrics": {}}


@dataclass
class Inbox:
    receiver: Receiver
    attempts: Attempts
    http: aiohttp.ClientSession

    @property
    def base(self) -> str:
        return self.receiver.public_url

    def claimed(self, prediction_id: str, number: int = 1) -> Attempt:
        """An attempt in flight here, as a claim leaves it."""
        entry = Entry("input:prediction:{test}:0", f"{uuid.uuid4().int % 10**9}-0", prediction_id)
        attempt = self.attempts.add(entry, Lease(prediction_id))
        attempt.lease.attempt = number
        return attempt

    async def post(self, url: str, body: Any = None, **kwargs: Any) -> tuple[int, str, bytes]:
        if body is not None:
            kwargs["json"] = {"id": url.split("/")[4], **body}
        if isinstance(kwargs.get("data"), bytes):  # sent with its Content-Length
            kwargs["data"] = io.BytesIO(kwargs["data"])
        async with self.http.post(url, **kwargs) as response:
            return response.status, response.content_type, await response.read()


@asynccontextmanager
async def inbox(public_url: str | None = None, port: int = 0) -> AsyncIterator[Inbox]:
    attempts = Attempts(4)
    receiver = Receiver("127.0.0.1", port, public_url, attempts, DirectorMetrics())
    await receiver.start()
    try:
        async with aiohttp.ClientSession() as http:
            yield Inbox(receiver, attempts, http)
    finally:
        await receiver.stop()


def _snapshot(status: str = "processing", **extra: Any) -> dict[str, Any]:
    return {"status": status, "output": None, "logs": "", **extra}


async def test_the_attempts_own_url_is_accepted() -> None:
    async with inbox() as box:
        attempt = box.claimed("p-right", 3)
        url = box.receiver.webhook_url(attempt)
        assert url.startswith(f"{box.base}/runner/p-right/3/")
        assert len(attempt.secret) >= 22  # at least 128 bits, URL-safe base64
        status, _, _ = await box.post(url, _snapshot())
        assert status == 200
        assert attempt.snapshots.get_nowait().status == "processing"


async def test_forged_snapshots_are_all_refused_with_one_and_the_same_404() -> None:
    async with inbox() as box:
        target = box.claimed("p-target", 2)
        other = box.claimed("p-other", 2)
        base = f"{box.base}/runner"
        forgeries = {
            "no secret (the old path shape)": f"{base}/p-target/2",
            "a wrong secret": f"{base}/p-target/2/{secrets.token_urlsafe(32)}",
            "another attempt's secret": f"{base}/p-target/2/{other.secret}",
            "its secret with another attempt number": f"{base}/p-target/1/{target.secret}",
            "a prediction not in flight": f"{base}/p-gone/2/{target.secret}",
            "an empty secret": f"{base}/p-target/2/",
            "a secret with a tail": f"{base}/p-target/2/{target.secret}/x",
            "a secret's prefix": f"{base}/p-target/2/{target.secret[:-1]}",
        }
        answers = {why: await box.post(url, SUCCEEDED) for why, url in forgeries.items()}
        for why, (status, content_type, _) in answers.items():
            assert (status, content_type) == (404, "application/problem+json"), why
        assert len({body for _, _, body in answers.values()}) == 1  # no oracle in the body
        assert target.snapshots.empty() and other.snapshots.empty()


async def test_an_attempt_that_ended_or_was_taken_over_is_not_fed_by_its_old_url() -> None:
    """Another record for the same prediction and attempt number (taken over, read again,
    or the director restarted) has its own secret: the URL handed out before feeds nothing."""
    async with inbox() as box:
        first = box.claimed("p-moved", 4)
        old_url = box.receiver.webhook_url(first)
        box.attempts.remove(first)
        assert (await box.post(old_url, _snapshot()))[0] == 404
        second = box.claimed("p-moved", 4)
        assert (await box.post(old_url, SUCCEEDED))[0] == 404
        assert first.snapshots.empty() and second.snapshots.empty()
        assert (await box.post(box.receiver.webhook_url(second), _snapshot()))[0] == 200


async def test_a_body_past_16_mib_is_refused_with_413_and_nothing_is_taken() -> None:
    async with inbox() as box:
        attempt = box.claimed("p-big")
        url = box.receiver.webhook_url(attempt)
        huge = b'{"status": "succeeded", "logs": "' + b"x" * MAX_BODY + b'"}'
        status, content_type, body = await box.post(url, data=huge)
        assert (status, content_type) == (413, "application/problem+json")
        assert b'"field":"body"' in body

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: only reading tells
            yield huge[: MAX_BODY // 2]
            yield huge[MAX_BODY // 2 :]

        assert (await box.post(url, data=chunks()))[0] == 413
        assert attempt.snapshots.empty()
        exactly = b'{"status": "processing", "logs": "' + b"y" * (MAX_BODY - 40) + b'"}'
        assert len(exactly) <= MAX_BODY
        assert (await box.post(url, data=exactly))[0] == 200  # up to the limit is taken
        assert attempt.snapshots.get_nowait().logs.startswith("yyy")


async def test_a_wrong_secret_is_refused_before_the_body_is_read() -> None:
    """An oversize body on a forged URL gets the forgery's 404, not the size's 413."""
    async with inbox() as box:
        box.claimed("p-size")
        forged = f"{box.base}/runner/p-size/1/{secrets.token_urlsafe(32)}"
        assert (await box.post(forged, data=b"x" * (MAX_BODY + 1)))[0] == 404


async def test_an_unreadable_snapshot_on_the_right_url_is_a_400_naming_the_field() -> None:
    async with inbox() as box:
        attempt = box.claimed("p-bad")
        url = box.receiver.webhook_url(attempt)
        status, content_type, body = await box.post(url, {"status": "exploded"})
        assert (status, content_type) == (400, "application/problem+json")
        assert b'"field":"status"' in body
        assert attempt.snapshots.empty()


async def test_it_listens_on_loopback_by_default_and_hands_out_a_configured_public_url() -> None:
    settings = DirectorSettings()
    assert settings.receiver_host == "127.0.0.1"
    port = free_port()
    async with inbox(public_url=f"http://127.0.0.1:{port}/", port=port) as box:
        assert box.receiver.public_url == f"http://127.0.0.1:{port}"
        attempt = box.claimed("p-public")
        url = box.receiver.webhook_url(attempt)
        assert url.startswith(f"http://127.0.0.1:{port}/runner/p-public/1/")
        assert (await box.post(url, _snapshot()))[0] == 200


def test_reported_times_are_bounded_by_what_the_director_observed() -> None:
    honest = RunnerTimes(predict_time=1.5, queue_wait_time=0.5, gpu_time=1.5)
    assert honest.within(2.0) == honest
    forged = RunnerTimes(predict_time=3600.0, queue_wait_time=60.0, gpu_time=3600.0)
    assert forged.within(2.0) == RunnerTimes(2.0, 0.0, 2.0)
    # The run is kept first; the queue wait gets what is left of the window.
    assert RunnerTimes(1.5, 5.0).within(2.0) == RunnerTimes(1.5, 0.5)
    assert RunnerTimes(queue_wait_time=5.0).within(2.0) == RunnerTimes(None, 2.0)
    assert RunnerTimes().within(2.0) == RunnerTimes()  # nothing reported: nothing invented
    assert RunnerTimes(predict_time=1.0).within(-1.0) == RunnerTimes(predict_time=0.0)


# --- a real director beside a scripted runner ----------------------------------------------


@dataclass
class Deployed:
    runner: ScriptedRunner
    name: str
    director: Proc
    receiver: str

    @property
    def path(self) -> str:
        return f"/v1/deployments/{self.name}/predictions"


@pytest.fixture(scope="module")
def held(launcher: Launcher, admin: Admin) -> Iterator[Deployed]:
    """A director whose runner accepts every prediction and keeps it queued, so the test
    decides what the runner says, and when."""
    with scripted_runner(f"receiver-{uuid.uuid4().hex[:8]}", hold=True) as runner:
        name = f"test/{runner.name}"
        admin.create_model(name, runner.url)
        admin.create_deployment(
            name, name, shards=1, visibility="public"
        )  # for every test's account
        port = free_port()
        director = launcher.director(name, runner.url, receiver_port=str(port))
        try:
            wait_for(lambda: runner.capability_reads > 0, "director up")
            yield Deployed(runner, name, director, f"http://127.0.0.1:{port}")
        finally:
            director.stop()


def _handed_url(deployed: Deployed, prediction_id: str) -> str:
    def url() -> str | None:
        deployed.director.check_alive()
        with deployed.runner.lock:
            held = deployed.runner.held.get(prediction_id)
        return held[0] if held else None

    return wait_for(url, "the director's start to reach the runner", timeout=30)


def _usage(database_url: str, prediction_id: str) -> tuple[float, float]:
    query = "SELECT predict_time, billable_seconds FROM usage_records WHERE prediction_id = %s"
    with psycopg.connect(database_url) as conn:
        row = conn.execute(query, (prediction_id,)).fetchone()
    assert row is not None, f"no usage record for {prediction_id}"
    return float(row[0]), float(row[1])


def test_a_running_directors_receiver_refuses_forgeries_and_takes_the_runners_word(
    client: httpx.Client, held: Deployed
) -> None:
    prediction_id = create(client, held.path, input={"prompt": "x"})["id"]
    handed = _handed_url(held, prediction_id)
    assert handed.startswith(f"{held.receiver}/runner/{prediction_id}/1/")
    forged = {**SUCCEEDED, "id": prediction_id, "metrics": {"predict_time": 3600}}
    for url in (
        f"{held.receiver}/runner/{prediction_id}/1",
        f"{held.receiver}/runner/{prediction_id}/1/{secrets.token_urlsafe(32)}",
        f"{held.receiver}/runner/{prediction_id}/2/{handed.rsplit('/', 1)[1]}",
    ):
        response = httpx.post(url, json=forged, timeout=10)
        assert response.status_code == 404, url
    assert fetch(client, prediction_id)["status"] == "starting"  # nothing changed

    start = {"id": prediction_id, "status": "processing", "output": None, "logs": ""}
    assert httpx.post(handed, json=start, timeout=10).status_code == 200
    wait_for(lambda: fetch(client, prediction_id)["status"] == "processing", "running")
    done = {**start, "status": "succeeded", "output": ["ok"], "metrics": {"predict_time": 0.0}}
    assert httpx.post(handed, json=done, timeout=10).status_code == 200
    final = wait_status(client, prediction_id)
    assert (final["status"], final["output"]) == ("succeeded", ["ok"])
    # Its attempt ended: the URL it was handed feeds nothing any more.
    assert httpx.post(handed, json=forged, timeout=10).status_code == 404
    assert fetch(client, prediction_id)["output"] == ["ok"]


def test_a_runner_overstating_its_times_is_billed_at_most_what_the_director_saw(
    client: httpx.Client, held: Deployed, database_url: str
) -> None:
    began = time.monotonic()  # the director's window lies inside the test's
    prediction_id = create(client, held.path, input={"prompt": "lie"})["id"]
    handed = _handed_url(held, prediction_id)
    hour = {"predict_time": 3600.0, "queue_wait_time": 1800.0, "gpu_time": 3600.0}
    lie = {"id": prediction_id, "status": "succeeded", "output": ["ok"], "metrics": hour}
    assert httpx.post(handed, json=lie, timeout=10).status_code == 200
    final = wait_status(client, prediction_id)
    seen = time.monotonic() - began
    assert final["status"] == "succeeded"
    metrics = final["metrics"]
    assert 0 < metrics["predict_time"] <= min(seen, metrics["total_time"])
    assert metrics["gpu_time"] <= seen
    assert metrics["predict_time"] + metrics["queue_wait_time"] <= seen
    predict_time, billable = _usage(database_url, prediction_id)
    assert billable == predict_time == metrics["predict_time"]
    assert "more than the" in held.director.log()  # the director says what it cut
