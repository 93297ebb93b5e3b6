"""``conduit admin create-account``, ``set-admin``, ``ops-viewer``: accounts and their roles."""

from __future__ import annotations

import argparse
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from conduit.admin.running import with_engine
from tracker import catalog_admin


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


def cmd_create_account(args: argparse.Namespace) -> None:
    made_admin = True if args.admin else None
    print(with_engine(lambda engine: create_account(engine, args.name, made_admin)))


def cmd_set_admin(args: argparse.Namespace) -> None:
    print(with_engine(lambda engine: set_admin(engine, args.account, not args.withdraw)))


def cmd_ops_viewer(args: argparse.Namespace) -> None:
    print(with_engine(lambda engine: set_ops_role(engine, args.account, args.withdraw)))


def add_accounts(admin_sub: Any) -> None:
    account = admin_sub.add_parser("create-account", help="create an account; prints a token")
    account.add_argument("name")
    account.add_argument(
        "--admin", action="store_true", help="make it an admin (it may read GET /v1/fleet)"
    )
    account.set_defaults(func=cmd_create_account)
    set_admin_ = admin_sub.add_parser(
        "set-admin", help="make an account an admin (it may read GET /v1/fleet)"
    )
    set_admin_.add_argument("account", metavar="ACCOUNT")
    set_admin_.add_argument("--withdraw", action="store_true", help="make it an admin no more")
    set_admin_.set_defaults(func=cmd_set_admin)
    viewer = admin_sub.add_parser(
        "ops-viewer", help="let an account look at the operator page (/ops), read-only"
    )
    viewer.add_argument("account", metavar="ACCOUNT")
    viewer.add_argument("--withdraw", action="store_true", help="let it look no more")
    viewer.set_defaults(func=cmd_ops_viewer)
