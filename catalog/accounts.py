"""Accounts as an operator sees them (``conduit admin list-accounts``, ``show-account``,
``delete-account``): what each holds, counted, and deactivation.

An account is deactivated, never removed: its predictions, usage and files keep naming it.
A deactivated account's tokens are deleted and it signs in nowhere (every token check asks
``active``); ``create-account`` of the same name makes it active again with a new token.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from tracker.block_tables import Block
from tracker.tables import Account, ApiToken, Deployment, Model


@dataclass(frozen=True, slots=True)
class AccountSummary:
    name: str
    active: bool
    is_admin: bool
    #: ``viewer``: signs in to ``/ops`` read-only.
    ops_role: str | None
    may_use_high_priority: bool
    tokens: int
    models: int
    deployments: int
    blocks: int
    created_at: datetime


def _count(table: Any, *where: Any) -> Any:
    return select(func.count()).select_from(table).where(*where).scalar_subquery()


def _query() -> Select[Any]:
    return select(
        Account.name,
        Account.active,
        Account.is_admin,
        Account.ops_role,
        Account.may_use_high_priority,
        _count(ApiToken, ApiToken.account_id == Account.id),
        _count(Model, Model.owner == Account.name, Model.deleted_at.is_(None)),
        _count(Deployment, Deployment.owner == Account.name),
        _count(Block, Block.account_id == Account.id),
        Account.created_at,
    )


async def list_accounts(engine: AsyncEngine, limit: int = 1000) -> list[AccountSummary]:
    """Newest first."""
    query = _query().order_by(Account.created_at.desc(), Account.id.desc()).limit(limit)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    return [AccountSummary(*row) for row in rows]


async def read_account(engine: AsyncEngine, name: str) -> AccountSummary | None:
    async with engine.connect() as conn:
        row = (await conn.execute(_query().where(Account.name == name))).one_or_none()
    return AccountSummary(*row) if row is not None else None


async def deactivate_account(engine: AsyncEngine, name: str) -> int:
    """Deactivate ``name`` and delete its tokens; how many it had. :class:`LookupError` when
    there is no such account."""
    async with engine.begin() as conn:
        found = await conn.execute(
            update(Account).where(Account.name == name).values(active=False).returning(Account.id)
        )
        account_id = found.scalar_one_or_none()
        if account_id is None:
            raise LookupError(f"account {name} does not exist")
        deleted = await conn.execute(
            delete(ApiToken).where(ApiToken.account_id == account_id).returning(ApiToken.id)
        )
        return len(deleted.all())
