"""A built wheel carries the migrations: ``conduit migrate`` from a fresh virtualenv, away from
the source tree, brings a new database to head."""

from __future__ import annotations

import os
import re
import site
import sys
import uuid
from pathlib import Path

import psycopg
from alembic.script import ScriptDirectory

from conduit.services import ServiceUrls
from tests.fixtures.processes import base_env
from tests.fixtures.servers import create_database
from tests.packaging.wheels import ROOT, build_wheel, run


def _venv_with(wheel: Path, tmp_path: Path) -> Path:
    """A virtualenv holding only the wheel; its dependencies come from this interpreter's
    site-packages (no index needed), whose own ``.pth`` files (the editable checkout) are
    not processed from there."""
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", python)
    run(*pip, "install", "--quiet", "--no-deps", "--no-index", wheel)
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
    deps = "\n".join(site.getsitepackages()) + "\n"
    Path(purelib.stdout.strip(), "conduit-test-deps.pth").write_text(deps)
    return venv


def test_migrate_from_an_installed_wheel(services: ServiceUrls, tmp_path: Path) -> None:
    venv = _venv_with(build_wheel(tmp_path), tmp_path)
    url = create_database(services.database_url, f"conduit_wheel_{uuid.uuid4().hex[:12]}")
    env = {k: v for k, v in base_env(url, services.redis_url).items() if k != "PYTHONPATH"}
    away = tmp_path / "elsewhere"
    away.mkdir()

    where = run(
        venv / "bin" / "python",
        "-c",
        "import conduit.runtime; print(conduit.runtime.migrations_dir())",
        cwd=away,
        env=env,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv), where

    migrated = run(venv / "bin" / "conduit", "migrate", cwd=away, env=env)
    assert "database migrated to head" in migrated.stdout

    head = ScriptDirectory(str(ROOT / "alembic")).get_current_head()
    conninfo = re.sub(r"^postgres(?:ql)?\+\w+://", "postgresql://", url)
    with psycopg.connect(conninfo) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
    assert os.listdir(away) == []
