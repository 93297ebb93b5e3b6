"""A block marked synchronous: through the ``/run`` lane on a gateway that joins it (no durable
write before the answer; the run is recorded after it), and on the durable path on one that
does not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from gateway.proto.inference_pb2 import BlockInferencePacket
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.gateway_stack import Live
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import until


@pytest.fixture(scope="module")
def lane_gateway(stack: Stack, launcher: Launcher) -> Iterator[str]:
    proc, address = launcher.gateway({"CONDUIT_GATEWAY_LANE": "true"})
    try:
        yield address
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def synchronous_block(stack: Stack, admin: Admin) -> str:
    return admin.create_block(ECHO, synchronous=True)


async def _run(address: str, block: str, token: str, prompt: str) -> Any:
    async with grpc.aio.insecure_channel(address) as channel:
        answer = await BlockInferenceServiceStub(channel).infer(
            BlockInferencePacket(block_id=block, data=json.dumps({"prompt": prompt})),
            metadata=[("authorization", f"Bearer {token}")],
        )
    return json.loads(answer.data)


async def _sources(api_url: str, token: str) -> list[str]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers) as client:
        listed = (await client.get("/v1/predictions")).json()["results"]
    return [p["source"] for p in listed]


async def test_a_synchronous_block_runs_through_the_lane(
    stack: Stack, lane_gateway: str, synchronous_block: str, token: str
) -> None:
    # The lane learns its runners from the fleet registry: the first run may find none yet.
    async def answered() -> list[str] | None:
        try:
            return await _run(lane_gateway, synchronous_block, token, "fast")
        except grpc.aio.AioRpcError as error:
            if error.code() is not grpc.StatusCode.UNAVAILABLE:
                raise
            return None

    assert await until(answered, "the lane running the block", timeout=30) == ["fast-0"]
    sources = await until(
        lambda: _listed(stack.api_url, token), "the run recorded after its answer", timeout=30
    )
    assert "gateway" not in sources  # recorded as a /run run, not a queued prediction


async def _listed(api_url: str, token: str) -> list[str] | None:
    return await _sources(api_url, token) or None


async def test_without_the_lane_a_synchronous_block_takes_the_durable_path(
    stack: Stack, live: Live, admin: Admin, token: str
) -> None:
    block = admin.create_block(live.deployment, synchronous=True)  # the inspect model's
    answer = await _run(live.address, block, token, "slow")
    assert answer == {"got": {"prompt": "slow"}}
    assert await _sources(stack.api_url, token) == ["gateway"]
