"""``X-Priority`` reaches the runner: the deployment's by default, the request's when it sets one;
an unknown value is refused before anything is stored. ``high`` is an entitlement: honoured for
an account or on a deployment allowed it, anyone else's runs at the default."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import psycopg
import pytest

from front.admission import honoured
from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.scripted_runner import ScriptedRunner, scripted_runner
from tracker.priority import Priority


@pytest.fixture(scope="module")
def urgent(launcher: Launcher, admin: Admin) -> Iterator[tuple[str, ScriptedRunner]]:
    """A deployment configured ``--priority high`` on a scripted runner that records headers."""
    with scripted_runner(f"priority-{uuid.uuid4().hex[:8]}") as runner:
        name = f"test/{runner.name}"
        admin.create_model(name, runner.url)
        admin.create_deployment(name, name, shards=2, priority="high", visibility="public")
        director = launcher.director(name, runner.url)
        yield name, runner
        director.stop()


def _sent(client: httpx.Client, runner: ScriptedRunner, prediction_id: str) -> dict[str, str]:
    assert wait_status(client, prediction_id)["status"] == "succeeded"
    [put] = runner.puts_for(prediction_id)
    return put.headers


def test_deployment_priority_is_forwarded(
    client: httpx.Client, urgent: tuple[str, ScriptedRunner]
) -> None:
    name, runner = urgent
    created = create(client, f"/v1/deployments/{name}/predictions", input={"prompt": "a"})
    headers = _sent(client, runner, created["id"])
    assert headers["x-priority"] == "high"
    assert headers["x-tenant-id"].isdigit()  # the account's id


def test_request_priority_overrides_the_deployment(
    client: httpx.Client, urgent: tuple[str, ScriptedRunner]
) -> None:
    name, runner = urgent
    path = f"/v1/deployments/{name}/predictions"
    low = client.post(path, json={"input": {}}, headers={"X-Priority": "low"})
    assert low.status_code == 201, low.text
    assert _sent(client, runner, low.json()["id"])["x-priority"] == "low"
    # Case does not matter; the model route takes it too.
    model = client.post(
        f"/v1/models/{name}/predictions", json={"input": {}}, headers={"X-Priority": "Normal"}
    )
    assert model.status_code == 201, model.text
    assert _sent(client, runner, model.json()["id"])["x-priority"] == "normal"


def test_invalid_priority_is_422_naming_the_header(
    client: httpx.Client, urgent: tuple[str, ScriptedRunner]
) -> None:
    name, _ = urgent
    for path in (f"/v1/deployments/{name}/predictions", f"/v1/models/{name}/predictions"):
        response = client.post(path, json={"input": {}}, headers={"X-Priority": "urgent"})
        body = assert_problem(response, 422)
        assert body["errors"] == [
            {"field": "X-Priority", "message": "must be one of high, normal, low"}
        ]
        assert "X-Priority" in body["detail"]
    assert client.get("/v1/predictions").json()["results"] == []


def test_priority_is_part_of_an_idempotent_request(
    client: httpx.Client, urgent: tuple[str, ScriptedRunner]
) -> None:
    name, _ = urgent
    path = f"/v1/deployments/{name}/predictions"
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = client.post(path, json={"input": {}}, headers={**key, "X-Priority": "low"})
    assert first.status_code == 201
    again = client.post(path, json={"input": {}}, headers={**key, "X-Priority": "low"})
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    other = client.post(path, json={"input": {}}, headers={**key, "X-Priority": "high"})
    assert_problem(other, 422)


@dataclass(frozen=True)
class Entitlements:
    runner: ScriptedRunner
    plain: str  # priority normal, honours no one's high
    allowing: str  # priority normal, honours everyone's high


@pytest.fixture(scope="module")
def entitlements(launcher: Launcher, admin: Admin) -> Iterator[Entitlements]:
    with scripted_runner(f"entitled-{uuid.uuid4().hex[:8]}") as runner:
        model = f"test/{runner.name}"
        admin.create_model(model, runner.url)
        plain, allowing = f"{model}-plain", f"{model}-allowing"
        admin.create_deployment(plain, model, shards=1, visibility="public")
        admin.create_deployment(
            allowing, model, shards=1, visibility="public", allow_high_priority=True
        )
        directors = [launcher.director(name, runner.url) for name in (plain, allowing)]
        yield Entitlements(runner, plain, allowing)
        for director in directors:
            director.stop()


def _recorded(database_url: str, prediction_id: str) -> str | None:
    """The priority stored with the prediction (None: the deployment's applies)."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT priority FROM predictions WHERE id = %s", (prediction_id,)
        ).fetchone()
    assert row is not None
    priority: str | None = row[0]
    return priority


def _high(
    client: httpx.Client, runner: ScriptedRunner, deployment: str, database_url: str
) -> tuple[str | None, str]:
    """Ask for high on ``deployment``: (what was recorded, what the runner was sent)."""
    created = client.post(
        f"/v1/deployments/{deployment}/predictions",
        json={"input": {}},
        headers={"X-Priority": "high"},
    )
    assert created.status_code == 201, created.text  # never refused
    prediction_id = created.json()["id"]
    sent = _sent(client, runner, prediction_id)["x-priority"]
    return _recorded(database_url, prediction_id), sent


def test_high_from_an_account_not_entitled_runs_at_the_default(
    client: httpx.Client, entitlements: Entitlements, database_url: str
) -> None:
    runner, plain = entitlements.runner, entitlements.plain
    assert _high(client, runner, plain, database_url) == (None, "normal")
    # Lowering needs no entitlement.
    low = client.post(
        f"/v1/deployments/{plain}/predictions", json={"input": {}}, headers={"X-Priority": "low"}
    )
    assert low.status_code == 201, low.text
    assert _recorded(database_url, low.json()["id"]) == "low"
    assert _sent(client, runner, low.json()["id"])["x-priority"] == "low"


def test_high_from_an_entitled_account_is_honoured(
    stack: Stack, admin: Admin, entitlements: Entitlements, database_url: str
) -> None:
    name = f"urgent-{uuid.uuid4().hex[:8]}"
    token = admin.create_account(name)
    admin.entitle_priority(name)
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as entitled:
        runner = entitlements.runner
        assert _high(entitled, runner, entitlements.plain, database_url) == ("high", "high")
        # The model route honours it too (no deployment: only the account's entitlement).
        created = entitled.post(
            f"/v1/models/test/{runner.name}/predictions",
            json={"input": {}},
            headers={"X-Priority": "high"},
        )
        assert created.status_code == 201, created.text
        assert _recorded(database_url, created.json()["id"]) == "high"


def test_high_on_a_deployment_that_allows_it_is_honoured_for_anyone(
    client: httpx.Client, entitlements: Entitlements, database_url: str
) -> None:
    runner = entitlements.runner
    assert _high(client, runner, entitlements.allowing, database_url) == ("high", "high")


def test_only_an_unentitled_high_is_held_back() -> None:
    for requested in (None, Priority.LOW, Priority.NORMAL):
        assert honoured(requested, False, False) is requested
    assert honoured(Priority.HIGH, False, False) is None
    assert honoured(Priority.HIGH, True, False) is Priority.HIGH
    assert honoured(Priority.HIGH, False, True) is Priority.HIGH
