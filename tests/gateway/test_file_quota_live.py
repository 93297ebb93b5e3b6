"""A gateway task's files are uploads of the caller: they count against the account's upload
quotas (``files.quota``) as the api's uploads do, and past them the task is
RESOURCE_EXHAUSTED naming the quota, with nothing queued."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from gateway.proto.inference_pb2 import BlockInferencePacket, FileInfo
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from tests.fixtures.gateway_stack import Live
from tests.fixtures.processes import Launcher


@pytest.fixture
async def stub(live: Live, launcher: Launcher) -> AsyncIterator[BlockInferenceServiceStub]:
    """A gateway of the test's own, whose accounts may hold one upload each."""
    proc, address = launcher.gateway({"CONDUIT_FILES_ACCOUNT_MAX_FILES": "1"})
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            yield BlockInferenceServiceStub(channel)
    finally:
        proc.stop()


async def test_task_files_past_the_accounts_quota_are_resource_exhausted(
    stub: BlockInferenceServiceStub, live: Live, token: str
) -> None:
    files = [FileInfo(metadata='{"file_name": "a.bin"}', file_data=b"a")]
    packet = BlockInferencePacket(block_id=live.block, data=json.dumps({"task": "t"}), files=files)
    auth = [("authorization", f"Bearer {token}")]
    await stub.infer(packet, metadata=auth)  # the account's one upload
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.infer(packet, metadata=auth)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value.details()
    assert refused.value.details().startswith("files[0]: ")
    assert "CONDUIT_FILES_ACCOUNT_MAX_FILES" in refused.value.details()
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=live.api_url, headers=headers) as client:
        assert len((await client.get("/v1/files")).json()["results"]) == 1
        assert len((await client.get("/v1/predictions")).json()["results"]) == 1
