"""A base64 data URL's payload as it stands in a snapshot's JSON, read as it streams in: its
runs of base64 (``\\/`` and ``\\n`` or ``\\r`` escapes read as base64's), and the whole quanta
decoded. A part of :class:`~director.snapshot_files.SnapshotScanner`, whose state it reads."""

from __future__ import annotations

import binascii
import re

from director.snapshot_events import ScanError

#: A run of a data URL's payload as it stands in JSON: base64, escaped slashes, line breaks.
_BASE64 = re.compile(rb"(?:[A-Za-z0-9+/=]+|\\[/nr])*")
_UNESCAPED = {ord("/"): b"/", ord("n"): b"", ord("r"): b""}


class Base64Payload:
    """Reading and decoding the payload of the data URL the scanner is in."""

    files: int
    _payload: bytearray  # base64 characters not yet decoded
    _escape: bool  # the last chunk ended in a backslash
    _padded: bool

    def _payload_run(self, chunk: bytes, pos: int) -> tuple[int, bytes] | None:
        """Where the payload from ``pos`` stops, and its base64 characters; None when the last
        chunk's backslash (read with this one) escapes what no base64 holds."""
        escaped = b""
        if self._escape:
            if (unescaped := _UNESCAPED.get(chunk[pos])) is None:
                return None  # still escaped: the string it turns out to be reads it so
            self._escape, escaped, pos = False, unescaped, pos + 1
        end = _BASE64.match(chunk, pos).end()  # type: ignore[union-attr]
        if end == len(chunk) - 1 and chunk[end] == ord("\\"):
            self._escape = True
            end += 1
        raw = chunk[pos:end]
        if b"\\" in raw:
            raw = raw.replace(b"\\/", b"/").replace(b"\\n", b"").replace(b"\\r", b"")
            raw = raw.removesuffix(b"\\")
        return end, escaped + raw

    def _decode(self, final: bool) -> bytes:
        """Decode the whole quanta held (all of it when ``final``); keep the rest."""
        payload = self._payload
        size = len(payload) if final else len(payload) // 4 * 4
        if size == 0:
            return b""
        if self._padded:
            raise ScanError(f"output file {self.files} is not valid base64 (data after =)")
        part = bytes(payload[:size])
        del payload[:size]
        if final and len(part) % 4:
            part += b"=" * (-len(part) % 4)
        self._padded = part.endswith(b"=")
        try:
            return binascii.a2b_base64(part, strict_mode=True)
        except binascii.Error as error:
            raise ScanError(f"output file {self.files} is not valid base64: {error}") from error
