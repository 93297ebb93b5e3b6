"""A session keeps what it resolved in Redis: its later tasks, on any gateway replica, skip
resolving their block (and their graph's checks). Shown by deleting the block after a
session's first task: within the route TTL the session's next task still runs on a second
gateway that never saw the block, while a new session is refused."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from blocks import blocks
from catalog.lookups import account_for_token
from gateway.proto.inference_pb2 import BlockInferencePacket
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from tests.fixtures.admin import Admin
from tests.fixtures.gateway_stack import Live
from tests.fixtures.processes import Launcher
from tracker.gateway_keys import session_keys


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def infer(address: str, token: str, packet: BlockInferencePacket) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        answer = await BlockInferenceServiceStub(channel).infer(
            packet, metadata=[("authorization", f"Bearer {token}")]
        )
    return answer.data


async def test_a_session_resolves_its_block_and_graph_once(
    live: Live,
    launcher: Launcher,
    admin: Admin,
    engine: AsyncEngine,
    redis: Redis,
    token: str,
) -> None:
    first, second = admin.create_block(live.deployment), admin.create_block(live.deployment)
    graph = json.dumps({"graph": {first: [second], second: []}})

    def packet(session: str, seq_no: int, output_ptr: str = "") -> BlockInferencePacket:
        return BlockInferencePacket(
            block_id=first,
            session_id=session,
            seq_no=seq_no,
            data='{"prompt": "r"}',
            output_ptr=output_ptr,
        )

    await infer(live.address, token, packet("kept", 1))
    await infer(live.address, token, packet("kept", 2, graph))
    account_id = await engine_account(engine, token)
    kept = await redis.hgetall(session_keys(account_id, "kept").route)
    assert {k.decode().partition(":")[0] for k in kept} == {"block", "graph"}

    assert await blocks.delete_block(engine, second)
    assert await blocks.delete_block(engine, first)
    other, address = launcher.gateway()  # a replica that never resolved either block
    try:
        assert json.loads(await infer(address, token, packet("kept", 3))) == {
            "got": {"prompt": "r"}
        }
        chained = json.loads(await infer(address, token, packet("kept", 4, graph)))
        assert chained == {"got": {"got": {"prompt": "r"}}}
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await infer(address, token, packet("new", 1))
        assert missing.value.code() is grpc.StatusCode.NOT_FOUND
    finally:
        other.stop()


async def engine_account(engine: AsyncEngine, token: str) -> int:
    account = await account_for_token(engine, token)
    assert account is not None
    return account.id
