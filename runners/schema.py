"""A model's OpenAPI document, built the way ``cog build`` writes ``openapi_schema.json``.

Models declare their inputs as :class:`InputField` values and their output as a JSON schema;
:func:`build_openapi_schema` turns those into the document a director (and replicate's
clients) read: ``components.schemas.Input`` with ``x-order``/``title``/``default``/
``minimum``..., ``Output`` (``x-cog-array-type: iterator`` for streamed lists), the request,
response, status and validation-error schemas, and cog's paths.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from protocol.headers import JSON
from protocol.paths import CANCEL_PATH, HEALTH_CHECK_PATH, PREDICTIONS_PATH, ROOT_PATH
from protocol.values import RunnerStatus
from runners import COG_VERSION

InputType = Literal["string", "integer", "number", "boolean", "file"]
"""``file`` is Cog's ``Path``: a URL on the wire (``{"type": "string", "format": "uri"}``), a
local :class:`pathlib.Path` by the time the model sees it (:mod:`runners.file_inputs`)."""

_COG_STATUS_ORDER = (
    RunnerStatus.STARTING,
    RunnerStatus.PROCESSING,
    RunnerStatus.SUCCEEDED,
    RunnerStatus.CANCELED,
    RunnerStatus.FAILED,
)
"""The prediction statuses in the order coglet's OpenAPI document lists them."""


class _NoDefault(enum.Enum):
    NO_DEFAULT = enum.auto()


NO_DEFAULT = _NoDefault.NO_DEFAULT
"""Marks an input without a default: the field is required."""


@dataclass(frozen=True)
class InputField:
    """One model input, mirroring ``cog.Input(...)``'s options."""

    name: str
    type: InputType
    default: Any = NO_DEFAULT
    description: str | None = None
    ge: int | float | None = None
    le: int | float | None = None
    min_length: int | None = None
    max_length: int | None = None
    regex: str | None = None
    choices: tuple[str | int, ...] | None = None
    nullable: bool = False


def title_case(name: str) -> str:
    return name.replace("_", " ").title()


def iterator_output(items: Mapping[str, Any], *, concatenate: bool = False) -> dict[str, Any]:
    """Output schema of a model that yields: a list whose items arrive one by one."""
    schema: dict[str, Any] = {
        "title": "Output",
        "type": "array",
        "items": dict(items),
        "x-cog-array-type": "iterator",
    }
    if concatenate:
        schema["x-cog-array-display"] = "concatenate"
    return schema


def _input_property(order: int, field: InputField) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The property for ``field`` and, for ``choices``, the enum schema it references."""
    prop: dict[str, Any] = {"x-order": order}
    enum_schema: dict[str, Any] | None = None
    if field.choices:
        # cog names the enum component after the parameter and points at it with allOf.
        enum_schema = {
            "title": field.name,
            "description": "An enumeration.",
            "enum": list(field.choices),
            "type": field.type,
        }
        prop["allOf"] = [{"$ref": f"#/components/schemas/{field.name}"}]
    else:
        prop["title"] = title_case(field.name)
        if field.type == "file":
            prop.update(type="string", format="uri")
        else:
            prop["type"] = field.type
    if field.default is not NO_DEFAULT:
        prop["default"] = field.default
    if field.nullable:
        prop["nullable"] = True
    optional = {
        "description": field.description,
        "minimum": field.ge,
        "maximum": field.le,
        "minLength": field.min_length,
        "maxLength": field.max_length,
        "pattern": field.regex,
    }
    prop.update({key: value for key, value in optional.items() if value is not None})
    return prop, enum_schema


def build_input_schema(fields: Sequence[InputField]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``components.schemas.Input`` plus the enum components its ``choices`` need."""
    properties: dict[str, Any] = {}
    enums: dict[str, Any] = {}
    required: list[str] = []
    for order, field in enumerate(fields):
        prop, enum_schema = _input_property(order, field)
        properties[field.name] = prop
        if enum_schema is not None:
            enums[field.name] = enum_schema
        if field.default is NO_DEFAULT:
            required.append(field.name)
    schema: dict[str, Any] = {"title": "Input", "type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema, enums


def _json_response(
    schema: dict[str, Any] | None = None, description: str = "Successful Response"
) -> dict[str, Any]:
    body = {} if schema is None else schema
    return {"description": description, "content": {JSON: {"schema": body}}}


def _validation_error() -> dict[str, Any]:
    ref = {"$ref": "#/components/schemas/HTTPValidationError"}
    return _json_response(ref, "Validation Error")


def _fixed_schemas() -> dict[str, Any]:
    def string(title: str, **extra: str) -> dict[str, Any]:
        return {"title": title, "type": "string", **extra}

    return {
        "PredictionRequest": {
            "title": "PredictionRequest",
            "type": "object",
            "properties": {
                "id": string("Id"),
                "input": {"$ref": "#/components/schemas/Input"},
            },
        },
        "PredictionResponse": {
            "title": "PredictionResponse",
            "type": "object",
            "properties": {
                "input": {"$ref": "#/components/schemas/Input"},
                "output": {"$ref": "#/components/schemas/Output"},
                "id": string("Id"),
                "version": string("Version"),
                "created_at": string("Created At", format="date-time"),
                "started_at": string("Started At", format="date-time"),
                "completed_at": string("Completed At", format="date-time"),
                "status": string("Status"),
                "error": string("Error"),
                "logs": string("Logs"),
                "metrics": {"title": "Metrics", "type": "object"},
            },
        },
        "Status": {
            "title": "Status",
            "description": "An enumeration.",
            "enum": [status.value for status in _COG_STATUS_ORDER],
            "type": "string",
        },
        "HTTPValidationError": {
            "title": "HTTPValidationError",
            "type": "object",
            "properties": {
                "detail": {
                    "title": "Detail",
                    "type": "array",
                    "items": {"$ref": "#/components/schemas/ValidationError"},
                }
            },
        },
        "ValidationError": {
            "title": "ValidationError",
            "required": ["loc", "msg", "type"],
            "type": "object",
            "properties": {
                "loc": {
                    "title": "Location",
                    "type": "array",
                    "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                },
                "msg": string("Message"),
                "type": string("Error Type"),
            },
        },
    }


def _paths() -> dict[str, Any]:
    return {
        ROOT_PATH: {
            "get": {
                "summary": "Root",
                "operationId": "root__get",
                "responses": {"200": _json_response()},
            }
        },
        HEALTH_CHECK_PATH: {
            "get": {
                "summary": "Healthcheck",
                "operationId": "healthcheck_health_check_get",
                "responses": {"200": _json_response()},
            }
        },
        PREDICTIONS_PATH: {
            "post": {
                "summary": "Predict",
                "description": "Run a single prediction on the model",
                "operationId": "predict_predictions_post",
                "requestBody": {
                    "content": {
                        JSON: {"schema": {"$ref": "#/components/schemas/PredictionRequest"}}
                    }
                },
                "responses": {
                    "200": _json_response({"$ref": "#/components/schemas/PredictionResponse"}),
                    "422": _validation_error(),
                },
            }
        },
        CANCEL_PATH.format(id="{prediction_id}"): {
            "post": {
                "summary": "Cancel",
                "operationId": "cancel_predictions__prediction_id__cancel_post",
                "parameters": [
                    {
                        "required": True,
                        "schema": {"title": "Prediction Id", "type": "string"},
                        "name": "prediction_id",
                        "in": "path",
                    }
                ],
                "responses": {
                    "200": _json_response(),
                    "422": _validation_error(),
                },
            }
        },
    }


def build_openapi_schema(
    fields: Sequence[InputField], output: Mapping[str, Any], *, version: str = COG_VERSION
) -> dict[str, Any]:
    """The whole OpenAPI 3.0.2 document for a model with these inputs and this output."""
    input_schema, enums = build_input_schema(fields)
    output_schema = {"title": "Output", **copy.deepcopy(dict(output))}
    schemas: dict[str, Any] = {"Input": input_schema, "Output": output_schema, **enums}
    schemas.update(_fixed_schemas())
    return {
        "openapi": "3.0.2",
        "info": {"title": "Cog", "version": version},
        "paths": _paths(),
        "components": {"schemas": schemas},
    }
