"""The models a runner can serve, by name.

Imported lazily: a model's heavy dependencies (torch, vLLM) are loaded only by the runner
that serves it, and an optional extra that is not installed breaks only its own model.
"""

from __future__ import annotations

import importlib

from runners.model import Model

MODELS: dict[str, str] = {
    "echo": "runners.models.echo:EchoModel",
    "faulty": "runners.models.faulty:FaultyModel",
    "embeddings": "runners.models.embeddings:EmbeddingsModel",
    "vllm": "runners.models.vllm:VLLMModel",
}


def get_model(name: str) -> type[Model]:
    """The model class registered as ``name``; ``KeyError`` names the known ones."""
    try:
        target = MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None
    module, _, attribute = target.partition(":")
    model: type[Model] = getattr(importlib.import_module(module), attribute)
    return model
