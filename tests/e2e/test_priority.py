"""``X-Priority`` reaches the runner: the deployment's by default, the request's when it sets one;
an unknown value is refused before anything is stored."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.scripted_runner import ScriptedRunner, scripted_runner


@pytest.fixture(scope="module")
def urgent(launcher: Launcher, admin: Admin) -> Iterator[tuple[str, ScriptedRunner]]:
    """A deployment configured ``--priority high`` on a scripted runner that records headers."""
    with scripted_runner(f"priority-{uuid.uuid4().hex[:8]}") as runner:
        name = f"test/{runner.name}"
        admin.create_model(name, runner.url)
        admin.create_deployment(name, name, shards=2, priority="high")
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
