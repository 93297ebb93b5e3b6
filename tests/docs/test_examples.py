"""Every example in the docs runs as printed against the live stack (api, echo runner and
director for ``conduit/echo``), as an admin account's token, as ``./scripts/dev``'s is: only
the values a reader substitutes are replaced (``tests/docs/examples.py``). A block the page
marks ``<!-- not-run: … -->`` is skipped with its reason, so ``-ra`` lists what is not run.
A page's blocks run in their order on the page, each from what the ones before it made, as a
reader runs them; a shell block has the dev stack's exports (``conduit dev --env``).

Shell examples run under ``set -euo pipefail`` with ``curl`` failing on an HTTP error
(``--fail-with-body``), so an example that answers 4xx or 5xx fails here as it would fail its
reader."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from subprocess import PIPE
from typing import Any

import httpx
import pytest

from core.ports import free_port
from tests.conftest import ECHO, Stack
from tests.docs.examples import DOCS, ROOT, Example, examples
from tests.fixtures.admin import Admin
from tests.fixtures.gateway_stack import served
from tests.fixtures.js_client import JS, NODE
from tests.fixtures.js_client import missing as js_missing
from tests.fixtures.pgbouncer import ensure_pgbouncer
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.e2e

EXAMPLES = examples()
#: Seconds one example may take before the test gives up on it (a liveness deadline).
DEADLINE = 90
#: The api's address and the token as the pages print them.
PRINTED_API = "http://127.0.0.1:8000"
PRINTED_TOKEN = "r8_..."
#: What a shell example runs before its first line.
SHELL_PRELUDE = 'set -euo pipefail\ncurl() { command curl --fail-with-body "$@"; }\n'
#: The file model the pages name (``conduit runner files``), served when an example needs it.
FILES_MODEL = "conduit/files"
#: The gateway's address and a block of the files model as the pages print them.
PRINTED_GATEWAY = "127.0.0.1:50051"
PRINTED_BLOCK = "blk-7k2m9q4x"
#: A block of conduit/echo on the gateway, as the Open Inference Protocol's example prints it.
PRINTED_ECHO_BLOCK = "blk-3n8v2k5p"
#: What the gateway fixture serves: an example naming any of them (a block registered in a
#: named graph over REST, say) gets the gateway and its blocks.
GATEWAY_PRINTED = (PRINTED_GATEWAY, PRINTED_BLOCK, PRINTED_ECHO_BLOCK)
#: tritonclient's own environment (it needs protobuf < 7), made by scripts/bootstrap.
TRITON_PYTHON = ROOT / ".venv-triton" / "bin" / "python"
#: Ports a tutorial names for the processes it starts. The scale-out walkthrough's (its Redis
#: servers, Sentinel, PgBouncer, runner, director, api, and cluster nodes with their bus ports)
#: have five digits and lie below the ephemeral range (32768-60999): a free port put in for one
#: never holds another's digits.
PRINTED_PORTS = (
    *("5050", "5051", "5070", "5071", "5072"),
    *("16390", "16391", "26390", "16432", "15100", "15101", "18100"),
    *("17001", "17002", "17003", "27001", "27002", "27003"),
)
#: A file of the reader's that an example opens or uploads by name: made for it here.
READER_FILE = re.compile(r'(?:open|files\.create)\("([\w.-]+)"')


@pytest.fixture(scope="module")
def reader(stack: Stack, admin: Admin) -> dict[str, str]:
    """The values a reader of the docs has: the api, an admin token (as the dev stack's), a
    finished prediction and a block of ``conduit/echo``, and the runner's URL; once the fleet
    knows the runner (its hardware listed), as a reader finds it a moment after the start."""
    token = admin.create_account(f"docs-{uuid.uuid4().hex[:10]}", admin_flag=True)
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as http:
        made = http.post(
            f"/v1/models/{ECHO}/predictions",
            json={"input": {"prompt": "hello", "n": 3}},
            headers={"Prefer": "wait"},
        )
        assert made.status_code == 201, made.text
        block = http.post("/v1/blocks", json={"deployment": ECHO})
        assert block.status_code == 201, block.text
        wait_for(lambda: http.get("/v1/hardware").json(), "the fleet's hardware")
    prediction = made.json()
    return {
        "api": stack.api_url,
        "token": token,
        "id": prediction["id"],
        "stream": prediction["urls"]["stream"],
        "block": block.json()["id"],
        "runner": stack.runner_url,
    }


def exports(launcher: Launcher, reader: dict[str, str]) -> dict[str, str]:
    """What a shell with the dev stack's exports has (``conduit dev --env``): the database,
    Redis and runner token, the official clients' token and URL, the api's public URL and the
    file store, ``conduit`` on the PATH."""
    env = launcher.env
    bindir = str(Path(sys.executable).parent)
    return {
        **{
            name: env[name]
            for name in ("DATABASE_URL", "REDIS_URL", "CONDUIT_RUNNER_TOKEN", "CONDUIT_FILES_DIR")
        },
        "REPLICATE_API_TOKEN": reader["token"],
        "REPLICATE_BASE_URL": reader["api"],
        "CONDUIT_PUBLIC_URL": reader["api"],
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
    }


@pytest.fixture(scope="module")
def files_model(stack: Stack, launcher: Launcher, admin: Admin, redis_url: str) -> Iterator[str]:
    """A public deployment of the ``files`` model on a runner of its own, under a name of
    this module's (the pages' ``conduit/files`` is substituted by it)."""
    proc, url = launcher.runner("files", concurrency=2)
    name = f"docs-{uuid.uuid4().hex[:8]}/files"
    admin.create_model(name, url)
    admin.create_deployment(name, name, shards=1, visibility="public")
    director = launcher.director(name, url, concurrency=2)
    try:
        wait_for(lambda: served(redis_url, name), "the files runner in the fleet")
        yield name
    finally:
        director.stop()
        proc.stop()


@pytest.fixture(scope="module")
def gateway(launcher: Launcher, admin: Admin, files_model: str) -> Iterator[dict[str, str]]:
    """The gateway, and a block of the files model."""
    proc, address = launcher.gateway()
    try:
        yield {
            "gateway": address,
            "files_block": admin.create_block(files_model),
            "echo_block": admin.create_block(ECHO),
        }
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def workdirs() -> dict[str, Path]:
    """One working directory per page: a page's blocks see what the ones before them wrote."""
    return {}


@pytest.fixture(scope="module")
def sessions() -> Iterator[list[int]]:
    """The process groups of the shell examples: what one starts in the background (a model
    server, a director) is stopped once the module is done."""
    groups: list[int] = []
    yield groups
    for group in reversed(groups):
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def ports() -> dict[str, str]:
    """Free ports for the fixed ones a tutorial names (another run of the suite on this
    machine may be using them)."""
    return {printed: str(free_port()) for printed in PRINTED_PORTS}


def substituted(code: str, reader: dict[str, str]) -> str:
    for printed, value in (
        (PRINTED_API, reader["api"]),
        (PRINTED_TOKEN, reader["token"]),
        ("<urls.stream of the prediction>", reader["stream"]),
        ("<id>", reader["id"]),
        ("blk-…", reader["block"]),
        ("<runner URL>", reader["runner"]),
        ("<weights URL>", reader.get("weights", "<weights URL>")),
        *((port, reader.get(port, port)) for port in PRINTED_PORTS),
        (FILES_MODEL, reader.get("files", FILES_MODEL)),
        (PRINTED_GATEWAY, reader.get("gateway", PRINTED_GATEWAY)),
        (PRINTED_BLOCK, reader.get("files_block", PRINTED_BLOCK)),
        (PRINTED_ECHO_BLOCK, reader.get("echo_block", PRINTED_ECHO_BLOCK)),
    ):
        code = code.replace(printed, value)
    return code


def test_examples_are_found_and_each_is_run_or_says_why_not() -> None:
    markers = sum(p.read_text().count("<!-- not-run:") for p in DOCS.rglob("*.md"))
    assert markers == sum(e.not_run is not None for e in EXAMPLES), (
        "a <!-- not-run: … --> marker stands before no runnable block"
    )
    assert any(e.page == "tutorials/using-it.md" and e.not_run is None for e in EXAMPLES)


def _workdir(
    example: Example, workdirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The page's working directory (one per page: its examples build on each other), with
    what the example needs of the reader's machine."""
    if "pgbouncer" in example.code:
        # The reader has installed it, as the page asks; here it is installed when missing.
        ensure_pgbouncer()
    if example.page not in workdirs:
        workdirs[example.page] = tmp_path_factory.mktemp("page")
        # As from the root of a checkout, for the paths of it an example names.
        (workdirs[example.page] / "gateway").symlink_to(ROOT / "gateway")
    return workdirs[example.page]


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example_runs_as_printed(
    example: Example,
    reader: dict[str, str],
    launcher: Launcher,
    workdirs: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> None:
    if example.not_run is not None:
        pytest.skip(f"{example.name}: not-run: {example.not_run}")
    reader = {**reader, **request.getfixturevalue("ports")}
    if "<weights URL>" in example.code:
        reader = {**reader, "weights": _newest_weights(reader)}
    if FILES_MODEL in example.code:
        reader = {**reader, "files": request.getfixturevalue("files_model")}
    if any(printed in example.code for printed in GATEWAY_PRINTED):
        reader = {**reader, **request.getfixturevalue("gateway")}
    tmp_path = _workdir(example, workdirs, tmp_path_factory)
    if example.file is not None:
        (tmp_path / example.file).write_text(example.code)
        if example.language == "python":
            compile(example.code, example.file, "exec")
        return
    for name in READER_FILE.findall(example.code):
        (tmp_path / name).write_bytes(f"{name}: a file of the reader's\n".encode())
    code = substituted(example.code, reader)
    if "/run " in code or "/run\n" in code:
        _wait_for_a_runner_on_the_lane(reader)
    env = {
        **os.environ,
        **exports(launcher, reader),
        "API": reader["api"],
        "TOKEN": reader["token"],
    }
    command = _written(example, code, tmp_path)
    # A session of its own: what the example starts in the background stays in its group.
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=PIPE, stderr=PIPE, text=True, start_new_session=True
    )
    request.getfixturevalue("sessions").append(process.pid)
    stdout, stderr = process.communicate(timeout=DEADLINE)
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    assert done.returncode == 0, (
        f"{example.name} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    )


def _written(example: Example, code: str, workdir: Path) -> list[str]:
    """The example written into ``workdir`` as a file, and the command that runs it."""
    if example.language == "python":
        (workdir / "example.py").write_text(code)
        if "import tritonclient" not in code:
            return [sys.executable, "example.py"]
        if not TRITON_PYTHON.is_file():
            pytest.skip("tritonclient's environment is missing: run ./scripts/bootstrap")
        return [str(TRITON_PYTHON), "example.py"]
    if example.language == "js":
        if js_missing() is not None:
            pytest.skip(js_missing() or "")
        assert NODE is not None
        if not (workdir / "node_modules").exists():
            (workdir / "node_modules").symlink_to(JS / "node_modules")
        (workdir / "example.mjs").write_text(code)
        return [NODE, "example.mjs"]
    bash = shutil.which("bash")
    assert bash is not None
    (workdir / "example.sh").write_text(SHELL_PRELUDE + code)
    return [bash, "example.sh"]


def _newest_weights(reader: dict[str, str]) -> str:
    """The weights of the reader's newest training, which a page's reader copies from it."""
    headers = {"Authorization": f"Bearer {reader['token']}"}
    trainings = httpx.get(f"{reader['api']}/v1/trainings", headers=headers, timeout=30)
    newest = trainings.json()["results"][0]
    assert newest["status"] == "succeeded", newest
    return str(newest["output"]["weights"])


def _wait_for_a_runner_on_the_lane(reader: dict[str, str]) -> None:
    """The fleet view takes a heartbeat or two to see a new runner: wait until ``/run`` has
    one, as a reader would find it a moment after the stack came up."""
    headers = {"Authorization": f"Bearer {reader['token']}"}

    def probe() -> Any:
        answer = httpx.post(
            f"{reader['api']}/v1/deployments/{ECHO}/run",
            json={"input": {"prompt": "ready"}},
            headers=headers,
            timeout=30,
        )
        return answer.status_code == 200 or None

    wait_for(probe, "a runner on the synchronous lane")
