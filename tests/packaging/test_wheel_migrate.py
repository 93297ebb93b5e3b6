"""A built wheel carries the migrations: ``conduit migrate`` from a fresh virtualenv, away from
the source tree, brings a new database to head."""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from alembic.script import ScriptDirectory

from conduit.services import ServiceUrls
from tests.fixtures.processes import base_env
from tests.fixtures.servers import create_database

ROOT = Path(__file__).resolve().parents[2]


def _run(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, env=env)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


def _build_wheel(tmp_path: Path) -> Path:
    """Build from a copy of the files git sees (not ignored ones), so the tree gets no build/
    or egg-info."""
    source = tmp_path / "source"
    tracked = _run(
        "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT
    ).stdout.split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    dist = tmp_path / "dist"
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check")
    _run(*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", source, "-w", dist)
    (wheel,) = dist.glob("conduit-*.whl")
    return wheel


def _venv_with(wheel: Path, tmp_path: Path) -> Path:
    """A virtualenv holding only the wheel; its dependencies come from this interpreter's
    site-packages (no index needed), whose own ``.pth`` files (the editable checkout) are
    not processed from there."""
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    pip = (sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", python)
    _run(*pip, "install", "--quiet", "--no-deps", "--no-index", wheel)
    purelib = _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
    deps = "\n".join(site.getsitepackages()) + "\n"
    Path(purelib.stdout.strip(), "conduit-test-deps.pth").write_text(deps)
    return venv


def test_migrate_from_an_installed_wheel(services: ServiceUrls, tmp_path: Path) -> None:
    venv = _venv_with(_build_wheel(tmp_path), tmp_path)
    url = create_database(services.database_url, f"conduit_wheel_{uuid.uuid4().hex[:12]}")
    env = {k: v for k, v in base_env(url, services.redis_url).items() if k != "PYTHONPATH"}
    away = tmp_path / "elsewhere"
    away.mkdir()

    where = _run(
        venv / "bin" / "python",
        "-c",
        "import conduit.cli; print(conduit.cli.migrations_dir())",
        cwd=away,
        env=env,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv), where

    migrated = _run(venv / "bin" / "conduit", "migrate", cwd=away, env=env)
    assert "database migrated to head" in migrated.stdout

    head = ScriptDirectory(str(ROOT / "alembic")).get_current_head()
    conninfo = re.sub(r"^postgres(?:ql)?\+\w+://", "postgresql://", url)
    with psycopg.connect(conninfo) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
    assert os.listdir(away) == []
