"""``conduit dev``: the whole stack on one machine, for a first run.

Uses ``DATABASE_URL``/``REDIS_URL`` when set, otherwise throwaway servers; migrates; starts an
echo runner, the api and a director as child processes; creates a dev account, the model and
deployment ``conduit/echo``; prints how to call it. Ctrl-C stops everything it started.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import httpx

from conduit.binaries import ServicesUnavailable
from conduit.services import local_services
from core.ports import free_port

MODEL = "conduit/echo"
CONCURRENCY = 4


class Children:
    """Child processes, stopped in reverse order of start."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "conduit", *args], env=self.env)
        self.procs.append((name, proc))
        return proc

    def exited(self) -> str | None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                return f"{name} exited with code {proc.returncode}"
        return None

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_until(
    check: Callable[[], bool], what: str, children: Children, timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        problem = children.exited()
        if problem:
            raise RuntimeError(f"while waiting for {what}: {problem}")
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def _status_ok(url: str, key: str | None = None, value: str | None = None) -> bool:
    response = httpx.get(url, timeout=2)
    if response.status_code != 200:
        return False
    return key is None or response.json().get(key) == value


def _admin(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "conduit", "admin", *args],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip().splitlines()[-1]


def run_dev(port: int = 8000) -> int:
    try:
        with local_services(os.environ.get("REDIS_URL"), os.environ.get("DATABASE_URL")) as urls:
            env = {**os.environ, "REDIS_URL": urls.redis_url, "DATABASE_URL": urls.database_url}
            # The runner takes cancel and shutdown only with a token its director sends.
            if not env.get("CONDUIT_RUNNER_TOKEN"):
                env["CONDUIT_RUNNER_TOKEN"] = secrets.token_urlsafe(32)
            return _serve(env, port)
    except ServicesUnavailable as error:
        print(f"conduit dev: {error}", file=sys.stderr)
        return 2


def _serve(env: dict[str, str], port: int) -> int:
    from conduit.cli import migrate

    migrate(env["DATABASE_URL"])
    children = Children(env)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        runner_port = free_port()
        runner_url = f"http://127.0.0.1:{runner_port}"
        children.start(
            "runner",
            "runner",
            "echo",
            "--port",
            str(runner_port),
            "--concurrency",
            str(CONCURRENCY),
        )
        wait_until(
            lambda: _status_ok(f"{runner_url}/health-check", "status", "READY"), "runner", children
        )
        _admin(env, "create-model", MODEL, "--runner-url", runner_url)
        _admin(env, "create-deployment", MODEL, "--model", MODEL, "--visibility", "public")
        # An admin: its token also signs in to the operator page (/ops).
        token = _admin(env, "create-account", "dev", "--admin")
        children.start("api", "api", "--port", str(port))
        children.start(
            "director",
            "director",
            "--deployment",
            MODEL,
            "--runner-url",
            runner_url,
            "--concurrency",
            str(CONCURRENCY),
        )
        api_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _status_ok(f"{api_url}/health"), "api", children)
        _print_banner(api_url, runner_url, token, env)
        while not stop.wait(0.5):
            problem = children.exited()
            if problem:
                print(f"conduit dev: {problem}; stopping", file=sys.stderr)
                return 1
        return 0
    finally:
        children.stop()


def _print_banner(api_url: str, runner_url: str, token: str, env: dict[str, str]) -> None:
    print(
        f"""
Conduit is running.
  API:       {api_url}
  Token:     {token}
  Runner:    {runner_url}
  Operators: {api_url}/ops  (sign in with the token above)
  Database:  {env["DATABASE_URL"]}
  Redis:     {env["REDIS_URL"]}

Try it:
  curl -s -X POST {api_url}/v1/models/{MODEL}/predictions \\
    -H "Authorization: Bearer {token}" -H "Content-Type: application/json" \\
    -d '{{"input": {{"prompt": "hello", "n": 3}}}}'

Press Ctrl-C to stop everything.
""",
        flush=True,
    )
