"""Managing models, versions and deployments with the official ``replicate`` Python client
(1.0.7), unmodified: create, read back, change and delete in the order the rules allow, and
the refusals on the way (problem+json naming the field, 404 for what may not be seen)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import replicate
import yaml
from replicate.exceptions import ReplicateError

from tests.conftest import Stack
from tests.deploy.validation import VERSIONS, validate
from tests.fixtures.admin import Admin, run_admin_cli
from tests.fixtures.fleet_entries import registered
from tests.fixtures.waiting import wait_for
from tracker.keys import DEFAULT_SHARDS

pytestmark = pytest.mark.e2e


@pytest.fixture
def owner(admin: Admin) -> tuple[str, str]:
    name = f"team-{uuid.uuid4().hex[:8]}"
    return name, admin.create_account(name)


@pytest.fixture
def official(stack: Stack, owner: tuple[str, str]) -> Iterator[replicate.Client]:
    client = replicate.Client(api_token=owner[1], base_url=stack.api_url)
    yield client
    client._client.close()


@pytest.fixture
def cpu(redis_url: str) -> Iterator[str]:
    """A hardware class the fleet has while the test runs."""
    with registered(redis_url, "cpu"):
        yield "cpu"


def _problem(error: pytest.ExceptionInfo[ReplicateError]) -> tuple[int | None, str]:
    return error.value.status, str(error.value.detail)


def _deployed(
    official: replicate.Client,
    admin: Admin,
    stack: Stack,
    model: str,
    deployment: str,
    hardware: str,
    max_instances: int,
) -> tuple[str, Any]:
    """A private model made with the client, its version registered from the stack's runner
    (the operator's act), and a deployment of it from 0 to ``max_instances``."""
    owner, _, name = model.partition("/")
    official.models.create(owner=owner, name=name, visibility="private", hardware=hardware)
    version = admin.create_model(model, stack.runner_url)
    made = official.deployments.create(
        name=deployment,
        model=model,
        version=version,
        hardware=hardware,
        min_instances=0,
        max_instances=max_instances,
    )
    return version, made


def test_models_are_created_changed_and_deleted(
    official: replicate.Client, owner: tuple[str, str], stack: Stack, cpu: str, admin: Admin
) -> None:
    name = owner[0]
    model = official.models.create(
        owner=name,
        name="sketch",
        visibility="private",
        hardware=cpu,
        description="draws",
        github_url="https://example.invalid/sketch",
    )
    assert (model.owner, model.name, model.visibility, model.description) == (
        name,
        "sketch",
        "private",
        "draws",
    )
    assert model.github_url == "https://example.invalid/sketch"
    assert model.latest_version is None
    assert official.models.get(f"{name}/sketch").description == "draws"

    with pytest.raises(ReplicateError) as taken:
        official.models.create(owner=name, name="sketch", visibility="private", hardware=cpu)
    assert _problem(taken)[0] == 409
    with pytest.raises(ReplicateError) as no_such:
        official.models.create(owner=name, name="other", visibility="private", hardware="tpu-v9")
    status, detail = _problem(no_such)
    assert status == 422 and "hardware" in detail and "cpu" in detail
    with pytest.raises(ReplicateError) as not_mine:
        official.models.create(owner="conduit", name="mine", visibility="public", hardware=cpu)
    assert _problem(not_mine)[0] == 403

    # A runner registers a version (the operator's act); then the model cannot go.
    version = admin.create_model(f"{name}/sketch", stack.runner_url)

    def latest() -> str | None:  # the api's catalogue sees the operator's change within its TTL
        found = official.models.get(f"{name}/sketch").latest_version
        return found.id if found is not None else None

    assert wait_for(latest, "the registered version") == version
    with pytest.raises(ReplicateError) as has_versions:
        official.models.delete(name, "sketch")
    assert _problem(has_versions)[0] == 409

    assert official.models.get(f"{name}/sketch").versions.delete(version) is True
    assert official.models.get(f"{name}/sketch").latest_version is None
    with pytest.raises(ReplicateError) as gone:
        official.models.get(f"{name}/sketch").versions.get(version)
    assert _problem(gone)[0] == 404

    assert official.models.delete(name, "sketch") is True
    with pytest.raises(ReplicateError) as deleted:
        official.models.get(f"{name}/sketch")
    assert _problem(deleted)[0] == 404
    # The name is free again.
    again = official.models.create(owner=name, name="sketch", visibility="public", hardware=cpu)
    assert again.visibility == "public"


def test_deployments_are_created_released_and_deleted(
    official: replicate.Client, owner: tuple[str, str], stack: Stack, cpu: str, admin: Admin
) -> None:
    name = owner[0]
    version, deployment = _deployed(official, admin, stack, f"{name}/echo", "echo-prod", cpu, 3)
    assert deployment.owner == name and deployment.name == "echo-prod"
    release = deployment.current_release
    assert release is not None and release.number == 1 and release.version == version
    assert release.configuration.hardware == cpu
    assert (release.configuration.min_instances, release.configuration.max_instances) == (0, 3)
    assert release.created_by is not None and release.created_by.username == name

    updated = official.deployments.update(name, "echo-prod", max_instances=5)
    assert updated.current_release is not None
    assert updated.current_release.number == 2
    assert updated.current_release.configuration.max_instances == 5
    same = official.deployments.update(name, "echo-prod", max_instances=5)
    assert same.current_release is not None and same.current_release.number == 2  # no change
    fetched = official.deployments.get(f"{name}/echo-prod")
    assert fetched.current_release is not None
    assert fetched.current_release.configuration.max_instances == 5

    # A second version (the same runner rebuilt on another Cog), released by the client.
    schema = official.models.get(f"{name}/echo").versions.get(version).openapi_schema
    second = admin.register_version(f"{name}/echo", schema, "rebuilt")
    released = official.deployments.update(name, "echo-prod", version=second)
    assert released.current_release is not None
    assert (released.current_release.number, released.current_release.version) == (3, second)
    with pytest.raises(ReplicateError) as still_running:
        official.models.get(f"{name}/echo").versions.delete(second)
    assert _problem(still_running)[0] == 409

    with pytest.raises(ReplicateError) as bounds:
        official.deployments.update(name, "echo-prod", min_instances=9)
    status, detail = _problem(bounds)
    assert status == 422 and "min_instances" in detail
    with pytest.raises(ReplicateError) as foreign:
        official.deployments.update(name, "echo-prod", version="0" * 64)
    assert _problem(foreign)[0] == 422
    with pytest.raises(ReplicateError) as deployed:
        official.models.delete(name, "echo")
    assert _problem(deployed)[0] == 409

    assert official.deployments.delete(name, "echo-prod") is True
    with pytest.raises(ReplicateError) as gone:
        official.deployments.get(f"{name}/echo-prod")
    assert _problem(gone)[0] == 404
    echo = official.models.get(f"{name}/echo")
    assert echo.versions.delete(version) is True
    assert echo.versions.delete(second) is True
    assert official.models.delete(name, "echo") is True


def test_what_an_account_may_not_see_answers_as_missing(
    stack: Stack, owner: tuple[str, str], token: str, cpu: str, admin: Admin
) -> None:
    name = owner[0]
    mine = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {owner[1]}"})
    stranger = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"})
    with mine, stranger:
        made = mine.post(
            "/v1/models",
            json={"owner": name, "name": "hidden-one", "visibility": "private", "hardware": cpu},
        )
        assert made.status_code == 201, made.text
        missing = stranger.delete(f"/v1/models/{name}/nothing")
        hidden = stranger.delete(f"/v1/models/{name}/hidden-one")
        assert hidden.status_code == missing.status_code == 404
        assert hidden.json()["detail"].replace("hidden-one", "nothing") == missing.json()["detail"]
        assert stranger.patch(f"/v1/models/{name}/hidden-one", json={}).status_code == 404
        # A public one is seen, but not the stranger's to change.
        assert mine.patch(f"/v1/models/{name}/hidden-one", json={"visibility": "public"}).is_success
        refused = stranger.patch(f"/v1/models/{name}/hidden-one", json={"description": "mine now"})
        assert refused.status_code == 403
        assert refused.headers["content-type"].startswith("application/problem+json")

        bad = mine.post(
            "/v1/deployments",
            json={"name": "Bad Name", "model": f"{name}/hidden-one", "version": "a" * 64},
        )
        assert bad.status_code == 422
        assert {e["field"] for e in bad.json()["errors"]} == {"hardware"}
        named = mine.post(
            "/v1/deployments",
            json={
                "name": "Bad Name",
                "model": f"{name}/hidden-one",
                "version": "a" * 64,
                "hardware": cpu,
            },
        )
        assert named.status_code == 422, named.text
        assert named.json()["errors"][0]["field"] == "name"


def test_the_scaler_follows_the_releases(
    official: replicate.Client,
    owner: tuple[str, str],
    stack: Stack,
    cpu: str,
    admin: Admin,
    database_url: str,
    redis_url: str,
) -> None:
    """``conduit admin scaler`` prints the ScaledObject whose bounds the API set, and it fits
    KEDA's schema."""
    name = owner[0]
    version, _ = _deployed(official, admin, stack, f"{name}/scaled", "scaled", cpu, 2)
    official.deployments.update(name, "scaled", max_instances=7)
    printed = run_admin_cli(
        database_url, redis_url, "scaler", f"{name}/scaled", "--concurrency", "3"
    )
    assert printed.returncode == 0, printed.stderr
    manifest = yaml.safe_load(printed.stdout)
    validate(manifest, VERSIONS[0])
    spec = manifest["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (0, 7)
    streams = [t["metadata"]["stream"] for t in spec["triggers"]]
    # Every shard of the deployment's streams and of its version's: 16 each by default.
    assert len(streams) == 2 * DEFAULT_SHARDS and len(set(streams)) == 2 * DEFAULT_SHARDS
    assert sum(f"{{dp-{name}/scaled}}" in s for s in streams) == DEFAULT_SHARDS
    assert sum(f"{{vp-{version}}}" in s for s in streams) == DEFAULT_SHARDS
    assert spec["advanced"]["scalingModifiers"]["target"] == "3"
    assert manifest["metadata"]["labels"]["conduit.dev/hardware"] == cpu


def test_an_admin_reads_what_it_manages(
    stack: Stack, owner: tuple[str, str], token: str, cpu: str, admin: Admin
) -> None:
    """An admin account manages every account's models and deployments, and reads them too:
    the private model it made for another account is no 404 to it, in lists either, while a
    stranger still gets the answer for a name that does not exist."""
    name = owner[0]
    operator_token = admin.create_account(f"op-{uuid.uuid4().hex[:8]}", admin_flag=True)
    operator = replicate.Client(api_token=operator_token, base_url=stack.api_url)
    stranger = httpx.Client(base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"})
    with operator._client, stranger:
        operator.models.create(owner=name, name="sdxl", visibility="private", hardware=cpu)
        got = operator.models.get(f"{name}/sdxl")
        assert (got.owner, got.name, got.visibility) == (name, "sdxl", "private")
        assert f"{name}/sdxl" in [f"{m.owner}/{m.name}" for m in operator.models.list().results]
        with pytest.raises(ReplicateError) as taken:
            operator.models.create(owner=name, name="sdxl", visibility="private", hardware=cpu)
        assert _problem(taken)[0] == 409
        patched = operator._client.patch(
            f"/v1/models/{name}/sdxl",
            json={"description": "admin's"},
            headers={"Authorization": f"Bearer {operator_token}"},
        )
        assert patched.status_code == 200 and patched.json()["description"] == "admin's"

        version = admin.create_model(f"{name}/sdxl", stack.runner_url)
        model = operator.models.get(f"{name}/sdxl")
        assert [v.id for v in model.versions.list()] == [version]
        schema = model.versions.get(version).openapi_schema
        second = admin.register_version(f"{name}/sdxl", schema, "rebuilt")

        made = operator.deployments.create(
            name="sdxl-prod",
            model=f"{name}/sdxl",
            version=version,
            hardware=cpu,
            min_instances=0,
            max_instances=1,
        )
        mine = made.owner  # as on Replicate, a deployment is the caller's
        assert operator.deployments.get(f"{mine}/sdxl-prod").owner == mine
        listed = operator.deployments.list().results
        assert f"{mine}/sdxl-prod" in [f"{d.owner}/{d.name}" for d in listed]
        released = operator.deployments.update(mine, "sdxl-prod", version=second)
        assert released.current_release is not None
        assert released.current_release.version == second
        read = operator._client.get(f"/v1/deployments/{mine}/sdxl-prod").json()
        assert read["withdrawn"] is None  # its owner, an admin, sees the private model
        assert operator.deployments.delete(mine, "sdxl-prod") is True

        # The owner's own deployment, managed and read by the admin.
        with replicate.Client(api_token=owner[1], base_url=stack.api_url)._client as own:
            created = own.post(
                "/v1/deployments",
                json={"name": "sdxl-prod", "model": f"{name}/sdxl", "version": version,
                      "hardware": cpu, "max_instances": 1},
            )  # fmt: skip
            assert created.status_code == 201, created.text
        assert operator.deployments.get(f"{name}/sdxl-prod").owner == name
        listed = operator.deployments.list().results
        assert f"{name}/sdxl-prod" in [f"{d.owner}/{d.name}" for d in listed]
        released = operator.deployments.update(name, "sdxl-prod", version=second)
        assert released.current_release is not None
        assert (released.current_release.number, released.current_release.version) == (2, second)

        for path in (f"/v1/models/{name}/sdxl", f"/v1/deployments/{name}/sdxl-prod"):
            assert stranger.get(path).status_code == 404, path
        assert operator.deployments.delete(name, "sdxl-prod") is True
        for each in (version, second):
            assert operator.models.get(f"{name}/sdxl").versions.delete(each) is True
        assert operator.models.delete(name, "sdxl") is True
