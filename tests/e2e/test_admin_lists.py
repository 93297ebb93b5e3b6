"""``conduit admin`` list, show and delete commands, run as an operator runs them, against
the test database: what ``create-*`` made is listed (``--json`` for scripts), shown and
deleted, and a database or Redis out of reach is one line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import run_admin_cli
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for


@pytest.fixture(scope="module")
def fresh_api(launcher: Launcher) -> Iterator[str]:
    """An api that caches tokens for a tenth of a second: a deactivation shows at once."""
    api, url = launcher.api(env={"CONDUIT_API_CACHE_TTL": "0.1"})
    yield url
    api.stop()


def _ok(ran: subprocess.CompletedProcess[str]) -> str:
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()


def test_accounts_listed_shown_and_deleted(
    stack: Stack, database_url: str, redis_url: str, fresh_api: str
) -> None:
    name = f"list-{uuid.uuid4().hex[:8]}"
    token = _ok(run_admin_cli(database_url, redis_url, "create-account", name, "--admin"))

    table = _ok(run_admin_cli(database_url, redis_url, "list-accounts"))
    assert table.splitlines()[0].split() == [
        "NAME", "ACTIVE", "ROLE", "TOKENS", "MODELS", "DEPLOYMENTS", "BLOCKS", "CREATED"
    ]  # fmt: skip
    row = next(line.split() for line in table.splitlines() if line.startswith(name + " "))
    assert row[:4] == [name, "yes", "admin", "1"]
    listed = json.loads(_ok(run_admin_cli(database_url, redis_url, "list-accounts", "--json")))
    mine = next(account for account in listed if account["name"] == name)
    assert (mine["active"], mine["is_admin"], mine["tokens"]) == (True, True, 1)
    shown = json.loads(_ok(run_admin_cli(database_url, redis_url, "show-account", name)))
    assert shown == mine

    def status(token: str) -> int:
        headers = {"Authorization": f"Bearer {token}"}
        return httpx.get(f"{fresh_api}/v1/predictions", headers=headers).status_code

    assert status(token) == 200
    said = _ok(run_admin_cli(database_url, redis_url, "delete-account", name))
    assert said.startswith(f"account {name} deactivated, 1 token(s) deleted")
    wait_for(lambda: status(token) == 401, "the deactivation seen", 10)
    shown = json.loads(_ok(run_admin_cli(database_url, redis_url, "show-account", name)))
    assert (shown["active"], shown["tokens"]) == (False, 0)

    again = _ok(run_admin_cli(database_url, redis_url, "create-account", name))
    assert status(again) == 200


def test_models_and_deployments_listed_shown_and_deleted(
    stack: Stack, database_url: str, redis_url: str
) -> None:
    owner = f"list-{uuid.uuid4().hex[:8]}"
    model = f"{owner}/echo"
    version = _ok(
        run_admin_cli(
            database_url,
            redis_url,
            "create-model",
            model,
            "--runner-url",
            stack.runner_url,
            "--visibility",
            "private",
        )  # fmt: skip
    )
    deployment = f"{owner}/d"
    _ok(run_admin_cli(database_url, redis_url, "create-deployment", deployment, "--model", model))

    models = json.loads(_ok(run_admin_cli(database_url, redis_url, "list-models", "--json")))
    mine = next(m for m in models if (m["owner"], m["name"]) == (owner, "echo"))
    assert (mine["visibility"], mine["latest_version_id"]) == ("private", version)
    assert model in _ok(run_admin_cli(database_url, redis_url, "list-models"))
    shown = json.loads(_ok(run_admin_cli(database_url, redis_url, "show-model", model)))
    assert shown["versions"] == [version]

    listed = json.loads(_ok(run_admin_cli(database_url, redis_url, "list-deployments", "--json")))
    assert [d["version_id"] for d in listed if d["owner"] == owner] == [version]
    table = _ok(run_admin_cli(database_url, redis_url, "list-deployments"))
    assert any(line.split()[:3] == [deployment, model, "1"] for line in table.splitlines())
    shown = json.loads(_ok(run_admin_cli(database_url, redis_url, "show-deployment", deployment)))
    assert (shown["model"], shown["release_number"]) == (model, 1)

    refused = run_admin_cli(database_url, redis_url, "delete-model", model, "--with-versions")
    assert refused.returncode != 0
    assert f"is run by deployment {deployment}" in refused.stderr
    said = _ok(run_admin_cli(database_url, redis_url, "delete-deployment", deployment))
    assert said == f"deleted deployment {deployment}"
    gone = run_admin_cli(database_url, redis_url, "show-deployment", deployment)
    assert (gone.returncode, gone.stderr.strip()) == (1, f"deployment {deployment} does not exist")
    said = _ok(run_admin_cli(database_url, redis_url, "delete-model", model, "--with-versions"))
    assert said == f"deleted model {model}"
    assert run_admin_cli(database_url, redis_url, "show-model", model).returncode != 0


def test_blocks_and_graphs_listed_shown_and_deleted(
    stack: Stack, database_url: str, redis_url: str
) -> None:
    owner = f"list-{uuid.uuid4().hex[:8]}"
    token = _ok(run_admin_cli(database_url, redis_url, "create-account", owner))
    deployment = f"{owner}/d"
    _ok(run_admin_cli(database_url, redis_url, "create-deployment", deployment, "--model", ECHO))
    block = _ok(run_admin_cli(database_url, redis_url, "create-block", deployment))

    listed = json.loads(_ok(run_admin_cli(database_url, redis_url, "list-blocks", "--json")))
    mine = next(b for b in listed if b["id"] == block)
    assert (mine["owner"], mine["deployment"]) == (owner, deployment)
    shown = json.loads(_ok(run_admin_cli(database_url, redis_url, "show-block", block)))
    assert shown == mine

    spec = {"name": "g", "steps": [{"id": "a", "block": block, "input": {"prompt": "input.text"}}]}
    headers = {"Authorization": f"Bearer {token}"}
    made = httpx.post(f"{stack.api_url}/v1/graphs", json=spec, headers=headers)
    assert made.status_code == 201, made.text
    graph = made.json()["id"]
    table = _ok(run_admin_cli(database_url, redis_url, "list-graphs", owner))
    assert table.splitlines()[1].split()[:3] == [graph, "g", "1"]
    graphs = json.loads(_ok(run_admin_cli(database_url, redis_url, "list-graphs", owner, "--json")))
    assert [(g["id"], g["name"]) for g in graphs] == [(graph, "g")]
    shown = json.loads(_ok(run_admin_cli(database_url, redis_url, "show-graph", owner, graph)))
    assert (shown["id"], shown["spec"]["steps"][0]["block"]) == (graph, block)
    said = _ok(run_admin_cli(database_url, redis_url, "delete-graph", owner, graph))
    assert said == f"deleted graph {graph} of {owner}"
    assert _ok(run_admin_cli(database_url, redis_url, "list-graphs", owner)) == "no graphs"

    assert _ok(run_admin_cli(database_url, redis_url, "delete-block", block)) == (
        f"deleted block {block}"
    )
    assert run_admin_cli(database_url, redis_url, "show-block", block).returncode != 0


@pytest.mark.parametrize(
    ("command", "which"),
    [
        (("list-accounts",), "database"),
        (("create-account", "x"), "database"),
        (("fleet",), "Redis"),
    ],
)
def test_a_service_out_of_reach_is_one_line_and_exit_code_2(
    database_url: str, redis_url: str, command: tuple[str, ...], which: str
) -> None:
    closed = "127.0.0.1:9"  # discard: nothing listens there
    bad_db = f"postgresql://user:hunter2@{closed}/conduit"
    bad_redis = f"redis://{closed}/0"
    db, rd = (bad_db, redis_url) if which == "database" else (database_url, bad_redis)
    ran = run_admin_cli(db, rd, *command)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert ran.stderr.startswith(f"conduit admin: cannot reach {'the ' * (which == 'database')}")
    assert which in ran.stderr and "Traceback" not in ran.stderr
    assert "hunter2" not in ran.stderr
