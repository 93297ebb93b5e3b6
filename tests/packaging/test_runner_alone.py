"""A runner ships alone: the wheel without its dependencies plus the ``runner`` dependency
group, in a fresh virtualenv away from the source tree, serves a prediction, with no database
driver, ORM, migration tool or api web framework installed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement

from tests.fixtures.waiting import wait_for
from tests.packaging.wheels import ROOT, build_wheel, run

#: What a runner image must not carry (the import-linter contract "runners ship alone" keeps
#: runners/, protocol/ and core/'s modules they import from reaching for them).
PLATFORM_ONLY = ("psycopg", "sqlalchemy", "alembic", "fastapi", "starlette", "uvicorn", "httpx")
LISTENING = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


def _pyproject() -> dict[str, object]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)


def _runner_venv(tmp_path: Path) -> Path:
    """The wheel with ``--no-deps``, then the ``runner`` group from pip's configured index
    (its cache makes a second build quick)."""
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    pip = (
        sys.executable,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "--python",
        venv / "bin/python",
    )
    run(*pip, "install", "--quiet", "--no-deps", build_wheel(tmp_path))
    run(*pip, "install", "--quiet", "--group", f"{ROOT / 'pyproject.toml'}:runner")
    return venv


@pytest.fixture
def away(tmp_path: Path) -> Path:
    """A working directory outside the source tree, so ``-m`` finds only what is installed."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CONDUIT_"))}
    return {**env, "PYTHONNOUSERSITE": "1"}


@pytest.fixture
def runner_url(tmp_path: Path, away: Path) -> Iterator[str]:
    venv = _runner_venv(tmp_path)
    python = venv / "bin" / "python"
    absent = run(
        python,
        "-c",
        "import importlib.util as u, sys, runners.pool.http, runners.server; "
        f"print([m for m in {PLATFORM_ONLY!r} if u.find_spec(m)]); "
        "print(runners.server.__file__)",
        cwd=away,
        env=_env(),
    ).stdout.splitlines()
    assert absent[0] == "[]", absent
    assert Path(absent[1]).is_relative_to(venv), absent

    log = tmp_path / "runner.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [python, "-m", "runners", "echo", "--host", "127.0.0.1", "--port", "0"],
            cwd=away,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def listening() -> str | None:
            said = log.read_text(errors="replace")
            assert proc.poll() is None, f"the runner exited ({proc.returncode}):\n{said}"
            found = LISTENING.search(said)
            return found.group(1) if found and "is ready" in said else None

        yield f"http://127.0.0.1:{wait_for(listening, 'the runner to listen', timeout=60)}"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_runner_serves_with_only_its_own_dependencies(runner_url: str) -> None:
    answer = httpx.post(
        f"{runner_url}/predictions", json={"input": {"prompt": "alone", "n": 2}}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["status"] == "succeeded", body
    assert body["output"] == ["alone-0", "alone-1"]


def test_the_runner_group_is_part_of_the_dependencies() -> None:
    """``pip install conduit`` brings all a runner needs too, in versions the group allows."""
    project = _pyproject()
    declared = {Requirement(r).name: Requirement(r) for r in project["project"]["dependencies"]}  # type: ignore[index]
    for line in project["dependency-groups"]["runner"]:  # type: ignore[index]
        wanted = Requirement(line)
        assert wanted.name in declared, f"{wanted.name} is in the runner group only"
        assert declared[wanted.name].specifier == wanted.specifier, line
        assert declared[wanted.name].marker == wanted.marker, line
