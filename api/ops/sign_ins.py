"""Operators' sign-ins to ``/ops``: a random cookie, its digest a row, a CSRF token each.

The API token is handed over once, in a POST body, and never travels again: the browser holds
only the session cookie (``HttpOnly``, ``SameSite=Strict``, path ``/ops``), which names a row of
``ops_sessions`` by its SHA-256 (a database dump holds no usable cookie). Each row carries the
CSRF token every POST must echo, and expires after ``ttl`` seconds without use; signing out
deletes it, so a copied cookie dies with it. Kept in Postgres, not Redis: the page must still
let its operator in while Redis is down, which is when it is needed most.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

COOKIE = "conduit_ops"
#: The CSRF cookie of the sign-in form, before any session exists (double submit).
LOGIN_COOKIE = "conduit_ops_login"


class Role(StrEnum):
    ADMIN = "admin"  # ``accounts.is_admin``: sees and acts
    VIEWER = "viewer"  # ``accounts.ops_role = 'viewer'``: sees only


@dataclass(frozen=True, slots=True)
class OpsSession:
    account_id: int
    account: str
    role: Role
    csrf: str

    @property
    def may_act(self) -> bool:
        return self.role is Role.ADMIN


def _digest(cookie: str) -> str:
    return hashlib.sha256(cookie.encode()).hexdigest()


def same_token(given: str | None, expected: str) -> bool:
    """Whether ``given`` is ``expected``, compared in constant time."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


class SignIns:
    def __init__(self, engine: AsyncEngine, ttl: int) -> None:
        self.engine = engine
        self.ttl = ttl

    async def start(self, account_id: int, account: str, role: Role) -> tuple[str, OpsSession]:
        """A new session: the cookie to set, and the session. Expired ones go meanwhile."""
        cookie = secrets.token_urlsafe(32)
        session = OpsSession(account_id, account, role, secrets.token_urlsafe(32))
        async with self.engine.begin() as conn:
            await conn.execute(text("DELETE FROM ops_sessions WHERE expires_at < now()"))
            await conn.execute(
                text(
                    "INSERT INTO ops_sessions (digest, account_id, role, csrf, expires_at) "
                    "VALUES (:digest, :account_id, :role, :csrf, "
                    "now() + make_interval(secs => :ttl))"
                ),
                {
                    "digest": _digest(cookie),
                    "account_id": account_id,
                    "role": role.value,
                    "csrf": session.csrf,
                    "ttl": self.ttl,
                },
            )
        return cookie, session

    async def find(self, cookie: str | None) -> OpsSession | None:
        """The session ``cookie`` names, its expiry pushed back; None for none (or a malformed
        cookie, or an account no longer active or no longer an operator). The role is the
        account's now, not at sign-in: a withdrawn admin acts no more."""
        if not cookie or len(cookie) > 100:
            return None
        async with self.engine.begin() as conn:
            row = (
                await conn.execute(
                    text(
                        "UPDATE ops_sessions s SET expires_at = now() + make_interval(secs => :ttl)"
                        " FROM accounts a WHERE s.digest = :digest AND s.expires_at > now()"
                        " AND a.id = s.account_id AND a.active"
                        " AND (a.is_admin OR a.ops_role = 'viewer')"
                        " RETURNING s.account_id, a.name,"
                        " CASE WHEN a.is_admin THEN 'admin' ELSE 'viewer' END, s.csrf"
                    ),
                    {"digest": _digest(cookie), "ttl": self.ttl},
                )
            ).first()
        if row is None:
            return None
        return OpsSession(int(row[0]), row[1], Role(row[2]), row[3])

    async def end(self, cookie: str | None) -> None:
        if cookie and len(cookie) <= 100:
            async with self.engine.begin() as conn:
                await conn.execute(
                    text("DELETE FROM ops_sessions WHERE digest = :digest"),
                    {"digest": _digest(cookie)},
                )
