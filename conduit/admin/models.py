"""``conduit admin create-model``, ``list-models``, ``show-model``, ``delete-model``: models,
each version registered from what its runner serves."""

from __future__ import annotations

import argparse
import os
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import lookups, models, rules, versions, writes
from catalog.records import ModelInfo
from conduit.admin.collection import Collection
from conduit.admin.names import VISIBILITIES, note_new_owner, split_name
from conduit.admin.names import visibility as parse_visibility
from conduit.admin.running import OPERATOR, with_engine
from conduit.admin.tables import when
from protocol.headers import bearer
from tracker.keys import DEFAULT_SHARDS


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


async def create_model(
    engine: AsyncEngine,
    name: str,
    runner_url: str,
    shards: int = DEFAULT_SHARDS,
    visibility: str | None = None,
    runner_token: str | None = None,
) -> str:
    """Register the runner's model as ``OWNER/NAME`` (a new model's name follows the rules
    the API's follow). A missing owner account is created (it has no token until
    ``create-account OWNER``): said on stderr, so a mistyped owner shows."""
    owner, short = split_name(name)
    chosen = parse_visibility(visibility)
    schema, cog_version = read_runner_schema(runner_url, runner_token)
    existed = await lookups.get_account(engine, owner) is not None
    try:
        version = await writes.create_version(
            engine, owner, short, schema, cog_version, shards, visibility=chosen
        )
    except (LookupError, rules.Refused, rules.NotOwner) as error:
        raise SystemExit(f"create-model: {error}") from None
    if not existed:
        note_new_owner(owner)
    return version


MODEL_COLUMNS = ("MODEL", "VISIBILITY", "LATEST VERSION", "HARDWARE", "CREATED")


def _row(model: ModelInfo) -> tuple[str, ...]:
    latest = model.latest_version_id or "-"
    name = f"{model.owner}/{model.name}"
    return (name, model.visibility, latest, model.hardware or "-", when(model.created_at))


async def _model(engine: AsyncEngine, name: str) -> ModelInfo:
    owner, short = split_name(name)
    found = await lookups.get_model(engine, owner, short)
    if found is None:
        raise SystemExit(f"model {name} does not exist")
    return found


async def show_model(engine: AsyncEngine, name: str) -> dict[str, Any]:
    """The model's row and its versions, newest first."""
    model = await _model(engine, name)
    return {"model": model, "versions": await lookups.list_versions(engine, model.id)}


async def delete_model(engine: AsyncEngine, name: str, with_versions: bool) -> str:
    """Delete the model; ``with_versions``: its versions first (each refused while a
    deployment runs it)."""
    model = await _model(engine, name)
    try:
        if with_versions:
            for version in await lookups.list_versions(engine, model.id):
                await versions.delete_version(engine, model, version, OPERATOR)
        await models.delete_model(engine, model, OPERATOR)
    except (LookupError, rules.Refused, rules.InUse, rules.NotOwner) as error:
        raise SystemExit(f"delete-model: {error}") from None
    return f"deleted model {name}"


MODELS: Collection[ModelInfo] = Collection(
    noun="model",
    metavar="OWNER/NAME",
    columns=MODEL_COLUMNS,
    row=_row,
    read_all=lambda engine, args: lookups.list_models(engine, OPERATOR, limit=args.limit),
    read_one=lambda engine, args: show_model(engine, args.name),
    delete=lambda engine, args: delete_model(engine, args.name, args.with_versions),
)


def cmd_create_model(args: argparse.Namespace) -> None:
    print(
        with_engine(
            lambda engine: create_model(
                engine,
                args.name,
                args.runner_url,
                visibility=args.visibility,
                runner_token=args.runner_token or os.environ.get("CONDUIT_RUNNER_TOKEN") or None,
            ),
            catalog_change=True,
        )
    )


def add_models(admin_sub: Any) -> None:
    model = admin_sub.add_parser("create-model", help="register a model version from a runner")
    model.add_argument("name", metavar="OWNER/NAME")
    model.add_argument("--runner-url", required=True)
    model.add_argument(
        "--runner-token",
        help="the runner's CONDUIT_RUNNER_TOKEN (default: that variable; prefer it to the flag, "
        "which other users of the machine can read in the process list)",
    )
    model.add_argument(
        "--visibility",
        choices=VISIBILITIES,
        help="public (default for a new model) or private; unchanged when omitted on an existing",
    )
    model.set_defaults(func=cmd_create_model)
    deleted = MODELS.add(
        admin_sub,
        list_help="list every account's models",
        show_help="print a model and its versions as JSON",
        delete_help="delete a model (refused while it has versions or deployments)",
    )
    deleted.add_argument(
        "--with-versions",
        action="store_true",
        help="delete its versions first (each refused while a deployment runs it)",
    )
