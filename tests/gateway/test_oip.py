"""The Open Inference Protocol (``inference.GRPCInferenceService``) over real gRPC on loopback:
tensors as the block's JSON input and its answer as tensors, every refusal with its status
naming the tensor, models described from the catalog (Postgres), and Triton's streaming with
sequences. The executor is the echo of ``conftest.py``; its answer is an object, so each of
its keys comes back as a tensor (``data``, an object, as JSON)."""

from __future__ import annotations

import json
import math
import struct
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import writes
from catalog.records import Visibility
from core.ports import free_port
from gateway.executor import OutputFile
from gateway.oip.outputs import Tensor, output_tensors
from gateway.oip.requests import answer_tensors, response_of
from gateway.proto.grpc_service_pb2 import (
    InferParameter,
    InferTensorContents,
    ModelInferRequest,
    ModelInferResponse,
    ModelMetadataRequest,
    ModelReadyRequest,
    ModelStreamInferResponse,
    ServerLiveRequest,
    ServerMetadataRequest,
    ServerReadyRequest,
)
from gateway.proto.grpc_service_pb2_grpc import GRPCInferenceServiceStub
from gateway.server import Gateway, start, token_auth
from gateway.settings import GatewaySettings
from tests.fixtures.admin import Admin
from tests.gateway.conftest import EchoExecutor

Input = ModelInferRequest.InferInputTensor
Wanted = ModelInferRequest.InferRequestedOutputTensor
BLOCK = "blk-abcdefgh"
FORMATS = {"INT64": "q", "FP64": "d", "BOOL": "?"}


def auth(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def param(value: Any) -> InferParameter:
    if isinstance(value, bool):
        return InferParameter(bool_param=value)
    if isinstance(value, int):
        return InferParameter(int64_param=value)
    if isinstance(value, float):
        return InferParameter(double_param=value)
    return InferParameter(string_param=value)


def request(*inputs: Input, raw: list[bytes] | None = None, **parameters: Any) -> ModelInferRequest:
    return ModelInferRequest(
        model_name=BLOCK,
        id="req-1",
        inputs=inputs,
        raw_input_contents=raw or [],
        parameters={key: param(value) for key, value in parameters.items()},
    )


def tensor(
    name: str, datatype: str, shape: list[int], content_type: str | None = None, **contents: Any
) -> Input:
    made = Input(name=name, datatype=datatype, shape=shape)
    if contents:
        made.contents.CopyFrom(InferTensorContents(**contents))
    if content_type is not None:
        made.parameters["content_type"].string_param = content_type
    return made


def shared(made: Input) -> Input:
    """``made`` in a shared memory region, as ``InferInput.set_shared_memory`` says it."""
    made.parameters["shared_memory_region"].string_param = "region"
    made.parameters["shared_memory_byte_size"].int64_param = 8
    return made


def raw_strings(*texts: str | bytes) -> bytes:
    encoded = [t.encode() if isinstance(t, str) else t for t in texts]
    return b"".join(struct.pack("<I", len(e)) + e for e in encoded)


def outputs_of(response: ModelInferResponse) -> dict[str, tuple[str, list[int], list[Any]]]:
    """Each output: its datatype, shape and elements (BYTES as str), however they were sent."""
    found: dict[str, tuple[str, list[int], list[Any]]] = {}
    for index, out in enumerate(response.outputs):
        count = math.prod(out.shape)
        if response.raw_output_contents:
            raw = response.raw_output_contents[index]
            if out.datatype == "BYTES":
                elements: list[Any] = []
                offset = 0
                while offset < len(raw):
                    (size,) = struct.unpack_from("<I", raw, offset)
                    elements.append(raw[offset + 4 : offset + 4 + size].decode())
                    offset += 4 + size
            else:
                elements = list(struct.unpack(f"<{count}{FORMATS[out.datatype]}", raw))
        else:
            field = {
                "INT64": "int64_contents",
                "FP64": "fp64_contents",
                "BOOL": "bool_contents",
                "BYTES": "bytes_contents",
            }[out.datatype]
            elements = list(getattr(out.contents, field))
            if out.datatype == "BYTES":
                elements = [e.decode() for e in elements]
        assert len(elements) == count, out.name
        found[out.name] = (out.datatype, list(out.shape), elements)
    return found


def echoed(response: ModelInferResponse) -> dict[str, Any]:
    """The echo's ``data``: the input the executor was given."""
    datatype, shape, (text,) = outputs_of(response)["data"]
    assert (datatype, shape) == ("BYTES", [1])
    (data,) = [o for o in response.outputs if o.name == "data"]
    assert data.parameters["content_type"].string_param == "json"
    value: dict[str, Any] = json.loads(text)
    return value


async def refusal(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() != grpc.StatusCode.UNKNOWN
    return caught.value


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> GRPCInferenceServiceStub:
    return GRPCInferenceServiceStub(channel)


# The answer as tensors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("hi", [Tensor("output", "BYTES", [1], ["hi"])]),
        (3, [Tensor("output", "INT64", [1], [3])]),
        (2.5, [Tensor("output", "FP64", [1], [2.5])]),
        (True, [Tensor("output", "BOOL", [1], [True])]),
        ([[1, 2, 3], [4, 5, 6]], [Tensor("output", "INT64", [2, 3], [1, 2, 3, 4, 5, 6])]),
        ([1, 2.5], [Tensor("output", "FP64", [2], [1.0, 2.5])]),
        (["a", "b"], [Tensor("output", "BYTES", [2], ["a", "b"])]),
        ([True, False], [Tensor("output", "BOOL", [2], [True, False])]),
        (
            {"text": "t", "score": 0.5, "n": [1, 2]},
            [
                Tensor("text", "BYTES", [1], ["t"]),
                Tensor("score", "FP64", [1], [0.5]),
                Tensor("n", "INT64", [2], [1, 2]),
            ],
        ),
        ({}, []),
        (None, [Tensor("output", "BYTES", [1], ["null"], {"content_type": "json"})]),
        ([], [Tensor("output", "BYTES", [1], ["[]"], {"content_type": "json"})]),
        (["a", 1], [Tensor("output", "BYTES", [1], ['["a",1]'], {"content_type": "json"})]),
        (
            [[1], [2, 3]],
            [Tensor("output", "BYTES", [1], ["[[1],[2,3]]"], {"content_type": "json"})],
        ),
        ([True, 1], [Tensor("output", "BYTES", [1], ["[true,1]"], {"content_type": "json"})]),
        (2**70, [Tensor("output", "BYTES", [1], [str(2**70)], {"content_type": "json"})]),
        (
            {"box": {"x": 1}},
            [Tensor("box", "BYTES", [1], ['{"x":1}'], {"content_type": "json"})],
        ),
    ],
)
def test_answer_as_tensors(value: Any, expected: list[Tensor]) -> None:
    assert output_tensors(value) == expected


@pytest.mark.parametrize("raw", [False, True])
def test_the_answers_files_are_one_more_tensor(raw: bool) -> None:
    sent = request(raw=[b"\0" * 8] if raw else None)
    files = [OutputFile({"name": "a.bin"}, b"\x00\xff"), OutputFile({}, b"xyz")]
    tensors = answer_tensors(sent, {"files": 2, "n": 1}, files)
    assert tensors[-1] == Tensor(
        "_files", "BYTES", [2], [b"\x00\xff", b"xyz"], {"file_metadata": '[{"name":"a.bin"},{}]'}
    )
    response = response_of(sent, tensors)
    assert [o.name for o in response.outputs] == ["files", "n", "_files"]
    if raw:
        assert response.raw_output_contents[2] == raw_strings(b"\x00\xff", b"xyz")
    else:
        assert list(response.outputs[2].contents.bytes_contents) == [b"\x00\xff", b"xyz"]
    assert answer_tensors(sent, "x", files)[-1].name == "files"


# Server ------------------------------------------------------------------------------------


async def test_server_live_ready_and_metadata(stub: GRPCInferenceServiceStub) -> None:
    assert (await stub.ServerLive(ServerLiveRequest())).live
    assert (await stub.ServerReady(ServerReadyRequest())).ready
    metadata = await stub.ServerMetadata(ServerMetadataRequest())
    assert metadata.name == "conduit"
    assert metadata.version
    assert set(metadata.extensions) == {"parameters", "sequence"}


# Inputs ------------------------------------------------------------------------------------


async def test_contents_are_the_blocks_input(stub: GRPCInferenceServiceStub, token: str) -> None:
    sent = request(
        tensor("n", "INT64", [1], int64_contents=[3]),
        tensor("xs", "FP32", [2, 2], fp32_contents=[1.5, 2, 3, 4]),
        tensor("prompt", "BYTES", [1], bytes_contents=["héllo".encode()]),
        tensor("opts", "BYTES", [1], "json", bytes_contents=[b'{"a": [1, 2]}']),
        tensor("flags", "BOOL", [3], bool_contents=[True, False, True]),
        tensor("words", "BYTES", [2, 1], bytes_contents=[b"a", b"b"]),
        tensor("none", "INT32", [0]),
        tensor("scalar", "INT32", [], int_contents=[7]),
        tensor("small", "UINT8", [2], uint_contents=[0, 255]),
        tensor("big", "UINT64", [1], uint64_contents=[2**64 - 1]),
        tensor("grid", "INT16", [2, 0]),
    )
    response = await stub.ModelInfer(sent, metadata=auth(token))
    assert echoed(response) == {
        "n": 3,
        "xs": [[1.5, 2.0], [3.0, 4.0]],
        "prompt": "héllo",
        "opts": {"a": [1, 2]},
        "flags": [True, False, True],
        "words": [["a"], ["b"]],
        "none": [],
        "scalar": 7,
        "small": [0, 255],
        "big": 2**64 - 1,
        "grid": [[], []],
    }
    assert (response.model_name, response.id) == (BLOCK, "req-1")
    assert not response.raw_output_contents  # contents in, contents out
    outputs = outputs_of(response)
    assert outputs["block_id"] == ("BYTES", [1], [BLOCK])
    assert outputs["seq_no"] == ("INT64", [1], [0])
    assert outputs["has_deadline"] == ("BOOL", [1], [True])
    assert outputs["ts"][:2] == ("FP64", [1])
    assert outputs["query_parameters"] == ("BYTES", [1], ["null"])


async def test_raw_contents_are_the_blocks_input(
    stub: GRPCInferenceServiceStub, token: str
) -> None:
    sent = request(
        tensor("ids", "INT64", [2]),
        tensor("scale", "FP32", [1]),
        tensor("docs", "BYTES", [2]),
        tensor("half", "FP16", [2]),
        tensor("brain", "BF16", [1]),
        tensor("mask", "BOOL", [2]),
        tensor("delta", "INT8", [1]),
        tensor("text", "BYTES", [1], "str"),
        raw=[
            struct.pack("<2q", -5, 2**40),
            struct.pack("<f", 0.25),
            raw_strings('{"k": "v"}', "[1, 2]"),
            struct.pack("<2e", 1.5, -2.0),
            struct.pack("<f", 3.0)[2:],  # BF16: the upper half of an FP32
            b"\x01\x00",
            struct.pack("<b", -7),
            raw_strings("{not json}"),
        ],
        content_type="json",  # the request's: the BYTES tensors without their own
    )
    response = await stub.ModelInfer(sent, metadata=auth(token))
    assert echoed(response) == {
        "ids": [-5, 2**40],
        "scale": 0.25,
        "docs": [{"k": "v"}, [1, 2]],
        "half": [1.5, -2.0],
        "brain": 3.0,
        "mask": [True, False],
        "delta": -7,
        "text": "{not json}",
    }
    assert len(response.raw_output_contents) == len(response.outputs)  # raw in, raw out
    assert not any(o.HasField("contents") for o in response.outputs)
    assert outputs_of(response)["seq_no"] == ("INT64", [1], [0])


async def test_requested_outputs_only(stub: GRPCInferenceServiceStub, token: str) -> None:
    sent = request(tensor("n", "INT64", [1], int64_contents=[1]))
    sent.outputs.extend([Wanted(name="seq_no"), Wanted(name="block_id")])
    response = await stub.ModelInfer(sent, metadata=auth(token))
    assert [o.name for o in response.outputs] == ["seq_no", "block_id"]

    sent.outputs.append(Wanted(name="nope"))
    refused = await refusal(stub.ModelInfer(sent, metadata=auth(token)))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details().startswith("outputs[2]: the model gave no output 'nope'")


BAD_TENSORS: list[tuple[str, Callable[[], ModelInferRequest], str]] = [
    (
        "unknown datatype",
        lambda: request(tensor("x", "INT128", [1], int64_contents=[1])),
        "input 'x': unknown datatype 'INT128'",
    ),
    (
        "negative dimension",
        lambda: request(tensor("x", "INT64", [-1], int64_contents=[1])),
        "input 'x': shape [-1] has a negative dimension",
    ),
    (
        "too few elements",
        lambda: request(tensor("x", "INT64", [2, 2], int64_contents=[1, 2, 3])),
        "input 'x': contents hold 3 elements; its shape says 4",
    ),
    (
        "contents of another datatype",
        lambda: request(tensor("x", "INT64", [1], fp32_contents=[1.0])),
        "input 'x': has fp32_contents, which is not for INT64",
    ),
    (
        "out of range",
        lambda: request(tensor("x", "INT8", [1], int_contents=[300])),
        "input 'x': holds a value out of INT8's range",
    ),
    (
        "not a finite number",
        lambda: request(tensor("x", "FP64", [2], fp64_contents=[1.0, math.nan])),
        "input 'x': holds a value that is not a finite number",
    ),
    (
        "FP16 in contents",
        lambda: request(tensor("x", "FP16", [1])),
        "input 'x': FP16 is sent in raw_input_contents only",
    ),
    (
        "not UTF-8",
        lambda: request(tensor("x", "BYTES", [1], bytes_contents=[b"\xff"])),
        "input 'x': holds an element that is not UTF-8",
    ),
    (
        "not JSON",
        lambda: request(tensor("x", "BYTES", [1], "json", bytes_contents=[b"{"])),
        "input 'x': holds an element that is not JSON",
    ),
    (
        "unknown content type",
        lambda: request(tensor("x", "BYTES", [1], "pickle", bytes_contents=[b"a"])),
        "input 'x' parameters: content_type 'pickle' is not one of json, str",
    ),
    (
        "wrong raw byte count",
        lambda: request(tensor("x", "INT32", [2]), raw=[b"\0" * 7]),
        "input 'x': raw contents are 7 bytes; 2 INT32 elements are 8",
    ),
    (
        "raw BYTES cut short",
        lambda: request(tensor("x", "BYTES", [1]), raw=[raw_strings("abc")[:-1]]),
        "input 'x': raw BYTES contents end inside an element",
    ),
    (
        "raw BYTES count",
        lambda: request(tensor("x", "BYTES", [1]), raw=[raw_strings("a", "b")]),
        "input 'x': raw BYTES contents hold 2 elements; its shape says 1",
    ),
    (
        "raw and contents",
        lambda: request(tensor("x", "INT64", [1], int64_contents=[1]), raw=[b"\0" * 8]),
        "input 'x': has contents beside raw_input_contents",
    ),
    (
        "too many dimensions",
        lambda: request(tensor("x", "INT64", [1] * 33)),
        "input 'x': has 33 dimensions, over 32",
    ),
    (
        "empty tensor of too many lists",
        lambda: request(tensor("x", "INT64", [1 << 20, 0])),
        "input 'x': shape [1048576, 0] is too large for no elements",
    ),
    (
        "shared memory",
        lambda: request(shared(tensor("x", "INT64", [1]))),
        "input 'x': shared memory is not supported",
    ),
    (
        "twice",
        lambda: request(
            tensor("x", "INT64", [1], int64_contents=[1]),
            tensor("x", "INT64", [1], int64_contents=[2]),
        ),
        "input 'x': given twice",
    ),
    (
        "no name",
        lambda: request(tensor("", "INT64", [1], int64_contents=[1])),
        "inputs[0]: has no name",
    ),
    (
        "raw for some inputs",
        lambda: request(tensor("x", "INT64", [1]), tensor("y", "INT64", [1]), raw=[b"\0" * 8]),
        "raw_input_contents: has 1 entries for 2 inputs",
    ),
    (
        "no model",
        lambda: ModelInferRequest(inputs=[tensor("x", "INT64", [1], int64_contents=[1])]),
        "model_name: required",
    ),
    (
        "sequence id of a bool",
        lambda: request(sequence_id=True),
        "parameters.sequence_id: must be an integer or a string",
    ),
    (
        "sequence start not a bool",
        lambda: request(sequence_id="s", sequence_start=1),
        "parameters.sequence_start: must be a boolean",
    ),
    ("seq_no of 0", lambda: request(seq_no=0), "parameters.seq_no: must be a positive integer"),
]


@pytest.mark.parametrize(("case", "make", "message"), BAD_TENSORS, ids=[c[0] for c in BAD_TENSORS])
async def test_bad_request_is_invalid_argument(
    stub: GRPCInferenceServiceStub,
    token: str,
    case: str,
    make: Callable[[], ModelInferRequest],
    message: str,
) -> None:
    refused = await refusal(stub.ModelInfer(make(), metadata=auth(token)))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, case
    assert refused.details().startswith(message), refused.details()


async def test_token_is_required(stub: GRPCInferenceServiceStub, token: str) -> None:
    sent = request(tensor("x", "INT64", [1], int64_contents=[1]))
    bad = auth("r8_" + "A" * 40)
    calls = [
        lambda md: stub.ModelInfer(sent, metadata=md),
        lambda md: stub.ModelReady(ModelReadyRequest(name=BLOCK), metadata=md),
        lambda md: stub.ModelMetadata(ModelMetadataRequest(name=BLOCK), metadata=md),
    ]
    for call in calls:
        missing = await refusal(call(None))
        assert missing.code() == grpc.StatusCode.UNAUTHENTICATED
        assert missing.details().startswith("authorization: a bearer token is required")
        wrong = await refusal(call(bad))
        assert wrong.code() == grpc.StatusCode.UNAUTHENTICATED
        assert wrong.details() == "authorization: the bearer token is not valid"
    stream = stub.ModelStreamInfer(metadata=bad)
    assert await stream.code() == grpc.StatusCode.UNAUTHENTICATED
    assert await stream.details() == "authorization: the bearer token is not valid"


async def test_failures_and_deadlines(stub: GRPCInferenceServiceStub, token: str) -> None:
    failing = request(tensor("fail", "BOOL", [1], bool_contents=[True]))
    failed = await refusal(stub.ModelInfer(failing, metadata=auth(token)))
    assert (failed.code(), failed.details()) == (grpc.StatusCode.INTERNAL, "internal error")

    waiting = request(tensor("wait", "BOOL", [1], bool_contents=[True]))
    late = await refusal(stub.ModelInfer(waiting, metadata=auth(token), timeout=0.5))
    assert late.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # No deadline of the call's own: the gateway's default (2 s in conftest.py).
    late = await refusal(stub.ModelInfer(waiting, metadata=auth(token)))
    assert late.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert late.details().startswith("the task took longer than 2.000 s")


async def test_a_sequence_on_model_infer(stub: GRPCInferenceServiceStub, token: str) -> None:
    outputs = outputs_of(
        await stub.ModelInfer(request(sequence_id="abc", seq_no=4), metadata=auth(token))
    )
    assert (outputs["session_id"][2], outputs["seq_no"][2]) == (["abc"], [4])
    outputs = outputs_of(await stub.ModelInfer(request(sequence_id=42), metadata=auth(token)))
    assert (outputs["session_id"][2], outputs["seq_no"][2]) == (["42"], [0])
    outputs = outputs_of(await stub.ModelInfer(request(sequence_id=0), metadata=auth(token)))
    assert outputs["session_id"][2] == [""]


# Models from the catalog -------------------------------------------------------------------

SCHEMA: dict[str, Any] = {
    "components": {
        "schemas": {
            "Input": {
                "type": "object",
                "properties": {
                    "prompt": {"type": "string", "x-order": 0},
                    "steps": {"type": "integer", "x-order": 2},
                    "image": {"type": "string", "format": "uri", "x-order": 1},
                    "scale": {"type": "number", "x-order": 3},
                    "safe": {"type": "boolean", "x-order": 4},
                    "seeds": {"type": "array", "items": {"type": "integer"}, "x-order": 5},
                    "style": {"allOf": [{"$ref": "#/components/schemas/style"}], "x-order": 6},
                    "extra": {"type": "object"},
                },
            },
            "style": {"type": "string", "enum": ["a", "b"]},
            "Output": {
                "type": "array",
                "items": {"type": "string"},
                "x-cog-array-type": "iterator",
            },
        }
    }
}
OBJECT_OUTPUT: dict[str, Any] = {
    "components": {
        "schemas": {
            "Input": {"type": "object", "properties": {}},
            "Output": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "boxes": {"type": "array", "items": {"type": "number"}},
                    "meta": {"type": "object"},
                },
            },
        }
    }
}


@dataclass(frozen=True)
class Models:
    owner_token: str
    version: str
    #: A block of a private deployment, a block of its (deployed) version, and a block of a
    #: version no deployment runs.
    deployed: str
    version_block: str
    idle: str


@pytest.fixture
async def models(engine: AsyncEngine, admin: Admin) -> Models:
    owner = f"oip-{uuid.uuid4().hex[:10]}"
    owner_token = admin.create_account(owner)
    private = Visibility.PRIVATE
    version = await writes.create_version(engine, owner, "gen", SCHEMA, None, 2, private)
    idle = await writes.create_version(engine, owner, "det", OBJECT_OUTPUT, None, 2, private)
    admin.create_deployment(f"{owner}/gen-run", f"{owner}/gen", version=version, shards=2)
    return Models(
        owner_token=owner_token,
        version=version,
        deployed=admin.create_block(f"{owner}/gen-run"),
        version_block=admin.create_block(None, version=version),
        idle=admin.create_block(None, version=idle),
    )


def _specs(tensors: Any) -> list[tuple[str, str, list[int]]]:
    return [(t.name, t.datatype, list(t.shape)) for t in tensors]


async def test_model_metadata_from_the_schema(
    stub: GRPCInferenceServiceStub, models: Models
) -> None:
    for block in (models.deployed, models.version_block):
        metadata = await stub.ModelMetadata(
            ModelMetadataRequest(name=block), metadata=auth(models.owner_token)
        )
        assert (metadata.name, list(metadata.versions)) == (block, [models.version])
        assert metadata.platform == "cog"
        assert _specs(metadata.inputs) == [
            ("prompt", "BYTES", [1]),
            ("image", "BYTES", [1]),
            ("steps", "INT64", [1]),
            ("scale", "FP64", [1]),
            ("safe", "BOOL", [1]),
            ("seeds", "INT64", [-1]),
            ("style", "BYTES", [1]),
            ("extra", "BYTES", [1]),
        ]
        assert _specs(metadata.outputs) == [("output", "BYTES", [-1])]
    metadata = await stub.ModelMetadata(
        ModelMetadataRequest(name=models.idle), metadata=auth(models.owner_token)
    )
    assert _specs(metadata.inputs) == []
    assert _specs(metadata.outputs) == [
        ("boxes", "FP64", [-1]),
        ("label", "BYTES", [1]),
        ("meta", "BYTES", [1]),
    ]


async def test_model_ready_while_a_deployment_runs_it(
    stub: GRPCInferenceServiceStub, models: Models
) -> None:
    owner = auth(models.owner_token)
    ready = [
        (await stub.ModelReady(ModelReadyRequest(name=name), metadata=owner)).ready
        for name in (models.deployed, models.version_block, models.idle)
    ]
    assert ready == [True, True, False]
    named = ModelReadyRequest(name=models.deployed, version=models.version)
    assert (await stub.ModelReady(named, metadata=owner)).ready


async def test_an_invisible_model_is_one_that_does_not_exist(
    stub: GRPCInferenceServiceStub, models: Models, token: str
) -> None:
    missing = "blk-zzzzzzzz"
    for name, who in (
        (models.deployed, token),  # private: another account's
        (missing, models.owner_token),
        ("", models.owner_token),
    ):
        for call in (
            stub.ModelReady(ModelReadyRequest(name=name), metadata=auth(who)),
            stub.ModelMetadata(ModelMetadataRequest(name=name), metadata=auth(who)),
        ):
            refused = await refusal(call)
            assert refused.code() == grpc.StatusCode.NOT_FOUND
            assert refused.details() == f"name: no model {name!r}"
    wrong = ModelMetadataRequest(name=models.deployed, version="v0")
    refused = await refusal(stub.ModelMetadata(wrong, metadata=auth(models.owner_token)))
    assert refused.code() == grpc.StatusCode.NOT_FOUND
    assert refused.details() == f"version: model {models.deployed!r} has no version 'v0'"


# Streams -----------------------------------------------------------------------------------


def items(*values: Any, **parameters: Any) -> ModelInferRequest:
    """A request whose echo streams ``values`` one by one."""
    text = json.dumps(list(values)).encode()
    return request(tensor("items", "BYTES", [1], "json", bytes_contents=[text]), **parameters)


def plain(**parameters: Any) -> ModelInferRequest:
    return request(tensor("x", "INT64", [1], int64_contents=[1]), **parameters)


async def responses(
    stub: GRPCInferenceServiceStub, token: str, sent: list[ModelInferRequest]
) -> list[ModelStreamInferResponse]:
    """Send every request, close the sending side, and read the stream to its end."""
    call = stub.ModelStreamInfer(metadata=auth(token))
    for one in sent:
        await call.write(one)
    await call.done_writing()
    got = [r async for r in _read(call)]
    assert await call.code() == grpc.StatusCode.OK
    return got


async def _read(call: Any) -> AsyncIterator[ModelStreamInferResponse]:
    while (response := await call.read()) is not grpc.aio.EOF:
        yield response


def session_of(response: ModelStreamInferResponse) -> tuple[str, int]:
    outputs = outputs_of(response.infer_response)
    return outputs["session_id"][2][0], outputs["seq_no"][2][0]


async def test_stream_answers_one_response_per_item(
    stub: GRPCInferenceServiceStub, token: str
) -> None:
    got = await responses(
        stub,
        token,
        [
            # One sequence: its requests run in turn (others side by side).
            items("a", "b", {"k": 1}, sequence_id="one"),
            items(1, 2, sequence_id="one", triton_enable_empty_final_response=True),
        ],
    )
    assert [r.error_message for r in got] == [""] * 6
    first, second = got[:3], got[3:]
    assert [outputs_of(r.infer_response)["output"][2] for r in first[:2]] == [["a"], ["b"]]
    assert outputs_of(first[2].infer_response) == {"k": ("INT64", [1], [1])}
    assert all("triton_final_response" not in r.infer_response.parameters for r in first)
    assert [outputs_of(r.infer_response).get("output") for r in second] == [
        ("INT64", [1], [1]),
        ("INT64", [1], [2]),
        None,
    ]
    finals = [r.infer_response.parameters["triton_final_response"].bool_param for r in second]
    assert finals == [False, False, True]
    assert not second[2].infer_response.outputs
    assert {r.infer_response.id for r in got} == {"req-1"}


async def test_stream_sequences_are_sessions(stub: GRPCInferenceServiceStub, token: str) -> None:
    got = await responses(
        stub,
        token,
        [
            plain(sequence_id=7, sequence_start=True),
            plain(sequence_id=7),
            plain(sequence_id="s", sequence_start=True),
            plain(sequence_id=7, sequence_end=True),
            plain(sequence_id=7, sequence_start=True),  # the same id again: a new sequence
            plain(sequence_id="new"),  # not started on this stream: run, counted from 1
            plain(sequence_id="new", seq_no=10),  # its own seq_no, and the count goes on
            plain(sequence_id="new"),
            plain(),
        ],
    )
    assert [r.error_message for r in got] == [""] * 9
    by_session: dict[str, list[int]] = {}
    for response in got:
        session, seq_no = session_of(response)
        by_session.setdefault(session, []).append(seq_no)
    assert by_session == {"7": [1, 2, 3, 1], "s": [1], "new": [1, 10, 11], "": [0]}


async def test_a_failed_request_does_not_end_the_stream(
    stub: GRPCInferenceServiceStub, token: str
) -> None:
    broken = items("x", sequence_id="q", triton_enable_empty_final_response=True)
    broken.inputs.append(tensor("fail", "BOOL", [1], bool_contents=[True]))
    got = await responses(
        stub,
        token,
        [
            request(tensor("x", "INT64", [2], int64_contents=[1]), sequence_id="q"),
            broken,
            plain(sequence_id="q"),
        ],
    )
    assert [r.error_message for r in got] == [
        "INVALID_ARGUMENT: input 'x': contents hold 1 elements; its shape says 2",
        "",
        "INTERNAL: internal error",
        "",
    ]
    assert got[2].infer_response.parameters["triton_final_response"].bool_param
    assert session_of(got[3]) == ("q", 2)  # the refused request was not counted


async def test_stream_answers_items_as_they_come(
    stub: GRPCInferenceServiceStub, token: str
) -> None:
    # The task yields two items and then never ends: both arrive while it runs.
    endless = items("first", "second")
    endless.inputs.append(tensor("wait", "BOOL", [1], bool_contents=[True]))
    call = stub.ModelStreamInfer(metadata=auth(token))
    await call.write(endless)
    for expected in ("first", "second"):
        response = await call.read()
        assert outputs_of(response.infer_response)["output"][2] == [expected]
    call.cancel()
    assert await call.code() == grpc.StatusCode.CANCELLED


async def test_a_stream_request_past_its_deadline(engine: AsyncEngine, token: str) -> None:
    settings = GatewaySettings(default_deadline=0.3)
    served: Gateway = await start(
        settings, EchoExecutor(), token_auth(engine, settings), free_port()
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stub = GRPCInferenceServiceStub(channel)
            waiting = items("early")
            waiting.inputs.append(tensor("wait", "BOOL", [1], bool_contents=[True]))
            got = await responses(stub, token, [waiting, plain()])
    finally:
        await served.stop(None)
    errors = sorted(r.error_message for r in got)
    assert errors[:2] == ["", ""]
    assert errors[2] == "DEADLINE_EXCEEDED: the task took longer than 0.300 s"
