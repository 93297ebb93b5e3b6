"""What every ``conduit`` command shares to run: the event loop, the database it reads
(``DATABASE_URL``) and that database's migrations."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    loop_factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main)


def database_url() -> str:
    from api.settings import ApiSettings

    return ApiSettings().database_url


def migrations_dir() -> Path:
    """The alembic scripts: ``conduit/migrations`` in an installed wheel (where the top-level
    ``alembic/`` of the source tree ships), else ``alembic/`` of this checkout."""
    installed = Path(__file__).resolve().parent / "migrations"
    return installed if (installed / "env.py").is_file() else ROOT / "alembic"


def migrate(url: str | None = None, revision: str = "head") -> None:
    # Alembic says at INFO which of its plug-ins it loaded, on import and before alembic.ini's
    # levels apply: nothing an operator acts on.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    from alembic.config import Config

    from alembic import command

    ini = ROOT / "alembic.ini"  # logging levels; only in a checkout
    config = Config(str(ini)) if ini.is_file() else Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", (url or database_url()).replace("%", "%%"))
    command.upgrade(config, revision)
