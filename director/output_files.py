"""Where a run's output files go: the store behind :class:`tracker.files.service.Files`.

The receiver streams what runners upload (and the data URLs it takes out of webhooks) through
:class:`OutputFiles`; a :class:`~tracker.files.data_urls.DataUrlKeeper` does the same for the
output of a snapshot already parsed (a Conduit runner's snapshot stream). An output file that
cannot be stored is output that cannot be kept: :func:`unkept_reason` words it, and the attempt
fails the prediction with it (``Attempt.cannot_keep``).
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from dataclasses import dataclass
from typing import Any, Protocol

from tracker.files.data_urls import SAVE_ERRORS, DataUrlKeeper, unkept_reason

__all__ = ["SAVE_ERRORS", "DataUrlKeeper", "OutputFiles", "OutputStore", "unkept_reason"]


class OutputFiles(Protocol):
    """Stores one output file of a prediction; returns its delivery URL. Raises the store's
    errors (``TooLarge``, ``StoreUnavailable``) or a database outage's."""

    async def save_output(
        self,
        account_id: int,
        prediction_id: str,
        name: str,
        content_type: str,
        chunks: AsyncIterable[bytes],
    ) -> str: ...

    async def input_links(
        self, account_id: int, input: dict[str, Any], base_url: str | None = None
    ) -> tuple[dict[str, Any], list[Any]]: ...


@dataclass(frozen=True, slots=True)
class OutputStore:
    """Where this director keeps output files, and how large a data URL may stay inline."""

    files: OutputFiles
    inline_max: int

    def keeper(self, account_id: int, prediction_id: str) -> DataUrlKeeper:
        return DataUrlKeeper(self.files, account_id, prediction_id, self.inline_max)

    async def runner_input(self, account_id: int, input: dict[str, Any]) -> tuple[Any, str | None]:
        """``input`` as the runner gets it: each file reference (``/v1/files/{id}``) a signed
        delivery URL it fetches without a token; with the reason when a referenced upload is
        gone (deleted or expired since the prediction was created)."""
        linked, errors = await self.files.input_links(account_id, input)
        if errors:
            return input, "; ".join(f"{e.field}: {e.message}" for e in errors)
        return linked, None
