"""``conduit admin``: accounts, models (read from a runner), deployments."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from tracker import catalog
from tracker.priority import Priority


def split_name(value: str) -> tuple[str, str]:
    owner, sep, name = value.partition("/")
    if not sep or not owner or not name or "/" in name:
        raise SystemExit(f"expected OWNER/NAME, got {value!r}")
    return owner, name


def read_runner_schema(runner_url: str) -> tuple[dict[str, Any], str | None]:
    """The runner's OpenAPI schema and, when its ``GET /`` reports one, its cog version."""
    base = runner_url.rstrip("/")
    with httpx.Client(timeout=30) as client:
        response = client.get(f"{base}/openapi.json")
        if response.status_code != 200:
            raise SystemExit(
                f"{base}/openapi.json answered {response.status_code}: {response.text[:200]}\n"
                "A Cog model needs .cog/openapi_schema.json (written by `cog build`)."
            )
        schema: dict[str, Any] = response.json()
        cog_version = None
        root = client.get(f"{base}/")
        if root.status_code == 200 and isinstance(root.json(), dict):
            cog_version = root.json().get("cog_version")
    return schema, cog_version


async def create_account(engine: AsyncEngine, name: str) -> str:
    _, token = await catalog.create_account(engine, name)
    return token


async def create_model(engine: AsyncEngine, name: str, runner_url: str, shards: int = 8) -> str:
    owner, short = split_name(name)
    schema, cog_version = read_runner_schema(runner_url)
    return await catalog.create_version(engine, owner, short, schema, cog_version, shards)


async def create_deployment(
    engine: AsyncEngine,
    name: str,
    model: str,
    version: str | None,
    shards: int,
    prediction_timeout: float,
    max_attempts: int = 1,
    priority: str = Priority.NORMAL,
) -> catalog.DeploymentInfo:
    owner, short = split_name(name)
    model_owner, model_name = split_name(model)
    if priority not in tuple(Priority):
        raise SystemExit(f"priority must be one of {', '.join(Priority)}, got {priority!r}")
    try:
        return await catalog.create_deployment(
            engine,
            owner,
            short,
            model_owner,
            model_name,
            version,
            shards,
            prediction_timeout,
            max_attempts,
            Priority(priority),
        )
    except LookupError as error:
        raise SystemExit(str(error)) from error
