"""A prediction's ``input``, made canonical once: checked for what Conduit cannot store,
serialise or send, then encoded with orjson.

The encoded bytes are what is stored (``NewPrediction.input_json``) and, read back, what the
director hands the runner. What would break on the way is refused here, with 422 naming the
field, before anything is stored:

- integers outside 64 bits (orjson, hence every response and the runner request, cannot
  encode them);
- NaN and ±Infinity (not JSON; orjson would silently write ``null``);
- nesting deeper than ``max_depth`` (orjson refuses past 255 levels);
- strings, or keys, holding U+0000 (Postgres text and jsonb cannot hold it) or a lone
  surrogate (not UTF-8);
- keys that are not strings.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from api.errors import InvalidInput

#: Default deepest nesting of an input (the input object itself is level 1).
DEFAULT_MAX_DEPTH = 64
INT_MIN = -(2**63)  # orjson's range: signed 64-bit ...
INT_MAX = 2**64 - 1  # ... to unsigned 64-bit
#: At most this many refused fields are named; the first ones found.
MAX_REPORTED = 20


def canonical_input(value: dict[str, Any], max_depth: int = DEFAULT_MAX_DEPTH) -> bytes:
    """The input as canonical JSON bytes; InvalidInput naming each field that cannot be kept."""
    check = _Check(max_depth)
    check.value(value, "input", 1)
    if check.errors:
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in check.errors)
        raise InvalidInput(detail, errors=check.errors)
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as error:  # a type the parser never produces
        raise InvalidInput(
            f"input: {error}", errors=[{"field": "input", "message": str(error)}]
        ) from error


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored or sent, or None."""
    if "\x00" in text:
        return "must not contain NUL (\\u0000) characters"
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            return "must not contain lone surrogates (not valid UTF-8)"
    return None


class _Check:
    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.errors: list[dict[str, str]] = []

    def refuse(self, field: str, message: str) -> None:
        if len(self.errors) < MAX_REPORTED:
            self.errors.append({"field": field, "message": message})

    def value(self, value: Any, field: str, depth: int) -> None:
        if isinstance(value, str):
            problem = text_problem(value)
            if problem is not None:
                self.refuse(field, problem)
        elif isinstance(value, bool) or value is None:
            return
        elif isinstance(value, int):
            if not INT_MIN <= value <= INT_MAX:
                self.refuse(field, "integer out of the 64-bit range")
        elif isinstance(value, float):
            if not math.isfinite(value):
                self.refuse(field, "NaN and Infinity are not JSON numbers")
        elif isinstance(value, dict | list):
            self.container(value, field, depth)
        else:
            self.refuse(field, f"not a JSON value ({type(value).__name__})")

    def container(self, value: dict[Any, Any] | list[Any], field: str, depth: int) -> None:
        if depth > self.max_depth:
            self.refuse(field, f"nested deeper than {self.max_depth} levels")
            return
        if isinstance(value, list):
            for index, element in enumerate(value):
                self.value(element, f"{field}.{index}", depth + 1)
            return
        for key, item in value.items():
            if not isinstance(key, str):
                self.refuse(f"{field}.{key!r}", "keys must be strings")
                continue
            problem = text_problem(key)
            if problem is not None:
                self.refuse(f"{field}.{key!r}", f"key {problem}")
                continue
            self.value(item, f"{field}.{key}", depth + 1)
