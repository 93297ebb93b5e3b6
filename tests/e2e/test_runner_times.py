"""The runner's own times reach the prediction's ``metrics``, the usage record and, on request,
the ``Prefer: wait`` response headers, exactly as the runner reported them."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, wait_status
from tests.fixtures.processes import Launcher, Proc
from tests.fixtures.scripted_runner import ScriptedRunner, scripted_runner
from tests.fixtures.waiting import wait_for

# Binary fractions, so sums and JSON round trips are exact.
GPU_TIMES = {"predict_time": 0.25, "queue_wait_time": 0.125, "gpu_time": 0.5}
CPU_TIMES = {"predict_time": 0.75, "queue_wait_time": 0.0625, "gpu_time": 0.0}
COG_TIMES = {"predict_time": 0.5}


def _capabilities(hardware: str) -> dict[str, Any]:
    """The runner API spec's capabilities document, plus Conduit's ``hardware``."""
    return {
        "runnerType": "conduit-scripted",
        "runnerId": f"r-{hardware}",
        "hardware": hardware,
        "queue": {"depth": 0, "maxDepth": 8, "avgWaitMs": 0, "p95WaitMs": 0},
        "health": "healthy",
    }


class Deployed:
    def __init__(self, runner: ScriptedRunner, name: str, director: Proc) -> None:
        self.runner = runner
        self.name = name
        self.director = director

    @property
    def path(self) -> str:
        return f"/v1/deployments/{self.name}/predictions"


@pytest.fixture(scope="module")
def runners(launcher: Launcher, admin: Admin) -> Iterator[dict[str, Deployed]]:
    """Three runners: a GPU one, a CPU one, and one that says nothing of itself (stock Cog)."""
    kinds = {
        "gpu": {"metrics": GPU_TIMES, "capabilities": _capabilities("gpu")},
        "cpu": {"metrics": CPU_TIMES, "capabilities": _capabilities("cpu")},
        "cog": {"metrics": COG_TIMES, "capabilities": None},
    }
    deployed: dict[str, Deployed] = {}
    with contextlib.ExitStack() as stack:
        for kind, options in kinds.items():
            name = f"times-{kind}-{uuid.uuid4().hex[:8]}"
            runner = stack.enter_context(scripted_runner(name, **options))
            full_name = f"test/{runner.name}"
            admin.create_model(full_name, runner.url)
            admin.create_deployment(full_name, full_name, shards=2, visibility="public")
            director = launcher.director(full_name, runner.url)
            stack.callback(director.stop)
            deployed[kind] = Deployed(runner, full_name, director)
        # A director reads its runner's capabilities before taking work.
        wait_for(
            lambda: all(d.runner.capability_reads > 0 for d in deployed.values()), "directors up"
        )
        yield deployed


def _usage_row(database_url: str, prediction_id: str) -> dict[str, Any]:
    query = (
        "SELECT hardware, status, predict_time, gpu_time, cpu_time, queue_wait_time, "
        "billable_seconds FROM usage_records WHERE prediction_id = %s"
    )
    with psycopg.connect(database_url) as conn:
        cursor = conn.execute(query, (prediction_id,))
        row = cursor.fetchone()
        assert row is not None, f"no usage record for {prediction_id}"
        names = [column.name for column in cursor.description or []]
    return dict(zip(names, row, strict=True))


def _run(client: httpx.Client, deployed: Deployed) -> dict[str, Any]:
    done = wait_status(client, create(client, deployed.path, input={"prompt": "t"})["id"])
    assert done["status"] == "succeeded", done
    return done


def test_gpu_runner_times_are_recorded_exactly(
    client: httpx.Client, runners: dict[str, Deployed], database_url: str
) -> None:
    done = _run(client, runners["gpu"])
    metrics = done["metrics"]
    assert {k: metrics[k] for k in GPU_TIMES} == GPU_TIMES
    assert metrics["total_time"] > 0
    assert _usage_row(database_url, done["id"]) == {
        "hardware": "gpu",
        "status": "succeeded",
        "predict_time": 0.25,
        "gpu_time": 0.5,
        "cpu_time": 0.0,
        "queue_wait_time": 0.125,
        "billable_seconds": 0.25,
    }


def test_cpu_runner_bills_its_slot_as_cpu_time(
    client: httpx.Client, runners: dict[str, Deployed], database_url: str
) -> None:
    done = _run(client, runners["cpu"])
    assert {k: done["metrics"][k] for k in CPU_TIMES} == CPU_TIMES
    assert _usage_row(database_url, done["id"]) == {
        "hardware": "cpu",
        "status": "succeeded",
        "predict_time": 0.75,
        "gpu_time": 0.0,
        "cpu_time": 0.75,
        "queue_wait_time": 0.0625,
        "billable_seconds": 0.75,
    }


def test_stock_cog_runner_reports_only_predict_time(
    client: httpx.Client, runners: dict[str, Deployed], database_url: str
) -> None:
    done = _run(client, runners["cog"])
    assert set(done["metrics"]) == {"predict_time", "total_time"}
    assert done["metrics"]["predict_time"] == 0.5
    assert _usage_row(database_url, done["id"]) == {
        "hardware": "runner",  # it did not say
        "status": "succeeded",
        "predict_time": 0.5,
        "gpu_time": None,
        "cpu_time": 0.0,
        "queue_wait_time": None,
        "billable_seconds": 0.5,
    }


def test_usage_totals_gpu_and_cpu_time(client: httpx.Client, runners: dict[str, Deployed]) -> None:
    for kind in ("gpu", "cpu", "cog"):
        _run(client, runners[kind])
    usage = client.get("/v1/usage").json()
    assert usage["predictions"] == 3
    assert usage["predict_time"] == 1.5
    assert usage["gpu_time"] == 0.5
    assert usage["cpu_time"] == 0.75
    assert usage["billable_seconds"] == 1.5
    by_name = {row["deployable"]: row for row in usage["by_deployable"]}
    assert by_name[runners["gpu"].name]["gpu_time"] == 0.5
    assert by_name[runners["cpu"].name]["cpu_time"] == 0.75
    assert by_name[runners["cog"].name]["gpu_time"] == 0


def test_prefer_wait_reports_processing_time_only(client: httpx.Client) -> None:
    response = client.post(
        f"/v1/deployments/{ECHO}/predictions",
        json={"input": {"prompt": "w"}},
        headers={"Prefer": "wait"},
    )
    assert response.status_code == 201 and response.json()["status"] == "succeeded"
    assert 0 < float(response.headers["x-processing-time"]) < response.elapsed.total_seconds()
    # Forwarding the runner's times is off by default.
    assert "x-remote-processing-time" not in response.headers
    assert "x-remote-processing-times" not in response.headers

    no_wait = client.post(f"/v1/deployments/{ECHO}/predictions", json={"input": {}})
    assert "x-processing-time" not in no_wait.headers


@pytest.fixture(scope="module")
def forwarding_api(launcher: Launcher, stack: Stack) -> Iterator[str]:
    proc, url = launcher.api(
        env={"CONDUIT_REMOTE_TIME_FORWARDING": "true", "CONDUIT_PUBLIC_URL": stack.api_url}
    )
    yield url
    proc.stop()


def test_remote_processing_time_is_forwarded_when_enabled(
    forwarding_api: str, token: str, runners: dict[str, Deployed]
) -> None:
    headers = {"Authorization": f"Bearer {token}", "Prefer": "wait"}
    with httpx.Client(base_url=forwarding_api, headers=headers, timeout=30) as client:
        response = client.post(runners["gpu"].path, json={"input": {"prompt": "f"}})
        assert response.status_code == 201 and response.json()["status"] == "succeeded"
        assert float(response.headers["x-processing-time"]) > 0
        assert response.headers["x-remote-processing-time"] == "0.375"  # 0.25 run + 0.125 queued
        assert response.headers["x-remote-processing-times"] == "0.375"

        # A prediction still running when the wait ends has no runner times to report.
        slow = client.post(
            f"/v1/deployments/{ECHO}/predictions",
            json={"input": {"prompt": "s", "n": 3, "delay": 0.8}},
            headers={"Prefer": "wait=1"},
        )
        assert slow.json()["status"] == "starting"
        assert "x-processing-time" in slow.headers
        assert "x-remote-processing-time" not in slow.headers
