"""Where a run's output files go: the store behind :class:`tracker.files.service.Files`.

The receiver streams what runners upload (and the data URLs it takes out of webhooks) through
:class:`OutputFiles`; :func:`keep_data_urls` does the same for the output of a snapshot already
parsed (a Conduit runner's snapshot stream). An output file that cannot be stored is output
that cannot be kept: :func:`unkept_reason` words it, and the attempt fails the prediction with
it (``Attempt.cannot_keep``).
"""

from __future__ import annotations

import binascii
import hashlib
import re
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from core.transient import TRANSIENT
from director.snapshot_files import file_name
from tracker.files.store import StoreError

#: Base64 characters decoded per chunk of a parsed data URL (a multiple of 4).
_DECODE_CHARS = 1024 * 1024
_DATA_URL = re.compile(r"data:([^;,\"\\]*)((?:;[^;,]*)*);base64,", re.IGNORECASE)
_BASE64 = re.compile(r"[A-Za-z0-9+/]*(={0,2})")

#: What saving an output file may raise that is the store's or the database's failure.
SAVE_ERRORS = (StoreError, *TRANSIENT)


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


def unkept_reason(error: BaseException) -> str:
    """The prediction's error when one of its output files could not be stored."""
    return f"output file could not be stored: {error}"


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


class DataUrlKeeper:
    """Moves the large base64 data URLs of parsed outputs into the store, for one attempt.

    Snapshots are cumulative: the same data URL comes again with each later one, and is
    stored once (remembered by its digest)."""

    def __init__(
        self, files: OutputFiles, account_id: int, prediction_id: str, inline_max: int
    ) -> None:
        self.files = files
        self.account_id = account_id
        self.prediction_id = prediction_id
        self.inline_max = inline_max
        self._kept: dict[str, str] = {}
        self._count = 0

    async def keep(self, output: Any) -> Any:
        """``output`` with each large data URL replaced by its file's URL."""
        if isinstance(output, str):
            return await self._string(output)
        if isinstance(output, list):
            return [await self.keep(item) for item in output]
        if isinstance(output, dict):
            return {key: await self.keep(value) for key, value in output.items()}
        return output

    async def _string(self, value: str) -> str:
        match = _DATA_URL.match(value)
        if match is None:
            return value
        payload = _BASE64.fullmatch(value, match.end())
        size = len(value) - match.end()
        if payload is None or size % 4:
            return value  # not base64 as it should be: kept as the runner sent it
        if size // 4 * 3 - len(payload.group(1)) <= self.inline_max:
            return value
        digest = hashlib.sha256(value.encode()).hexdigest()
        if digest in self._kept:
            return self._kept[digest]
        self._count += 1
        content_type = match.group(1).strip().lower() or "application/octet-stream"
        url = await self.files.save_output(
            self.account_id,
            self.prediction_id,
            file_name(self._count, content_type),
            content_type,
            _decoded(value, match.end()),
        )
        self._kept[digest] = url
        return url


async def _decoded(value: str, start: int) -> AsyncIterator[bytes]:
    for at in range(start, len(value), _DECODE_CHARS):
        yield binascii.a2b_base64(value[at : at + _DECODE_CHARS], strict_mode=True)
