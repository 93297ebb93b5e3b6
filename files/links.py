"""Where a file's URLs point, and the delivery URL's capability.

``urls.get`` (``{base}/v1/files/{id}``) answers the file's JSON to its owner's token. The
delivery URL ``{base}/v1/files/{id}/{exp}.{sig}/{name}`` serves the bytes with no token: the
signature (the stream URL signer's key, purpose ``file``) names the file and an expiry (unix
seconds; 0: never, the file's own retention governs). The capability is in the path, not the
query, because Cog strips the query from an upload's ``Location``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote, urlsplit

from files.records import FileRecord
from tracker.render import iso
from tracker.stream_urls import Signature, StreamSigner

PURPOSE = "file"
#: A file id: ``f`` and 25 lowercase base32 characters.
FILE_ID = re.compile(r"f[a-z2-7]{25}")
_REFERENCE_PATH = re.compile(r"/v1/files/(f[a-z2-7]{25})")
_DELIVERY_PATH = re.compile(r"/v1/files/(f[a-z2-7]{25})/[^/]+/[^/]+")


@dataclass(frozen=True, slots=True)
class FileLinks:
    """The public base URL, and the signer of delivery URLs (None: none can be made)."""

    base_url: str
    signer: StreamSigner | None = None

    def at(self, base_url: str) -> FileLinks:
        """The same links under another base URL (the one a request arrived at)."""
        return replace(self, base_url=base_url.rstrip("/"))

    def get_url(self, file_id: str) -> str:
        return f"{self.base_url}/v1/files/{file_id}"

    def delivery_url(self, record: FileRecord, expires_at: int | None) -> str | None:
        """The URL that serves ``record``'s bytes until ``expires_at`` (unix seconds; None:
        for as long as the file lives), or None without a signing key."""
        exp = expires_at or 0
        sig = self.signer.sign(PURPOSE, record.id, exp) if self.signer is not None else None
        if sig is None:
            return None
        return f"{self.get_url(record.id)}/{exp}.{sig}/{quote(record.name, safe='')}"

    def verify(self, file_id: str, token: str) -> Signature:
        if self.signer is None:
            return Signature.FORGED
        exp, _, sig = token.partition(".")
        return self.signer.verify_signed(PURPOSE, file_id, exp, sig)

    async def check(self, file_id: str, token: str) -> Signature:
        """:meth:`verify`, re-reading the shared key once when the signature is refused."""
        if self.signer is None:
            return Signature.FORGED
        exp, _, sig = token.partition(".")
        return await self.signer.check_signed(PURPOSE, file_id, exp, sig)


def file_reference(value: str) -> str | None:
    """The file id when ``value`` is an http(s) URL whose path is exactly
    ``/v1/files/{id}`` (any host), else None."""
    if "/v1/files/f" not in value or not value.startswith(("http://", "https://")):
        return None
    try:
        path = urlsplit(value).path
    except ValueError:
        return None
    match = _REFERENCE_PATH.fullmatch(path)
    return match.group(1) if match else None


def delivery_file_id(url: str) -> str | None:
    """The file id of a delivery URL (a path ``/v1/files/{id}/{token}/{name}``, any host),
    else None."""
    try:
        path = urlsplit(url).path
    except ValueError:
        return None
    match = _DELIVERY_PATH.fullmatch(path)
    return match.group(1) if match else None


def render_file(record: FileRecord, links: FileLinks) -> dict[str, Any]:
    """A file as the API answers it (Replicate's file object)."""
    return {
        "id": record.id,
        "name": record.name,
        "content_type": record.content_type,
        "size": record.size,
        "etag": record.etag,
        "checksums": {"sha256": record.sha256, "md5": record.md5},
        "metadata": record.metadata,
        "created_at": iso(record.created_at),
        "expires_at": iso(record.expires_at),
        "urls": {"get": links.get_url(record.id)},
    }
