"""``faulty``: echo plus the failures operators meet, for fault drills and tests.

Extra inputs: ``crash`` kills the whole runner process mid-prediction (a segfaulting CUDA
kernel, an OOM kill); ``ignore_cancel`` keeps running through a cancel, as a wedged model does.
With ``CONDUIT_FAULTY_RECORD=<file>`` every invocation appends its prediction id to that file
(one line, ``O_APPEND``), so a drill can count how often each prediction really ran.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from runners.model import PredictContext
from runners.models.echo import EchoModel
from runners.schema import InputField


def _record(prediction_id: str) -> None:
    path = os.environ.get("CONDUIT_FAULTY_RECORD")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{prediction_id}\n".encode())
    finally:
        os.close(fd)


class FaultyModel(EchoModel):
    name: ClassVar[str] = "faulty"
    inputs: ClassVar[tuple[InputField, ...]] = (
        *EchoModel.inputs,
        InputField("crash", "boolean", default=False, description="Kill the runner process"),
        InputField(
            "ignore_cancel", "boolean", default=False, description="Keep running when canceled"
        ),
    )

    async def predict(self, inputs: dict[str, Any], ctx: PredictContext) -> AsyncIterator[str]:
        _record(ctx.prediction_id)
        if inputs["crash"]:
            ctx.log("crashing the runner as requested")
            await asyncio.sleep(inputs["delay"])
            os._exit(70)
        outputs = super().predict(inputs, ctx)
        assert isinstance(outputs, AsyncIterator)
        while True:
            try:
                yield await anext(outputs)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if not inputs["ignore_cancel"]:
                    raise
                # A wedged model: it swallows the cancel and holds its slot for as long as the
                # whole run would have taken, then returns.
                await asyncio.shield(asyncio.sleep(inputs["n"] * inputs["delay"]))
                return
