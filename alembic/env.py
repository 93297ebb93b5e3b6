"""Alembic environment: migrates the database named by DATABASE_URL (or the config's url).

Concurrent runs (every replica of a deployment running ``conduit migrate`` as it starts) are
serialised by a transaction-level advisory lock taken before alembic reads the current
revision: the first run migrates, the others wait, then find the schema at head. A
transaction-level lock also holds through a pooler in transaction mode, which a session-level
one would not (all migrations run in one transaction, as Postgres allows DDL in one).
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from sqlalchemy import create_engine, pool, text

from alembic import context
from tracker import block_tables, ops_tables, record_tables, registry_tables  # noqa: F401  (their tables, on Base's metadata)
from tracker.db import MIGRATE_LOCK_KEY, connect_args, sqlalchemy_url
from tracker.tables import Base

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def database_url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("DATABASE_URL is not set")
    return sqlalchemy_url(url)


def run_migrations_offline() -> None:
    context.configure(url=database_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(database_url(), poolclass=pool.NullPool, connect_args=connect_args())
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATE_LOCK_KEY}
            )
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
