"""A ``BlockInferencePacket`` as the gateway works with it: a plain :class:`Task`, its JSON
fields parsed, each refusal naming the field at fault.

What a caller names is checked for its shape before anything is looked up, counted or cached
by it: a block id is a block id (or a named graph's id where a task may name one), a session id
at most :data:`MAX_SESSION_ID` characters; a refusal quotes at most a short prefix of what was
sent. A task carries at most ``max_files`` files of ``max_file_bytes`` in all
(:class:`FileLimits`), refused before any is stored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from blocks.blocks import BLOCK_ID
from blocks.named_graphs import GRAPH_ID
from core.nesting import DEPTH_CEILING, MAX_DEPTH, TooDeep, parse_json
from gateway.errors import InvalidArgument, ResourceExhausted
from gateway.proto.inference_pb2 import BlockInferencePacket

#: Longest ``session_id`` taken.
MAX_SESSION_ID = 256
#: Characters of a refused value quoted in the refusal.
QUOTED = 32


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


@dataclass(frozen=True, slots=True)
class FileLimits:
    """Files one task may carry: how many, and their bytes in all."""

    max_files: int
    max_file_bytes: int


def quoted(value: str) -> str:
    """``value`` as a refusal quotes it: its first :data:`QUOTED` characters."""
    if len(value) <= QUOTED:
        return repr(value)
    return f"{value[:QUOTED]!r}... ({len(value)} characters)"


def block_id_of(value: str, field: str = "block_id") -> str:
    """``value``, a block id by its shape; else ``INVALID_ARGUMENT`` naming ``field``."""
    if BLOCK_ID.fullmatch(value) is None:
        raise InvalidArgument(
            f"not a block id (blk- and 4 to 12 lowercase letters or digits): {quoted(value)}",
            field,
        )
    return value


def target_of(value: str, field: str = "block_id") -> str:
    """``value``, a block id or a named graph's id (``gph-`` and 8 lowercase letters or
    digits) by its shape; else ``INVALID_ARGUMENT`` naming ``field``."""
    if GRAPH_ID.fullmatch(value) is None and BLOCK_ID.fullmatch(value) is None:
        raise InvalidArgument(
            "not a block id (blk- and 4 to 12 lowercase letters or digits) nor a graph id "
            f"(gph- and 8): {quoted(value)}",
            field,
        )
    return value


def session_id_of(value: str, field: str = "session_id") -> str:
    """``value``, no longer than :data:`MAX_SESSION_ID`; else ``INVALID_ARGUMENT``."""
    if len(value) > MAX_SESSION_ID:
        raise InvalidArgument(f"longer than {MAX_SESSION_ID} characters", field)
    return value


def check_files(packet: BlockInferencePacket, limits: FileLimits) -> None:
    """The packet's files within ``limits``: too many is ``INVALID_ARGUMENT``, too many bytes
    ``RESOURCE_EXHAUSTED`` (each naming ``files``)."""
    if len(packet.files) > limits.max_files:
        raise InvalidArgument(
            f"{len(packet.files)} files; a task carries at most {limits.max_files}", "files"
        )
    size = sum(len(f.file_data) for f in packet.files)
    if size > limits.max_file_bytes:
        raise ResourceExhausted(
            f"{size} bytes of files; a task carries at most {limits.max_file_bytes}", "files"
        )


def parse_object(text: str, name: str, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """``text`` as a JSON object nesting at most ``max_depth`` deep; the empty string is
    ``{}``."""
    if not text.strip():
        return {}
    value = _parse(text, name, max_depth)
    if not isinstance(value, dict):
        raise InvalidArgument(f"must be a JSON object, not {type(value).__name__}", name)
    return value


def _parse(text: str, name: str, max_depth: int = MAX_DEPTH) -> Any:
    try:
        return parse_json(text, name, max_depth)
    except TooDeep as error:
        raise InvalidArgument(error.message, error.field) from None
    except ValueError as error:  # JSONDecodeError; also a lone surrogate in the text
        raise InvalidArgument(f"not valid JSON ({error})", name) from None


def parse_packet(packet: BlockInferencePacket, files: FileLimits) -> Task:
    """The packet's task, or :class:`InvalidArgument` naming the first field at fault (its
    files over ``files``: ``INVALID_ARGUMENT`` or ``RESOURCE_EXHAUSTED``)."""
    check_files(packet, files)
    query = packet.query_parameters
    return Task(
        block_id=target_of(packet.block_id) if packet.block_id else "",
        session_id=session_id_of(packet.session_id),
        seq_no=packet.seq_no,
        frame_ptr=packet.frame_ptr,
        # The configured depth (``max_input_depth``) is held when the input is checked.
        data=parse_object(packet.data, "data", DEPTH_CEILING),
        query_parameters=parse_object(query, "query_parameters") if query.strip() else None,
        ts=packet.ts,
        files=[
            InputFile(parse_object(f.metadata, f"files[{i}].metadata"), f.file_data)
            for i, f in enumerate(packet.files)
        ],
        output_ptr=_parse(packet.output_ptr, "output_ptr") if packet.output_ptr.strip() else None,
    )
