"""The Open Inference Protocol on a live stack: a block of the session's echo deployment as a
model, ``ModelInfer`` answered as tensors, and ``ModelStreamInfer`` streaming the model's items
as it yields them, its sequence a session."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import httpx
import pytest

from gateway.proto.grpc_service_pb2 import ModelInferRequest, ModelReadyRequest
from gateway.proto.grpc_service_pb2_grpc import GRPCInferenceServiceStub
from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.gateway_stack import Live, served
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for
from tests.gateway.test_oip import auth, outputs_of, param, tensor


@pytest.fixture(scope="module")
def echo_block(stack: Stack, launcher: Launcher, admin: Admin, redis_url: str) -> Iterator[str]:
    """A block of an echo deployment of this module's own (its own runner and director: the
    session's echo runner is restarted and drained by other tests)."""
    runner, runner_url = launcher.runner("echo", concurrency=2)
    name = f"oip{uuid.uuid4().hex[:6]}/echo"
    admin.create_model(name, runner_url)
    admin.create_deployment(name, name, shards=1, visibility="public")
    director = launcher.director(name, runner_url, concurrency=2)
    try:
        wait_for(lambda: served(redis_url, name), "the echo runner ready in the fleet")
        yield admin.create_block(name)
    finally:
        director.stop()
        runner.stop()


@pytest.fixture
async def stub(live: Live) -> AsyncIterator[GRPCInferenceServiceStub]:
    async with grpc.aio.insecure_channel(live.address) as channel:
        yield GRPCInferenceServiceStub(channel)


def echo_request(block: str, prompt: str, n: int, delay: float, **parameters: Any) -> Any:
    return ModelInferRequest(
        model_name=block,
        id="r",
        inputs=[
            tensor("prompt", "BYTES", [1], bytes_contents=[prompt.encode()]),
            tensor("n", "INT64", [1], int64_contents=[n]),
            tensor("delay", "FP64", [1], fp64_contents=[delay]),
        ],
        parameters={key: param(value) for key, value in parameters.items()},
    )


async def statuses(api_url: str, token: str) -> list[str]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers) as client:
        return [p["status"] for p in (await client.get("/v1/predictions")).json()["results"]]


async def test_model_infer_runs_the_block(
    stub: GRPCInferenceServiceStub, live: Live, echo_block: str, token: str
) -> None:
    ready = await stub.ModelReady(ModelReadyRequest(name=echo_block), metadata=auth(token))
    assert ready.ready
    answer = await stub.ModelInfer(echo_request(echo_block, "t", 3, 0.0), metadata=auth(token))
    assert outputs_of(answer)["output"] == ("BYTES", [3], ["t-0", "t-1", "t-2"])
    assert await statuses(live.api_url, token) == ["succeeded"]


async def test_stream_infer_sends_items_as_the_model_yields_them(
    stub: GRPCInferenceServiceStub, live: Live, echo_block: str, token: str
) -> None:
    call = stub.ModelStreamInfer(metadata=auth(token))
    await call.write(echo_request(echo_block, "s", 3, 2.0, sequence_id="seq", sequence_start=True))
    first = await call.read()
    assert first.error_message == ""
    assert outputs_of(first.infer_response)["output"][2] == ["s-0"]
    # The first item came while the model was still making the others.
    assert await statuses(live.api_url, token) == ["processing"]
    rest = [await call.read() for _ in range(2)]
    assert [outputs_of(r.infer_response)["output"][2] for r in rest] == [["s-1"], ["s-2"]]
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert await statuses(live.api_url, token) == ["succeeded"]
