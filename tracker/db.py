"""Engine construction: one async SQLAlchemy engine per process."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


def sqlalchemy_url(database_url: str) -> str:
    """Accept plain ``postgresql://`` DSNs (as users and tools write them) and pick psycopg 3."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix) :]
    raise ValueError(f"DATABASE_URL must be a postgresql:// URL, got {database_url.split(':')[0]}")


def make_engine(database_url: str, pool_size: int = 10) -> AsyncEngine:
    # No pre-ping: it costs a round trip on every checkout, i.e. on every state write. A
    # connection broken by a Postgres restart fails one statement, SQLAlchemy invalidates the
    # pool, and callers treat the error as the transient outage it is.
    return create_async_engine(
        sqlalchemy_url(database_url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=3600,
    )


_AUTOCOMMIT: dict[int, AsyncEngine] = {}


def autocommit(engine: AsyncEngine) -> AsyncEngine:
    """The same pool, without BEGIN/COMMIT around each statement.

    For single-statement reads and writes, which are atomic anyway: one round trip instead of
    three. Anything that must commit two statements together uses ``engine.begin()``.
    """
    found = _AUTOCOMMIT.get(id(engine))
    if found is None or found.sync_engine.pool is not engine.sync_engine.pool:
        found = engine.execution_options(isolation_level="AUTOCOMMIT")
        _AUTOCOMMIT[id(engine)] = found
    return found
