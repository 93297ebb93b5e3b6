"""A prediction's scratch directory (where its file inputs and outputs live) is removed however
the prediction ends, its driver canceled by a runner shutting down included."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

from protocol.values import Priority
from runners.model import Model, PredictContext
from runners.prediction import Prediction
from runners.scheduler import Scheduler


class Holding(Model):
    """Writes a file into its scratch directory, then waits until it is canceled."""

    name: ClassVar[str] = "holding"

    def __init__(self) -> None:
        self.scratch: Path | None = None
        self.wrote = asyncio.Event()

    async def predict(self, inputs: dict[str, Any], ctx: PredictContext) -> None:
        self.scratch = ctx.scratch_dir()
        (self.scratch / "partial.bin").write_bytes(b"x" * 1024)
        self.wrote.set()
        await asyncio.Event().wait()


async def test_a_canceled_driver_removes_the_scratch_directory() -> None:
    scheduler = Scheduler(slots=1, max_queue_depth=0)
    ticket = scheduler.admit(Priority.NORMAL)
    prediction = Prediction("p1", {}, {}, None, ticket=ticket, scheduler=scheduler)
    model = Holding()
    driver = prediction.start(model, lambda _: None)
    await asyncio.wait_for(model.wrote.wait(), 30)
    scratch = model.scratch
    assert scratch is not None and scratch.exists()
    driver.cancel()
    await asyncio.wait({driver})
    assert driver.cancelled()
    assert not scratch.exists()  # removed before the driver ended
