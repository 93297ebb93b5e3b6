"""Two models registered from one runner keep their own versions, end to end."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, wait_status
from tests.fixtures.processes import Launcher


@pytest.fixture
def twins(stack: Stack, launcher: Launcher, admin: Admin) -> Iterator[dict[str, str]]:
    """Two models (name → version id) read from the session's echo runner, each deployed."""
    owner = f"twin-{uuid.uuid4().hex[:8]}"
    models = {
        f"{owner}/{short}": admin.create_model(f"{owner}/{short}", stack.runner_url)
        for short in ("left", "right")
    }
    directors = []
    for name in models:
        admin.create_deployment(name, name, shards=2, visibility="public")
        directors.append(launcher.director(name, stack.runner_url))
    yield models
    for director in directors:
        director.stop()


def test_models_from_one_runner_have_distinct_versions(
    client: httpx.Client, stack: Stack, twins: dict[str, str]
) -> None:
    assert len(set(twins.values())) == 2
    assert stack.version not in twins.values()
    for name, version_id in twins.items():
        model = client.get(f"/v1/models/{name}")
        assert model.status_code == 200, model.text
        assert model.json()["latest_version"]["id"] == version_id
        version = client.get(f"/v1/models/{name}/versions/{version_id}")
        assert version.status_code == 200, version.text
        assert version.json()["id"] == version_id
        listed = client.get(f"/v1/models/{name}/versions").json()["results"]
        assert [v["id"] for v in listed] == [version_id]


def test_qualified_version_predictions_record_their_model(
    client: httpx.Client, twins: dict[str, str]
) -> None:
    created = {
        name: create(
            client, "/v1/predictions", version=f"{name}:{version_id}", input={"prompt": name}
        )
        for name, version_id in twins.items()
    }
    for name, prediction in created.items():
        assert prediction["model"] == name
        assert prediction["version"] == twins[name]
        done = wait_status(client, prediction["id"])
        assert done["status"] == "succeeded", done
        assert done["model"] == name
        assert done["output"] == [f"{name}-0"]


def test_model_predictions_run_their_own_latest_version(
    client: httpx.Client, twins: dict[str, str]
) -> None:
    path = "/v1/models/{}/predictions"
    created = {name: create(client, path.format(name), input={"prompt": "m"}) for name in twins}
    for name, prediction in created.items():
        assert (prediction["model"], prediction["version"]) == (name, twins[name])
        done = wait_status(client, prediction["id"])
        assert (done["status"], done["model"], done["output"]) == ("succeeded", name, ["m-0"])


def test_version_of_another_model_is_refused(client: httpx.Client, twins: dict[str, str]) -> None:
    (left, left_version), (right, _) = twins.items()
    response = client.post(
        "/v1/predictions", json={"version": f"{right}:{left_version}", "input": {}}
    )
    assert response.status_code == 422, response.text


def test_reregistering_keeps_the_version_id(
    client: httpx.Client, stack: Stack, admin: Admin, twins: dict[str, str]
) -> None:
    for name, version_id in twins.items():
        assert admin.create_model(name, stack.runner_url) == version_id
        listed = client.get(f"/v1/models/{name}/versions").json()["results"]
        assert [v["id"] for v in listed] == [version_id]
    assert admin.create_model("conduit/echo", stack.runner_url) == stack.version
