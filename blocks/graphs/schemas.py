"""A named graph's mappings checked against its blocks' Cog schemas, at registration.

KServe's most reported graph failure is one step's output not fitting the next step's input,
found only when a request runs. Here it is found when the graph is registered, from what the
blocks' versions declare (``components.schemas.Input`` and ``Output``, as Cog writes them):

- a mapped field the block's ``Input`` does not declare (Cog would drop it silently);
- a required input (no default) left unmapped;
- a literal (``'fr'``, ```3```) the field's schema refuses, by the version's own validator;
- a plain path into another step's output (``steps.<id>.output`` then field names) whose
  JSON type, by that block's ``Output`` schema, the field cannot take: an ``array`` into a
  ``string``, or a field of an array (always null) into a field that takes no null.

Only definite faults are refused: a block without an ``Input`` (or ``Output``) schema, a
schema without a type (``{}``, ``anyOf`` of unknowns), a path the schema does not describe,
or any expression other than a plain path or a literal is taken on trust. An integer into a
number, or a number into an integer, is not a fault (``3.0`` is an integer to JSON Schema).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from blocks.blocks import BlockInfo
from blocks.graphs.specs import GraphSpec, StepSpec
from catalog.records import VersionInfo
from tracker.input_checks import FieldError

#: Declared fields listed in a refusal of an undeclared one, at most.
_LISTED = 20
_FOLLOWED_REFS = 16


class StepBlock(Protocol):
    """What a step's block resolves to (the front door's ``Destination`` of a block is one;
    its ``block`` is always set)."""

    @property
    def block(self) -> BlockInfo | None: ...

    @property
    def version(self) -> VersionInfo: ...

    @property
    def validator(self) -> Any: ...


def block_of(step: StepBlock) -> BlockInfo:
    """The block a step resolved to."""
    assert step.block is not None
    return step.block


def _block_id(step: StepBlock) -> str:
    return block_of(step).id


def check_mappings(spec: GraphSpec, resolved: Mapping[str, StepBlock]) -> list[FieldError]:
    """Every fault of the mappings of the steps in ``resolved`` (step id → its block)."""
    errors: list[FieldError] = []
    for step in spec.steps:
        target = resolved.get(step.id)
        if target is not None:
            errors.extend(_check_step(step, target, resolved))
    return errors


def _check_step(
    step: StepSpec, target: StepBlock, resolved: Mapping[str, StepBlock]
) -> list[FieldError]:
    schemas = _components(target.version.openapi_schema)
    input_schema = _resolve(schemas.get("Input"), schemas)
    if not input_schema:
        return []
    properties = input_schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    errors: list[FieldError] = []
    for name, expression in step.input.items():
        field = f"{step.field}.input.{name}"
        if name not in properties:
            errors.append(FieldError(field, _undeclared(step.block, name, properties)))
            continue
        if expression.literal is not None:
            errors.extend(_check_literal(field, name, expression.literal[0], target.validator))
        elif (source_path := expression.source) is not None and source_path.step in resolved:
            if source_path.step == step.id:
                continue  # refused already: a step cannot read itself
            source = resolved[source_path.step]
            accepted = _types(properties[name], schemas)
            message = _check_source(expression.text, source_path.path, source, name, accepted)
            if message is not None:
                errors.append(FieldError(field, message))
    required = input_schema.get("required")
    for name in required if isinstance(required, list) else []:
        prop = properties.get(name)
        if name not in step.input and not (isinstance(prop, dict) and "default" in prop):
            errors.append(
                FieldError(
                    f"{step.field}.input.{name}",
                    f"block {step.block} requires {name}; map it to an expression",
                )
            )
    return errors


def _undeclared(block: str, name: str, properties: Mapping[str, Any]) -> str:
    declared = sorted(properties)
    listed = ", ".join(declared[:_LISTED]) + (", …" if len(declared) > _LISTED else "")
    return f"block {block} takes no input {name!r} (it takes: {listed or 'none'})"


def _check_literal(field: str, name: str, value: Any, validator: Any) -> list[FieldError]:
    """The version's validator on ``{name: value}``, keeping what it says of ``name`` alone
    (not the other required fields this one-field input lacks)."""
    if validator is None:
        return []
    errors = []
    for error in validator.iter_errors({name: value}):
        path = list(error.absolute_path)
        if path and path[0] == name:
            errors.append(FieldError(field, f"the literal is refused: {error.message}"))
    return errors


def _check_source(
    text: str,
    path: tuple[str, ...],
    source: StepBlock,
    name: str,
    accepted: frozenset[str] | None,
) -> str | None:
    """Why the output path cannot fit the field (of ``accepted`` types), or None when it can
    (or might)."""
    if accepted is None:
        return None
    source_schemas = _components(source.version.openapi_schema)
    found = _types_at(source_schemas.get("Output"), path, source_schemas)
    if found is None or any(_fits(kind, accepted) for kind in found):
        return None
    if path and found == frozenset({"null"}):
        return (
            f"{text} is always null (block {_block_id(source)}'s output has no such field), "
            f"and {name} takes {_describe(accepted)}"
        )
    return (
        f"{text} is {_describe(found)} (block {_block_id(source)}'s Output schema), "
        f"but {name} takes {_describe(accepted)}"
    )


def _components(openapi_schema: Mapping[str, Any]) -> Mapping[str, Any]:
    components = openapi_schema.get("components")
    schemas = components.get("schemas") if isinstance(components, dict) else None
    return schemas if isinstance(schemas, dict) else {}


def _resolve(schema: Any, schemas: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$ref`` (into ``components.schemas``) or lone ``allOf`` (Cog's
    way to point at a ``choices`` enum) merged in; ``{}`` for anything unreadable."""
    for _ in range(_FOLLOWED_REFS):
        if not isinstance(schema, dict):
            return {}
        ref = schema.get("$ref")
        all_of = schema.get("allOf")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            inner = schemas.get(ref.rsplit("/", 1)[-1])
            rest = {k: v for k, v in schema.items() if k != "$ref"}
        elif isinstance(all_of, list) and len(all_of) == 1:
            inner = all_of[0]
            rest = {k: v for k, v in schema.items() if k != "allOf"}
        else:
            return schema
        if not isinstance(inner, dict):
            return {}
        schema = {**inner, **rest}
    return {}


def _types(schema: Any, schemas: Mapping[str, Any]) -> frozenset[str] | None:
    """The JSON types a schema allows, or None when it does not say."""
    resolved = _resolve(schema, schemas)
    kind = resolved.get("type")
    types: set[str]
    if isinstance(kind, str):
        types = {kind}
    elif isinstance(kind, list) and kind and all(isinstance(k, str) for k in kind):
        types = set(kind)
    elif isinstance(resolved.get("enum"), list) and resolved["enum"]:
        types = {_json_type(value) for value in resolved["enum"]}
    elif isinstance(alternatives := resolved.get("anyOf", resolved.get("oneOf")), list):
        found = [_types(item, schemas) for item in alternatives]
        if not found or any(item is None for item in found):
            return None
        types = set().union(*(item for item in found if item is not None))
    else:
        return None
    if resolved.get("nullable") is True:
        types.add("null")
    return frozenset(types)


def _types_at(
    schema: Any, path: tuple[str, ...], schemas: Mapping[str, Any]
) -> frozenset[str] | None:
    """The JSON types at ``path`` inside a value of ``schema``; ``{"null"}`` where the path
    crosses something that is surely not an object."""
    for name in path:
        resolved = _resolve(schema, schemas)
        kinds = _types(resolved, schemas)
        if kinds is not None and "object" not in kinds:
            return frozenset({"null"})
        properties = resolved.get("properties")
        if not isinstance(properties, dict) or name not in properties:
            return None
        schema = properties[name]
    return _types(schema, schemas)


def _fits(kind: str, accepted: frozenset[str]) -> bool:
    if kind in accepted:
        return True
    return kind in ("integer", "number") and bool(accepted & {"integer", "number"})


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _describe(types: frozenset[str]) -> str:
    names = [f"an {t}" if t[0] in "aeiou" else f"a {t}" for t in sorted(types) if t != "null"]
    if "null" in types:
        names.append("null")
    return " or ".join(names)
