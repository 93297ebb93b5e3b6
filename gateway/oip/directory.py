"""What the Open Inference Protocol calls a model: a block, described from its Cog schema.

A model's name is its block id (``blk-…``); its one version is the Cog version the block runs
(the released version of its deployment, or the version it names). Its inputs are the
properties of the schema's ``Input``; its outputs are the properties of an object ``Output``,
else one tensor named ``output`` (properties in Cog's ``x-order``, then by name). A string is
BYTES, an integer INT64, a number FP64, a boolean BOOL, each of shape ``[1]``; an array of
those is shape ``[-1]``; anything else is a BYTES tensor holding JSON. A block is ready while
a deployment runs its version. A block the account may not use is described exactly as one
that does not exist: not at all.

A named graph (``gph-…``) is a model too: its input is the task's JSON (a BYTES tensor per
field, as the tensors map them), its answer one tensor ``output`` (or one per key of an object
answer); it is described with no fixed inputs, one ``output``, and ready while it exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from blocks import named_graphs
from blocks.named_graphs import GRAPH_ID
from blocks.versions import find_block_version
from catalog.cache import Catalog, TTLCache
from catalog.records import AccountInfo, VersionInfo
from gateway.oip.outputs import OUTPUT
from gateway.task import target_of

PLATFORM = "cog"
GRAPH_PLATFORM = "conduit-graph"
_TYPES = {"string": "BYTES", "integer": "INT64", "number": "FP64", "boolean": "BOOL"}
_REF = "#/components/schemas/"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    #: -1: a dimension of variable size.
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelDescription:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    ready: bool


class ModelDirectory(Protocol):
    async def model(self, account: AccountInfo, name: str) -> ModelDescription | None:
        """Model ``name`` as ``account`` sees it; None when it does not exist or the account
        may not use it (the one answer for both)."""
        ...


class NoModels:
    """The directory of a gateway that describes no model."""

    async def model(self, account: AccountInfo, name: str) -> ModelDescription | None:
        return None


class BlockDirectory:
    """Blocks (and named graphs) as the catalog has them, each answer remembered ``ttl``
    seconds per account."""

    def __init__(self, catalog: Catalog, ttl: float = 5.0) -> None:
        self.catalog = catalog
        self._cache: TTLCache[tuple[int, str], ModelDescription | None] = TTLCache(ttl)

    async def model(self, account: AccountInfo, name: str) -> ModelDescription | None:
        target_of(name, "name")  # before it keys the cache
        return await self._cache.get((account.id, name), lambda: self._read(account, name))

    async def _read(self, account: AccountInfo, name: str) -> ModelDescription | None:
        if GRAPH_ID.fullmatch(name):
            graph = await named_graphs.get(self.catalog.engine, account.id, name)
            if graph is None:
                return None
            output = (TensorSpec(OUTPUT, "BYTES", (1,)),)
            return ModelDescription(name, ("1",), GRAPH_PLATFORM, (), output, True)
        found = await find_block_version(self.catalog, account, name)
        return describe(found.block.id, found.version) if found is not None else None


def describe(name: str, version: VersionInfo) -> ModelDescription:
    schemas = version.openapi_schema.get("components", {}).get("schemas", {})
    if not isinstance(schemas, dict):
        schemas = {}
    return ModelDescription(
        name=name,
        versions=(version.id,),
        platform=PLATFORM,
        inputs=input_specs(schemas),
        outputs=output_specs(schemas),
        ready=version.deployed,
    )


def input_specs(schemas: dict[str, Any]) -> tuple[TensorSpec, ...]:
    properties = _properties(schemas.get("Input"), schemas)
    return _specs(properties, schemas) if properties is not None else ()


def output_specs(schemas: dict[str, Any]) -> tuple[TensorSpec, ...]:
    output = _resolve(schemas.get("Output"), schemas)
    properties = _properties(output, schemas)
    if properties is not None:
        return _specs(properties, schemas)
    if output is None:
        return (TensorSpec(OUTPUT, "BYTES", (1,)),)
    return (_spec(OUTPUT, output, schemas),)


def _specs(properties: dict[str, Any], schemas: dict[str, Any]) -> tuple[TensorSpec, ...]:
    """One spec a property, in ``x-order`` and then by name (the stored schema keeps no
    order of its keys)."""
    ordered = sorted(properties.items(), key=lambda item: (_order(item[1]), item[0]))
    return tuple(_spec(key, value, schemas) for key, value in ordered)


def _order(schema: Any) -> float:
    order = schema.get("x-order") if isinstance(schema, dict) else None
    return float(order) if isinstance(order, int | float) else float("inf")


def _properties(schema: Any, schemas: dict[str, Any]) -> dict[str, Any] | None:
    schema = _resolve(schema, schemas)
    if schema is None or schema.get("type") != "object":
        return None
    properties = schema.get("properties")
    return properties if isinstance(properties, dict) else None


def _resolve(schema: Any, schemas: dict[str, Any], depth: int = 0) -> dict[str, Any] | None:
    """``schema`` with a ``$ref`` (or Cog's ``allOf: [{$ref}]``) to a component followed."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    ref = schema.get("$ref")
    all_of = schema.get("allOf")
    if ref is None and isinstance(all_of, list) and len(all_of) == 1:
        ref = all_of[0].get("$ref") if isinstance(all_of[0], dict) else None
    if isinstance(ref, str) and ref.startswith(_REF):
        return _resolve(schemas.get(ref.removeprefix(_REF)), schemas, depth + 1)
    return schema


def _spec(name: str, schema: Any, schemas: dict[str, Any]) -> TensorSpec:
    resolved = _resolve(schema, schemas) or {}
    kind = resolved.get("type")
    if kind == "array":
        items = _resolve(resolved.get("items"), schemas) or {}
        datatype = _TYPES.get(items.get("type", ""))
        if datatype is not None:
            return TensorSpec(name, datatype, (-1,))
    return TensorSpec(name, _TYPES.get(kind, "BYTES") if isinstance(kind, str) else "BYTES", (1,))
