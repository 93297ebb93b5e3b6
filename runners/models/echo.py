"""``echo``: the fixture model. Yields ``<prompt>-<i>`` n times, logging a line before each.

``delay`` makes it slow enough to observe BUSY, cancel and idempotent PUT; ``fail`` makes it
raise after its outputs, to exercise the failure path with partial output and logs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from runners.model import Model, PredictContext
from runners.schema import InputField, iterator_output


class EchoModel(Model):
    name: ClassVar[str] = "echo"
    inputs: ClassVar[tuple[InputField, ...]] = (
        InputField("prompt", "string", default="hello", description="Text to echo"),
        InputField(
            "n", "integer", default=1, ge=1, le=100_000, description="How many outputs to yield"
        ),
        InputField(
            "delay", "number", default=0.0, ge=0, description="Seconds to wait before each output"
        ),
        InputField("fail", "boolean", default=False, description="Raise after the outputs"),
    )
    output: ClassVar[dict[str, Any]] = iterator_output({"type": "string"}, concatenate=True)

    async def predict(self, inputs: dict[str, Any], ctx: PredictContext) -> AsyncIterator[str]:
        prompt: str = inputs["prompt"]
        delay: float = inputs["delay"]
        for i in range(inputs["n"]):
            await asyncio.sleep(delay)
            ctx.log(f"echo {prompt}-{i}")
            yield f"{prompt}-{i}"
        if inputs["fail"]:
            raise RuntimeError("echo failed as requested")
