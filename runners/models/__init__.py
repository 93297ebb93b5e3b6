"""The models a runner can serve, by name.

Imported lazily: a model's heavy dependencies (torch, vLLM) are loaded only by the runner
that serves it, and an optional extra that is not installed breaks only its own model.

Models that do not ship with Conduit are served without editing this package: name them by
import path (``conduit runner mypackage.models:MyModel``), or register names for them in
``CONDUIT_RUNNER_MODELS`` (``name=module:Class`` pairs, comma-separated), which is how the test
suite serves its fault-injecting model.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from runners.model import Model

MODELS: dict[str, str] = {
    "echo": "runners.models.echo:EchoModel",
    "files": "runners.models.files:FilesModel",
    "embeddings": "runners.models.embeddings:EmbeddingsModel",
    "vllm": "runners.models.vllm:VLLMModel",
}

EXTRA_MODELS_ENV = "CONDUIT_RUNNER_MODELS"


def registered(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The built-in models plus those ``CONDUIT_RUNNER_MODELS`` registers, name -> target."""
    env = os.environ if environ is None else environ
    models = dict(MODELS)
    for pair in env.get(EXTRA_MODELS_ENV, "").split(","):
        if not pair.strip():
            continue
        name, equals, target = pair.partition("=")
        if not equals or ":" not in target or not name.strip():
            raise ValueError(f"{EXTRA_MODELS_ENV}: expected name=module:Class, not {pair!r}")
        models[name.strip()] = target.strip()
    return models


def get_model(name: str, environ: Mapping[str, str] | None = None) -> type[Model]:
    """The model class registered as ``name``, or named by a ``module:Class`` path; a
    ``KeyError`` names the registered ones."""
    if ":" in name:
        target = name
    else:
        models = registered(environ)
        try:
            target = models[name]
        except KeyError:
            known = ", ".join(sorted(models))
            raise KeyError(f"unknown model {name!r}; known: {known}") from None
    module, _, attribute = target.partition(":")
    model = getattr(importlib.import_module(module), attribute)
    if not (isinstance(model, type) and issubclass(model, Model)):
        raise TypeError(f"{target} is not a runners.model.Model subclass")
    return model
