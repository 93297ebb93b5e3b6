"""The names every process knows, declared in ``core`` for a runner image, equal those of the
settings classes; and ``python -m runners`` warns of a mistyped ``CONDUIT_*`` variable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conduit.env_check import known_names
from core.env_names import KNOWN_NAMES
from tests.fixtures.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def _declaration(names: frozenset[str]) -> str:
    """The text between the quotes of ``KNOWN_NAMES`` for ``names``."""
    lines = textwrap.wrap(" ".join(sorted(names)), 96, break_long_words=False)
    return "\n".join(f"    {line}" for line in lines)


def test_the_declared_names_are_those_of_the_settings_classes() -> None:
    read = known_names()
    assert KNOWN_NAMES == read, (
        f"core/env_names.py's KNOWN_NAMES differs from the settings classes: missing "
        f"{sorted(read - KNOWN_NAMES)}, not read by any process {sorted(KNOWN_NAMES - read)}. "
        f"Its names should be:\n{_declaration(read)}"
    )


def test_a_runner_warns_of_a_mistyped_variable_with_the_nearest_name(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    # An api's setting is known to a runner too: one environment file feeds every process.
    env = {**clean, "CONDUIT_RUNER_TOKEN": "x" * 32, "CONDUIT_API_CACHE_TTL": "3"}
    log_path = tmp_path / "runner.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runners", "echo", "--host", "127.0.0.1", "--port", "0"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def ready() -> str | None:
            """What the runner said, once it is serving (it warns before it listens)."""
            said = log_path.read_text(errors="replace")
            assert proc.poll() is None, f"the runner exited ({proc.returncode}):\n{said}"
            return said if "is ready" in said else None

        said = wait_for(ready, "the runner to be ready", timeout=60)
        warned = [line for line in said.splitlines() if "CONDUIT_RUNER_TOKEN" in line]
        assert len(warned) == 1, said
        assert "WARNING" in warned[0] and "did you mean CONDUIT_RUNNER_TOKEN?" in warned[0]
        assert "CONDUIT_API_CACHE_TTL" not in said
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
