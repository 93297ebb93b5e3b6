"""One front door (:mod:`front`): the REST create, ``/run`` and a gateway task take the same
admission, so one setting of it (``CONDUIT_MAX_INPUT_DEPTH``) changes what all three refuse.

The input nests four levels deep. Under the default depth (64) it reaches the schema, which
refuses it for its type; an api and a gateway given a depth of 3 refuse it for its depth,
naming the same field under each entry's root, before anything is stored or run."""

from __future__ import annotations

import json
from typing import Any

import grpc
import httpx
import pytest

from gateway.proto.inference_pb2 import BlockInferencePacket
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from tests.fixtures.gateway_stack import Live
from tests.fixtures.processes import Launcher

#: Four levels: the input, ``prompt``, ``a`` and ``b``.
DEEP = {"prompt": {"a": {"b": {"c": 1}}}}
TOO_DEEP = "nested deeper than 3 levels"


async def _refused_over_http(api_url: str, token: str, path: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=30) as client:
        answer = await client.post(path, json={"input": DEEP})
    assert answer.status_code == 422, answer.text
    problem: dict[str, Any] = answer.json()
    return problem


async def _refused_by_gateway(address: str, token: str, block: str) -> str:
    task = BlockInferencePacket(block_id=block, data=json.dumps(DEEP))
    async with grpc.aio.insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await BlockInferenceServiceStub(channel).infer(
                task, metadata=[("authorization", f"Bearer {token}")]
            )
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    return refused.value.details() or ""


async def _predictions(api_url: str, token: str) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers) as client:
        answer = await client.get("/v1/predictions")
    answer.raise_for_status()
    results: list[dict[str, Any]] = answer.json()["results"]
    return results


async def test_one_admission_setting_moves_rest_run_and_the_gateway_together(
    launcher: Launcher, live: Live, token: str
) -> None:
    create = f"/v1/deployments/{live.deployment}/predictions"
    run = f"/v1/deployments/{live.deployment}/run"
    stored_before = len(await _predictions(live.api_url, token))

    # The default: deep enough, so the schema answers (prompt is a string).
    default = await _refused_over_http(live.api_url, token, create)
    assert TOO_DEEP not in default["detail"]
    assert default["errors"][0]["field"] == "input.prompt"

    env = {"CONDUIT_MAX_INPUT_DEPTH": "3"}
    proc, address = launcher.gateway(env)
    try:
        with launcher.own_api(env) as api_url:
            for path in (create, run):
                problem = await _refused_over_http(api_url, token, path)
                assert problem["errors"] == [{"field": "input.prompt.a.b", "message": TOO_DEEP}]
            details = await _refused_by_gateway(address, token, live.block)
            assert details == f"data.prompt.a.b: {TOO_DEEP}"
            assert len(await _predictions(api_url, token)) == stored_before
    finally:
        proc.stop()
