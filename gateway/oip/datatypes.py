"""The Open Inference Protocol's datatypes, as the tensors read and write them, and the value of
a request's (or a tensor's) parameter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.proto.grpc_service_pb2 import InferParameter

CONTENT_TYPE = "content_type"


@dataclass(frozen=True, slots=True)
class Datatype:
    #: ``struct`` code of one element (None: BYTES and BF16, read by hand).
    code: str | None
    size: int
    #: The ``InferTensorContents`` field of its elements (None: raw contents only).
    contents: str | None
    #: Smallest and largest value of an integer type given in ``contents``.
    bounds: tuple[int, int] | None = None


DATATYPES: dict[str, Datatype] = {
    "BOOL": Datatype("?", 1, "bool_contents"),
    "UINT8": Datatype("B", 1, "uint_contents", (0, 0xFF)),
    "UINT16": Datatype("H", 2, "uint_contents", (0, 0xFFFF)),
    "UINT32": Datatype("I", 4, "uint_contents"),
    "UINT64": Datatype("Q", 8, "uint64_contents"),
    "INT8": Datatype("b", 1, "int_contents", (-0x80, 0x7F)),
    "INT16": Datatype("h", 2, "int_contents", (-0x8000, 0x7FFF)),
    "INT32": Datatype("i", 4, "int_contents"),
    "INT64": Datatype("q", 8, "int64_contents"),
    "FP16": Datatype("e", 2, None),
    "BF16": Datatype(None, 2, None),
    "FP32": Datatype("f", 4, "fp32_contents"),
    "FP64": Datatype("d", 8, "fp64_contents"),
    "BYTES": Datatype(None, 0, "bytes_contents"),
}


def parameter(parameters: Mapping[str, InferParameter], key: str) -> Any:
    """The value of parameter ``key`` (bool, int, str or float); None when absent or unset."""
    found = parameters.get(key)
    if found is None:
        return None
    which = found.WhichOneof("parameter_choice")
    return getattr(found, which) if which is not None else None
