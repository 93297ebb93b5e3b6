"""A named graph registered over REST and run through the gateway by its ``gph-`` id: each
step's input mapped from the task and earlier steps (JMESPath), a ``when`` that skips a step,
``return_steps``; a registered graph whose block went away is refused before anything runs."""

from __future__ import annotations

import json
import uuid
from typing import Any

import grpc
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from blocks import blocks as block_store
from gateway.proto.grpc_service_pb2 import ModelInferRequest, ModelReadyRequest
from gateway.proto.grpc_service_pb2_grpc import GRPCInferenceServiceStub
from gateway.proto.inference_pb2 import BlockInferencePacket
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from tests.fixtures.admin import Admin
from tests.fixtures.gateway_stack import Live
from tests.gateway.test_oip import auth, outputs_of, tensor


def register(live: Live, token: str, spec: dict[str, Any]) -> str:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=live.api_url, headers=headers) as client:
        answer = client.post("/v1/graphs", json=spec)
    assert answer.status_code == 201, answer.text
    graph_id: str = answer.json()["id"]
    return graph_id


async def run(live: Live, token: str, graph_id: str, data: dict[str, Any]) -> Any:
    async with grpc.aio.insecure_channel(live.address) as channel:
        answer = await BlockInferenceServiceStub(channel).infer(
            BlockInferencePacket(block_id=graph_id, data=json.dumps(data)),
            metadata=[("authorization", f"Bearer {token}")],
        )
    return json.loads(answer.data)


def spec(first: str, second: str, third: str) -> dict[str, Any]:
    return {
        "name": f"g-{uuid.uuid4().hex[:8]}",
        "steps": [
            {"id": "first", "block": first, "input": {"prompt": "input.text"}},
            {
                "id": "second",
                "block": second,
                "input": {"task": "steps.first.output.got.prompt"},
                "when": "input.go",
            },
            {
                "id": "third",
                "block": third,
                "input": {"prompt": "'fixed'", "got": "steps.first.output.got"},
                "timeout": 60,
            },
        ],
        "output": "{a: steps.second.output, b: steps.third.output}",
        "return_steps": True,
    }


async def test_a_named_graph_maps_each_steps_input(live: Live, admin: Admin, token: str) -> None:
    blocks = [admin.create_block(live.deployment) for _ in range(3)]
    graph_id = register(live, token, spec(*blocks))
    answer = await run(live, token, graph_id, {"text": "hey", "go": True})
    first = {"got": {"prompt": "hey"}}
    second = {"got": {"task": "hey"}}
    third = {"got": {"prompt": "fixed", "got": {"prompt": "hey"}}}
    assert answer == {
        "output": {"a": second, "b": third},
        "steps": {"first": first, "second": second, "third": third},
    }
    skipped = await run(live, token, graph_id, {"text": "hey", "go": False})
    assert skipped["output"] == {"a": None, "b": third}
    assert skipped["steps"]["second"] is None


async def test_a_graph_whose_block_went_away_runs_nothing(
    live: Live, admin: Admin, token: str, engine: AsyncEngine
) -> None:
    blocks = [admin.create_block(live.deployment) for _ in range(3)]
    graph_id = register(live, token, spec(*blocks))
    assert await block_store.delete_block(engine, blocks[2])
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await run(live, token, graph_id, {"text": "hey", "go": True})
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert f"steps[2].block: unknown block {blocks[2]}" in refused.value.details()
    assert await statuses(live, token) == []
    # Another account's graph, and none at all, are answered alike.
    for named in (graph_id, "gph-zzzzzzzz"):
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await run(live, live.private_owner_token, named, {})
        assert missing.value.code() is grpc.StatusCode.NOT_FOUND


async def statuses(live: Live, token: str) -> list[str]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=live.api_url, headers=headers) as client:
        return [p["status"] for p in (await client.get("/v1/predictions")).json()["results"]]


async def test_a_named_graph_is_an_open_inference_protocol_model(
    live: Live, admin: Admin, token: str
) -> None:
    blocks = [admin.create_block(live.deployment) for _ in range(3)]
    graph_id = register(live, token, spec(*blocks))
    request = ModelInferRequest(
        model_name=graph_id,
        inputs=[
            tensor("text", "BYTES", [1], bytes_contents=[b"oip"]),
            tensor("go", "BOOL", [1], bool_contents=[False]),
        ],
    )
    async with grpc.aio.insecure_channel(live.address) as channel:
        oip = GRPCInferenceServiceStub(channel)
        ready = await oip.ModelReady(ModelReadyRequest(name=graph_id), metadata=auth(token))
        answer = await oip.ModelInfer(request, metadata=auth(token))
    assert ready.ready
    datatype, _, (text,) = outputs_of(answer)["output"]
    assert datatype == "BYTES"
    assert json.loads(text) == {
        "a": None,
        "b": {"got": {"prompt": "fixed", "got": {"prompt": "oip"}}},
    }
