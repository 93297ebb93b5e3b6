"""The OpenAPI schema a Cog model server serves (``.cog/openapi_schema.json``), written without
Docker: ``cog build`` (the Go CLI, in a container) writes it, and coglet serves no schema
without it, so a model served from Cog's Python package alone (``python -m cog.server.http``)
needs one made here, from Cog's own inspection of the predictor (``cog._inspector``)::

    python -m conduit.cog_schema predict.py:Predictor [--train train.py:train] \\
        > .cog/openapi_schema.json

run in the model's directory. The schema holds what Conduit and Cog read: ``Input`` (each
field's type, title, default, bounds, choices, order and description, and the required ones),
``Output``, and for a trainer ``TrainingInput`` and ``TrainingOutput``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SKELETON: dict[str, Any] = {"openapi": "3.0.2", "info": {"title": "Cog", "version": "0.1.0"}}


def schema(predictor: str | None, trainer: str | None = None) -> dict[str, Any]:
    """The schema of ``predictor`` and ``trainer`` (each ``file.py:Name``), importable from
    the current directory."""
    schemas: dict[str, Any] = {}
    for ref, (inputs, output) in (
        (predictor, ("Input", "Output")),
        (trainer, ("TrainingInput", "TrainingOutput")),
    ):
        if ref is not None:
            info = _inspect(ref)
            schemas[inputs] = _inputs(info.inputs.values(), inputs)
            schemas[output] = {**info.output.json_type(), "title": output}
    return {**SKELETON, "paths": {}, "components": {"schemas": schemas}}


def _inspect(ref: str) -> Any:
    from cog import _inspector  # type: ignore[import-untyped]

    path, _, name = ref.partition(":")
    if not name:
        raise SystemExit(f"{ref}: expected FILE.py:NAME, e.g. predict.py:Predictor")
    if "" not in sys.path:
        sys.path.insert(0, "")
    return _inspector.create_predictor(Path(path).stem, name)


def _inputs(fields: Any, title: str) -> dict[str, Any]:
    from cog._adt import Repetition  # type: ignore[import-untyped]

    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in sorted(fields, key=lambda f: f.order):
        prop: dict[str, Any] = {
            **field.type.json_type(),
            "title": field.name.replace("_", " ").title(),
        }
        if field.default is not None:
            prop["default"] = field.type.json_encode(field.default)
        elif field.type.repetition in (Repetition.REQUIRED, Repetition.REPEATED):
            required.append(field.name)
        for key, value in (
            ("minimum", _number(field.ge)),
            ("maximum", _number(field.le)),
            ("minLength", field.min_length),
            ("maxLength", field.max_length),
            ("pattern", field.regex),
            ("enum", field.choices),
            ("deprecated", field.deprecated),
        ):
            if value is not None:
                prop[key] = value
        prop["x-order"] = field.order
        if field.description is not None:
            prop["description"] = field.description
        properties[field.name] = prop
    document: dict[str, Any] = {"type": "object", "title": title}
    if required:
        document["required"] = required
    document["properties"] = properties
    return document


def _number(value: float | None) -> float | int | None:
    return int(value) if value is not None and float(value).is_integer() else value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m conduit.cog_schema",
        description="Print the OpenAPI schema `cog build` would write to "
        ".cog/openapi_schema.json, for a model served without Docker.",
    )
    parser.add_argument("predictor", nargs="?", help="the predictor, e.g. predict.py:Predictor")
    parser.add_argument("--train", help="the trainer, e.g. train.py:train")
    args = parser.parse_args(argv)
    if args.predictor is None and args.train is None:
        parser.error("name a predictor, a trainer (--train), or both")
    print(json.dumps(schema(args.predictor, args.train), indent=2))


if __name__ == "__main__":
    main()
