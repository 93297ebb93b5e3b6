"""The stock echo runner, except that every chunk carries the moment it was produced.

``python -m bench.stamped_runner --port P --concurrency N`` serves ``stamped-echo`` with the
real runner server (:func:`runners.server.serve`); the model is :class:`EchoModel` with each
output ``"<prompt>-<i>"`` turned into ``"<prompt>-<i>@<CLOCK_MONOTONIC seconds>"``, stamped the
moment the echo model yields it. ``CLOCK_MONOTONIC`` is system-wide on Linux, so a client in
another process can subtract the stamp from its own ``time.monotonic()`` on receipt.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from runners.model import PredictContext
from runners.models import MODELS
from runners.models.echo import EchoModel
from runners.server import serve

SEPARATOR = "@"


class StampedEchoModel(EchoModel):
    name: ClassVar[str] = "stamped-echo"

    async def predict(self, inputs: dict[str, Any], ctx: PredictContext) -> AsyncIterator[str]:
        async for chunk in super().predict(inputs, ctx):
            yield f"{chunk}{SEPARATOR}{time.monotonic():.6f}"


def produced_at(chunk: str) -> float:
    """The production time carried by a stamped chunk."""
    return float(chunk.rpartition(SEPARATOR)[2])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.stamped_runner", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    MODELS[StampedEchoModel.name] = "bench.stamped_runner:StampedEchoModel"  # this process only
    serve(StampedEchoModel.name, args.host, args.port, args.concurrency)


if __name__ == "__main__":
    main()
