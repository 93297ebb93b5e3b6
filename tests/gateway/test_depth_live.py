"""JSON nested thousands deep in a gateway task (its ``data``, ``query_parameters`` or a file's
metadata) is INVALID_ARGUMENT naming the field (``core.nesting``), not INTERNAL, on a live
gateway; nothing is queued."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from gateway.proto.inference_pb2 import BlockInferencePacket, FileInfo
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from tests.fixtures.gateway_stack import Live

DEEP = 3000


def _deep(levels: int = DEEP) -> str:
    return '{"e": ' + "[" * levels + "]" * levels + "}"


@pytest.fixture
async def stub(live: Live) -> AsyncIterator[BlockInferenceServiceStub]:
    async with grpc.aio.insecure_channel(live.address) as channel:
        yield BlockInferenceServiceStub(channel)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"data": _deep()}, "data"),
        ({"data": _deep(300)}, "data.e"),
        ({"data": "{}", "query_parameters": _deep()}, "query_parameters"),
        (
            {"data": "{}", "files": [FileInfo(metadata=_deep(), file_data=b"x")]},
            "files[0].metadata",
        ),
    ],
)
async def test_deep_json_in_a_task_is_invalid_argument_naming_the_field(
    stub: BlockInferenceServiceStub, live: Live, token: str, fields: dict[str, object], named: str
) -> None:
    packet = BlockInferencePacket(block_id=live.block, **fields)  # type: ignore[arg-type]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.infer(packet, metadata=[("authorization", f"Bearer {token}")])
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert refused.value.details().startswith(named), refused.value.details()
    assert "nested deeper than" in refused.value.details()
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=live.api_url, headers=headers) as client:
        assert (await client.get("/v1/predictions")).json()["results"] == []
