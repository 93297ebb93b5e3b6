"""``conduit admin create-account``, ``list-accounts``, ``show-account``, ``delete-account``,
``set-admin``, ``ops-viewer``: accounts and their roles."""

from __future__ import annotations

import argparse
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import accounts, writes
from catalog.accounts import AccountSummary
from conduit.admin.collection import Collection
from conduit.admin.running import with_engine
from conduit.admin.tables import when

ACCOUNT_COLUMNS = ("NAME", "ACTIVE", "ROLE", "TOKENS", "MODELS", "DEPLOYMENTS", "BLOCKS", "CREATED")


async def create_account(engine: AsyncEngine, name: str, admin: bool | None = None) -> str:
    """A new token for account ``name`` (created if missing); ``admin=True`` makes it an
    admin, None leaves an existing account's flag as it was."""
    _, token = await writes.create_account(engine, name, admin)
    return token


async def set_admin(engine: AsyncEngine, account: str, admin: bool) -> str:
    """Whether ``account`` is an admin: it may read the fleet (``GET /v1/fleet``)."""
    try:
        await writes.set_admin(engine, account, admin)
    except LookupError as error:
        raise SystemExit(str(error)) from error
    return f"account {account} is {'an admin' if admin else 'not an admin'}"


async def set_ops_role(engine: AsyncEngine, account: str, withdraw: bool) -> str:
    """Whether ``account`` may look at the operator page (``/ops``) read-only."""
    try:
        await writes.set_ops_role(engine, account, None if withdraw else "viewer")
    except LookupError as error:
        raise SystemExit(str(error)) from error
    return f"account {account} {'may not' if withdraw else 'may'} look at /ops (read-only)"


def _role(account: AccountSummary) -> str:
    return "admin" if account.is_admin else account.ops_role or "-"


def _row(account: AccountSummary) -> tuple[str, ...]:
    counts = (account.tokens, account.models, account.deployments, account.blocks)
    active = "yes" if account.active else "no"
    return (account.name, active, _role(account), *map(str, counts), when(account.created_at))


async def show_account(engine: AsyncEngine, name: str) -> AccountSummary:
    found = await accounts.read_account(engine, name)
    if found is None:
        raise SystemExit(f"account {name} does not exist")
    return found


async def delete_account(engine: AsyncEngine, name: str) -> str:
    try:
        tokens = await accounts.deactivate_account(engine, name)
    except LookupError as error:
        raise SystemExit(str(error)) from error
    return (
        f"account {name} deactivated, {tokens} token(s) deleted; what it made and ran is kept "
        f"(create-account {name} makes it active again)"
    )


ACCOUNTS: Collection[AccountSummary] = Collection(
    noun="account",
    metavar="ACCOUNT",
    columns=ACCOUNT_COLUMNS,
    row=_row,
    read_all=lambda engine, args: accounts.list_accounts(engine, args.limit),
    read_one=lambda engine, args: show_account(engine, args.name),
    delete=lambda engine, args: delete_account(engine, args.name),
)


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
    ACCOUNTS.add(
        admin_sub,
        list_help="list accounts: role, tokens, what each owns",
        show_help="print an account as JSON",
        delete_help="deactivate an account and delete its tokens (its models, deployments and "
        "predictions are kept)",
    )
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
