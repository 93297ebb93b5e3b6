"""``conduit admin create-block``, ``list-blocks``, ``show-block``, ``delete-block``:
deployments and model versions published as blocks for the inference gateway."""

from __future__ import annotations

import argparse
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from blocks import blocks
from catalog import lookups
from conduit.admin.collection import Collection
from conduit.admin.names import split_name
from conduit.admin.running import with_engine


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
        found = await lookups.get_deployment(engine, owner, short)
        if found is None:
            raise SystemExit(f"deployment {deployment} does not exist")
        named: dict[str, Any] = {"deployment_id": found.id}
    else:
        assert version is not None
        info = await lookups.get_version(engine, version)
        if info is None:
            raise SystemExit(f"version {version} does not exist")
        owner = info.model.partition("/")[0]
        named = {"version_id": info.id}
    account = await lookups.get_account(engine, owner)
    if account is None:  # an owner is an account (the database says so); named for clarity
        raise SystemExit(f"account {owner} does not exist")
    try:
        block = await blocks.create(
            engine,
            metadata=metadata,
            synchronous=synchronous,
            block_id=block_id,
            **named,
        )
    except ValueError as error:
        raise SystemExit(f"create-block: {error}") from None
    return block.id


BLOCK_COLUMNS = ("ID", "OWNER", "RUNS", "MODEL", "SYNCHRONOUS", "METADATA")


def _row(block: blocks.BlockInfo) -> tuple[str, ...]:
    """RUNS is the deployment or the version."""
    return (
        block.id,
        block.owner,
        block.deployment or f"version {block.version_id}",
        block.model,
        "yes" if block.synchronous else "no",
        orjson.dumps(block.metadata).decode(),
    )


async def show_block(engine: AsyncEngine, block_id: str) -> blocks.BlockInfo:
    found = await blocks.get(engine, block_id)
    if found is None:
        raise SystemExit(f"block {block_id} does not exist")
    return found


async def delete_block(engine: AsyncEngine, block_id: str) -> str:
    if not await blocks.delete_block(engine, block_id):
        raise SystemExit(f"block {block_id} does not exist")
    return f"deleted block {block_id}"


def cmd_create_block(args: argparse.Namespace) -> None:
    metadata = parse_metadata(args.metadata)
    print(
        with_engine(
            lambda engine: create_block(
                engine, args.deployment, args.version, metadata, args.synchronous, args.id
            )
        )
    )


BLOCKS: Collection[blocks.BlockInfo] = Collection(
    noun="block",
    metavar="BLOCK_ID",
    columns=BLOCK_COLUMNS,
    row=_row,
    read_all=lambda engine, args: blocks.list_blocks(engine, None, limit=args.limit),
    read_one=lambda engine, args: show_block(engine, args.name),
    delete=lambda engine, args: delete_block(engine, args.name),
    catalog_change=False,
)


def add_blocks(admin_sub: Any) -> None:
    block = admin_sub.add_parser(
        "create-block", help="publish a deployment (or a model version) as a block; prints its id"
    )
    block.add_argument("deployment", nargs="?", metavar="OWNER/DEPLOYMENT")
    block.add_argument("--version", help="publish this model version instead of a deployment")
    block.add_argument(
        "--metadata", metavar="JSON", help="a JSON object describing it, what search filters on"
    )
    block.add_argument(
        "--synchronous", action="store_true", help="run it on the synchronous lane (/run)"
    )
    block.add_argument("--id", help="the block's id (blk- and 4 to 12 lowercase letters or digits)")
    block.set_defaults(func=cmd_create_block)
    BLOCKS.add(
        admin_sub,
        list_help="list the blocks of every account",
        show_help="print a block as JSON",
        delete_help="delete a block",
    )
