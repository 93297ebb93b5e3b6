"""``conduit admin``: accounts, models, deployments, who may use them, blocks, the fleet, op
tokens.

The parser of the subcommand and the commands themselves; each opens what it needs (the
database, Redis), does one thing through :mod:`conduit.admin` and prints the answer.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from conduit.cli import database_url, run_async
from conduit.shards_cli import add_shards
from tracker.keys import DEFAULT_SHARDS
from tracker.priority import Priority

T = TypeVar("T")


def _with_engine(work: Callable[[Any], Awaitable[T]], *, catalog_change: bool = False) -> T:
    """Run ``work`` on the database; with ``catalog_change``, then tell every process's
    catalogue cache (over Redis) that what they cached changed."""
    from tracker.db import make_engine

    async def main() -> T:
        engine = make_engine(database_url(), pool_size=2)
        try:
            done = await work(engine)
        finally:
            await engine.dispose()
        if catalog_change:
            await _announce_catalog_change()
        return done

    return run_async(main())


async def _announce_catalog_change() -> None:
    from api.settings import ApiSettings
    from tracker.catalog_generation import CatalogGeneration
    from tracker.redis_connect import connect

    redis = connect(ApiSettings().redis_url)
    try:
        await CatalogGeneration(redis).bump()
    finally:
        await redis.aclose()


def cmd_create_account(args: argparse.Namespace) -> None:
    from conduit import admin

    made_admin = True if args.admin else None
    print(_with_engine(lambda engine: admin.create_account(engine, args.name, made_admin)))


def cmd_set_admin(args: argparse.Namespace) -> None:
    from conduit import admin

    print(_with_engine(lambda engine: admin.set_admin(engine, args.account, not args.withdraw)))


def cmd_ops_viewer(args: argparse.Namespace) -> None:
    from conduit import admin

    print(_with_engine(lambda engine: admin.set_ops_role(engine, args.account, args.withdraw)))


def cmd_fleet(args: argparse.Namespace) -> None:
    from api.settings import ApiSettings
    from conduit import admin
    from tracker.redis_connect import connect

    async def main() -> str:
        redis = connect(ApiSettings().redis_url)
        try:
            return await admin.fleet(redis)
        finally:
            await redis.aclose()

    print(run_async(main()))


def cmd_create_model(args: argparse.Namespace) -> None:
    from conduit import admin

    print(
        _with_engine(
            lambda engine: admin.create_model(
                engine,
                args.name,
                args.runner_url,
                visibility=args.visibility,
                runner_token=args.runner_token or os.environ.get("CONDUIT_RUNNER_TOKEN") or None,
            ),
            catalog_change=True,
        )
    )


def cmd_create_deployment(args: argparse.Namespace) -> None:
    from conduit import admin

    deployment = _with_engine(
        lambda engine: admin.create_deployment(
            engine,
            args.name,
            args.model,
            args.version,
            args.shards,
            args.prediction_timeout,
            args.max_attempts,
            args.priority,
            visibility=args.visibility,
            grants=args.grant,
            allow_high_priority=args.allow_high_priority,
        ),
        catalog_change=True,
    )
    print(f"{deployment.full_name} release {deployment.release_number}: {deployment.version_id}")


def cmd_scaler(args: argparse.Namespace) -> None:
    import yaml

    from conduit.scaler import scaled_object
    from tracker import catalog

    owner, _, name = args.deployment.partition("/")

    async def read(engine: Any) -> tuple[catalog.DeploymentInfo, int]:
        deployment = await catalog.get_deployment(engine, owner, name)
        if deployment is None:
            raise SystemExit(f"conduit: deployment {args.deployment} does not exist")
        version = await catalog.get_version(engine, deployment.version_id)
        return deployment, version.shards if version is not None else deployment.shards

    deployment, version_shards = _with_engine(read)
    manifest = scaled_object(
        deployment, version_shards, target=args.target, concurrency=args.concurrency
    )
    print(yaml.safe_dump(manifest, sort_keys=False), end="")


def _kind(args: argparse.Namespace) -> tuple[Literal["model", "deployment"], str]:
    """(kind, OWNER/NAME) from a --model / --deployment pair of options."""
    return ("model", args.model) if args.model else ("deployment", args.deployment)


def cmd_grant(args: argparse.Namespace) -> None:
    from conduit import admin

    kind, name = _kind(args)
    print(
        "\n".join(
            _with_engine(
                lambda engine: admin.grant(engine, args.accounts, kind, name), catalog_change=True
            )
        )
    )


def cmd_revoke(args: argparse.Namespace) -> None:
    from conduit import admin

    kind, name = _kind(args)
    print(
        "\n".join(
            _with_engine(
                lambda engine: admin.revoke(engine, args.accounts, kind, name), catalog_change=True
            )
        )
    )


def cmd_set_visibility(args: argparse.Namespace) -> None:
    from conduit import admin

    kind, name = _kind(args)
    print(
        _with_engine(
            lambda engine: admin.set_visibility(engine, kind, name, args.visibility),
            catalog_change=True,
        )
    )


def cmd_entitle_priority(args: argparse.Namespace) -> None:
    from conduit import admin

    if (args.account is None) == (args.deployment is None):
        raise SystemExit("entitle-priority: name an ACCOUNT or a --deployment, not both")
    print(
        _with_engine(
            lambda engine: admin.entitle_priority(
                engine, args.account, args.deployment, not args.withdraw
            ),
            catalog_change=True,
        )
    )


def cmd_create_block(args: argparse.Namespace) -> None:
    from conduit import admin

    metadata = admin.parse_metadata(args.metadata)
    print(
        _with_engine(
            lambda engine: admin.create_block(
                engine, args.deployment, args.version, metadata, args.synchronous, args.id
            )
        )
    )


def cmd_list_blocks(args: argparse.Namespace) -> None:
    from conduit import admin

    print(_with_engine(lambda engine: admin.list_blocks(engine, args.limit)))


def cmd_delete_block(args: argparse.Namespace) -> None:
    from conduit import admin

    print(_with_engine(lambda engine: admin.delete_block(engine, args.block_id)))


def cmd_op_token(args: argparse.Namespace) -> None:
    from runners.optokens import issue, read_key

    signers = [name.strip() for name in args.signers.split(",") if name.strip()]
    key = read_key(args.key_file)
    print(issue(key, args.operation, args.model, signers, runner_id=args.runner))


VISIBILITIES = ["public", "private"]


def _target(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", metavar="OWNER/NAME")
    which.add_argument("--deployment", metavar="OWNER/NAME")


def _add_sharing(admin_sub: Any) -> None:
    """Who may use private models and deployments, and who may ask for high priority."""
    grant = admin_sub.add_parser("grant", help="let accounts use a private model or deployment")
    grant.add_argument("accounts", metavar="ACCOUNT[,ACCOUNT...]")
    _target(grant)
    grant.set_defaults(func=cmd_grant)
    revoke = admin_sub.add_parser("revoke", help="withdraw grants")
    revoke.add_argument("accounts", metavar="ACCOUNT[,ACCOUNT...]")
    _target(revoke)
    revoke.set_defaults(func=cmd_revoke)
    visibility = admin_sub.add_parser(
        "set-visibility", help="make a model or deployment public or private"
    )
    _target(visibility)
    visibility.add_argument("visibility", choices=VISIBILITIES)
    visibility.set_defaults(func=cmd_set_visibility)
    entitle = admin_sub.add_parser(
        "entitle-priority", help="honour X-Priority: high from an account or on a deployment"
    )
    entitle.add_argument("account", nargs="?", metavar="ACCOUNT")
    entitle.add_argument("--deployment", metavar="OWNER/NAME")
    entitle.add_argument("--withdraw", action="store_true", help="stop honouring it")
    entitle.set_defaults(func=cmd_entitle_priority)


def _add_blocks(admin_sub: Any) -> None:
    """Deployments and model versions published as blocks for the inference gateway."""
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
    listed = admin_sub.add_parser("list-blocks", help="list the blocks of every account")
    listed.add_argument("--limit", type=int, default=1000, help="newest N (default 1000)")
    listed.set_defaults(func=cmd_list_blocks)
    deleted = admin_sub.add_parser("delete-block", help="delete a block")
    deleted.add_argument("block_id", metavar="BLOCK_ID")
    deleted.set_defaults(func=cmd_delete_block)


def add_admin(sub: Any) -> None:
    """``conduit admin ...``: the subcommands, each with its function as ``func``."""
    admin = sub.add_parser(
        "admin", help="manage accounts, models, deployments and who may use them"
    )
    admin_sub = admin.add_subparsers(dest="admin_command", required=True)
    account = admin_sub.add_parser("create-account", help="create an account; prints a token")
    account.add_argument("name")
    account.add_argument(
        "--admin", action="store_true", help="make it an admin (it may read GET /v1/fleet)"
    )
    account.set_defaults(func=cmd_create_account)
    set_admin = admin_sub.add_parser(
        "set-admin", help="make an account an admin (it may read GET /v1/fleet)"
    )
    set_admin.add_argument("account", metavar="ACCOUNT")
    set_admin.add_argument("--withdraw", action="store_true", help="make it an admin no more")
    set_admin.set_defaults(func=cmd_set_admin)
    viewer = admin_sub.add_parser(
        "ops-viewer", help="let an account look at the operator page (/ops), read-only"
    )
    viewer.add_argument("account", metavar="ACCOUNT")
    viewer.add_argument("--withdraw", action="store_true", help="let it look no more")
    viewer.set_defaults(func=cmd_ops_viewer)
    fleet = admin_sub.add_parser(
        "fleet", help="list the runners of the fleet (REDIS_URL), with state and heartbeat age"
    )
    fleet.set_defaults(func=cmd_fleet)
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
    deployment = admin_sub.add_parser("create-deployment", help="create or update a deployment")
    deployment.add_argument("name", metavar="OWNER/NAME")
    deployment.add_argument("--model", required=True, metavar="OWNER/NAME")
    deployment.add_argument("--version", help="version id (default: the model's latest)")
    deployment.add_argument(
        "--shards",
        type=int,
        default=DEFAULT_SHARDS,
        help=f"its queue's shard streams (default {DEFAULT_SHARDS}; see move-shards)",
    )
    deployment.add_argument(
        "--prediction-timeout", type=float, default=1800.0, help="seconds (default 30 min)"
    )
    deployment.add_argument(
        "--max-attempts",
        type=int,
        default=1,
        help="runs a prediction may start; >1 re-runs one interrupted by a director's death",
    )
    deployment.add_argument(
        "--priority",
        choices=[p.value for p in Priority],
        default=Priority.NORMAL.value,
        help="X-Priority sent to the runner unless a request sets its own (default normal)",
    )
    deployment.add_argument(
        "--visibility",
        choices=VISIBILITIES,
        help="private (default for a new deployment) or public; unchanged when omitted on an "
        "existing one",
    )
    deployment.add_argument(
        "--grant",
        default="",
        metavar="ACCOUNT,ACCOUNT",
        help="accounts that may use it besides its owner (existing grants are kept)",
    )
    deployment.add_argument(
        "--allow-high-priority",
        action=argparse.BooleanOptionalAction,
        help="honour X-Priority: high from every account that may use it (unchanged if omitted)",
    )
    deployment.set_defaults(func=cmd_create_deployment)
    scaler = admin_sub.add_parser(
        "scaler",
        help="print a deployment's KEDA ScaledObject (min/max instances as its releases set "
        "them), for kubectl apply -f -",
    )
    scaler.add_argument("deployment", metavar="OWNER/NAME")
    scaler.add_argument(
        "--target", default="conduit-director", help="the Deployment of its directors"
    )
    scaler.add_argument(
        "--concurrency", type=int, default=4, help="each director's --concurrency (default 4)"
    )
    scaler.set_defaults(func=cmd_scaler)
    _add_sharing(admin_sub)
    add_shards(admin_sub)
    _add_blocks(admin_sub)
    op_token = admin_sub.add_parser(
        "op-token", help="mint a signed token for one runner lifecycle call"
    )
    op_token.add_argument(
        "--operation", required=True, choices=["model-load", "model-unload", "cache-flush"]
    )
    op_token.add_argument("--model", help="model id (omit for calls that name no model)")
    op_token.add_argument("--signers", required=True, metavar="NAME,NAME")
    op_token.add_argument("--key-file", required=True, help="the runner's op-token key")
    op_token.add_argument(
        "--runner",
        metavar="RUNNER_ID",
        help="accepted only by this runner (its runnerId in /v1/capabilities, CONDUIT_RUNNER_ID)",
    )
    op_token.set_defaults(func=cmd_op_token)
