"""Row helpers the catalogue's writes share: lock a row, count rows, find or make an owner."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from catalog.records import AccountInfo
from catalog.rules import NotOwner, Refused
from core.ids import new_webhook_secret
from tracker.tables import Account


async def lock(conn: AsyncConnection, column: Any, key: object, *where: Any) -> bool:
    """Lock the row whose ``column`` is ``key`` (and ``where``); False when there is none."""
    found = await conn.execute(select(column).where(column == key, *where).with_for_update())
    return found.one_or_none() is not None


async def count(conn: AsyncConnection, table: Any, *where: Any) -> int:
    found = await conn.execute(select(func.count()).select_from(table).where(*where))
    return int(found.scalar_one())


async def account_id(conn: AsyncConnection, name: str) -> int | None:
    found = await conn.execute(select(Account.id).where(Account.name == name))
    value = found.scalar_one_or_none()
    return int(value) if value is not None else None


async def ensure_account(conn: AsyncConnection, name: str) -> bool:
    """Make sure an account ``name`` exists (without a token); True when it was created."""
    created = await conn.execute(
        pg_insert(Account)
        .values(name=name, webhook_secret=new_webhook_secret())
        .on_conflict_do_nothing(index_elements=[Account.name])
        .returning(Account.id)
    )
    return created.one_or_none() is not None


async def require_owner(
    conn: AsyncConnection, principal: AccountInfo, owner: str, create: bool
) -> None:
    """``owner`` must be an account. With ``create`` (the operator's commands: only an admin
    principal may make accounts) a missing one is made, without a token."""
    if create:
        if not principal.is_admin:
            raise NotOwner(f"only an admin creates the account {owner}")
        await ensure_account(conn, owner)
    elif await account_id(conn, owner) is None:
        raise Refused("owner", f"there is no account {owner}")
