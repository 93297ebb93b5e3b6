"""``conduit dev``: the whole stack on one machine, for a first run.

Uses ``DATABASE_URL``/``REDIS_URL`` when set, otherwise throwaway servers; migrates; starts an
echo runner, the api and a director as child processes; creates a dev account, the model and
deployment ``conduit/echo``; with ``--with-files`` also the file model ``conduit/files`` (its
input ``file``, its output a copy), with ``--with-gateway`` the gRPC gateway. Prints how to
call it and writes the exports a second shell needs (:mod:`conduit.dev_exports`). Ctrl-C stops
everything it started.
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
from pathlib import Path

import httpx

from conduit.binaries import ServicesUnavailable
from conduit.dev_exports import DevStack, banner, write_env_file
from conduit.services import local_services
from core.ports import free_port
from files.settings import FileSettings

#: Where the local file store is when CONDUIT_FILES_DIR is unset (relative to the processes'
#: directory, this one's).
_DEFAULT_FILES_DIR = FileSettings.model_fields["dir"].default

MODEL = "conduit/echo"
FILES_MODEL = "conduit/files"
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
    check: Callable[[], bool], what: str, children: Children, timeout: float = 120
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
    # Plain HTTP on loopback, polled many times a second while a process starts: no TLS
    # context (httpx would load the whole CA bundle for each call).
    response = httpx.get(url, timeout=2, verify=False)
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


def run_dev(port: int = 8000, with_files: bool = False, with_gateway: bool = False) -> int:
    try:
        with local_services(os.environ.get("REDIS_URL"), os.environ.get("DATABASE_URL")) as urls:
            env = {**os.environ, "REDIS_URL": urls.redis_url, "DATABASE_URL": urls.database_url}
            # The runner takes cancel and shutdown only with a token its director sends.
            if not env.get("CONDUIT_RUNNER_TOKEN"):
                env["CONDUIT_RUNNER_TOKEN"] = secrets.token_urlsafe(32)
            return _serve(env, port, with_files, with_gateway)
    except ServicesUnavailable as error:
        print(f"conduit dev: {error}", file=sys.stderr)
        return 2


def _serve_model(children: Children, env: dict[str, str], model: str, runner: str) -> str:
    """A runner of ``runner``, model and public deployment ``model``, and its director; the
    runner's URL."""
    runner_port = free_port()
    runner_url = f"http://127.0.0.1:{runner_port}"
    args = ("--port", str(runner_port), "--concurrency", str(CONCURRENCY))
    children.start(f"{runner} runner", "runner", runner, *args)
    wait_until(
        lambda: _status_ok(f"{runner_url}/health-check", "status", "READY"), "runner", children
    )
    _admin(env, "create-model", model, "--runner-url", runner_url)
    _admin(env, "create-deployment", model, "--model", model, "--visibility", "public")
    return runner_url


def _serve(env: dict[str, str], port: int, with_files: bool, with_gateway: bool) -> int:
    from conduit.runtime import migrate

    migrate(env["DATABASE_URL"])
    # The URLs the api hands out (files a runner downloads) name the port it listens on.
    env["CONDUIT_PUBLIC_URL"] = env.get("CONDUIT_PUBLIC_URL") or f"http://127.0.0.1:{port}"
    children = Children(env)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    env_file = None
    try:
        runners = {MODEL: _serve_model(children, env, MODEL, "echo")}
        if with_files:
            runners[FILES_MODEL] = _serve_model(children, env, FILES_MODEL, "files")
        # An admin: its token also signs in to the operator page (/ops).
        token = _admin(env, "create-account", "dev", "--admin")
        children.start("api", "api", "--port", str(port))
        for model, runner_url in runners.items():
            children.start(
                f"{model} director",
                "director",
                "--deployment",
                model,
                "--runner-url",
                runner_url,
                "--concurrency",
                str(CONCURRENCY),
            )
        gateway = None
        if with_gateway:
            gateway = f"127.0.0.1:{free_port()}"
            children.start("gateway", "gateway", "--port", gateway.rpartition(":")[2])
        api_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _status_ok(f"{api_url}/health"), "api", children)
        stack = DevStack(
            api_url,
            token,
            env["DATABASE_URL"],
            env["REDIS_URL"],
            env["CONDUIT_RUNNER_TOKEN"],
            runners,
            gateway,
            files_dir=str(Path(env.get("CONDUIT_FILES_DIR") or _DEFAULT_FILES_DIR).resolve()),
        )
        env_file = write_env_file(stack)
        print(banner(stack, env_file, MODEL), flush=True)
        while not stop.wait(0.5):
            problem = children.exited()
            if problem:
                print(f"conduit dev: {problem}; stopping", file=sys.stderr)
                return 1
        return 0
    finally:
        children.stop()
        if env_file is not None:
            env_file.unlink(missing_ok=True)
