"""The wire: the seed's ``.proto`` is the seed's field for field, the Open Inference Protocol's
is KServe's and Triton's, and the committed stubs are what ``scripts/gen-protos`` generates."""

from __future__ import annotations

import subprocess
from pathlib import Path

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from gateway.proto import grpc_service_pb2, inference_pb2

ROOT = Path(__file__).resolve().parents[2]
GENERATED = tuple(
    f"{name}{suffix}"
    for name in ("inference", "grpc_service")
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
)
STRING, UINT64, DOUBLE, BYTES, MESSAGE = (
    FieldDescriptor.TYPE_STRING,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_DOUBLE,
    FieldDescriptor.TYPE_BYTES,
    FieldDescriptor.TYPE_MESSAGE,
)
BOOL, INT32, INT64, UINT32, FLOAT = (
    FieldDescriptor.TYPE_BOOL,
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_FLOAT,
)
SEED = {
    "AIOSPacket": {
        "session_id": (1, STRING),
        "seq_no": (2, UINT64),
        "data": (4, STRING),
        "ts": (5, DOUBLE),
        "output_ptr": (6, STRING),
        "files": (7, MESSAGE),
    },
    "FileInfo": {"metadata": (1, STRING), "file_data": (2, BYTES)},
    "BlockInferencePacket": {
        "block_id": (1, STRING),
        "session_id": (3, STRING),
        "seq_no": (4, UINT64),
        "frame_ptr": (5, BYTES),
        "data": (6, STRING),
        "query_parameters": (7, STRING),
        "ts": (8, DOUBLE),
        "files": (9, MESSAGE),
        "output_ptr": (10, STRING),
    },
}


def test_committed_stubs_are_generated(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "scripts" / "gen-protos"), str(tmp_path)], check=True)
    for name in GENERATED:
        committed = (ROOT / "gateway" / "proto" / name).read_text()
        assert (tmp_path / name).read_text() == committed, f"{name}: run scripts/gen-protos"


def test_messages_are_the_seeds() -> None:
    messages = inference_pb2.DESCRIPTOR.message_types_by_name
    assert set(messages) == set(SEED)
    for name, fields in SEED.items():
        got = {f.name: (f.number, f.type) for f in messages[name].fields}
        assert got == fields, name
    for name in ("AIOSPacket", "BlockInferencePacket"):
        assert messages[name].fields_by_name["files"].message_type.name == "FileInfo"
        assert messages[name].fields_by_name["files"].is_repeated


def test_service_is_the_seeds() -> None:
    service = inference_pb2.DESCRIPTOR.services_by_name["BlockInferenceService"]
    assert service.full_name == "BlockInferenceService"  # no package: what seed clients call
    (method,) = service.methods
    assert method.name == "infer"
    assert method.input_type.name == "BlockInferencePacket"
    assert method.output_type.name == "AIOSPacket"


#: Triton's ``grpc_service.proto`` (package ``inference``), the messages the gateway serves:
#: name -> field -> (number, type, repeated). ``tests/gateway/test_oip_triton.py`` checks the
#: same against the stubs ``tritonclient`` ships.
_INFER_TENSOR = {
    "name": (1, STRING, False),
    "datatype": (2, STRING, False),
    "shape": (3, INT64, True),
    "parameters": (4, MESSAGE, True),
    "contents": (5, MESSAGE, False),
}
OIP = {
    "ServerLiveRequest": {},
    "ServerLiveResponse": {"live": (1, BOOL, False)},
    "ServerReadyRequest": {},
    "ServerReadyResponse": {"ready": (1, BOOL, False)},
    "ModelReadyRequest": {"name": (1, STRING, False), "version": (2, STRING, False)},
    "ModelReadyResponse": {"ready": (1, BOOL, False)},
    "ServerMetadataRequest": {},
    "ServerMetadataResponse": {
        "name": (1, STRING, False),
        "version": (2, STRING, False),
        "extensions": (3, STRING, True),
    },
    "ModelMetadataRequest": {"name": (1, STRING, False), "version": (2, STRING, False)},
    "ModelMetadataResponse": {
        "name": (1, STRING, False),
        "versions": (2, STRING, True),
        "platform": (3, STRING, False),
        "inputs": (4, MESSAGE, True),
        "outputs": (5, MESSAGE, True),
    },
    "ModelMetadataResponse.TensorMetadata": {
        "name": (1, STRING, False),
        "datatype": (2, STRING, False),
        "shape": (3, INT64, True),
    },
    "InferParameter": {
        "bool_param": (1, BOOL, False),
        "int64_param": (2, INT64, False),
        "string_param": (3, STRING, False),
        "double_param": (4, DOUBLE, False),
        "uint64_param": (5, UINT64, False),
    },
    "InferTensorContents": {
        "bool_contents": (1, BOOL, True),
        "int_contents": (2, INT32, True),
        "int64_contents": (3, INT64, True),
        "uint_contents": (4, UINT32, True),
        "uint64_contents": (5, UINT64, True),
        "fp32_contents": (6, FLOAT, True),
        "fp64_contents": (7, DOUBLE, True),
        "bytes_contents": (8, BYTES, True),
    },
    "ModelInferRequest": {
        "model_name": (1, STRING, False),
        "model_version": (2, STRING, False),
        "id": (3, STRING, False),
        "parameters": (4, MESSAGE, True),
        "inputs": (5, MESSAGE, True),
        "outputs": (6, MESSAGE, True),
        "raw_input_contents": (7, BYTES, True),
    },
    "ModelInferRequest.InferInputTensor": _INFER_TENSOR,
    "ModelInferRequest.InferRequestedOutputTensor": {
        "name": (1, STRING, False),
        "parameters": (2, MESSAGE, True),
    },
    "ModelInferResponse": {
        "model_name": (1, STRING, False),
        "model_version": (2, STRING, False),
        "id": (3, STRING, False),
        "parameters": (4, MESSAGE, True),
        "outputs": (5, MESSAGE, True),
        "raw_output_contents": (6, BYTES, True),
    },
    "ModelInferResponse.InferOutputTensor": _INFER_TENSOR,
    "ModelStreamInferResponse": {
        "error_message": (1, STRING, False),
        "infer_response": (2, MESSAGE, False),
    },
}
OIP_METHODS = {
    "ServerLive": ("ServerLiveRequest", "ServerLiveResponse", False),
    "ServerReady": ("ServerReadyRequest", "ServerReadyResponse", False),
    "ModelReady": ("ModelReadyRequest", "ModelReadyResponse", False),
    "ServerMetadata": ("ServerMetadataRequest", "ServerMetadataResponse", False),
    "ModelMetadata": ("ModelMetadataRequest", "ModelMetadataResponse", False),
    "ModelInfer": ("ModelInferRequest", "ModelInferResponse", False),
    "ModelStreamInfer": ("ModelInferRequest", "ModelStreamInferResponse", True),
}


def _message(name: str) -> Descriptor:
    outer, _, inner = name.partition(".")
    found = grpc_service_pb2.DESCRIPTOR.message_types_by_name[outer]
    return found.nested_types_by_name[inner] if inner else found


def test_oip_messages_are_tritons() -> None:
    assert grpc_service_pb2.DESCRIPTOR.package == "inference"
    assert set(grpc_service_pb2.DESCRIPTOR.message_types_by_name) == {
        name for name in OIP if "." not in name
    }
    for name, fields in OIP.items():
        got = {f.name: (f.number, f.type, f.is_repeated) for f in _message(name).fields}
        assert got == fields, name
    (choice,) = _message("InferParameter").oneofs
    assert choice.name == "parameter_choice" and len(choice.fields) == 5
    for name in ("ModelInferRequest", "ModelInferResponse"):
        entry = _message(name).fields_by_name["parameters"].message_type
        assert entry.GetOptions().map_entry
        assert entry.fields_by_name["value"].message_type.name == "InferParameter"


def test_oip_service_is_tritons() -> None:
    service = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == "inference.GRPCInferenceService"
    got = {
        m.name: (m.input_type.name, m.output_type.name, m.client_streaming) for m in service.methods
    }
    assert got == OIP_METHODS
    streamed = service.methods_by_name["ModelStreamInfer"]
    assert streamed.client_streaming and streamed.server_streaming
