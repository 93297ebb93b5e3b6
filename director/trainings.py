"""What a training's success makes: its weights kept in the file store, and a new version of
its destination model that serves the base version's model with those weights.

A Cog trainer ends with ``{"weights": <file>}`` (``TrainingOutput``) or the file itself. The
file comes as a data URL (stock Cog, no upload URL), or as a file the receiver already stored
(an upload, or a large data URL it moved out): either way it is kept as *weights*, a file with
no expiry that retention leaves alone (``Files.save_weights``, ``Files.keep_as_weights``). A URL
of somewhere else is referenced as it is: the trainer chose to keep its weights there. The new
version (``versions.create_trained_version``) is written before the training's end, so a
training that reads ``succeeded`` always names a version that exists; its runner gets the
weights as Cog expects them, in ``COG_WEIGHTS`` (see docs/tutorials/trainings.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import versions
from catalog.generation import CatalogGeneration
from director.outcomes import OutputRefused
from files.data_urls import DataUrlKeeper
from files.links import delivery_file_id
from files.service import Files


class TrainingUnpublished(OutputRefused):
    """The training ran, but what it returned cannot become a version (its error)."""


class _WeightsSaver:
    """Stores a data URL's bytes as weights (``DataUrlKeeper``'s saver)."""

    def __init__(self, files: Files) -> None:
        self.files = files

    async def save_output(
        self,
        account_id: int,
        prediction_id: str,
        name: str,
        content_type: str,
        chunks: AsyncIterable[bytes],
    ) -> str:
        return await self.files.save_weights(account_id, prediction_id, name, content_type, chunks)


class TrainingResults:
    def __init__(
        self, engine: AsyncEngine, files: Files, generation: CatalogGeneration | None = None
    ) -> None:
        """``generation``: announces the new version to every process's catalogue cache."""
        self.engine = engine
        self.files = files
        self.generation = generation

    async def publish(self, row: Mapping[Any, Any], output: Any) -> dict[str, str]:
        """The training's output as Replicate words it: ``version``, the destination's new
        version (``owner/name:<id>``), and ``weights``, their URL. Raises
        :class:`TrainingUnpublished`, or what the store or the database raise (the entry is
        then offered again)."""
        weights = output.get("weights") if isinstance(output, dict) else output
        if not isinstance(weights, str) or not weights:
            raise TrainingUnpublished(
                "the trainer returned no weights (a file, or TrainingOutput with weights)"
            )
        url = await self._keep(row, weights)
        try:
            version = await versions.create_trained_version(
                self.engine, row["version_id"], row["destination"], url, row["id"]
            )
        except LookupError as error:
            raise TrainingUnpublished(f"the trained version cannot be made: {error}") from error
        if self.generation is not None:  # the destination's latest version is seen at once
            await self.generation.bump()
        # Replicate's form, which its clients parse: ``owner/name:<version id>``.
        return {"version": f"{row['destination']}:{version}", "weights": url}

    async def _keep(self, row: Mapping[Any, Any], weights: str) -> str:
        account_id, training_id = int(row["account_id"]), str(row["id"])
        if weights.startswith("data:"):
            keeper = DataUrlKeeper(_WeightsSaver(self.files), account_id, training_id, -1)
            kept = await keeper.keep(weights)
            if kept == weights:
                raise TrainingUnpublished("the trainer's weights are not a base64 data URL")
            return str(kept)
        own = delivery_file_id(weights) if weights.startswith(self.files.links.base_url) else None
        if own is not None:
            url = await self.files.keep_as_weights(account_id, own)
            if url is None:
                raise TrainingUnpublished(f"the weights file {own} is gone")
            return url
        return weights
