"""Engine construction: one async SQLAlchemy engine per process."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import Engine as SyncEngine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

#: The advisory lock key ``conduit migrate`` holds while it migrates (a fixed bigint; this one
#: spells "conduit" in ASCII).
MIGRATE_LOCK_KEY = 0x636F6E64756974


class DatabaseSettings(BaseSettings):
    """How every process (api, director, ``conduit migrate``, ``conduit admin``) talks to
    Postgres, from ``CONDUIT_DATABASE_*``."""

    model_config = SettingsConfigDict(
        env_prefix="CONDUIT_DATABASE_", extra="ignore", env_ignore_empty=True
    )

    #: Let psycopg prepare statements it runs often (its ``prepare_threshold``, 5 runs per
    #: connection). Set false when ``DATABASE_URL`` goes through a pooler in transaction mode
    #: (PgBouncer before 1.21, or without ``max_prepared_statements``): a statement prepared
    #: on one server connection is then executed on another, where it does not exist.
    prepared_statements: bool = True
    #: Seconds a query waits for a connection of its process's pool when all are busy (a
    #: lock held elsewhere, a slow database) before it fails as an outage: a request is then
    #: answered 503 with ``Retry-After`` while its client still waits, and a background loop
    #: retries later. SQLAlchemy's own default, 30 s, outlasts most clients' patience.
    pool_timeout: float = Field(5.0, gt=0)


def connect_args(prepared_statements: bool | None = None) -> dict[str, Any]:
    """psycopg ``connect()`` keywords for the setting (read from the environment when not
    given). ``prepare_threshold=None`` is psycopg's switch for "never prepare"."""
    if prepared_statements is None:
        prepared_statements = DatabaseSettings().prepared_statements
    return {} if prepared_statements else {"prepare_threshold": None}


def sqlalchemy_url(database_url: str) -> str:
    """Accept plain ``postgresql://`` DSNs (as users and tools write them) and pick psycopg 3."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix) :]
    raise ValueError(f"DATABASE_URL must be a postgresql:// URL, got {database_url.split(':')[0]}")


def make_engine(
    database_url: str,
    pool_size: int = 10,
    *,
    prepared_statements: bool | None = None,
    pool_timeout: float | None = None,
) -> Engine:
    """The process's engine; what is not given is read from ``DatabaseSettings``."""
    if prepared_statements is None or pool_timeout is None:
        settings = DatabaseSettings()
        if prepared_statements is None:
            prepared_statements = settings.prepared_statements
        if pool_timeout is None:
            pool_timeout = settings.pool_timeout
    # No pre-ping: it costs a round trip on every checkout, i.e. on every state write. A
    # connection broken by a Postgres restart fails one statement, SQLAlchemy invalidates the
    # pool, and callers treat the error as the transient outage it is. A checkout that waits
    # out ``pool_timeout`` raises ``sqlalchemy.exc.TimeoutError``, one of
    # ``core.transient.TRANSIENT``.
    engine = create_async_engine(
        sqlalchemy_url(database_url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=pool_timeout,
        pool_recycle=3600,
        # jsonb keeps numbers as decimals and prints a float such as 1e20 as the integer
        # 100000000000000000000, which no encoder of Conduit can send on (orjson stops at 64
        # bits; inputs are refused past it). orjson's parser reads integers beyond 64 bits as
        # floats: what was stored as a float reads back as one.
        json_deserializer=orjson.loads,
        connect_args=connect_args(prepared_statements),
    )
    return Engine(engine.sync_engine)


class Engine(AsyncEngine):
    """An async engine that keeps its autocommit variant (the same pool) beside it: building
    one costs ~18 µs, and single-statement writes ask for it several times per prediction."""

    __slots__ = ("_autocommit",)

    def __init__(self, sync_engine: SyncEngine) -> None:
        super().__init__(sync_engine)
        self._autocommit: AsyncEngine | None = None

    @property
    def autocommit(self) -> AsyncEngine:
        if self._autocommit is None:
            self._autocommit = self.execution_options(isolation_level="AUTOCOMMIT")
        return self._autocommit


def autocommit(engine: AsyncEngine) -> AsyncEngine:
    """The same pool, without BEGIN/COMMIT around each statement.

    For single-statement reads and writes, which are atomic anyway: one round trip instead of
    three. Anything that must commit two statements together uses ``engine.begin()``.
    """
    if isinstance(engine, Engine):
        return engine.autocommit
    return engine.execution_options(isolation_level="AUTOCOMMIT")
