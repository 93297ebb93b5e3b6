"""Calls admitted before their messages are read (``gateway.admission``): a real
``conduit gateway`` costs an unauthenticated client no memory for what it sends, bounds the
bytes authenticated calls hold, and the streams one connection has open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog.records import AccountInfo
from core.ports import free_port
from gateway.admission import ByteBudget
from gateway.executor import TaskResult
from gateway.metrics import GatewayMetrics
from gateway.proto.inference_pb2 import BlockInferencePacket, FileInfo
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from gateway.server import start, token_auth
from gateway.settings import GatewaySettings
from gateway.task import Task
from tests.fixtures.memory import peak_rss, reset_peak_rss, rss
from tests.fixtures.processes import Launcher, Proc
from tests.fixtures.waiting import until

MIB = 1024 * 1024
CALLS = 12
MESSAGE = 24 * MIB
BOGUS = "r8_" + "b" * 40


@pytest.fixture
def gateway_proc(launcher: Launcher) -> Iterator[tuple[Proc, str]]:
    """A gateway of the test's own: its memory is this test's alone."""
    proc, address = launcher.gateway()
    try:
        yield proc, address
    finally:
        proc.stop()


async def _calls(address: str, metadata: list[list[tuple[str, str]]]) -> list[BaseException]:
    """One large task per entry of ``metadata``, all at once; what each call raised."""
    limit = 128 * MIB
    options = [("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)]
    packet = BlockInferencePacket(
        block_id="blk-abcdefgh", files=[FileInfo(metadata="{}", file_data=b"\x01" * MESSAGE)]
    )
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = BlockInferenceServiceStub(channel)
        calls = [stub.infer(packet, metadata=each, timeout=60) for each in metadata]
        return list(await asyncio.gather(*calls, return_exceptions=True))


def test_unauthenticated_calls_are_refused_before_their_messages_are_read(
    gateway_proc: tuple[Proc, str],
) -> None:
    """12 unauthenticated calls of 24 MiB each, at once (without a token, and with a
    well-shaped unknown one): all refused, and the gateway's peak resident memory grows by a
    small fraction of what they sent (reading them whole cost +257 to +420 MiB)."""
    proc, address = gateway_proc
    assert proc.popen is not None
    pid = proc.popen.pid
    before = rss(pid)
    reset_peak_rss(pid)
    half = CALLS // 2
    metadata = [[]] * half + [[("authorization", f"Bearer {BOGUS}")]] * (CALLS - half)
    refused = asyncio.run(_calls(address, metadata))
    codes = [
        error.code() if isinstance(error, grpc.aio.AioRpcError) else error for error in refused
    ]
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * CALLS
    grown = peak_rss(pid) - before
    print(f"gateway peak RSS growth: {grown / MIB:.1f} MiB")
    assert grown < 48 * MIB, f"the gateway grew by {grown / MIB:.0f} MiB"


class Holding:
    """An executor whose tasks run until released: it counts those running at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.release = asyncio.Event()

    async def run(self, account: AccountInfo, task: Task, deadline: float | None) -> TaskResult:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        return TaskResult({}, [])

    async def stream(
        self, account: AccountInfo, task: Task, deadline: float | None
    ) -> AsyncIterator[Any]:
        yield (await self.run(account, task, deadline)).data


async def test_streams_per_connection_are_bounded(engine: AsyncEngine, token: str) -> None:
    """``CONDUIT_GATEWAY_MAX_CONCURRENT_STREAMS`` calls of one connection run at once: a
    third waits for one of two to end."""
    settings = GatewaySettings(max_concurrent_streams=2)
    executor = Holding()
    served = await start(settings, executor, token_auth(engine, settings), free_port())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stub = BlockInferenceServiceStub(channel)
            metadata = [("authorization", f"Bearer {token}")]
            packet = BlockInferencePacket(block_id="blk-abcdefgh")
            calls = [stub.infer(packet, metadata=metadata, timeout=60) for _ in range(3)]

            async def running(count: int) -> bool:
                return executor.running == count

            await until(lambda: running(2), "two calls running")
            calls[0].cancel()
            await until(lambda: running(2), "the third call running once the first ended")
            assert executor.most == 2
            executor.release.set()
            for call in calls[1:]:
                await call
    finally:
        await served.stop(None)


async def test_a_call_refused_before_it_is_read_is_counted(engine: AsyncEngine) -> None:
    settings = GatewaySettings()
    metrics = GatewayMetrics()
    served = await start(
        settings, Holding(), token_auth(engine, settings), free_port(), metrics=metrics
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stub = BlockInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.infer(BlockInferencePacket(block_id="blk-abcdefgh"), timeout=60)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        counted = metrics.registry.get_sample_value(
            "conduit_gateway_calls_total", {"status": "UNAUTHENTICATED"}
        )
        assert counted == 1
    finally:
        await served.stop(None)


async def test_a_byte_budget_holds_takers_in_order() -> None:
    budget = ByteBudget(10)

    async def waiting(count: int) -> bool:
        return len(budget._waiting) == count

    await budget.take(6)
    second = asyncio.create_task(budget.take(6))
    third = asyncio.create_task(budget.take(1))
    await until(lambda: waiting(2), "both takers waiting")  # the third too: first come first
    budget.give(6)
    await second
    await third
    assert budget.free == 3
    last = asyncio.create_task(budget.take(10))
    await until(lambda: waiting(1), "the last taker waiting")
    last.cancel()
    with pytest.raises(asyncio.CancelledError):
        await last
    budget.give(7)
    assert budget.free == 10
