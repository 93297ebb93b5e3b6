"""What a command says when Postgres or Redis cannot be reached: one line on stderr and exit
code 2, not a traceback. Recognised by the drivers' connection errors anywhere in the
exception's causes (SQLAlchemy wraps psycopg's as its cause; an asyncio task group wraps either)."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

EXIT_CODE = 2


def masked_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _causes(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    pending = [error]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                pending.append(linked)


def unreachable(error: BaseException, database_url: str, redis_url: str) -> str | None:
    """The line to print when ``error`` says the database or Redis is out of reach; None when
    it says something else."""
    import psycopg
    import redis.exceptions

    for cause in _causes(error):
        # A connection that failed has no SQLSTATE, or one of class 08 (a refused query,
        # a deadlock, a cancel are OperationalErrors too, with their own).
        if isinstance(cause, psycopg.OperationalError) and (
            cause.sqlstate is None or cause.sqlstate.startswith("08")
        ):
            reason = _first_line(cause)
            return f"cannot reach the database at {masked_url(database_url)}: {reason}"
        if isinstance(cause, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
            return f"cannot reach Redis at {masked_url(redis_url)}: {_first_line(cause)}"
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0].strip() if text else type(error).__name__
