"""A stock Cog model server (cog 0.23.1, no docker) works as a runner, unmodified."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures.admin import Admin
from tests.fixtures.api import create, fetch, wait_status
from tests.fixtures.cog_server import FIXTURES, cog_server
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for

MODEL_DIR = FIXTURES / "cog_model"
NAME = "test/cog-echo"


@pytest.fixture(scope="module")
def cog_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with cog_server(MODEL_DIR, tmp_path_factory.mktemp("cog")) as url:
        yield url


@pytest.fixture(scope="module")
def cog_deployment(cog_runner: str, launcher: Launcher, admin: Admin) -> Iterator[str]:
    admin.create_model(NAME, cog_runner)
    admin.create_deployment(NAME, NAME, shards=2, visibility="public")
    director = launcher.director(NAME, cog_runner, concurrency=1, cancel_grace="30")
    yield NAME
    director.stop()


def test_cog_server_runs_predictions(client: httpx.Client, cog_deployment: str) -> None:
    model = client.get(f"/v1/models/{cog_deployment}").json()
    assert model["latest_version"]["cog_version"]  # read from the cog server's GET /
    created = create(
        client, f"/v1/deployments/{cog_deployment}/predictions", input={"prompt": "c", "n": 4}
    )
    done = wait_status(client, created["id"], timeout=60)
    assert done["status"] == "succeeded", done
    assert done["output"] == ["c-0", "c-1", "c-2", "c-3"]
    assert "log line 3" in done["logs"]
    assert done["metrics"]["predict_time"] > 0


def test_cog_server_cancel(client: httpx.Client, cog_deployment: str) -> None:
    path = f"/v1/deployments/{cog_deployment}/predictions"
    created = create(client, path, input={"prompt": "s", "n": 500, "delay": 0.05})
    wait_for(lambda: len(fetch(client, created["id"])["output"] or []) >= 2, "cog output")
    assert client.post(f"/v1/predictions/{created['id']}/cancel").status_code == 200
    done = wait_status(client, created["id"], timeout=20)
    assert done["status"] == "canceled"
    assert 2 <= len(done["output"]) < 500
    # The runner is usable again afterwards.
    after = create(client, path, input={"prompt": "a", "n": 1})
    assert wait_status(client, after["id"], timeout=60)["output"] == ["a-0"]
