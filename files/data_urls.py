"""Large data URLs of a parsed output moved into the file store, small ones kept inline.

A runner without an upload URL (a Conduit runner called without ``output_file_prefix``, stock
Cog without ``--upload-url``) sends each output file as a base64 data URL: a 40 MB image is a
53 MB JSON string. Every data URL of more than ``inline_max`` decoded bytes becomes a file of
the run (:meth:`OutputSaver.save_output`) and its delivery URL takes its place; smaller ones stay
as they are. The director does this for the snapshots it parses, the synchronous lane for the
answers it relays. An output file that cannot be stored is output that cannot be kept:
:func:`unkept_reason` words it, and the run fails with it.
"""

from __future__ import annotations

import binascii
import hashlib
import mimetypes
import re
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from core.transient import TRANSIENT
from files.store import StoreError

#: Base64 characters decoded per chunk of a parsed data URL (a multiple of 4).
_DECODE_CHARS = 1024 * 1024
_DATA_URL = re.compile(r"data:([^;,\"\\]*)((?:;[^;,]*)*);base64,", re.IGNORECASE)
_BASE64 = re.compile(r"[A-Za-z0-9+/]*(={0,2})")

#: What saving an output file may raise that is the store's or the database's failure.
SAVE_ERRORS = (StoreError, *TRANSIENT)

#: The usual outputs' extensions, whatever the host's MIME tables say.
_EXTENSIONS = {
    **{f"image/{kind}": f".{kind}" for kind in ("png", "webp", "gif")},
    **{"image/jpeg": ".jpg", "audio/wav": ".wav", "audio/x-wav": ".wav"},
    **{"audio/mpeg": ".mp3", "video/mp4": ".mp4", "text/plain": ".txt"},
}


def file_name(number: int, content_type: str) -> str:
    """``out-<n>.<extension of the type>``: the name of a run's n-th output file."""
    guessed = _EXTENSIONS.get(content_type) or mimetypes.guess_extension(content_type, False)
    return f"out-{number}{guessed or '.bin'}"


def unkept_reason(error: BaseException) -> str:
    """A run's error when one of its output files could not be stored."""
    return f"output file could not be stored: {error}"


class OutputSaver(Protocol):
    """Stores one output file of a prediction; returns its delivery URL. Raises the store's
    errors (``TooLarge``, ``StoreUnavailable``) or a database outage's (:data:`SAVE_ERRORS`)."""

    async def save_output(
        self,
        account_id: int,
        prediction_id: str,
        name: str,
        content_type: str,
        chunks: AsyncIterable[bytes],
    ) -> str: ...


@dataclass(frozen=True, slots=True)
class DataUrls:
    """Where a run's output files go, and how large a data URL may stay inline."""

    files: OutputSaver
    inline_max: int

    def keeper(self, account_id: int, prediction_id: str) -> DataUrlKeeper:
        return DataUrlKeeper(self.files, account_id, prediction_id, self.inline_max)


class DataUrlKeeper:
    """Moves the large base64 data URLs of parsed outputs into the store, for one run.

    Snapshots are cumulative: the same data URL comes again with each later one, and is
    stored once (remembered by its digest)."""

    def __init__(
        self, files: OutputSaver, account_id: int, prediction_id: str, inline_max: int
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
