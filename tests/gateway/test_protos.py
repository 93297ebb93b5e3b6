"""The wire: the ``.proto`` is the seed's field for field, and the committed stubs are what
``scripts/gen-protos`` generates from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from google.protobuf.descriptor import FieldDescriptor

from gateway.proto import inference_pb2

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py")
STRING, UINT64, DOUBLE, BYTES, MESSAGE = (
    FieldDescriptor.TYPE_STRING,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_DOUBLE,
    FieldDescriptor.TYPE_BYTES,
    FieldDescriptor.TYPE_MESSAGE,
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
