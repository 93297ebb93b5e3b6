"""A model for control-API tests: holds real memory once loaded, can be gated or made to fail
while loading, records the order predictions start in, and caches its results."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from runners.model import Model, ModelCacheFlush, PredictContext
from runners.schema import InputField
from tests.fixtures.waiting import apace

WEIGHTS = 8 * 1024 * 1024


class ControlModel(Model):
    name: ClassVar[str] = "control"
    inputs: ClassVar[tuple[InputField, ...]] = (
        InputField("prompt", "string", default="hi"),
        InputField("delay", "number", default=0.0, ge=0),
    )
    output: ClassVar[dict[str, Any]] = {"type": "string"}

    def __init__(self) -> None:
        self.weights: bytearray | None = None
        self.gate: asyncio.Event | None = None
        self.fail_next_load = False
        self.loads = 0
        self.started: list[str] = []
        self.flushed = 0

    async def setup(self) -> None:
        self.loads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next_load:
            self.fail_next_load = False
            raise RuntimeError("weights are corrupt")
        self.weights = bytearray(WEIGHTS)

    async def unload(self) -> None:
        self.weights = None

    def memory_bytes(self) -> int:
        return 0 if self.weights is None else len(self.weights)

    def load_progress(self) -> float:
        return 0.5 if self.gate is not None and not self.gate.is_set() else 0.0

    async def flush_cache(self) -> ModelCacheFlush:
        self.flushed += 1
        return ModelCacheFlush(bytes_freed=0)

    async def predict(self, inputs: dict[str, Any], ctx: PredictContext) -> str:
        prompt: str = inputs["prompt"]
        self.started.append(prompt)
        if ctx.cache is not None and (cached := ctx.cache.get(prompt)) is not None:
            ctx.cache_used(True, tokens_reused=len(prompt.split()))
            return str(cached)
        await apace(inputs["delay"])  # the simulated work
        result = f"{prompt}!"
        if ctx.cache is not None:
            ctx.cache.put(prompt, result, len(result))
        return result
