"""Models and deployments belong to accounts: a private one is invisible to every other account
(404, the very answer a name that does not exist gets) until it is granted, and again after
the grant is revoked; public ones work for everyone; lists leave out what an account may not
see."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, fetch, wait_status
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for

#: The api of this module caches the catalog and grants this long (seconds).
CACHE_TTL = 1.0
#: Small pages, so listing walks several of them.
PAGE_SIZE = 2
ABSENT_VERSION = "0" * 64


@dataclass(frozen=True)
class World:
    api_url: str
    owner: str  # account name, owns everything below
    other: str  # account name, owns nothing
    model: str  # private model of owner
    version: str  # its version
    deployment: str  # private deployment of owner, running that model
    public_model: str
    public_deployment: str
    tokens: dict[str, str]

    def client(self, account: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[account]}"}
        return httpx.Client(base_url=self.api_url, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def world(stack: Stack, launcher: Launcher, admin: Admin) -> Iterator[World]:
    suffix = uuid.uuid4().hex[:8]
    owner, other = f"vis-owner-{suffix}", f"vis-other-{suffix}"
    tokens = {name: admin.create_account(name) for name in (owner, other)}
    model = f"{owner}/secret"
    version = admin.create_model(model, stack.runner_url, visibility="private")
    deployment = f"{owner}/secret-run"
    admin.create_deployment(deployment, model, shards=2)  # private: the default
    public_model = f"{owner}/open"
    admin.create_model(public_model, stack.runner_url)  # public: the default
    public_deployment = f"{owner}/open-run"
    admin.create_deployment(public_deployment, public_model, shards=2, visibility="public")
    directors = [
        launcher.director(name, stack.runner_url, concurrency=2)
        for name in (deployment, public_deployment)
    ]
    env = {"CONDUIT_API_CACHE_TTL": str(CACHE_TTL), "CONDUIT_API_PAGE_SIZE": str(PAGE_SIZE)}
    api, api_url = launcher.api(env=env)
    yield World(
        api_url, owner, other, model, version, deployment, public_model, public_deployment, tokens
    )
    api.stop()
    for director in directors:
        director.stop()


def _same_as_absent(
    present: httpx.Response, absent: httpx.Response, names: tuple[str, str]
) -> None:
    """``present`` (about something the caller may not see) is the answer ``absent`` (about a
    name that does not exist) got, byte for byte once the two names are swapped."""
    assert present.status_code == absent.status_code, (present.text, absent.text)
    assert present.headers["content-type"] == absent.headers["content-type"]
    hidden, missing = names
    assert present.content.replace(hidden.encode(), missing.encode()) == absent.content


def _reads(client: httpx.Client, model: str, version: str) -> dict[str, httpx.Response]:
    return {
        "model": client.get(f"/v1/models/{model}"),
        "versions": client.get(f"/v1/models/{model}/versions"),
        "version": client.get(f"/v1/models/{model}/versions/{version}"),
        "run model": client.post(f"/v1/models/{model}/predictions", json={"input": {}}),
        "run owner/name": client.post(
            "/v1/predictions", json={"version": model, "input": {"prompt": "x"}}
        ),
        "run owner/name:id": client.post(
            "/v1/predictions", json={"version": f"{model}:{version}", "input": {"prompt": "x"}}
        ),
    }


def _by_version_id(client: httpx.Client, version: str) -> httpx.Response:
    return client.post("/v1/predictions", json={"version": version, "input": {"prompt": "x"}})


def _deployment_calls(client: httpx.Client, deployment: str) -> dict[str, httpx.Response]:
    return {
        "deployment": client.get(f"/v1/deployments/{deployment}"),
        "run": client.post(f"/v1/deployments/{deployment}/predictions", json={"input": {}}),
    }


def _listed(client: httpx.Client, path: str) -> list[str]:
    """Every ``owner/name`` of a paginated list, following ``next`` to the end."""
    names: list[str] = []
    url: str | None = path
    while url is not None:
        response = client.get(url)
        assert response.status_code == 200, response.text
        page: dict[str, Any] = response.json()
        assert len(page["results"]) <= PAGE_SIZE
        names.extend(f"{item['owner']}/{item['name']}" for item in page["results"])
        url = page["next"]
    assert len(names) == len(set(names)), "a page repeated an item"
    return names


def test_a_private_model_is_a_name_that_does_not_exist(world: World) -> None:
    absent = f"{world.owner}/no-such-model"
    with world.client(world.other) as other:
        hidden = _reads(other, world.model, world.version)
        missing = _reads(other, absent, world.version)
        for what, response in hidden.items():
            assert response.status_code in (404, 422), (what, response.text)
            _same_as_absent(response, missing[what], (world.model, absent))
        # Its version id is no way in either.
        _same_as_absent(
            _by_version_id(other, world.version),
            _by_version_id(other, ABSENT_VERSION),
            (world.version, ABSENT_VERSION),
        )
    with world.client(world.owner) as owner:
        for what, response in _reads(owner, world.model, world.version).items():
            assert response.status_code in (200, 201), (what, response.text)
        assert _by_version_id(owner, world.version).status_code == 201


def test_a_private_deployment_is_a_name_that_does_not_exist(world: World) -> None:
    absent = f"{world.owner}/no-such-deployment"
    with world.client(world.other) as other:
        hidden = _deployment_calls(other, world.deployment)
        missing = _deployment_calls(other, absent)
        for what, response in hidden.items():
            assert_problem(response, 404)
            _same_as_absent(response, missing[what], (world.deployment, absent))
    with world.client(world.owner) as owner:
        calls = _deployment_calls(owner, world.deployment)
        assert calls["deployment"].status_code == 200, calls["deployment"].text
        assert calls["deployment"].json()["owner"] == world.owner
        assert calls["run"].status_code == 201, calls["run"].text
        assert wait_status(owner, calls["run"].json()["id"])["status"] == "succeeded"


def test_public_ones_work_for_every_account(world: World) -> None:
    with world.client(world.other) as other:
        model = other.get(f"/v1/models/{world.public_model}")
        assert model.status_code == 200, model.text
        assert model.json()["owner"] == world.owner
        assert model.json()["visibility"] == "public"
        assert other.get(f"/v1/deployments/{world.public_deployment}").status_code == 200
        for path in (
            f"/v1/deployments/{world.public_deployment}/predictions",
            f"/v1/models/{world.public_model}/predictions",
        ):
            created = create(other, path, input={"prompt": "pub"})
            assert wait_status(other, created["id"])["output"] == ["pub-0"]


def test_lists_leave_out_what_the_account_may_not_see(world: World) -> None:
    with world.client(world.other) as other:
        models = _listed(other, "/v1/models")
        deployments = _listed(other, "/v1/deployments")
    assert world.public_model in models and world.model not in models
    assert world.public_deployment in deployments and world.deployment not in deployments
    with world.client(world.owner) as owner:
        models = _listed(owner, "/v1/models")
        deployments = _listed(owner, "/v1/deployments")
        assert {world.model, world.public_model} <= set(models)
        assert {world.deployment, world.public_deployment} <= set(deployments)
        # Newest first: the public model was registered after the private one.
        assert models.index(world.public_model) < models.index(world.model)
        first = owner.get("/v1/models").json()
        assert first["previous"] is None
        second = owner.get(first["next"]).json()
        back = owner.get(second["previous"]).json()
        assert back["results"] == first["results"]
        assert_problem(owner.get("/v1/models", params={"cursor": "not-a-cursor"}), 400)


def test_a_deployment_grant_lets_its_account_in_until_revoked(world: World, admin: Admin) -> None:
    deployment = f"/v1/deployments/{world.deployment}"
    with world.client(world.other) as other:
        assert_problem(other.get(deployment), 404)
        admin.grant(world.other, "deployment", world.deployment)
        wait_for(lambda: other.get(deployment).status_code == 200, "the grant seen", 10)
        assert world.deployment in _listed(other, "/v1/deployments")
        created = create(other, f"{deployment}/predictions", input={"prompt": "granted"})
        assert wait_status(other, created["id"])["output"] == ["granted-0"]
        # The deployment, not the private model it runs, was granted.
        assert_problem(other.get(f"/v1/models/{world.model}"), 404)
        assert_problem(_by_version_id(other, world.version), 422)

        admin.revoke(world.other, "deployment", world.deployment)
        wait_for(lambda: other.get(deployment).status_code == 404, "the revoke seen", 10)
        assert_problem(other.post(f"{deployment}/predictions", json={"input": {}}), 404)
        assert world.deployment not in _listed(other, "/v1/deployments")
        # What it created while granted stays its own, and only its own.
        assert fetch(other, created["id"])["status"] == "succeeded"
    with world.client(world.owner) as owner:
        assert_problem(owner.get(f"/v1/predictions/{created['id']}"), 404)


def test_a_model_grant_lets_its_account_in_until_revoked(world: World, admin: Admin) -> None:
    model = f"/v1/models/{world.model}"
    with world.client(world.other) as other:
        admin.grant(world.other, "model", world.model)
        wait_for(lambda: other.get(model).status_code == 200, "the grant seen", 10)
        versions = other.get(f"{model}/versions").json()["results"]
        assert [v["id"] for v in versions] == [world.version]
        for response in _reads(other, world.model, world.version).values():
            assert response.status_code in (200, 201), response.text
        created = _by_version_id(other, world.version)
        assert created.status_code == 201, created.text
        assert wait_status(other, created.json()["id"])["status"] == "succeeded"
        # The model, not the private deployment that runs it, was granted.
        assert_problem(other.get(f"/v1/deployments/{world.deployment}"), 404)

        admin.revoke(world.other, "model", world.model)
        wait_for(lambda: other.get(model).status_code == 404, "the revoke seen", 10)
        assert_problem(_by_version_id(other, world.version), 422)


def test_visibility_can_change_both_ways(world: World, admin: Admin) -> None:
    deployment = f"/v1/deployments/{world.deployment}"
    with world.client(world.other) as other:
        admin.set_visibility("deployment", world.deployment, "public")
        try:
            wait_for(lambda: other.get(deployment).status_code == 200, "made public", 10)
        finally:
            admin.set_visibility("deployment", world.deployment, "private")
        wait_for(lambda: other.get(deployment).status_code == 404, "made private again", 10)


def test_a_model_list_right_after_a_grant_answers_with_what_it_read(
    world: World, launcher: Launcher, admin: Admin
) -> None:
    """The list reads visibility from the database; the model it finds must not then be
    refused by grants cached before the grant (a whole page answered 404)."""
    api, api_url = launcher.api(env={"CONDUIT_API_CACHE_TTL": "600"})
    headers = {"Authorization": f"Bearer {world.tokens[world.other]}"}
    try:
        with httpx.Client(base_url=api_url, headers=headers, timeout=30) as other:
            assert_problem(other.get(f"/v1/models/{world.model}"), 404)  # cached: not visible
            admin.grant(world.other, "model", world.model)
            try:
                listed = other.get("/v1/models")
                assert listed.status_code == 200, listed.text
                names = [f"{m['owner']}/{m['name']}" for m in listed.json()["results"]]
                assert world.model in names
                [model] = [
                    m
                    for m in listed.json()["results"]
                    if f"{m['owner']}/{m['name']}" == world.model
                ]
                assert model["latest_version"]["id"] == world.version
            finally:
                admin.revoke(world.other, "model", world.model)
    finally:
        api.stop()
