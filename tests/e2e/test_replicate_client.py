"""The official ``replicate`` Python client (1.0.7), unmodified, pointed at Conduit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import replicate
from replicate.exceptions import ReplicateError

from tests.conftest import ECHO, Stack
from tests.fixtures.fleet_entries import registered


@pytest.fixture
def client(stack: Stack, token: str) -> Iterator[replicate.Client]:
    official = replicate.Client(api_token=token, base_url=stack.api_url)
    yield official
    official._client.close()  # the client never closes its own connection pool


def test_create_get_wait_by_version_model_and_deployment(
    client: replicate.Client, stack: Stack
) -> None:
    by_version = client.predictions.create(version=stack.version, input={"prompt": "v", "n": 2})
    by_model = client.models.predictions.create(model=ECHO, input={"prompt": "m", "n": 2})
    deployment = client.deployments.get(ECHO)
    by_deployment = deployment.predictions.create(input={"prompt": "d", "n": 2})
    by_name = client.deployments.predictions.create(ECHO, input={"prompt": "n", "n": 2})

    for prediction, prompt in (
        (by_version, "v"),
        (by_model, "m"),
        (by_deployment, "d"),
        (by_name, "n"),
    ):
        assert prediction.status == "starting"
        prediction.wait()
        assert prediction.status == "succeeded"
        assert prediction.output == [f"{prompt}-0", f"{prompt}-1"]
        fetched = client.predictions.get(prediction.id)
        assert fetched.output == prediction.output
        assert fetched.version == stack.version


def test_list_and_cancel(client: replicate.Client, stack: Stack) -> None:
    slow = client.deployments.predictions.create(
        ECHO, input={"prompt": "slow", "n": 200, "delay": 0.05}
    )
    quick = client.deployments.predictions.create(ECHO, input={"prompt": "quick"})
    page = client.predictions.list()
    assert [p.id for p in page.results][:2] == [quick.id, slow.id]

    slow.cancel()
    slow.wait()
    assert slow.status == "canceled"
    quick.wait()
    assert quick.status == "succeeded"


def test_run_returns_full_output(client: replicate.Client, stack: Stack) -> None:
    output = client.run(ECHO, input={"prompt": "run", "n": 5, "delay": 0.05})
    assert list(output) == [f"run-{i}" for i in range(5)]

    versioned = client.run(f"{ECHO}:{stack.version}", input={"prompt": "ver", "n": 3})
    assert list(versioned) == ["ver-0", "ver-1", "ver-2"]


def test_model_and_version_objects(client: replicate.Client, stack: Stack) -> None:
    model = client.models.get(ECHO)
    assert model.latest_version is not None
    assert model.latest_version.id == stack.version
    version = model.versions.get(stack.version)
    assert version.openapi_schema["components"]["schemas"]["Input"]["properties"]["n"]


def test_errors_surface_as_replicate_errors(client: replicate.Client, stack: Stack) -> None:
    try:
        client.deployments.predictions.create(ECHO, input={"n": "many"})
    except ReplicateError as error:
        assert error.status == 422
        assert error.detail is not None and "input.n" in error.detail
    else:
        raise AssertionError("invalid input was accepted")


def test_the_current_account_checks_the_token(stack: Stack, token: str) -> None:
    official = replicate.Client(api_token=token, base_url=stack.api_url)
    account = official.accounts.current()
    assert account.type == "organization"
    assert account.username == account.name
    official._client.close()
    wrong = replicate.Client(api_token="r8_" + "x" * 40, base_url=stack.api_url)
    with pytest.raises(ReplicateError) as refused:
        wrong.accounts.current()
    assert refused.value.status == 401
    wrong._client.close()


def test_hardware_lists_the_classes_the_fleet_runs_on(
    client: replicate.Client, redis_url: str
) -> None:
    # Runners of other tests may be registered too: only what these add is certain.
    with registered(redis_url, "gpu"), registered(redis_url, "cpu"):
        listed = [(h.sku, h.name) for h in client.hardware.list()]
    assert {("cpu", "CPU"), ("gpu", "GPU")} <= set(listed)
    skus = [sku for sku, _ in listed]
    assert skus == sorted(set(skus))  # each class once, in a stable order
    # The stack's echo runner does not say what it runs on: it adds no class of its own.
    assert "runner" not in skus and "unknown" not in skus
