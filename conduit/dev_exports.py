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
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

ENV_FILE = Path(".conduit") / "dev.env"


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
    lines = [
        f"# conduit dev (pid {os.getpid()}): eval these in another shell, or source this file",
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
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


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
