"""Input validation against ``components.schemas.Input``, the way coglet does it.

Unknown keys are dropped before validating (Replicate's historical behaviour), errors come
back one per field in FastAPI's ``detail`` shape, and defaults are filled in afterwards so the
model always sees every declared input.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from runners.request_errors import InputValidationError, ValidationIssue

_DOCUMENT_URI = "urn:conduit:openapi"


def _allow_null(node: Any) -> Any:
    """Rewrite OpenAPI 3.0's ``nullable: true`` into JSON Schema, which has no such keyword."""
    if isinstance(node, list):
        return [_allow_null(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _allow_null(value) for key, value in node.items()}
    if out.pop("nullable", False) is not True:
        return out
    if isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
        return out
    return {"anyOf": [{"type": "null"}, out]}


def _absolute_refs(node: Any) -> Any:
    """Point the document's local ``$ref``s (``#/...``) at its registered URI, so the Input
    schema can be the validator's root: a root ``$ref`` would be resolved on every call."""
    if isinstance(node, list):
        return [_absolute_refs(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _absolute_refs(value) for key, value in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = _DOCUMENT_URI + ref
    return out


def _type_message(error: ValidationError) -> str:
    # coglet's validator prints JSON, not Python reprs; keep the wording identical.
    expected = error.validator_value
    instance = json.dumps(error.instance)
    if isinstance(expected, list):
        return f"{instance} is not of types " + ", ".join(json.dumps(t) for t in expected)
    return f"{instance} is not of type {json.dumps(expected)}"


class InputValidator:
    """Validates inputs against one OpenAPI document; ``$ref`` resolves within it."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        schemas = document.get("components", {}).get("schemas", {})
        input_schema = schemas.get("Input")
        self._properties: dict[str, Any] = {}
        self._required: list[str] = []
        self._validator: Draft202012Validator | None = None
        if not isinstance(input_schema, dict):
            return  # coglet skips validation when there is no Input schema
        self._properties = dict(input_schema.get("properties", {}))
        self._required = list(input_schema.get("required", []))
        contents = _absolute_refs(_allow_null(copy.deepcopy(dict(document))))
        resource = Resource.from_contents(contents, default_specification=DRAFT202012)
        registry: Registry[Any] = Registry().with_resource(_DOCUMENT_URI, resource)
        root = contents["components"]["schemas"]["Input"]
        self._validator = Draft202012Validator(root, registry=registry)

    def prepare(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Return the input the model will see, or raise :class:`InputValidationError`."""
        if self._validator is None:
            return dict(raw)
        inputs = {key: value for key, value in raw.items() if key in self._properties}
        issues = self._issues(inputs)
        if issues:
            raise InputValidationError(issues)
        for name, prop in self._properties.items():
            if name not in inputs and "default" in prop:
                inputs[name] = copy.deepcopy(prop["default"])
            elif prop.get("type") == "integer" and isinstance(inputs.get(name), float):
                inputs[name] = int(inputs[name])  # 2.0 is a valid JSON Schema integer
        return inputs

    def _issues(self, inputs: Mapping[str, Any]) -> list[ValidationIssue]:
        assert self._validator is not None
        issues: list[ValidationIssue] = []
        reported_missing = False
        for error in self._validator.iter_errors(inputs):
            if error.validator == "required" and not error.path:
                if not reported_missing:
                    reported_missing = True
                    issues.extend(
                        ValidationIssue(name, "Field required", "value_error.missing")
                        for name in self._required
                        if name not in inputs
                    )
                continue
            field = "/".join(str(part) for part in error.absolute_path) or "__root__"
            msg = _type_message(error) if error.validator == "type" else error.message
            issues.append(ValidationIssue(field, msg))
        return issues
