"""``conduit admin grant``, ``revoke``, ``set-visibility``, ``entitle-priority``: who may use
private models and deployments, and who may ask for high priority."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import records, writes
from conduit.admin.names import VISIBILITIES, account_names, split_name
from conduit.admin.names import visibility as parse_visibility
from conduit.admin.running import with_engine


async def grant(engine: AsyncEngine, accounts: str, kind: records.Kind, name: str) -> list[str]:
    """Let each of ``accounts`` (``acct1,acct2``) use the private model or deployment."""
    owner, short = split_name(name)

    def said(account: str, new: bool) -> str:
        return f"{account} {'granted' if new else 'already granted'} {kind} {name}"

    return await _each_account(
        accounts, lambda account: writes.grant(engine, account, kind, owner, short), said
    )


async def revoke(engine: AsyncEngine, accounts: str, kind: records.Kind, name: str) -> list[str]:
    """Withdraw grants. An account still sees a public one, or one it owns."""
    owner, short = split_name(name)

    def said(account: str, had: bool) -> str:
        return f"{account} {'revoked from' if had else 'had no grant on'} {kind} {name}"

    return await _each_account(
        accounts, lambda account: writes.revoke(engine, account, kind, owner, short), said
    )


async def _each_account(
    accounts: str, change: Callable[[str], Awaitable[bool]], said: Callable[[str, bool], str]
) -> list[str]:
    """``change`` each of ``accounts``; a line per account of what ``said`` makes of it."""
    lines = []
    for account in account_names(accounts, required=True):
        try:
            changed = await change(account)
        except LookupError as error:
            raise SystemExit(str(error)) from error
        lines.append(said(account, changed))
    return lines


async def set_visibility(
    engine: AsyncEngine, kind: records.Kind, name: str, visibility: str
) -> str:
    owner, short = split_name(name)
    chosen = parse_visibility(visibility)
    assert chosen is not None
    try:
        await writes.set_visibility(engine, kind, owner, short, chosen)
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
            await writes.entitle_deployment_priority(engine, owner, short, allowed)
            subject = f"deployment {deployment}"
        elif account is not None:
            await writes.entitle_account_priority(engine, account, allowed)
            subject = f"account {account}"
        else:
            raise SystemExit("name an account or a --deployment")
    except LookupError as error:
        raise SystemExit(str(error)) from error
    return f"{subject}: X-Priority: high is {'honoured' if allowed else 'not honoured'}"


def _kind(args: argparse.Namespace) -> tuple[Literal["model", "deployment"], str]:
    """(kind, OWNER/NAME) from a --model / --deployment pair of options."""
    return ("model", args.model) if args.model else ("deployment", args.deployment)


def cmd_grant(args: argparse.Namespace) -> None:
    kind, name = _kind(args)
    said = with_engine(lambda engine: grant(engine, args.accounts, kind, name), catalog_change=True)
    print("\n".join(said))


def cmd_revoke(args: argparse.Namespace) -> None:
    kind, name = _kind(args)
    said = with_engine(
        lambda engine: revoke(engine, args.accounts, kind, name), catalog_change=True
    )
    print("\n".join(said))


def cmd_set_visibility(args: argparse.Namespace) -> None:
    kind, name = _kind(args)
    print(
        with_engine(
            lambda engine: set_visibility(engine, kind, name, args.visibility),
            catalog_change=True,
        )
    )


def cmd_entitle_priority(args: argparse.Namespace) -> None:
    if (args.account is None) == (args.deployment is None):
        raise SystemExit("entitle-priority: name an ACCOUNT or a --deployment, not both")
    print(
        with_engine(
            lambda engine: entitle_priority(
                engine, args.account, args.deployment, not args.withdraw
            ),
            catalog_change=True,
        )
    )


def _target(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", metavar="OWNER/NAME")
    which.add_argument("--deployment", metavar="OWNER/NAME")


def add_sharing(admin_sub: Any) -> None:
    granted = admin_sub.add_parser("grant", help="let accounts use a private model or deployment")
    granted.add_argument("accounts", metavar="ACCOUNT[,ACCOUNT...]")
    _target(granted)
    granted.set_defaults(func=cmd_grant)
    revoked = admin_sub.add_parser("revoke", help="withdraw grants")
    revoked.add_argument("accounts", metavar="ACCOUNT[,ACCOUNT...]")
    _target(revoked)
    revoked.set_defaults(func=cmd_revoke)
    visible = admin_sub.add_parser(
        "set-visibility", help="make a model or deployment public or private"
    )
    _target(visible)
    visible.add_argument("visibility", choices=VISIBILITIES)
    visible.set_defaults(func=cmd_set_visibility)
    entitle = admin_sub.add_parser(
        "entitle-priority", help="honour X-Priority: high from an account or on a deployment"
    )
    entitle.add_argument("account", nargs="?", metavar="ACCOUNT")
    entitle.add_argument("--deployment", metavar="OWNER/NAME")
    entitle.add_argument("--withdraw", action="store_true", help="stop honouring it")
    entitle.set_defaults(func=cmd_entitle_priority)
