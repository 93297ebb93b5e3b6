"""``conduit dev`` through the real CLI: start it, call it as its banner says, stop it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from conduit.services import ServiceUrls
from core.ports import free_port
from tests.fixtures.api import wait_status
from tests.fixtures.processes import base_env
from tests.fixtures.servers import create_database
from tests.fixtures.waiting import wait_for

# dev names its deployment conduit/echo like the session's stack, and stream names carry the
# deployment's name, so dev gets a Redis database of its own as well as a fresh Postgres one.
DEV_REDIS_DB = 7


@dataclass
class Output:
    """Everything a process (and the children sharing its stdout) writes, read by a thread."""

    lines: list[str] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)

    def drain(self, stream: Iterator[bytes]) -> None:
        for line in stream:
            self.lines.append(line.decode(errors="replace").rstrip("\n"))
        self.closed.set()

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass(frozen=True)
class Banner:
    api_url: str
    runner_url: str
    token: str
    curl: str


def _parse_banner(text: str) -> Banner | None:
    if "Press Ctrl-C" not in text:
        return None
    found = {
        key: re.search(rf"^\s+{key}:\s+(\S+)", text, re.MULTILINE)
        for key in ("API", "Runner", "Token")
    }
    curl = re.search(r"^\s+(curl .*?[^\\])$", text, re.MULTILINE | re.DOTALL)
    assert all(found.values()) and curl, text
    api, runner, token = (match[1] for match in found.values() if match)
    return Banner(api, runner, token, curl[1])


def _session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``: dev and everything it started."""
    members = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            members.append(int(entry))
    return members


def _port_open(url: str) -> bool:
    parts = urlsplit(url)
    assert parts.hostname and parts.port
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((parts.hostname, parts.port)) == 0


@pytest.fixture
def dev_env(services: ServiceUrls, redis_url: str) -> dict[str, str]:
    database_url = create_database(services.database_url, f"conduit_dev_{uuid.uuid4().hex[:12]}")
    dev_redis = urlunsplit(urlsplit(redis_url)._replace(path=f"/{DEV_REDIS_DB}"))
    return base_env(database_url, dev_redis)


@pytest.fixture
def dev_flags() -> list[str]:
    return []


@pytest.fixture
def dev(
    dev_env: dict[str, str], dev_flags: list[str], tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Output]]:
    # Its own session, so the test can see (and, on failure, stop) everything dev starts; its
    # own directory, for the .conduit/dev.env it writes.
    proc = subprocess.Popen(
        [sys.executable, "-m", "conduit", "dev", "--port", str(free_port()), *dev_flags],
        env=dev_env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    output = Output()
    reader = threading.Thread(target=output.drain, args=(proc.stdout,), daemon=True)
    reader.start()
    yield proc, output
    if proc.poll() is None or _session_members(proc.pid):
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join(timeout=10)
    proc.stdout.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("interrupt", ["dev", "terminal"])
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_dev_serves_the_printed_curl_and_stops_everything_on_sigint(
    dev: tuple[subprocess.Popen[bytes], Output], interrupt: str
) -> None:
    proc, output = dev

    def banner() -> Banner | None:
        if proc.poll() is not None:
            raise AssertionError(f"conduit dev exited {proc.returncode}:\n{output.text}")
        return _parse_banner(output.text)

    printed = wait_for(banner, "conduit dev's banner", timeout=150, interval=0.2)
    children = [pid for pid in _session_members(proc.pid) if pid != proc.pid]
    assert len(children) >= 3, output.text  # runner, api, director
    # A first run says nothing that alarms: no warning, no alembic plug-in lines.
    assert not re.search(r"WARNING|Traceback|alembic\.runtime", output.text), output.text

    if shutil.which("curl"):
        ran = subprocess.run(["sh", "-c", printed.curl], capture_output=True, text=True, timeout=30)
        assert ran.returncode == 0, ran.stderr
        body = ran.stdout
    else:
        body = _post_like_curl(printed)
    created = json.loads(body)
    assert created["status"] == "starting", body
    assert created["model"] == "conduit/echo"

    headers = {"Authorization": f"Bearer {printed.token}"}
    with httpx.Client(base_url=printed.api_url, headers=headers, timeout=10) as client:
        done = wait_status(client, created["id"])
    assert done["status"] == "succeeded", done
    assert done["output"] == ["hello-0", "hello-1", "hello-2"]

    if interrupt == "terminal":  # Ctrl-C: the whole foreground process group gets SIGINT
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0, output.text
    wait_for(lambda: not _session_members(proc.pid), "dev's children to exit", timeout=10)
    for url in (printed.api_url, printed.runner_url):
        assert not _port_open(url), url
    # Every holder of the output pipe (dev and its children) has closed it.
    assert output.closed.wait(timeout=10)


def _post_like_curl(printed: Banner) -> str:
    """The printed curl's method, URL, headers and body, sent with httpx."""
    url = re.search(r"-X POST (\S+)", printed.curl)
    payload = re.search(r"-d '(.*)'", printed.curl)
    assert url and payload, printed.curl
    headers = dict(h.split(": ", 1) for h in re.findall(r'-H "([^"]+)"', printed.curl))
    return httpx.post(url[1], headers=headers, content=payload[1], timeout=30).text


def _second_shell(cwd: Path, script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a shell that knows nothing of the stack (no DATABASE_URL, REDIS_URL or
    CONDUIT_* names, a PATH without Conduit's virtualenv) but what it evals."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CONDUIT_", "REPLICATE_")) and k not in ("DATABASE_URL", "REDIS_URL")
    }
    env["PATH"] = path
    env["CONDUIT_LOG_LEVEL"] = "WARNING"
    return subprocess.run(
        ["sh", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dev_flags", [["--with-files", "--with-gateway"]])
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_dev_exports_drive_the_cli_and_clients_from_a_second_shell(
    dev: tuple[subprocess.Popen[bytes], Output], dev_flags: list[str], tmp_path: Path
) -> None:
    proc, output = dev

    def banner() -> Banner | None:
        if proc.poll() is not None:
            raise AssertionError(f"conduit dev exited {proc.returncode}:\n{output.text}")
        return _parse_banner(output.text)

    printed = wait_for(banner, "conduit dev's banner", timeout=200, interval=0.2)
    conduit = Path(sys.executable).parent / "conduit"
    assert f"CLI:       {conduit.resolve()}" in output.text
    runner_token = re.search(r"^\s+Runner token: (\S+)", output.text, re.MULTILINE)
    assert runner_token, output.text
    files_runner = re.search(r"^\s+Runner:\s+(\S+)\s+\(conduit/files\)", output.text, re.M)
    gateway = re.search(r"^\s+Gateway:\s+(\S+)", output.text, re.MULTILINE)
    assert files_runner and gateway, output.text

    # Eval what conduit dev --env prints; then the CLI is on the PATH and reaches dev's
    # database and Redis, and dev's runner token registers a model from dev's runner.
    script = f"""set -e
eval "$({conduit} dev --env)"
test "$REPLICATE_BASE_URL" = {printed.api_url}
test "$CONDUIT_RUNNER_TOKEN" = {runner_token[1]}
test "$CONDUIT_PUBLIC_URL" = {printed.api_url}
test "$CONDUIT_FILES_DIR" = {(tmp_path / ".conduit" / "files").resolve()}
conduit admin list-deployments --json
conduit admin create-model me/files --runner-url {files_runner[1]} >&2
"""
    ran = _second_shell(tmp_path, script)
    assert ran.returncode == 0, ran.stderr
    deployments = {d["owner"] + "/" + d["name"] for d in json.loads(ran.stdout)}
    assert deployments == {"conduit/echo", "conduit/files"}
    assert "created account me" in ran.stderr
    # The file it wrote is what --env printed, private to its user and ignored by git.
    env_file = tmp_path / ".conduit" / "dev.env"
    assert env_file.stat().st_mode & 0o077 == 0
    in_repo = subprocess.run(["git", "check-ignore", "-q", ".conduit/dev.env"], cwd=ROOT)
    assert in_repo.returncode == 0

    # The official client's variables reach the file model; the gateway listens.
    client = _second_shell(
        tmp_path,
        f'. {env_file} && {sys.executable} -c "{_FILES_CLIENT}"',
    )
    assert client.returncode == 0, client.stderr
    assert client.stdout.strip() == "b'hello file'"
    assert _port_open(f"grpc://{gateway[1]}")

    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0, output.text
    assert not env_file.exists()  # gone with the stack it described


ROOT = Path(__file__).resolve().parents[2]

#: The official Python client, configured by REPLICATE_API_TOKEN and REPLICATE_BASE_URL alone;
#: the output's URL (http: here, which the client leaves a string) fetched without a token.
_FILES_CLIENT = (
    "import io, urllib.request, replicate; "
    "out = replicate.run('conduit/files', input={'file': io.BytesIO(b'hello file')}); "
    "print(urllib.request.urlopen(str(out)).read())"
)
