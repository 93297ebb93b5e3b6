"""Version identity and deployment releases against the real Postgres."""

from __future__ import annotations

import re
import uuid

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import lookups, versions, writes

SCHEMA = {"components": {"schemas": {"Input": {"type": "object", "properties": {}}}}}
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _owner() -> str:
    return f"cat-{uuid.uuid4().hex[:8]}"


def test_version_id_depends_on_model_schema_and_cog_version() -> None:
    base = versions.version_id_for("a", "m", SCHEMA, "0.1")
    assert HEX64.match(base)
    assert versions.version_id_for("a", "m", {**SCHEMA}, "0.1") == base
    assert versions.version_id_for("a", "n", SCHEMA, "0.1") != base
    assert versions.version_id_for("b", "m", SCHEMA, "0.1") != base
    assert versions.version_id_for("a", "m", SCHEMA, "0.2") != base
    assert versions.version_id_for("a", "m", SCHEMA, None) != base
    assert versions.version_id_for("a", "m", {"components": {}}, "0.1") != base


async def test_two_models_with_one_schema_keep_their_own_versions(engine: AsyncEngine) -> None:
    owner = _owner()
    first = await writes.create_version(engine, owner, "one", SCHEMA, "0.1")
    second = await writes.create_version(engine, owner, "two", SCHEMA, "0.1")
    assert first != second

    for name, version_id in (("one", first), ("two", second)):
        model = await lookups.get_model(engine, owner, name)
        assert model is not None and model.latest_version_id == version_id
        version = await lookups.get_version(engine, version_id)
        assert version is not None and version.model == f"{owner}/{name}"
        assert await lookups.list_versions(engine, model.id) == [version_id]


async def test_reregistering_a_model_keeps_its_version_id(engine: AsyncEngine) -> None:
    owner = _owner()
    first = await writes.create_version(engine, owner, "m", SCHEMA, None)
    again = await writes.create_version(engine, owner, "m", SCHEMA, None)
    assert again == first
    model = await lookups.get_model(engine, owner, "m")
    assert model is not None
    assert await lookups.list_versions(engine, model.id) == [first]


async def test_deployment_refuses_a_version_of_another_model(engine: AsyncEngine) -> None:
    owner = _owner()
    await writes.create_version(engine, owner, "one", SCHEMA, None)
    other = await writes.create_version(engine, owner, "two", SCHEMA, None)
    with pytest.raises(LookupError, match=f"belongs to {owner}/two, not to {owner}/one"):
        await writes.create_deployment(
            engine, owner, "dep", owner, "one", other, shards=2, prediction_timeout=60
        )
    assert await lookups.get_deployment(engine, owner, "dep") is None

    deployment = await writes.create_deployment(
        engine, owner, "dep", owner, "two", other, shards=2, prediction_timeout=60
    )
    assert deployment.version_id == other and deployment.model == f"{owner}/two"
