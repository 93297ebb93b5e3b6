"""Open Inference Protocol input tensors as a block's Cog JSON.

Each tensor is the input field of its name. A BYTES element is a UTF-8 string, or the JSON
document it holds when the tensor's ``content_type`` parameter (else the request's) is
``json``. A tensor of shape ``[1]`` or ``[]`` is its one element; any other shape gives nested
lists (``[2, 3]``: two lists of three). Elements come from ``contents`` or, for every tensor of
the request at once, ``raw_input_contents`` (little-endian; a BYTES element as a 4-byte
little-endian length and its bytes). A tensor that does not hold what its datatype and shape
say is ``INVALID_ARGUMENT`` naming it. (:mod:`gateway.oip.outputs` writes the answer.)
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any

from core.nesting import TooDeep, parse_json
from gateway.errors import InvalidArgument
from gateway.oip.datatypes import CONTENT_TYPE, DATATYPES, Datatype, parameter
from gateway.proto.grpc_service_pb2 import InferTensorContents, ModelInferRequest

InputTensor = ModelInferRequest.InferInputTensor

JSON_TYPES = frozenset({"json", "application/json"})
TEXT_TYPES = frozenset({"", "str", "string", "text", "text/plain"})
#: Most dimensions a tensor may have.
MAX_RANK = 32
#: Most lists an empty tensor's shape may ask for (``[n, 0]`` is ``n`` empty lists).
MAX_EMPTY_LISTS = 1 << 16
_CONTENTS_FIELDS = tuple(sorted({d.contents for d in DATATYPES.values() if d.contents}))


def decode_inputs(request: ModelInferRequest) -> dict[str, Any]:
    """The request's tensors as the block's input object."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument(
            f"has {len(raw)} entries for {len(request.inputs)} inputs", "raw_input_contents"
        )
    request_type = parameter(request.parameters, CONTENT_TYPE)
    data: dict[str, Any] = {}
    for index, tensor in enumerate(request.inputs):
        name = tensor.name
        if not name:
            raise InvalidArgument("has no name", f"inputs[{index}]")
        if name in data:
            raise InvalidArgument("given twice", f"input {name!r}")
        data[name] = decode_input(tensor, raw[index] if raw else None, request_type)
    return data


def decode_input(tensor: InputTensor, raw: bytes | None, request_type: Any = None) -> Any:
    """One tensor's value: its element for shape ``[1]``/``[]``, else nested lists."""
    where = f"input {tensor.name!r}"
    datatype = DATATYPES.get(tensor.datatype)
    if datatype is None:
        known = ", ".join(DATATYPES)
        raise InvalidArgument(f"unknown datatype {tensor.datatype!r} (one of {known})", where)
    if "shared_memory_region" in tensor.parameters:
        raise InvalidArgument("shared memory is not supported: send the tensor's contents", where)
    shape = list(tensor.shape)
    count = element_count(shape, where)
    if raw is not None:
        if tensor.HasField("contents"):
            raise InvalidArgument("has contents beside raw_input_contents", where)
        elements = _from_raw(tensor.datatype, datatype, raw, count, where)
    else:
        elements = _from_contents(tensor.datatype, datatype, tensor.contents, count, where)
    if tensor.datatype == "BYTES":
        content_type = parameter(tensor.parameters, CONTENT_TYPE)
        if content_type is None:
            content_type = request_type
        elements = _strings(elements, content_type, where)
    elif tensor.datatype in ("FP16", "BF16", "FP32", "FP64"):
        if not all(math.isfinite(e) for e in elements):
            raise InvalidArgument("holds a value that is not a finite number", where)
    if len(shape) <= 1 and count == 1:
        return elements[0]
    return _nest(elements, shape)


def element_count(shape: Sequence[int], where: str) -> int:
    if len(shape) > MAX_RANK:
        raise InvalidArgument(f"has {len(shape)} dimensions, over {MAX_RANK}", where)
    count = 1
    for size in shape:
        if size < 0:
            raise InvalidArgument(f"shape {list(shape)} has a negative dimension", where)
        count *= size
    if count == 0:
        lists = 1
        for size in shape:
            if size == 0:
                break
            lists *= size
            if lists > MAX_EMPTY_LISTS:
                raise InvalidArgument(f"shape {list(shape)} is too large for no elements", where)
    return count


def _from_raw(name: str, datatype: Datatype, raw: bytes, count: int, where: str) -> list[Any]:
    if name == "BYTES":
        return _split_bytes(raw, count, where)
    expected = count * datatype.size
    if len(raw) != expected:
        raise InvalidArgument(
            f"raw contents are {len(raw)} bytes; {count} {name} elements are {expected}", where
        )
    if name == "BF16":  # the upper half of an FP32
        widened = b"".join(b"\0\0" + raw[i : i + 2] for i in range(0, len(raw), 2))
        return list(struct.unpack(f"<{count}f", widened))
    assert datatype.code is not None
    return list(struct.unpack(f"<{count}{datatype.code}", raw))


def _split_bytes(raw: bytes, count: int, where: str) -> list[bytes]:
    elements: list[bytes] = []
    offset = 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise InvalidArgument("raw BYTES contents end inside an element's length", where)
        (size,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise InvalidArgument("raw BYTES contents end inside an element", where)
        elements.append(raw[offset : offset + size])
        offset += size
    if len(elements) != count:
        raise InvalidArgument(
            f"raw BYTES contents hold {len(elements)} elements; its shape says {count}", where
        )
    return elements


def _from_contents(
    name: str, datatype: Datatype, contents: InferTensorContents, count: int, where: str
) -> list[Any]:
    if datatype.contents is None:
        raise InvalidArgument(f"{name} is sent in raw_input_contents only", where)
    for other in _CONTENTS_FIELDS:
        if other != datatype.contents and len(getattr(contents, other)):
            raise InvalidArgument(f"has {other}, which is not for {name}", where)
    elements = list(getattr(contents, datatype.contents))
    if len(elements) != count:
        raise InvalidArgument(
            f"contents hold {len(elements)} elements; its shape says {count}", where
        )
    if datatype.bounds is not None:
        low, high = datatype.bounds
        if any(not low <= e <= high for e in elements):
            raise InvalidArgument(f"holds a value out of {name}'s range", where)
    return elements


def _strings(elements: Iterable[bytes], content_type: Any, where: str) -> list[Any]:
    kind = content_type.lower() if isinstance(content_type, str) else content_type
    if kind is not None and kind not in JSON_TYPES and kind not in TEXT_TYPES:
        raise InvalidArgument(
            f"content_type {content_type!r} is not one of json, str", f"{where} parameters"
        )
    values: list[Any] = []
    for element in elements:
        try:
            text = element.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidArgument("holds an element that is not UTF-8", where) from None
        if kind in JSON_TYPES:
            try:
                values.append(parse_json(text, where))
            except TooDeep as error:
                raise InvalidArgument(f"holds an element {error.message}", where) from None
            except ValueError as error:
                raise InvalidArgument(
                    f"holds an element that is not JSON ({error})", where
                ) from None
        else:
            values.append(text)
    return values


def _nest(elements: list[Any], shape: Sequence[int]) -> Any:
    """Row-major ``elements`` as nested lists of ``shape`` (its element count checked)."""
    if len(shape) <= 1:
        return elements
    if not elements:  # some dimension is 0
        inner = shape[1:]
        return [_nest([], inner) for _ in range(shape[0])]
    step = len(elements) // shape[0]
    return [_nest(elements[i : i + step], shape[1:]) for i in range(0, len(elements), step)]
