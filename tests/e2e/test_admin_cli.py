"""``conduit admin`` run as a subprocess, the way an operator runs it."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import httpx

from tests.conftest import ECHO, Stack
from tests.fixtures.processes import base_env

HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _admin(database_url: str, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conduit", "admin", *args],
        env=base_env(database_url, redis_url),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_create_account_prints_a_token_that_authenticates(
    stack: Stack, database_url: str, redis_url: str
) -> None:
    ran = _admin(database_url, redis_url, "create-account", f"cli-{uuid.uuid4().hex[:8]}")
    assert ran.returncode == 0, ran.stderr
    token = ran.stdout.strip()
    assert token and "\n" not in token

    ok = httpx.get(f"{stack.api_url}/v1/predictions", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200, ok.text
    wrong = httpx.get(
        f"{stack.api_url}/v1/predictions", headers={"Authorization": f"Bearer {token}x"}
    )
    assert wrong.status_code == 401


def test_create_model_prints_its_version_and_deployments_check_it(
    stack: Stack, client: httpx.Client, database_url: str, redis_url: str
) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}/echo"
    ran = _admin(database_url, redis_url, "create-model", name, "--runner-url", stack.runner_url)
    assert ran.returncode == 0, ran.stderr
    version = ran.stdout.strip()
    assert HEX64.match(version), ran.stdout
    assert version != stack.version
    model = client.get(f"/v1/models/{name}")
    assert model.status_code == 200, model.text
    assert model.json()["latest_version"]["id"] == version

    foreign = _admin(
        database_url, redis_url, "create-deployment", name, "--model", name,
        "--version", stack.version,
    )  # fmt: skip
    assert foreign.returncode != 0
    assert f"belongs to {ECHO}, not to {name}" in foreign.stderr
    assert client.get(f"/v1/deployments/{name}").status_code == 404

    own = _admin(database_url, redis_url, "create-deployment", name, "--model", name)
    assert own.returncode == 0, own.stderr
    assert own.stdout.strip() == f"{name} release 1: {version}"
