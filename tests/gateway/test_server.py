"""``BlockInferenceService.infer`` over real gRPC on loopback: the seed's own client code,
authentication against the catalog, refusals naming the field, message limits, health."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.proto.inference_pb2 import BlockInferencePacket, FileInfo
from gateway.proto.inference_pb2_grpc import BlockInferenceServiceStub
from gateway.server import Gateway
from tests.fixtures.processes import Launcher
from tests.gateway.conftest import generate_stubs

EXAMPLES = Path(__file__).parent / "seed_examples"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_stubs(tmp_path_factory.mktemp("stubs"))


async def run_example(
    name: str, stubs: Path, cwd: Path, address: str, token: str
) -> dict[str, str]:
    """Run one of the seed's examples; what it printed, ``Name: value`` by name."""
    env = {
        **os.environ,
        "PYTHONPATH": str(stubs),
        "SERVER_ADDRESS": address,
        "REPLICATE_API_TOKEN": token,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / name),
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0] == "Inference Response:"
    return dict(line.split(": ", 1) for line in lines[1:])


def packet(data: str = "{}", **fields: Any) -> BlockInferencePacket:
    return BlockInferencePacket(
        block_id="blk-abcdefgh", session_id="s", seq_no=1, data=data, **fields
    )


def auth(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


async def refusal(
    channel: grpc.aio.Channel, request: BlockInferencePacket, **kw: Any
) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await BlockInferenceServiceStub(channel).infer(request, **kw)
    return caught.value


async def test_seed_example_with_block_id(
    gateway: Gateway, stubs: Path, tmp_path: Path, token: str
) -> None:
    printed = await run_example("block_id.py", stubs, tmp_path, f"127.0.0.1:{gateway.port}", token)
    assert printed["Session ID"] == "sess-12345"
    assert printed["Sequence No"] == "1"
    echo = json.loads(printed["Data"])
    assert echo["block_id"] == "blk-weugwtns"
    assert echo["data"]["messages"][1] == {
        "role": "user",
        "content": "How does photosynthesis work?",
    }
    assert echo["query_parameters"] is None and echo["output_ptr"] is None
    assert float(printed["Timestamp"]) > 0


async def test_seed_example_with_files(
    gateway: Gateway, stubs: Path, tmp_path: Path, token: str
) -> None:
    (tmp_path / "image1.jpg").write_bytes(b"\xff\xd8\xff" + b"1" * 1000)
    (tmp_path / "image2.jpg").write_bytes(b"\xff\xd8\xff" + b"2" * 2000)
    printed = await run_example("files.py", stubs, tmp_path, f"127.0.0.1:{gateway.port}", token)
    assert printed["Session ID"] == "sess-67890"
    echo = json.loads(printed["Data"])
    assert echo["data"]["task"] == "object_detection"
    assert echo["files"] == [
        {"metadata": {"file_name": "image1.jpg"}, "size": 1003},
        {"metadata": {"file_name": "image2.jpg"}, "size": 2003},
    ]


async def test_seed_example_with_frame_ptr(
    gateway: Gateway, stubs: Path, tmp_path: Path, token: str
) -> None:
    printed = await run_example("frame_ptr.py", stubs, tmp_path, f"127.0.0.1:{gateway.port}", token)
    echo = json.loads(printed["Data"])
    assert json.loads(echo["frame_ptr"]) == {"framedb_id": "framdb-123", "key": "video-abcdef-123"}
    assert echo["data"]["video_interval"] == {"start_time": 90, "end_time": 210}
    assert printed["Sequence No"] == "1"


async def test_answer_carries_files_and_graph(channel: grpc.aio.Channel, token: str) -> None:
    graph = '{"graph": {"blk-abcdefgh": []}}'
    request = packet(
        '{"x": 1}', output_ptr=graph, files=[FileInfo(metadata='{"n": 1}', file_data=b"abc")]
    )
    answer = await BlockInferenceServiceStub(channel).infer(request, metadata=auth(token))
    assert answer.output_ptr == graph
    assert [(f.metadata, f.file_data) for f in answer.files] == [('{"n":1}', b"abc")]
    assert json.loads(answer.data)["output_ptr"] == {"graph": {"blk-abcdefgh": []}}


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        [("authorization", "Bearer r8_" + "x" * 40)],  # well formed, no such token
        [("authorization", "Bearer not-a-token")],
        [("authorization", "Basic dXNlcjpwYXNz")],
    ],
)
async def test_unknown_or_missing_token_is_unauthenticated(
    channel: grpc.aio.Channel, metadata: list[tuple[str, str]] | None
) -> None:
    error = await refusal(channel, packet(), metadata=metadata)
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert (error.details() or "").startswith("authorization: ")


@pytest.mark.parametrize("data", ["not json", "{", "[1, 2]", '"text"'])
async def test_data_not_a_json_object_is_invalid_argument(
    channel: grpc.aio.Channel, token: str, data: str
) -> None:
    error = await refusal(channel, packet(data), metadata=auth(token))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith("data: ")


async def test_bad_file_metadata_names_the_file(channel: grpc.aio.Channel, token: str) -> None:
    files = [FileInfo(metadata="{}"), FileInfo(metadata="nope")]
    error = await refusal(channel, packet(files=files), metadata=auth(token))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith("files[1].metadata: ")


async def test_empty_data_is_an_empty_object(channel: grpc.aio.Channel, token: str) -> None:
    answer = await BlockInferenceServiceStub(channel).infer(packet(""), metadata=auth(token))
    assert json.loads(answer.data)["data"] == {}


async def test_message_limit_is_64_mib(channel: grpc.aio.Channel, token: str) -> None:
    stub = BlockInferenceServiceStub(channel)
    fits = packet(files=[FileInfo(file_data=b"\0" * (60 * MIB))])
    answer = await stub.infer(fits, metadata=auth(token))
    assert json.loads(answer.data)["files"] == [{"metadata": {}, "size": 60 * MIB}]
    error = await refusal(
        channel, packet(files=[FileInfo(file_data=b"\0" * (65 * MIB))]), metadata=auth(token)
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_task_past_the_default_deadline(channel: grpc.aio.Channel, token: str) -> None:
    error = await refusal(channel, packet('{"wait": true}'), metadata=auth(token))
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_unexpected_error_is_internal(channel: grpc.aio.Channel, token: str) -> None:
    error = await refusal(channel, packet('{"fail": true}'), metadata=auth(token))
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "the block broke" not in (error.details() or "")


@pytest.mark.parametrize("service", ["", "BlockInferenceService"])
async def test_health_serving(channel: grpc.aio.Channel, service: str) -> None:
    answer = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service)
    )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_conduit_gateway_process(launcher: Launcher, token: str) -> None:
    """``conduit gateway`` serves health, checks tokens against the catalog, answers a block
    that does not exist NOT_FOUND naming the field, and stops cleanly on SIGTERM."""
    proc, address = launcher.gateway()
    try:
        with grpc.insecure_channel(address) as channel:
            stub = BlockInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as unauthenticated:
                stub.infer(packet(), timeout=10)
            assert unauthenticated.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as missing:
                stub.infer(packet(), metadata=auth(token), timeout=10)
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
            assert (missing.value.details() or "").startswith("block_id: ")
    finally:
        proc.stop()
    assert proc.popen is not None and proc.popen.returncode == 0, proc.log()
