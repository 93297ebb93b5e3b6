"""A gateway served in the test's own loop, on a free loopback port, whose executor echoes
the task back; and the stubs a user of the ``.proto`` generates for themselves."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.cache import Catalog
from catalog.records import AccountInfo
from core.ports import free_port
from gateway.executor import OutputFile, TaskResult
from gateway.oip.directory import BlockDirectory
from gateway.server import Gateway, start, token_auth
from gateway.settings import GatewaySettings
from gateway.task import Task
from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.gateway_stack import Live, live_fixture
from tests.fixtures.processes import Launcher

PROTO = Path(__file__).resolve().parents[2] / "gateway" / "proto" / "inference.proto"
#: Files up to this size are sent back as the answer's files; larger ones only counted.
ECHOED_FILE_BYTES = 1024 * 1024


class EchoExecutor:
    """Answers with what it was given. ``data`` ``{"wait": true}`` never answers; ``{"fail":
    true}`` raises what the gateway does not expect. Streamed, ``{"items": [...]}`` yields
    each item (then waits or fails as above); without items it yields the echo once."""

    async def run(self, account: AccountInfo, task: Task, deadline: float | None) -> TaskResult:
        if task.data.get("wait"):
            await asyncio.Event().wait()
        if task.data.get("fail"):
            raise RuntimeError("the block broke")
        echo: dict[str, Any] = {
            "account": account.name,
            "block_id": task.block_id,
            "session_id": task.session_id,
            "seq_no": task.seq_no,
            "data": task.data,
            "frame_ptr": task.frame_ptr.decode(),
            "query_parameters": task.query_parameters,
            "ts": task.ts,
            "files": [{"metadata": f.metadata, "size": len(f.data)} for f in task.files],
            "output_ptr": task.output_ptr,
            "has_deadline": deadline is not None,
        }
        files = [
            OutputFile(f.metadata, f.data) for f in task.files if len(f.data) <= ECHOED_FILE_BYTES
        ]
        return TaskResult(echo, files)

    async def stream(
        self, account: AccountInfo, task: Task, deadline: float | None
    ) -> AsyncIterator[Any]:
        items = task.data.get("items")
        if not isinstance(items, list):
            yield (await self.run(account, task, deadline)).data
            return
        for item in items:
            yield item
        if task.data.get("wait"):
            await asyncio.Event().wait()
        if task.data.get("fail"):
            raise RuntimeError("the block broke")


@pytest.fixture
async def gateway(engine: AsyncEngine) -> AsyncIterator[Gateway]:
    settings = GatewaySettings(default_deadline=2.0)
    served = await start(
        settings,
        EchoExecutor(),
        token_auth(engine, settings),
        free_port(),
        directory=BlockDirectory(Catalog(engine, 0.0), ttl=0.0),
    )
    yield served
    await served.stop(None)


@pytest.fixture
async def channel(gateway: Gateway) -> AsyncIterator[grpc.aio.Channel]:
    limit = 128 * 1024 * 1024  # above the gateway's: its limit is the one tested
    options = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}", options=options) as chan:
        yield chan


def generate_stubs(out: Path) -> Path:
    """``inference_pb2.py`` and ``inference_pb2_grpc.py`` in ``out``, as the seed's users make
    them: ``python -m grpc_tools.protoc`` on the ``.proto`` alone."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={PROTO.parent}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            PROTO.name,
        ],
        check=True,
    )
    return out


@pytest.fixture(scope="session")
def live(stack: Stack, launcher: Launcher, admin: Admin, redis_url: str) -> Iterator[Live]:
    """The live gateway stack (``tests.fixtures.gateway_stack``), once per session: its
    blocks have fixed ids."""
    yield from live_fixture(stack, launcher, admin, redis_url)
