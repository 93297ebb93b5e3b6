"""A run's input checked once, wherever it arrives (the api's predictions, the gateway's blocks):
made canonical, then validated against its version's OpenAPI ``Input`` schema.

Canonical: checked for what Conduit cannot store, serialise or send, then encoded with orjson.
The encoded bytes are what is stored (``NewPrediction.input_json``) and, read back, what the
director hands the runner. What would break on the way is refused here, naming the field, before
anything is stored:

- integers outside 64 bits (orjson, hence every response and the runner request, cannot
  encode them);
- NaN and ±Infinity (not JSON; orjson would silently write ``null``);
- nesting deeper than ``max_depth`` (orjson refuses past 255 levels);
- strings, or keys, holding U+0000 (Postgres text and jsonb cannot hold it) or a lone
  surrogate (not UTF-8);
- keys that are not strings.

Validated: Cog writes OpenAPI 3.0 schemas, with ``nullable: true`` instead of a null type, and
``$ref``s into ``components.schemas`` (enums for ``choices``). They are turned into plain JSON
Schema once per version, and the catalog keeps the compiled validator
(:mod:`catalog.cache`).

A refusal is :class:`RefusedInput`, naming each field under ``root`` (``input.<path>`` unless
told otherwise); each front end answers it in its own terms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import orjson
from jsonschema import Draft7Validator

from core.nesting import MAX_DEPTH, TooDeep, check_depth

#: Default deepest nesting of an input (the input object itself is level 1): the one rule.
DEFAULT_MAX_DEPTH = MAX_DEPTH
INT_MIN = -(2**63)  # orjson's range: signed 64-bit ...
INT_MAX = 2**64 - 1  # ... to unsigned 64-bit
#: At most this many refused fields are named; the first ones found.
MAX_REPORTED = 20


class FieldError(NamedTuple):
    """One refused field: its dotted path (``input.prompt``) and why."""

    field: str
    message: str


class FieldErrors(Exception):
    """Something refused; ``errors`` names each field at fault."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__(errors)
        self.errors = errors

    @property
    def detail(self) -> str:
        """Every error on one line: ``field: message; field: message``."""
        return "; ".join(f"{e.field}: {e.message}" for e in self.errors)

    def __str__(self) -> str:
        return self.detail


class RefusedInput(FieldErrors):
    """The input cannot be kept or run."""


def canonical_input(
    value: dict[str, Any], max_depth: int = DEFAULT_MAX_DEPTH, *, root: str = "input"
) -> bytes:
    """The input as canonical JSON bytes; RefusedInput naming each field that cannot be kept."""
    try:
        check_depth(value, root, max_depth)  # without recursion, before the walk below
    except TooDeep as error:
        raise RefusedInput([FieldError(error.field, error.message)]) from None
    check = _Check(max_depth)
    check.value(value, root, 1)
    if check.errors:
        raise RefusedInput(check.errors)
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as error:  # a type the parser never produces
        raise RefusedInput([FieldError(root, str(error))]) from error


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
        self.errors: list[FieldError] = []

    def refuse(self, field: str, message: str) -> None:
        if len(self.errors) < MAX_REPORTED:
            self.errors.append(FieldError(field, message))

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


def _to_json_schema(node: Any) -> Any:
    if isinstance(node, list):
        return [_to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _to_json_schema(value) for key, value in node.items()}
    if converted.pop("nullable", False):
        if "type" in converted:
            kind = converted["type"]
            converted["type"] = [*kind, "null"] if isinstance(kind, list) else [kind, "null"]
        elif "allOf" in converted or "$ref" in converted:
            converted = {"anyOf": [converted, {"type": "null"}]}
    return converted


def build_validator(openapi_schema: dict[str, Any]) -> Draft7Validator | None:
    """A compiled validator for the schema's ``Input``; None when the schema has none."""
    schemas = openapi_schema.get("components", {}).get("schemas", {})
    if "Input" not in schemas:
        return None
    root = dict(_to_json_schema(schemas["Input"]))
    root["components"] = {"schemas": _to_json_schema(schemas)}
    return Draft7Validator(root)


def unknown_fields(
    validator: Draft7Validator | None, value: dict[str, Any], *, root: str = "input"
) -> list[FieldError]:
    """The input's top-level fields its version's ``Input`` does not declare, each named with
    the inputs it does declare. Cog (and Replicate) drop such a field without a word, so a
    misspelt one (``image`` for ``file``) would run the model without it and succeed with a
    wrong result; the api refuses it instead. An ``Input`` that declares no properties, or
    allows others (``additionalProperties``), has none."""
    if validator is None:
        return []
    schema = validator.schema
    if not isinstance(schema, Mapping):
        return []
    declared = schema.get("properties")
    if not isinstance(declared, dict) or schema.get("additionalProperties", False) is not False:
        return []
    unknown = [key for key in value if key not in declared]
    if not unknown:
        return []
    inputs = ", ".join(sorted(declared)) or "none"
    message = f"is not an input of this model (its inputs: {inputs})"
    return [FieldError(f"{root}.{key}", message) for key in unknown[:MAX_REPORTED]]


def check_input(
    validator: Draft7Validator | None,
    value: dict[str, Any],
    *,
    root: str = "input",
    refuse_unknown: bool = False,
) -> None:
    """Refuse (RefusedInput) an input its version's schema does not accept; None accepts all.
    ``refuse_unknown``: a field the schema does not declare is refused too
    (:func:`unknown_fields`), where Cog would drop it."""
    if validator is None:
        return
    errors = unknown_fields(validator, value, root=root) if refuse_unknown else []
    for error in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.path))):
        path = [str(p) for p in error.absolute_path]
        if error.validator == "required" and isinstance(error.instance, dict):
            missing = [r for r in error.validator_value if r not in error.instance]
            path += missing[:1]
        errors.append(FieldError(".".join([root, *path]), error.message))
    if errors:
        raise RefusedInput(errors)
