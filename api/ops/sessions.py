"""Operators' sign-ins to ``/ops``: a random cookie, its digest a Redis key, a CSRF token each.

The API token is handed over once, in a POST body, and never travels again: the browser holds
only the session cookie (``HttpOnly``, ``SameSite=Strict``, path ``/ops``), which names a
record in Redis by its SHA-256 (a Redis dump does not hold usable cookies). Each record carries
the CSRF token every POST must echo, and expires after ``ttl`` seconds without use; signing out
deletes it, so a copied cookie dies with it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import StrEnum

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError

from tracker.keys import ops_session_key

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


class Sessions:
    def __init__(self, redis: Redis, ttl: int) -> None:
        self.redis = redis
        self.ttl = ttl

    async def start(self, account_id: int, account: str, role: Role) -> tuple[str, OpsSession]:
        """A new session: the cookie to set, and the session."""
        cookie = secrets.token_urlsafe(32)
        session = OpsSession(account_id, account, role, secrets.token_urlsafe(32))
        record = {"account_id": account_id, "account": account, "role": role.value}
        record["csrf"] = session.csrf
        await self.redis.set(ops_session_key(_digest(cookie)), orjson.dumps(record), ex=self.ttl)
        return cookie, session

    async def find(self, cookie: str | None) -> OpsSession | None:
        """The session ``cookie`` names, its expiry pushed back; None for none (or a malformed
        cookie, or Redis away: the page then asks to sign in again, it shows nothing)."""
        if not cookie or len(cookie) > 100:
            return None
        key = ops_session_key(_digest(cookie))
        try:
            raw = await self.redis.getex(key, ex=self.ttl)
        except RedisError:
            return None
        if raw is None:
            return None
        record = orjson.loads(raw)
        return OpsSession(
            int(record["account_id"]), record["account"], Role(record["role"]), record["csrf"]
        )

    async def end(self, cookie: str | None) -> None:
        if cookie and len(cookie) <= 100:
            await self.redis.delete(ops_session_key(_digest(cookie)))
