"""A run's input checks, shared by the api and the gateway: canonical JSON and the version's
schema, each refusal naming its field under the caller's root."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from tracker.input_checks import (
    MAX_REPORTED,
    FieldError,
    RefusedInput,
    build_validator,
    canonical_input,
    check_input,
)

SCHEMA: dict[str, Any] = {
    "components": {
        "schemas": {
            "Input": {
                "type": "object",
                "properties": {
                    "prompt": {"type": "string"},
                    "seed": {"type": "integer", "nullable": True},
                    "size": {"allOf": [{"$ref": "#/components/schemas/size"}], "nullable": True},
                },
                "required": ["prompt"],
            },
            "size": {"type": "string", "enum": ["small", "large"]},
        }
    }
}


def _refused(call: Any, *args: Any, **kwargs: Any) -> RefusedInput:
    with pytest.raises(RefusedInput) as raised:
        call(*args, **kwargs)
    return raised.value


def test_canonical_input_is_orjson_bytes() -> None:
    value = {"prompt": "é", "n": [1, 2.5, None, True], "big": 2**64 - 1}
    assert canonical_input(value) == orjson.dumps(value)


@pytest.mark.parametrize(
    ("value", "field", "message"),
    [
        ({"n": 2**64}, "input.n", "integer out of the 64-bit range"),
        ({"n": -(2**63) - 1}, "input.n", "integer out of the 64-bit range"),
        ({"n": [1, float("nan")]}, "input.n.1", "NaN and Infinity are not JSON numbers"),
        ({"t": "a\x00b"}, "input.t", "must not contain NUL (\\u0000) characters"),
        ({"t": "\ud800"}, "input.t", "must not contain lone surrogates (not valid UTF-8)"),
        ({1: "x"}, "input.1", "keys must be strings"),
        ({"\x00": 1}, "input.'\\x00'", "key must not contain NUL (\\u0000) characters"),
        ({"o": object()}, "input.o", "not a JSON value (object)"),
    ],
)
def test_canonical_input_names_the_field_it_refuses(value: Any, field: str, message: str) -> None:
    refused = _refused(canonical_input, value)
    assert refused.errors == [FieldError(field, message)]
    assert refused.detail == f"{field}: {message}"


def test_canonical_input_refuses_nesting_past_the_limit() -> None:
    assert canonical_input({"a": {"b": 1}}, 2) == b'{"a":{"b":1}}'
    refused = _refused(canonical_input, {"a": {"b": {}}}, 2)
    assert refused.errors == [FieldError("input.a.b", "nested deeper than 2 levels")]


def test_canonical_input_names_fields_under_the_given_root() -> None:
    refused = _refused(canonical_input, {"a": [float("inf")]}, root="data")
    assert refused.errors[0].field == "data.a.0"


def test_canonical_input_reports_at_most_the_first_fields() -> None:
    refused = _refused(canonical_input, {str(i): float("nan") for i in range(MAX_REPORTED + 5)})
    assert [e.field for e in refused.errors] == [f"input.{i}" for i in range(MAX_REPORTED)]
    assert refused.detail.count("; ") == MAX_REPORTED - 1


def test_a_schema_without_input_accepts_anything() -> None:
    validator = build_validator({"components": {"schemas": {}}})
    assert validator is None
    check_input(validator, {"anything": object()})


def test_check_input_accepts_what_the_openapi_schema_allows() -> None:
    validator = build_validator(SCHEMA)
    check_input(validator, {"prompt": "x", "seed": None, "size": None})
    check_input(validator, {"prompt": "x", "seed": 3, "size": "large"})


def test_check_input_names_each_field_in_order() -> None:
    validator = build_validator(SCHEMA)
    refused = _refused(check_input, validator, {"seed": "x", "size": "huge"})
    assert refused.errors == [
        FieldError("input.prompt", "'prompt' is a required property"),
        FieldError("input.seed", "'x' is not of type 'integer', 'null'"),
        FieldError("input.size", "'huge' is not valid under any of the given schemas"),
    ]
    assert refused.detail == "; ".join(f"{e.field}: {e.message}" for e in refused.errors)


def test_check_input_names_fields_under_the_given_root() -> None:
    refused = _refused(check_input, build_validator(SCHEMA), {}, root="data")
    assert refused.errors == [FieldError("data.prompt", "'prompt' is a required property")]


def test_a_field_the_schema_does_not_declare_is_refused_only_when_asked() -> None:
    validator = build_validator(SCHEMA)
    check_input(validator, {"prompt": "x", "image": "y"})  # Cog's way: it drops it
    refused = _refused(check_input, validator, {"prompt": "x", "image": "y"}, refuse_unknown=True)
    inputs = "is not an input of this model (its inputs: prompt, seed, size)"
    assert refused.errors == [FieldError("input.image", inputs)]
    both = _refused(check_input, validator, {"image": 1, "seed": "x"}, refuse_unknown=True)
    assert [e.field for e in both.errors] == ["input.image", "input.prompt", "input.seed"]
    schema = copy.deepcopy(SCHEMA)
    schema["components"]["schemas"]["Input"]["additionalProperties"] = True
    check_input(build_validator(schema), {"prompt": "x", "image": "y"}, refuse_unknown=True)
