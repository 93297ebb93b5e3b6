"""File inputs: a URL the caller sends is handed to the model as a local file, as Cog does.

An input the model declares as a file (``{"type": "string", "format": "uri"}``, Cog's
``Path``; a list of them too) arrives as an http(s) URL or a data URL. Before ``predict`` runs
each is fetched into the prediction's scratch directory, and the model sees a
:class:`pathlib.Path`. Downloads follow no redirect (the URL a runner is handed is the file's
own address; following one would let a caller steer the runner elsewhere), stop at
``file_max_bytes``, ask for the bytes uncompressed (and refuse them encoded all the same: the
session does not inflate, and a model must not be handed gzip for its file), and go through the
runner's guarded session, so the SSRF guard that protects webhooks applies to them as well.
That guard sits in the session's resolver, which aiohttp skips for a host that is an address
literal (``http://169.254.169.254/``): :class:`AddressGuard` checks such a host before the
request, against the same allow-list (``CONDUIT_RUNNER_WEBHOOK_ALLOW``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import mimetypes
import re
import tempfile
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
import yarl

from core.ssrf import BlockedAddress, Network, is_blocked, literal_address
from core.unreachable import UNREACHABLE

CHUNK = 1 << 20
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class InputFileError(Exception):
    """A file input could not be fetched; the message names the input and says why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"input {field}: {reason}")


@dataclass(frozen=True, slots=True)
class AddressGuard:
    """Refuses a URL whose host is an address literal the SSRF guard does not permit.

    A host name needs no check here: the session's resolver checks every address it resolves
    to. Host names in ``hosts`` are trusted whatever they resolve to, as for webhooks."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    def check(self, url: yarl.URL) -> None:
        """Raises :class:`BlockedAddress` (its message names the address, never the URL)."""
        # The host as written and as aiohttp connects to it (yarl maps IDNA forms).
        names = {(url.host or "").strip("[]"), (url.raw_host or "").strip("[]")}
        names = {name.rstrip(".").lower() for name in names if name}
        if names <= self.hosts:
            return
        for name in names:
            address = literal_address(name)
            if address is not None and is_blocked(address, self.networks):
                raise BlockedAddress(f"address {address} is not publicly routable")


@dataclass(frozen=True, slots=True)
class FetchLimits:
    max_bytes: int
    read_timeout: float
    connect_timeout: float
    guard: AddressGuard = AddressGuard()


def file_fields(document: Mapping[str, Any]) -> frozenset[str]:
    """The inputs of an OpenAPI document that are files, or lists of files."""
    schemas = document.get("components", {}).get("schemas", {})
    properties = schemas.get("Input", {}).get("properties", {})

    def is_file(prop: Any) -> bool:
        return isinstance(prop, dict) and prop.get("format") == "uri"

    return frozenset(
        name
        for name, prop in properties.items()
        if is_file(prop) or (isinstance(prop, dict) and is_file(prop.get("items")))
    )


def safe_name(raw: str, fallback: str) -> str:
    """A file name made of harmless characters, never empty, never hidden."""
    name = _UNSAFE.sub("_", urllib.parse.unquote(raw).rsplit("/", 1)[-1]).lstrip(".")
    return name[:200] or fallback


async def fetch_inputs(
    inputs: Mapping[str, Any],
    fields: frozenset[str],
    session: aiohttp.ClientSession,
    scratch: Callable[[], Path],
    limits: FetchLimits,
) -> dict[str, Any]:
    """``inputs`` with every file input replaced by the :class:`Path` of its local copy."""
    prepared = dict(inputs)
    for name in fields:
        value = prepared.get(name)
        if isinstance(value, str):
            prepared[name] = await _fetch(name, value, scratch(), session, limits)
        elif isinstance(value, list):
            prepared[name] = [
                await _fetch(f"{name}[{i}]", item, scratch(), session, limits)
                if isinstance(item, str)
                else item
                for i, item in enumerate(value)
            ]
    return prepared


async def _fetch(
    field: str, url: str, under: Path, session: aiohttp.ClientSession, limits: FetchLimits
) -> Path:
    # A directory per file keeps the sender's name without two inputs colliding.
    directory = Path(await asyncio.to_thread(tempfile.mkdtemp, dir=under))
    if url.startswith("data:"):
        return await _decode(field, url, directory, limits.max_bytes)
    parsed = yarl.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InputFileError(field, "not an http(s) or data URL")
    target = directory / safe_name(parsed.raw_name, "input")
    try:
        limits.guard.check(parsed)
    except BlockedAddress as error:
        raise InputFileError(field, f"download refused: {error}") from error
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=limits.connect_timeout, sock_read=limits.read_timeout
    )
    headers = {"Accept-Encoding": "identity"}
    try:
        async with session.get(
            url, allow_redirects=False, timeout=timeout, headers=headers
        ) as answer:
            if answer.status != 200:
                raise InputFileError(field, f"download answered {answer.status}")
            encoding = answer.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise InputFileError(field, f"download is encoded ({encoding})")
            length = answer.content_length
            if length is not None and length > limits.max_bytes:
                raise InputFileError(field, f"file is over {limits.max_bytes} bytes")
            sink = await asyncio.to_thread(target.open, "wb")
            try:
                await _copy(field, answer, sink, limits.max_bytes)
            finally:
                await asyncio.to_thread(sink.close)
    except UNREACHABLE as error:
        raise InputFileError(field, f"download failed: {error!r}") from error
    except BlockedAddress as error:
        raise InputFileError(field, f"download refused: {error}") from error
    return target


async def _copy(field: str, answer: aiohttp.ClientResponse, sink: BinaryIO, limit: int) -> None:
    written = 0
    async for chunk in answer.content.iter_chunked(CHUNK):
        written += len(chunk)
        if written > limit:
            raise InputFileError(field, f"file is over {limit} bytes")
        await asyncio.to_thread(sink.write, chunk)


async def _decode(field: str, url: str, directory: Path, limit: int) -> Path:
    header, comma, data = url[len("data:") :].partition(",")
    if not comma:
        raise InputFileError(field, "malformed data URL")
    params = header.split(";")
    mime = params[0] or "text/plain"
    if len(data) * 3 // 4 > limit + 3:
        raise InputFileError(field, f"file is over {limit} bytes")
    try:
        if "base64" in params[1:]:
            content = await asyncio.to_thread(base64.b64decode, data, validate=False)
        else:
            content = urllib.parse.unquote_to_bytes(data)
    except (binascii.Error, ValueError) as error:
        raise InputFileError(field, f"malformed data URL: {error}") from error
    if len(content) > limit:
        raise InputFileError(field, f"file is over {limit} bytes")
    extension = mimetypes.guess_extension(mime) or ""
    target = directory / ("file" + extension)  # the name Cog gives a data URL
    await asyncio.to_thread(target.write_bytes, content)
    return target
