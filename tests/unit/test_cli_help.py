"""``conduit``'s help, ``conduit config`` and the check of ``CONDUIT_*`` names, through the
real command line."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from conduit.cli import build_parser
from conduit.env_check import known_names

CLOSED_DB = "postgresql://conduit:hunter2@127.0.0.1:9/conduit"  # nothing listens on 9


def _conduit(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    return subprocess.run(
        [sys.executable, "-m", "conduit", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*path, name))


def _flat(text: str) -> str:
    """Help text on one line, words broken at a hyphen joined again."""
    return re.sub(r"-\s+", "-", " ".join(text.split()))


def test_every_command_has_a_description_and_shows_its_defaults() -> None:
    commands = dict(_commands(build_parser()))
    assert ("pool", "simulate") in commands and ("admin", "list-graphs") in commands
    for path, parser in commands.items():
        text = parser.format_help()
        assert parser.description, path
        assert "``" not in text and ":mod:" not in text, (path, text)  # no reST
        for action in parser._actions:
            default = action.default
            if action.option_strings and default not in (None, False, "", argparse.SUPPRESS):
                if action.help != argparse.SUPPRESS and "default" not in (action.help or ""):
                    assert f"(default: {default})" in _flat(text), (path, action.dest)


def test_the_variables_help_names_are_settings() -> None:
    named = {
        name
        for _, parser in _commands(build_parser())
        for name in re.findall(r"\[env: (\w+)\]", _flat(parser.format_help()))
    }
    assert {"CONDUIT_DIRECTOR_DEPLOYMENT", "CONDUIT_GATEWAY_PORT", "PORT"} <= named
    assert named - {"PORT"} <= known_names()


def test_top_level_help_lists_every_command() -> None:
    ran = _conduit("--help")
    assert ran.returncode == 0, ran.stderr
    for command in ("migrate", "api", "runner", "director", "gateway", "admin", "config", "pool"):
        assert re.search(rf"^\s+{command}\s+\w", ran.stdout, re.MULTILINE), command


def test_a_process_warns_of_a_mistyped_variable_with_the_nearest_name() -> None:
    ran = _conduit(
        "migrate", DATABASE_URL=CLOSED_DB, CONDUIT_API_CACHE_TTLL="3", CONDUIT_LOG_LEVEL="INFO"
    )
    assert ran.returncode == 2
    warned = [line for line in ran.stderr.splitlines() if "CONDUIT_API_CACHE_TTLL" in line]
    assert len(warned) == 1, ran.stderr
    assert "WARNING" in warned[0] and "did you mean CONDUIT_API_CACHE_TTL?" in warned[0]
    # ... and a database out of reach is one line naming it, its password masked.
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("conduit migrate: cannot reach the database at postgresql://conduit:")
    assert "hunter2" not in ran.stderr and "Traceback" not in ran.stderr
    assert "alembic.runtime.plugins" not in ran.stderr


def test_known_names_raise_no_warning() -> None:
    ran = _conduit("migrate", DATABASE_URL=CLOSED_DB, CONDUIT_API_CACHE_TTL="3")
    assert ran.returncode == 2
    assert "not a Conduit setting" not in ran.stderr, ran.stderr


@pytest.mark.parametrize("process", ["api", "director", "gateway", "runner"])
def test_config_prints_the_effective_settings_with_secrets_masked(process: str) -> None:
    ran = _conduit(
        "config",
        process,
        CONDUIT_RUNNER_TOKEN="s3cret-token-" + "x" * 40,
        CONDUIT_DIRECTOR_CONCURRENCY="7",
        DATABASE_URL=CLOSED_DB,
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0].startswith(f"# {process}: ")
    assert "s3cret-token" not in ran.stdout and "hunter2" not in ran.stdout
    if process != "runner":
        assert "DATABASE_URL=postgresql://conduit:***@127.0.0.1:9/conduit" in lines
    if process == "director":
        assert "CONDUIT_DIRECTOR_CONCURRENCY=7" in lines
        assert "CONDUIT_RUNNER_TOKEN=***" in lines
    if process == "runner":
        assert "CONDUIT_RUNNER_TOKEN=***" in lines


def test_config_names_a_mistyped_variable() -> None:
    ran = _conduit("config", "api", CONDUIT_DIRECTOR_CONCURENCY="7")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[0] == (
        "# CONDUIT_DIRECTOR_CONCURENCY is not a Conduit setting; it is ignored "
        "(did you mean CONDUIT_DIRECTOR_CONCURRENCY?)"
    )
