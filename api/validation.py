"""Validate a prediction's ``input`` against its version's OpenAPI ``Input`` schema.

Cog writes OpenAPI 3.0 schemas: ``nullable: true`` instead of a null type, and ``$ref``s into
``components.schemas`` (enums for ``choices``). They are turned into plain JSON Schema once per
version, and the catalog keeps the compiled validator.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft7Validator

from api.errors import InvalidInput


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


def check_input(validator: Draft7Validator | None, value: dict[str, Any]) -> None:
    if validator is None:
        return
    errors = []
    for error in sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.path))):
        path = [str(p) for p in error.absolute_path]
        if error.validator == "required" and isinstance(error.instance, dict):
            missing = [r for r in error.validator_value if r not in error.instance]
            path += missing[:1]
        field = ".".join(["input", *path])
        errors.append({"field": field, "message": error.message})
    if errors:
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        raise InvalidInput(detail, errors=errors)
