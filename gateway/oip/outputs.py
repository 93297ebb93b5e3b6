"""A block's JSON answer as Open Inference Protocol output tensors.

An object answer is one tensor per key, any other value one tensor named ``output``.
A string is BYTES, an int INT64, a float FP64, a bool BOOL, each of shape ``[1]``; a
rectangular, non-empty list of one such kind (ints and floats together: FP64) is a tensor of
its shape; anything else (an object, a mixed or empty list, null) is a BYTES tensor of shape
``[1]`` holding its JSON, with parameter ``content_type: "json"``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gateway.oip.datatypes import CONTENT_TYPE, DATATYPES
from gateway.proto.grpc_service_pb2 import InferTensorContents, ModelInferResponse

#: The output tensor of an answer that is not an object.
OUTPUT = "output"
_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True, slots=True)
class Tensor:
    """An output tensor before it is encoded: its elements flattened in row-major order."""

    name: str
    datatype: str
    shape: list[int]
    elements: list[Any]
    #: String parameters of the tensor (``content_type``).
    parameters: dict[str, str] = field(default_factory=dict)


def output_tensors(value: Any) -> list[Tensor]:
    """An answer as tensors: one per key of an object, else one named ``output``."""
    if isinstance(value, dict):
        return [tensor_of(str(key), item) for key, item in value.items()]
    return [tensor_of(OUTPUT, value)]


def tensor_of(name: str, value: Any) -> Tensor:
    kind = _scalar_kind(value)
    if kind is not None:
        return Tensor(name, kind, [1], [value])
    if isinstance(value, list):
        shaped = _shaped(value)
        if shaped is not None:
            shape, elements = shaped
            kinds = {_scalar_kind(e) for e in elements}
            if kinds == {"INT64", "FP64"}:
                return Tensor(name, "FP64", shape, [float(e) for e in elements])
            (only,) = kinds if len(kinds) == 1 else (None,)
            if only is not None:
                return Tensor(name, only, shape, elements)
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return Tensor(name, "BYTES", [1], [text], {CONTENT_TYPE: "json"})


def _scalar_kind(value: Any) -> str | None:
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int):
        return "INT64" if _INT64[0] <= value <= _INT64[1] else None
    if isinstance(value, float):
        return "FP64"
    if isinstance(value, str):
        return "BYTES"
    return None


def _shaped(value: list[Any]) -> tuple[list[int], list[Any]] | None:
    """A rectangular, non-empty nest of lists: its shape and its elements; else None."""
    if not value:
        return None
    if not any(isinstance(item, list) for item in value):
        return [len(value)], list(value)
    if not all(isinstance(item, list) for item in value):
        return None
    inner = [_shaped(item) for item in value]
    first = inner[0]
    if first is None or any(other is None or other[0] != first[0] for other in inner):
        return None
    elements = [e for part in inner if part is not None for e in part[1]]
    return [len(value), *first[0]], elements


def encode_outputs(
    tensors: Iterable[Tensor], response: ModelInferResponse, raw: bool
) -> ModelInferResponse:
    """Add ``tensors`` to ``response``, in ``raw_output_contents`` or in each ``contents``."""
    for tensor in tensors:
        out = response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        for key, text in tensor.parameters.items():
            out.parameters[key].string_param = text
        if raw:
            response.raw_output_contents.append(_raw(tensor))
        else:
            _contents(tensor, out.contents)
    return response


def _element_bytes(element: str | bytes) -> bytes:
    """A BYTES element: a string as UTF-8, bytes as they are."""
    return element.encode("utf-8", "surrogatepass") if isinstance(element, str) else element


def _raw(tensor: Tensor) -> bytes:
    count = len(tensor.elements)
    if tensor.datatype == "BYTES":
        encoded = [_element_bytes(e) for e in tensor.elements]
        return b"".join(struct.pack("<I", len(e)) + e for e in encoded)
    code = DATATYPES[tensor.datatype].code
    return struct.pack(f"<{count}{code}", *tensor.elements)


def _contents(tensor: Tensor, contents: InferTensorContents) -> None:
    if tensor.datatype == "BYTES":
        contents.bytes_contents.extend(_element_bytes(e) for e in tensor.elements)
        return
    target = DATATYPES[tensor.datatype].contents
    assert target is not None
    getattr(contents, target).extend(tensor.elements)
