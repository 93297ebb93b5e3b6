"""What ``conduit dev`` tells a second shell: its banner, and the ``export`` lines it writes to
``.conduit/dev.env`` while it runs (``conduit dev --env`` prints them, for
``eval "$(conduit dev --env)"``).

The exports are the names the tools read: ``DATABASE_URL`` and ``REDIS_URL`` for ``conduit
admin``, ``CONDUIT_RUNNER_TOKEN`` for ``create-model`` against dev's runners,
``REPLICATE_API_TOKEN`` and ``REPLICATE_BASE_URL`` for the official clients, ``PATH`` with
the directory of this ``conduit`` (a checkout's ``.venv/bin`` is not on the PATH by itself),
and for a process of the reader's own (a director beside their model) the api's
``CONDUIT_PUBLIC_URL`` and the file store's absolute ``CONDUIT_FILES_DIR``: a director started
in another directory would otherwise keep its runner's output files in a store of its own,
which the api does not serve.

The file's first line names the pid of the ``conduit dev`` that wrote it and, where there is a
``/proc``, that process's start time: a file whose writer is gone (killed with SIGKILL, so it
could not remove it) or whose pid now belongs to another process describes a stack that is no
longer there, and :func:`read_env_file` removes it instead of handing out its exports.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

ENV_FILE = Path(".conduit") / "dev.env"

#: The writer's pid and start time (absent where there is no /proc) on the file's first line.
_HEADER = re.compile(r"# conduit dev \(pid (\d+)(?:, started (\d+))?\)")


class StaleEnvFile(Exception):
    """The env file was left by a ``conduit dev`` that is no longer running; it was removed."""

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        writer = f"conduit dev (pid {pid})" if pid is not None else "a conduit dev"
        super().__init__(f"no dev stack is running: removed {path}, left by {writer} that died")


@dataclass(frozen=True)
class DevStack:
    api_url: str
    token: str
    database_url: str
    redis_url: str
    runner_token: str
    runners: dict[str, str] = field(default_factory=dict)
    gateway: str | None = None
    files_dir: str | None = None


def conduit_path() -> Path:
    """The ``conduit`` this process runs as (the one beside its Python, in a virtualenv)."""
    beside = Path(sys.executable).parent / "conduit"
    found = beside if beside.is_file() else shutil.which("conduit")
    return Path(found).resolve() if found else beside


def exports(stack: DevStack) -> str:
    values = {
        "DATABASE_URL": stack.database_url,
        "REDIS_URL": stack.redis_url,
        "CONDUIT_RUNNER_TOKEN": stack.runner_token,
        "REPLICATE_API_TOKEN": stack.token,
        "REPLICATE_BASE_URL": stack.api_url,
        "CONDUIT_PUBLIC_URL": stack.api_url,
    }
    if stack.files_dir:
        values["CONDUIT_FILES_DIR"] = stack.files_dir
    pid = os.getpid()
    started = _start_time(pid)
    writer = f"pid {pid}" if started is None else f"pid {pid}, started {started}"
    lines = [
        f"# conduit dev ({writer}): eval these in another shell, or source this file",
        *(f"export {name}={shlex.quote(value)}" for name, value in values.items()),
        f'export PATH={shlex.quote(str(conduit_path().parent))}:"$PATH"',
    ]
    if stack.gateway:
        lines.append(f"# the gateway (gRPC): {stack.gateway}")
    return "\n".join(lines) + "\n"


def write_env_file(stack: DevStack, path: Path = ENV_FILE) -> Path:
    """Readable by this user alone: it holds tokens."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(exports(stack))
    return path.resolve()


def read_env_file(path: Path = ENV_FILE) -> str | None:
    """The exports of the running ``conduit dev``; None when there is no file. A file whose
    writer is no longer running is removed, and :class:`StaleEnvFile` raised."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    header = _HEADER.match(text)
    if header is None or not _running(int(header[1]), header[2]):
        path.unlink(missing_ok=True)
        raise StaleEnvFile(path, int(header[1]) if header else None)
    return text


def _running(pid: int, started: str | None) -> bool:
    """Whether ``pid`` is still the process that wrote the file: the same start time where
    the file has one (a pid is reused, in time), or else any process with that pid."""
    if started is not None:
        return _start_time(pid) == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, though hardly a dev stack here
        return True
    return True


def _start_time(pid: int) -> str | None:
    """When ``pid`` started, in clock ticks after boot (``/proc/PID/stat``'s 22nd field);
    None with no such process (or only its zombie, dead but not yet reaped) or no ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The second field, the command's name in parentheses, may hold spaces: count after it.
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def banner(stack: DevStack, env_file: Path, model: str) -> str:
    conduit = conduit_path()
    runners = "".join(f"\n  Runner:    {url}  ({name})" for name, url in stack.runners.items())
    gateway = f"\n  Gateway:   {stack.gateway}  (gRPC)" if stack.gateway else ""
    return f"""
Conduit is running.
  API:       {stack.api_url}
  Token:     {stack.token}{runners}{gateway}
  Operators: {stack.api_url}/ops  (sign in with the token above)
  Database:  {stack.database_url}
  Redis:     {stack.redis_url}
  Runner token: {stack.runner_token}  (CONDUIT_RUNNER_TOKEN of every runner here)
  CLI:       {conduit}

Try it:
  curl -s -X POST {stack.api_url}/v1/models/{model}/predictions \\
    -H "Authorization: Bearer {stack.token}" -H "Content-Type: application/json" \\
    -d '{{"input": {{"prompt": "hello", "n": 3}}}}'

In another shell, for the CLI and the official clients:
  eval "$({conduit} dev --env)"     # or: . {env_file}
  conduit admin list-deployments

Press Ctrl-C to stop everything.
"""
