"""``files``: a model with a file input and a file output, as a stock Cog model has them.

With ``file`` it returns a copy of that file (so a caller can check the bytes that reached the
model); without, ``size`` pseudo-random bytes drawn from ``seed`` (:func:`made_bytes`), in a
file named ``out<suffix>``. It logs the input's size and sha256.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from runners.model import Model, PredictContext
from runners.schema import InputField

CHUNK = 1 << 20


def made_bytes(size: int, seed: int) -> Iterator[bytes]:
    """The bytes the model makes for ``size`` and ``seed``, a chunk at a time."""
    rng = random.Random(seed)
    left = size
    while left > 0:
        n = min(CHUNK, left)
        yield rng.randbytes(n)
        left -= n


def _copy(source: Path, target: Path) -> str:
    digest = hashlib.sha256()
    with source.open("rb") as reader:
        while chunk := reader.read(CHUNK):
            digest.update(chunk)
    shutil.copyfile(source, target)
    return f"input {source.name} size={source.stat().st_size} sha256={digest.hexdigest()}"


def _make(target: Path, size: int, seed: int) -> str:
    with target.open("wb") as sink:
        for chunk in made_bytes(size, seed):
            sink.write(chunk)
    return f"made {target.name} size={size}"


class FilesModel(Model):
    name: ClassVar[str] = "files"
    inputs: ClassVar[tuple[InputField, ...]] = (
        InputField(
            "file", "file", default=None, nullable=True, description="A file to copy to the output"
        ),
        InputField("size", "integer", default=0, ge=0, description="Bytes to make without a file"),
        InputField("seed", "integer", default=0, description="Seed of the made bytes"),
        InputField("suffix", "string", default=".png", description="Suffix of the made file"),
    )
    output: ClassVar[dict[str, Any]] = {"type": "string", "format": "uri"}

    async def predict(self, inputs: dict[str, Any], ctx: PredictContext) -> Path:
        out = ctx.scratch_dir() / "out"
        await asyncio.to_thread(out.mkdir, exist_ok=True)
        source: Path | None = inputs["file"]
        if source is not None:
            target = out / source.name
            ctx.log(await asyncio.to_thread(_copy, source, target))
        else:
            target = out / f"out{inputs['suffix']}"
            ctx.log(await asyncio.to_thread(_make, target, inputs["size"], inputs["seed"]))
        return target
