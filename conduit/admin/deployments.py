"""``conduit admin create-deployment``, ``list-deployments``, ``show-deployment``,
``delete-deployment`` and ``scaler``: deployments and their KEDA scaler."""

from __future__ import annotations

import argparse
from collections.abc import Collection as Names
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import deployments, lookups, records, rules, writes
from catalog.records import DeploymentInfo
from conduit.admin.collection import Collection
from conduit.admin.names import (
    VISIBILITIES,
    account_names,
    note_new_owner,
    split_name,
)
from conduit.admin.names import visibility as parse_visibility
from conduit.admin.running import OPERATOR, with_engine, with_redis
from conduit.admin.tables import when
from tracker.keys import DEFAULT_SHARDS
from tracker.priority import Priority


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
    hardware: str | None = None,
    known_hardware: Names[str] = (),
) -> records.DeploymentInfo:
    """Create a deployment (private unless ``visibility`` says public) or release a new
    configuration of one; ``grants`` (``acct1,acct2``) may use it. The rules are those of
    the API (:mod:`catalog.deployments`), the operator acting for the owner: a new
    deployment's name, a ``hardware`` the fleet has (``known_hardware``), a version of the
    model. The owner account is created when missing, as for models; granted accounts must
    exist."""
    owner, short = split_name(name)
    model_owner, model_name = split_name(model)
    if priority not in tuple(Priority):
        raise SystemExit(f"priority must be one of {', '.join(Priority)}, got {priority!r}")
    chosen = parse_visibility(visibility)
    granted = account_names(grants)
    for account in granted:
        if await lookups.get_account(engine, account) is None:
            raise SystemExit(f"account {account} does not exist")
    existed = await lookups.get_account(engine, owner) is not None
    try:
        deployment = await writes.create_deployment(
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
            hardware=hardware,
            known_hardware=known_hardware,
        )
        for account in granted:
            await writes.grant(engine, account, "deployment", owner, short)
    except (LookupError, rules.Refused, rules.InUse, rules.NotOwner) as error:
        raise SystemExit(f"create-deployment: {error}") from error
    if not existed:
        note_new_owner(owner)
    return deployment


DEPLOYMENT_COLUMNS = ("DEPLOYMENT", "MODEL", "RELEASE", "VERSION", "VISIBILITY", "CREATED")


def _row(deployment: DeploymentInfo) -> tuple[str, ...]:
    return (
        deployment.full_name,
        deployment.model,
        str(deployment.release_number),
        deployment.version_id,
        deployment.visibility + (" (withdrawn)" if deployment.withdrawn else ""),
        when(deployment.created_at),
    )


async def show_deployment(engine: AsyncEngine, name: str) -> DeploymentInfo:
    owner, short = split_name(name)
    found = await lookups.get_deployment(engine, owner, short)
    if found is None:
        raise SystemExit(f"deployment {name} does not exist")
    return found


async def delete_deployment(engine: AsyncEngine, name: str) -> str:
    deployment = await show_deployment(engine, name)
    try:
        await deployments.delete_deployment(engine, deployment, OPERATOR)
    except (LookupError, rules.Refused, rules.InUse, rules.NotOwner) as error:
        raise SystemExit(f"delete-deployment: {error}") from None
    return f"deleted deployment {name}"


DEPLOYMENTS: Collection[DeploymentInfo] = Collection(
    noun="deployment",
    metavar="OWNER/NAME",
    columns=DEPLOYMENT_COLUMNS,
    row=_row,
    read_all=lambda engine, args: lookups.list_deployments(engine, OPERATOR, limit=args.limit),
    read_one=lambda engine, args: show_deployment(engine, args.name),
    delete=lambda engine, args: delete_deployment(engine, args.name),
)


def cmd_create_deployment(args: argparse.Namespace) -> None:
    from api.routes.hardware import fleet_classes

    known: Names[str] = with_redis(fleet_classes) if args.hardware is not None else ()
    deployment = with_engine(
        lambda engine: create_deployment(
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
            hardware=args.hardware,
            known_hardware=known,
        ),
        catalog_change=True,
    )
    print(f"{deployment.full_name} release {deployment.release_number}: {deployment.version_id}")


def cmd_scaler(args: argparse.Namespace) -> None:
    import yaml

    from conduit.scaler import scaled_object

    owner, name = split_name(args.deployment)

    async def read(engine: Any) -> tuple[records.DeploymentInfo, int]:
        deployment = await lookups.get_deployment(engine, owner, name)
        if deployment is None:
            raise SystemExit(f"conduit: deployment {args.deployment} does not exist")
        version = await lookups.get_version(engine, deployment.version_id)
        return deployment, version.shards if version is not None else deployment.shards

    deployment, version_shards = with_engine(read)
    manifest = scaled_object(
        deployment, version_shards, target=args.target, concurrency=args.concurrency
    )
    print(yaml.safe_dump(manifest, sort_keys=False), end="")


def add_deployments(admin_sub: Any) -> None:
    deployment = admin_sub.add_parser(
        "create-deployment",
        help="create a deployment or release a new configuration of one, by the API's rules "
        "for its name, hardware and version",
    )
    deployment.add_argument("name", metavar="OWNER/NAME")
    deployment.add_argument("--model", required=True, metavar="OWNER/NAME")
    deployment.add_argument("--version", help="version id (default: the model's latest)")
    deployment.add_argument(
        "--hardware",
        help="a hardware class of the fleet (conduit admin fleet); unchanged when omitted",
    )
    deployment.add_argument(
        "--shards",
        type=int,
        default=DEFAULT_SHARDS,
        help="its queue's shard streams (see move-shards)",
    )
    deployment.add_argument("--prediction-timeout", type=float, default=1800.0, help="seconds")
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
        help="X-Priority sent to the runner unless a request sets its own",
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
    DEPLOYMENTS.add(
        admin_sub,
        list_help="list every account's deployments",
        show_help="print a deployment as JSON",
        delete_help="delete a deployment (refused while it is a block or runs predictions)",
    )
    scaler = admin_sub.add_parser(
        "scaler",
        help="print a deployment's KEDA ScaledObject (min/max instances as its releases set "
        "them), for kubectl apply -f -",
    )
    scaler.add_argument("deployment", metavar="OWNER/NAME")
    scaler.add_argument(
        "--target", default="conduit-director", help="the Deployment of its directors"
    )
    scaler.add_argument("--concurrency", type=int, default=4, help="each director's --concurrency")
    scaler.set_defaults(func=cmd_scaler)
