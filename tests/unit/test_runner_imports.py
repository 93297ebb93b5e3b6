"""A runner ships alone in a GPU image: importing any of its entry points pulls in nothing of
the platform's database, web framework or other packages (``core`` and ``protocol`` only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from core.ports import free_port
from tests.fixtures.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINTS = ["runners.__main__", "runners.server", "runners.pool.http", "runners.pool.backends"]
#: Not in a runner's image: the database, the api's web framework, the platform's other parts.
FORBIDDEN = {
    "sqlalchemy",
    "psycopg",
    "alembic",
    "fastapi",
    "starlette",
    "uvicorn",
    "conduit",
    "tracker",
    "catalog",
    "files",
    "blocks",
    "front",
    "api",
    "director",
    "lane",
}


def test_runner_entry_points_import_nothing_of_the_rest() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {ENTRY_POINTS!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert loaded & FORBIDDEN == set()
    assert {"core", "protocol", "runners"} <= loaded


def test_a_runner_served_from_a_program_of_its_own_logs_in_the_configured_shape(
    tmp_path: Path,
) -> None:
    """``serve`` configures logging when nobody did, from the same settings as every entry
    point (here JSON lines), rather than a shape of its own."""
    port = free_port()
    log_path = tmp_path / "runner.log"
    code = f"from runners.server import serve\nserve('echo', '127.0.0.1', {port}, 1)\n"
    env = {**os.environ, "CONDUIT_LOG_FORMAT": "json", "CONDUIT_LOG_LEVEL": "INFO"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:

        def listening() -> dict[str, object] | None:
            for line in log_path.read_text(errors="replace").splitlines():
                if "listening" in line:
                    document: dict[str, object] = json.loads(line)
                    return document
            assert proc.poll() is None, log_path.read_text(errors="replace")
            return None

        line = wait_for(listening, "the runner's listening line")
        assert line["level"] == "INFO"
        assert line["logger"] == "runners.server"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
