"""A ``BlockInferencePacket`` as the gateway works with it: a plain :class:`Task`, its JSON
fields parsed, each refusal naming the field at fault."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gateway.errors import InvalidArgument
from gateway.proto.inference_pb2 import BlockInferencePacket


class InputFile(NamedTuple):
    """One of ``files``: its metadata (a JSON object; ``{}`` when empty) and its bytes."""

    metadata: dict[str, Any]
    data: bytes


@dataclass(frozen=True, slots=True)
class Task:
    block_id: str
    session_id: str
    seq_no: int
    #: A frame store reference, passed on unchanged (empty: none).
    frame_ptr: bytes
    #: The block's input: ``data`` parsed, always a JSON object (``{}`` when empty).
    data: dict[str, Any]
    #: The search query selecting the block, parsed; None when empty.
    query_parameters: dict[str, Any] | None
    ts: float
    files: list[InputFile] = field(default_factory=list)
    #: The graph (``output_ptr``) parsed; None when empty.
    output_ptr: Any = None


def parse_object(text: str, name: str) -> dict[str, Any]:
    """``text`` as a JSON object; the empty string is ``{}``."""
    if not text.strip():
        return {}
    value = _parse(text, name)
    if not isinstance(value, dict):
        raise InvalidArgument(f"must be a JSON object, not {type(value).__name__}", name)
    return value


def _parse(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as error:  # JSONDecodeError; also a lone surrogate in the text
        raise InvalidArgument(f"not valid JSON ({error})", name) from None


def parse_packet(packet: BlockInferencePacket) -> Task:
    """The packet's task, or :class:`InvalidArgument` naming the first field at fault."""
    query = packet.query_parameters
    return Task(
        block_id=packet.block_id,
        session_id=packet.session_id,
        seq_no=packet.seq_no,
        frame_ptr=packet.frame_ptr,
        data=parse_object(packet.data, "data"),
        query_parameters=parse_object(query, "query_parameters") if query.strip() else None,
        ts=packet.ts,
        files=[
            InputFile(parse_object(f.metadata, f"files[{i}].metadata"), f.file_data)
            for i, f in enumerate(packet.files)
        ],
        output_ptr=_parse(packet.output_ptr, "output_ptr") if packet.output_ptr.strip() else None,
    )
