"""File outputs: a model's :class:`pathlib.Path` outputs leave the runner as URLs, as Cog's do.

With an ``output_file_prefix`` on the request, each file is uploaded by ``PUT
{prefix}{filename}`` with its raw bytes (streamed from disk, never read whole) and its
Content-Type, and the output becomes the answer's ``Location`` without its query string (Cog
strips it too, which is why a receiver puts any capability in the path), or the upload URL
itself when the answer names none. Without a prefix the file becomes a ``data:`` URL. An
upload that fails fails the prediction; the reason names the file, never the prefix (it may
carry a secret of the receiver's). Redirects are not followed: a streamed body cannot be
sent twice, and the receiver is the one the prefix names. The prefix's host is checked
against the SSRF guard first (:class:`~runners.file_inputs.AddressGuard`): the session's
resolver never sees an address literal.
"""

from __future__ import annotations

import asyncio
import base64
import mimetypes
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yarl

from core.ssrf import BlockedAddress
from core.unreachable import UNREACHABLE
from runners.file_inputs import AddressGuard

CHUNK = 1 << 20


class OutputUploadError(Exception):
    """An output file could not be handed over; fails the prediction with this reason."""


def content_type(path: Path) -> str:
    return mimetypes.guess_type(path.name)[0] or "application/octet-stream"


async def _chunks(path: Path) -> AsyncIterator[bytes]:
    source = await asyncio.to_thread(path.open, "rb")
    try:
        while chunk := await asyncio.to_thread(source.read, CHUNK):
            yield chunk
    finally:
        await asyncio.to_thread(source.close)


def _data_url(path: Path) -> str:
    encoded = base64.b64encode(path.read_bytes()).decode("ascii")
    return f"data:{content_type(path)};base64,{encoded}"


@dataclass(frozen=True, slots=True)
class FileOutputs:
    session: aiohttp.ClientSession
    prefix: str | None
    read_timeout: float
    connect_timeout: float
    guard: AddressGuard = AddressGuard()

    async def convert(self, value: Any) -> Any:
        """``value`` with every :class:`Path` in it (at any depth) replaced by its URL."""
        if isinstance(value, Path):
            return await self._handover(value)
        if isinstance(value, list | tuple):
            return [await self.convert(item) for item in value]
        if isinstance(value, dict):
            return {key: await self.convert(item) for key, item in value.items()}
        return value

    async def _handover(self, path: Path) -> str:
        if not await asyncio.to_thread(path.is_file):
            raise OutputUploadError(f"output file {path.name} does not exist")
        if self.prefix is None:
            return await asyncio.to_thread(_data_url, path)
        return await self._upload(path, self.prefix)

    async def _upload(self, path: Path, prefix: str) -> str:
        url = yarl.URL(prefix + urllib.parse.quote(path.name), encoded=True)
        if url.scheme not in ("http", "https") or not url.host:
            raise OutputUploadError("output_file_prefix is not an http(s) URL")
        try:
            self.guard.check(url)
        except BlockedAddress as error:
            raise OutputUploadError(
                f"upload of output file {path.name} refused: {error}"
            ) from error
        size = (await asyncio.to_thread(path.stat)).st_size
        headers = {"Content-Type": content_type(path), "Content-Length": str(size)}
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.connect_timeout, sock_read=self.read_timeout
        )
        try:
            async with self.session.put(
                url, data=_chunks(path), headers=headers, allow_redirects=False, timeout=timeout
            ) as answer:
                if not 200 <= answer.status < 300:
                    raise OutputUploadError(
                        f"upload of output file {path.name} answered {answer.status}"
                    )
                location = answer.headers.get("Location")
                final = answer.url
        except UNREACHABLE as error:
            raise OutputUploadError(
                f"upload of output file {path.name} failed: {error!r}"
            ) from error
        except BlockedAddress as error:
            raise OutputUploadError(
                f"upload of output file {path.name} refused: {error}"
            ) from error
        target = final.join(yarl.URL(location)) if location else final
        return str(target.with_query(None).with_fragment(None))
