"""The runner sidecar's probes, run as kubelet runs them, against real runners.

Its probes are commands inside its container (the runner listens on the pod's loopback), so
the manifests hold small programs: here they run as written against ``conduit runner echo``
processes that hold a runner token. Only the address (the manifests' port 5000 may be taken on
this machine) and the interpreter's path are replaced.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator

import pytest

from core.ports import free_port
from tests.deploy.rendering import overlay
from tests.deploy.workloads import containers
from tests.fixtures.processes import Launcher

STARTED_AND_READY = ("startupProbe", "readinessProbe")


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    env["CONDUIT_RUNNER_TOKEN"] = secrets.token_urlsafe(24)
    launcher = Launcher(env, tmp_path_factory.mktemp("logs"))
    try:
        yield launcher
    finally:
        launcher.stop_all()


@pytest.fixture(scope="module")
def ready_runner(launcher: Launcher) -> str:
    return launcher.runner("echo", concurrency=1)[1]


@pytest.fixture(scope="module")
def starved_runner(launcher: Launcher) -> str:
    """A runner whose loop runs but which reports itself out of memory: it wants a petabyte
    free."""
    env = {"CONDUIT_RUNNER_MIN_FREE_MEMORY": str(10**15)}
    return launcher.runner("echo", concurrency=1, env=env)[1]


def probe(runner_url: str, name: str) -> int:
    """Run the production sidecar's ``name`` probe against ``runner_url``, without the runner
    token in its environment; its exit status (0: kubelet counts a success)."""
    [runner] = [c for c in containers(overlay("production")) if c.process == "runner"]
    command = list(runner.spec[name]["exec"]["command"])
    assert command[0] == "python"
    address = f"http://127.0.0.1:{runner.args.port}"
    assert any(address in part for part in command), name
    command = [sys.executable, *(part.replace(address, runner_url) for part in command[1:])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDUIT_")}
    timeout = runner.spec[name]["timeoutSeconds"] * 5  # a loaded machine, not a limit tested
    return subprocess.run(command, env=env, capture_output=True, timeout=timeout).returncode


def test_every_probe_passes_on_a_ready_runner_without_its_token(ready_runner: str) -> None:
    for name in (*STARTED_AND_READY, "livenessProbe"):
        assert probe(ready_runner, name) == 0, name


def test_a_runner_that_cannot_serve_is_alive_but_not_ready(starved_runner: str) -> None:
    for name in STARTED_AND_READY:
        assert probe(starved_runner, name) != 0, name
    assert probe(starved_runner, "livenessProbe") == 0


def test_every_probe_fails_when_nothing_listens() -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    for name in (*STARTED_AND_READY, "livenessProbe"):
        assert probe(nowhere, name) != 0, name
