"""``conduit dev --env`` prints a running dev stack's exports, and never those of one that
was killed: its ``.conduit/dev.env`` is removed, with one line saying no stack runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.waiting import wait_for

#: Writes the env file as ``conduit dev`` does (``write_env_file``), then waits until killed.
WRITER = """
import sys
from conduit.dev_exports import DevStack, write_env_file

write_env_file(DevStack("http://127.0.0.1:9", "dev-token", "postgresql://db", "redis://r", "rt"))
sys.stdin.read()
"""


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process that has written ``tmp_path/.conduit/dev.env`` and is still running."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER], cwd=tmp_path, stdin=subprocess.PIPE)
    env_file = tmp_path / ".conduit" / "dev.env"
    try:
        wait_for(lambda: env_file.exists() and env_file.read_text(), "the env file written")
        yield proc
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdin is not None
        proc.stdin.close()


def _dev_env(cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    return subprocess.run(
        [sys.executable, "-m", "conduit", "dev", "--env"],
        cwd=cwd,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_running_writers_exports_are_printed(
    tmp_path: Path, writer: subprocess.Popen[bytes]
) -> None:
    ran = _dev_env(tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert f"# conduit dev (pid {writer.pid}" in ran.stdout.splitlines()[0]
    assert "export REPLICATE_API_TOKEN=dev-token" in ran.stdout
    assert (tmp_path / ".conduit" / "dev.env").exists()


def test_a_killed_writers_file_is_removed_and_nothing_printed(
    tmp_path: Path, writer: subprocess.Popen[bytes]
) -> None:
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    ran = _dev_env(tmp_path)
    assert ran.returncode != 0
    assert ran.stdout == ""
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1, ran.stderr
    assert "no dev stack is running" in lines[0] and f"pid {writer.pid}" in lines[0]
    assert "died" in lines[0]
    assert not (tmp_path / ".conduit" / "dev.env").exists()
    # ... and from then on, the answer for no file at all.
    again = _dev_env(tmp_path)
    assert again.returncode != 0 and "is conduit dev running?" in again.stderr
