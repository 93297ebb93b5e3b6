"""One write path for the catalogue, against the real Postgres: what an account's create over
the API (``catalog.deployments``, ``catalog.models``, as ``api.routes.manage`` calls them)
refuses, ``conduit admin`` (the operator, an admin principal) refuses too, in the same words;
and the operator acts for any owner where an account acts only for itself."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import deployments, lookups, models, rules, writes
from catalog.deployments import DeploymentChanges
from catalog.records import AccountInfo, ModelInfo
from conduit import admin

SCHEMA = {"components": {"schemas": {"Input": {"type": "object", "properties": {}}}}}
FLEET = {"cpu"}


async def _owner(engine: AsyncEngine) -> tuple[AccountInfo, ModelInfo, str]:
    """An account, its model ``m`` and the model's version."""
    account, _ = await writes.create_account(engine, f"rules-{uuid.uuid4().hex[:8]}")
    version = await writes.create_version(engine, account.name, "m", SCHEMA, None)
    model = await lookups.get_model(engine, account.name, "m")
    assert model is not None
    return account, model, version


async def _over_the_api(
    engine: AsyncEngine,
    account: AccountInfo,
    model: ModelInfo,
    name: str,
    hardware: str = "cpu",
    version: str | None = None,
) -> str:
    """What the API's create refuses, as the message the client reads."""
    wanted = DeploymentChanges(
        version=version or model.latest_version_id,
        hardware=hardware,
        min_instances=0,
        max_instances=1,
    )
    with pytest.raises((rules.Refused, rules.NotOwner)) as refused:
        await deployments.create_deployment(
            engine, account, account.name, name, model, wanted, known_hardware=FLEET
        )
    return str(refused.value)


async def _with_the_cli(
    engine: AsyncEngine, name: str, model: str, hardware: str | None = None
) -> str:
    """What ``conduit admin create-deployment`` refuses, as the message the operator reads."""
    with pytest.raises(SystemExit) as refused:
        await admin.create_deployment(
            engine, name, model, None, 2, 60.0, hardware=hardware, known_hardware=FLEET
        )
    message = str(refused.value)
    assert message.startswith("create-deployment: ")
    return message.removeprefix("create-deployment: ")


async def test_a_deployment_name_the_api_refuses_the_cli_refuses_alike(
    engine: AsyncEngine,
) -> None:
    account, model, _ = await _owner(engine)
    api = await _over_the_api(engine, account, model, "Bad Name")
    cli = await _with_the_cli(engine, f"{account.name}/Bad Name", f"{account.name}/m")
    assert api == cli and api.startswith("name: must be 1-100 lowercase letters")
    assert await lookups.get_deployment(engine, account.name, "Bad Name") is None
    # The rule is the new deployment's: a good name is created by either entry.
    made = await admin.create_deployment(
        engine, f"{account.name}/good", f"{account.name}/m", None, 2, 60.0
    )
    assert made.full_name == f"{account.name}/good" and made.released_by is None


async def test_hardware_the_fleet_lacks_is_refused_by_both(engine: AsyncEngine) -> None:
    account, model, _ = await _owner(engine)
    api = await _over_the_api(engine, account, model, "gpu-run", hardware="h200")
    cli = await _with_the_cli(
        engine, f"{account.name}/gpu-run", f"{account.name}/m", hardware="h200"
    )
    assert api == cli and api.startswith("hardware: 'h200' is not a hardware class")
    made = await admin.create_deployment(
        engine, f"{account.name}/cpu-run", f"{account.name}/m", None, 2, 60.0,
        hardware="cpu", known_hardware=FLEET,
    )  # fmt: skip
    assert made.hardware == "cpu"


async def test_a_version_of_another_model_is_refused_by_both(engine: AsyncEngine) -> None:
    account, model, _ = await _owner(engine)
    other = await writes.create_version(engine, account.name, "other", SCHEMA, None)
    api = await _over_the_api(engine, account, model, "mixed", version=other)
    with pytest.raises(LookupError) as cli:
        await writes.create_deployment(
            engine, account.name, "mixed", account.name, "m", other, shards=2, prediction_timeout=60
        )
    assert api == str(cli.value)
    assert api.endswith(f"belongs to {account.name}/other, not to {account.name}/m")


async def test_an_account_acts_for_itself_and_the_operator_for_any_owner(
    engine: AsyncEngine,
) -> None:
    account, model, version = await _owner(engine)
    stranger, _ = await writes.create_account(engine, f"rules-{uuid.uuid4().hex[:8]}")
    changes = DeploymentChanges(version=version, hardware="cpu", min_instances=0, max_instances=1)
    with pytest.raises(rules.NotOwner):
        await deployments.create_deployment(
            engine, stranger, account.name, "theirs", model, changes, known_hardware=FLEET
        )
    with pytest.raises(rules.NotOwner):
        await models.create_model(engine, stranger, account.name, "theirs", {}, FLEET)
    made = await deployments.create_deployment(
        engine, rules.OPERATOR, account.name, "theirs", model, changes, known_hardware=FLEET
    )
    assert made.owner == account.name and made.released_by is None
    # The owner's own release, then the operator's "create or update" of the same deployment:
    # one that changes nothing makes no release, by either entry.
    same = await deployments.update_deployment(engine, made, account, changes)
    assert same.release_number == 1
    released = await deployments.update_deployment(
        engine, made, account, DeploymentChanges(max_instances=3)
    )
    assert (released.release_number, released.released_by) == (2, account.name)
    again = await admin.create_deployment(
        engine, made.full_name, f"{account.name}/m", None, made.shards, made.prediction_timeout
    )
    assert again.release_number == 2 and again.max_instances == 3


async def test_a_model_name_the_api_refuses_registering_refuses_alike(
    engine: AsyncEngine,
) -> None:
    account, _, _ = await _owner(engine)
    with pytest.raises(rules.Refused) as api:
        await models.create_model(
            engine, account, account.name, "Bad_Model", {"hardware": "cpu"}, FLEET
        )
    with pytest.raises(rules.Refused) as cli:
        await writes.create_version(engine, account.name, "Bad_Model", SCHEMA, None)
    assert str(api.value) == str(cli.value)
    assert await lookups.get_model(engine, account.name, "Bad_Model") is None
