"""A compressed body costs a runner what it weighs, not what it inflates to.

A real ``conduit runner`` process with a token is sent, authorised, a gzip body that inflates
far past the runner's 100 MiB body cap. It is refused with 415 problem+json, and the process's
resident memory (``VmRSS`` in ``/proc``) grows by a small fraction of what inflating the body
would take. Before, each such request was inflated to the cap and then refused (413), growing
the process by hundreds of MiB.
"""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.fixtures.processes import RUNNER_AUTH, Launcher, base_env

MIB = 1024 * 1024
#: What the body inflates to: past the runner's cap (100 MiB), as an attacker would send it.
INFLATED = 160 * MIB
REQUESTS = 3
#: Growth of resident memory allowed over all the requests: well under one inflated body.
GROWTH_LIMIT = 48 * MIB


def _rss(pid: int) -> int:
    """Resident set size of ``pid`` in bytes (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return gzip.compress(b"{" + b" " * (INFLATED - 2) + b"}", compresslevel=9)


def test_an_authorised_gzip_body_is_refused_without_inflating_it(bomb: bytes) -> None:
    if not Path("/proc/self/status").exists():
        pytest.skip("reads resident memory from /proc")
    with tempfile.TemporaryDirectory() as logdir:
        launcher = Launcher(base_env("postgresql://unused", "redis://unused"), Path(logdir))
        try:
            proc, url = launcher.runner("echo", 1)
            assert proc.popen is not None
            headers = {
                **RUNNER_AUTH,
                "Content-Type": "application/json",
                "Content-Encoding": "gzip",
            }
            with httpx.Client(base_url=url, timeout=60) as http:
                # Warm the process (first request, imports) before measuring.
                assert http.post("/predictions", json={"input": {}}, headers=RUNNER_AUTH)
                before = _rss(proc.popen.pid)
                for _ in range(REQUESTS):
                    answer = http.post("/predictions", content=bomb, headers=headers)
                    assert answer.status_code == 415, answer.text
                    assert answer.headers["content-type"] == "application/problem+json"
                    problem = answer.json()
                    assert (problem["status"], problem["field"]) == (415, "Content-Encoding")
                after = _rss(proc.popen.pid)
                proc.check_alive()
            print(
                f"runner RSS {before / MIB:.1f} MiB -> {after / MIB:.1f} MiB after "
                f"{REQUESTS} gzip bodies of {len(bomb) / 1024:.0f} KiB ({INFLATED // MIB} MiB "
                "inflated)"
            )
            assert after - before < GROWTH_LIMIT
        finally:
            launcher.stop_all()
