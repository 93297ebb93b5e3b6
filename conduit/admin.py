"""``conduit admin``: accounts, models (read from a runner), deployments, who may use them,
and the fleet of runners.

Models and deployments belong to the account their owner names; creating one for an owner
that has no account creates that account (without a token: ``create-account`` reuses it by
name and gives it one). Models are public unless made private, deployments private unless
made public; ``grant`` lets other accounts use a private one. A block publishes a deployment
(or a model version) for the inference gateway, as its owner's.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import Any

import httpx
import orjson
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from protocol import bearer
from tracker import blocks, catalog, catalog_admin
from tracker.fleet import FleetEntry, read_fleet
from tracker.keys import DEFAULT_SHARDS
from tracker.priority import Priority


def split_name(value: str) -> tuple[str, str]:
    owner, sep, name = value.partition("/")
    if not sep or not owner or not name or "/" in name:
        raise SystemExit(f"expected OWNER/NAME, got {value!r}")
    return owner, name


def read_runner_schema(
    runner_url: str, runner_token: str | None = None
) -> tuple[dict[str, Any], str | None]:
    """The runner's OpenAPI schema and, when its ``GET /`` reports one, its cog version.

    ``runner_token`` (the runner's ``CONDUIT_RUNNER_TOKEN``) is sent as a bearer token; a stock
    Cog server ignores it. Redirects are not followed, so the token goes to this runner only.
    """
    base = runner_url.rstrip("/")
    headers = bearer(runner_token) if runner_token else {}
    with httpx.Client(timeout=30, headers=headers, follow_redirects=False) as client:
        response = client.get(f"{base}/openapi.json")
        if response.status_code == 401:
            raise SystemExit(
                f"{base}/openapi.json answered 401: the runner needs its token "
                "(CONDUIT_RUNNER_TOKEN or --runner-token)"
            )
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


async def create_account(engine: AsyncEngine, name: str, admin: bool | None = None) -> str:
    """A new token for account ``name`` (created if missing); ``admin=True`` makes it an
    admin, None leaves an existing account's flag as it was."""
    _, token = await catalog_admin.create_account(engine, name, admin)
    return token


async def set_admin(engine: AsyncEngine, account: str, admin: bool) -> str:
    """Whether ``account`` is an admin: it may read the fleet (``GET /v1/fleet``)."""
    try:
        await catalog_admin.set_admin(engine, account, admin)
    except LookupError as error:
        raise SystemExit(str(error)) from error
    return f"account {account} is {'an admin' if admin else 'not an admin'}"


async def set_ops_role(engine: AsyncEngine, account: str, withdraw: bool) -> str:
    """Whether ``account`` may look at the operator page (``/ops``) read-only."""
    try:
        await catalog_admin.set_ops_role(engine, account, None if withdraw else "viewer")
    except LookupError as error:
        raise SystemExit(str(error)) from error
    return f"account {account} {'may not' if withdraw else 'may'} look at /ops (read-only)"


FLEET_COLUMNS = ("ID", "DEPLOYMENT", "URL", "STATE", "CONCURRENCY", "HARDWARE", "HEARTBEAT")


def format_fleet(entries: Iterable[FleetEntry], now: float) -> str:
    """The fleet as a table, one runner a line, by deployment then URL; heartbeat age in
    seconds."""
    rows = [FLEET_COLUMNS]
    for entry in sorted(entries, key=lambda e: (e.deployment, e.url)):
        rows.append(
            (
                entry.id,
                entry.deployment,
                entry.url,
                entry.state.value,
                str(entry.concurrency),
                entry.hardware,
                f"{entry.age(now):.1f}s ago",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(FLEET_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


async def fleet(redis: Redis) -> str:
    """``conduit admin fleet``: every runner the fleet registry knows, now."""
    entries = await read_fleet(redis)
    if not entries:
        return "no runners in the fleet"
    return format_fleet(entries.values(), time.time())


async def create_model(
    engine: AsyncEngine,
    name: str,
    runner_url: str,
    shards: int = DEFAULT_SHARDS,
    visibility: str | None = None,
    runner_token: str | None = None,
) -> str:
    """Register the runner's model as ``OWNER/NAME``. A missing owner account is created (it
    has no token until ``create-account OWNER``): said on stderr, so a mistyped owner shows."""
    owner, short = split_name(name)
    chosen = _visibility(visibility)
    schema, cog_version = read_runner_schema(runner_url, runner_token)
    async with engine.begin() as conn:
        created = await catalog_admin.ensure_account(conn, owner)
    if created:
        _note_new_owner(owner)
    return await catalog_admin.create_version(
        engine, owner, short, schema, cog_version, shards, visibility=chosen
    )


async def create_deployment(
    engine: AsyncEngine,
    name: str,
    model: str,
    version: str | None,
    shards: int,
    prediction_timeout: float,
    max_attempts: int = 1,
    priority: str = Priority.NORMAL,
    visibility: str | None = None,
    grants: str = "",
    allow_high_priority: bool | None = None,
) -> catalog.DeploymentInfo:
    """Create a deployment (private unless ``visibility`` says public) or release a new
    configuration of one; ``grants`` (``acct1,acct2``) may use it. The owner account is
    created when missing, as for models; granted accounts must exist."""
    owner, short = split_name(name)
    model_owner, model_name = split_name(model)
    if priority not in tuple(Priority):
        raise SystemExit(f"priority must be one of {', '.join(Priority)}, got {priority!r}")
    chosen = _visibility(visibility)
    granted = _names(grants)
    for account in granted:
        if await catalog.get_account(engine, account) is None:
            raise SystemExit(f"account {account} does not exist")
    existed = await catalog.get_account(engine, owner) is not None
    try:
        deployment = await catalog_admin.create_deployment(
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
            visibility=chosen,
            allow_high_priority=allow_high_priority,
        )
        for account in granted:
            await catalog_admin.grant(engine, account, "deployment", owner, short)
    except LookupError as error:
        raise SystemExit(str(error)) from error
    if not existed:
        _note_new_owner(owner)
    return deployment


async def grant(engine: AsyncEngine, accounts: str, kind: catalog.Kind, name: str) -> list[str]:
    """Let each of ``accounts`` (``acct1,acct2``) use the private model or deployment."""
    owner, short = split_name(name)
    said = []
    for account in _names(accounts, required=True):
        try:
            new = await catalog_admin.grant(engine, account, kind, owner, short)
        except LookupError as error:
            raise SystemExit(str(error)) from error
        said.append(f"{account} {'granted' if new else 'already granted'} {kind} {name}")
    return said


async def revoke(engine: AsyncEngine, accounts: str, kind: catalog.Kind, name: str) -> list[str]:
    """Withdraw grants. An account still sees a public one, or one it owns."""
    owner, short = split_name(name)
    said = []
    for account in _names(accounts, required=True):
        try:
            had = await catalog_admin.revoke(engine, account, kind, owner, short)
        except LookupError as error:
            raise SystemExit(str(error)) from error
        said.append(f"{account} {'revoked from' if had else 'had no grant on'} {kind} {name}")
    return said


async def set_visibility(
    engine: AsyncEngine, kind: catalog.Kind, name: str, visibility: str
) -> str:
    owner, short = split_name(name)
    chosen = _visibility(visibility)
    assert chosen is not None
    try:
        await catalog_admin.set_visibility(engine, kind, owner, short, chosen)
    except LookupError as error:
        raise SystemExit(str(error)) from error
    return f"{kind} {name} is {chosen}"


async def entitle_priority(
    engine: AsyncEngine, account: str | None, deployment: str | None, allowed: bool
) -> str:
    """Whether ``X-Priority: high`` is honoured from an account, or on a deployment for every
    account that may use it. Without it, ``high`` runs at the deployment's priority."""
    try:
        if deployment is not None:
            owner, short = split_name(deployment)
            await catalog_admin.entitle_deployment_priority(engine, owner, short, allowed)
            subject = f"deployment {deployment}"
        elif account is not None:
            await catalog_admin.entitle_account_priority(engine, account, allowed)
            subject = f"account {account}"
        else:
            raise SystemExit("name an account or a --deployment")
    except LookupError as error:
        raise SystemExit(str(error)) from error
    return f"{subject}: X-Priority: high is {'honoured' if allowed else 'not honoured'}"


def parse_metadata(text: str | None) -> dict[str, Any]:
    """``--metadata``: a JSON object (none: ``{}``)."""
    if not text:
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise SystemExit(f"--metadata must be JSON: {error}") from None
    if not isinstance(value, dict):
        raise SystemExit("--metadata must be a JSON object")
    return value


async def create_block(
    engine: AsyncEngine,
    deployment: str | None,
    version: str | None = None,
    metadata: dict[str, Any] | None = None,
    synchronous: bool = False,
    block_id: str | None = None,
) -> str:
    """Publish deployment ``OWNER/NAME`` (or model version ``version``) as a block of the
    deployment's (the model's) owner; its id (``block_id`` when given). ``synchronous``: run
    on the ``/run`` lane."""
    if (deployment is None) == (version is None):
        raise SystemExit("create-block: name a deployment or a --version, not both")
    if deployment is not None:
        owner, short = split_name(deployment)
        found = await catalog.get_deployment(engine, owner, short)
        if found is None:
            raise SystemExit(f"deployment {deployment} does not exist")
        named: dict[str, Any] = {"deployment_id": found.id}
    else:
        assert version is not None
        info = await catalog.get_version(engine, version)
        if info is None:
            raise SystemExit(f"version {version} does not exist")
        owner = info.model.partition("/")[0]
        named = {"version_id": info.id}
    account = await catalog.get_account(engine, owner)
    if account is None:  # an owner is an account (the database says so); named for clarity
        raise SystemExit(f"account {owner} does not exist")
    try:
        block = await blocks.create(
            engine,
            account.id,
            metadata=metadata,
            synchronous=synchronous,
            block_id=block_id,
            **named,
        )
    except ValueError as error:
        raise SystemExit(f"create-block: {error}") from None
    return block.id


BLOCK_COLUMNS = ("ID", "OWNER", "RUNS", "MODEL", "SYNCHRONOUS", "METADATA")


def format_blocks(found: Iterable[blocks.BlockInfo]) -> str:
    """Blocks as a table, one a line, newest first; RUNS is the deployment or the version."""
    rows = [BLOCK_COLUMNS]
    for block in found:
        runs = block.deployment or f"version {block.version_id}"
        sync = "yes" if block.synchronous else "no"
        metadata = orjson.dumps(block.metadata).decode()
        rows.append((block.id, block.owner, runs, block.model, sync, metadata))
    widths = [max(len(row[i]) for row in rows) for i in range(len(BLOCK_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


async def list_blocks(engine: AsyncEngine, limit: int = 1000) -> str:
    """``conduit admin list-blocks``: the newest ``limit`` blocks of every account."""
    found = await blocks.list_blocks(engine, None, limit=limit)
    return format_blocks(found) if found else "no blocks"


async def delete_block(engine: AsyncEngine, block_id: str) -> str:
    if not await blocks.delete_block(engine, block_id):
        raise SystemExit(f"block {block_id} does not exist")
    return f"deleted block {block_id}"


def _visibility(value: str | None) -> catalog.Visibility | None:
    if value is None:
        return None
    try:
        return catalog.Visibility(value)
    except ValueError:
        allowed = ", ".join(catalog.Visibility)
        raise SystemExit(f"visibility must be one of {allowed}, got {value!r}") from None


def _names(value: str, required: bool = False) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    if required and not names:
        raise SystemExit("expected ACCOUNT[,ACCOUNT...]")
    return names


def _note_new_owner(owner: str) -> None:
    print(
        f"created account {owner} to own it (no token: `conduit admin create-account {owner}`"
        " gives it one)",
        file=sys.stderr,
    )
