"""A stock Cog model server (cog 0.23.1, no docker) works as a runner, unmodified."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.ports import free_port
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, fetch, wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for

MODEL_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "cog_model"
NAME = "test/cog-echo"


def _ready(proc: subprocess.Popen[bytes], url: str) -> bool:
    assert proc.poll() is None, "cog server exited"
    try:
        return httpx.get(f"{url}/health-check", timeout=1).json().get("status") == "READY"
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def cog_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    bindir = str(Path(sys.executable).parent)
    # coglet spawns its worker as plain `python` from PATH: the venv's must come first.
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PORT": str(port),
        "COG_PREDICT_TYPE_STUB": "predict.py:Predictor",
    }
    log = (tmp_path_factory.mktemp("cog") / "cog.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cog.server.http", "--host", "127.0.0.1"],
        cwd=MODEL_DIR,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(proc, url), "cog server READY", timeout=60)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


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
