"""What the snapshot scanner (:mod:`director.snapshot_files`) says about a webhook body as it
streams in: :class:`Text` of the reduced body, or one output file framed by :class:`FileStart`,
:class:`FileBytes` and :class:`FileEnd`; and :class:`ScanError` when it cannot walk the body."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Text:
    data: bytes  # bytes of the reduced body


@dataclass(frozen=True, slots=True)
class FileStart:
    """An output file begins; its JSON string (quotes included) is left out of the body."""

    content_type: str
    name: str


@dataclass(frozen=True, slots=True)
class FileBytes:
    data: bytes  # the next decoded bytes of the file begun last


@dataclass(frozen=True, slots=True)
class FileEnd:
    """The file is complete: the caller writes its URL, as a JSON string, into the body."""


Event = Text | FileStart | FileBytes | FileEnd


class ScanError(ValueError):
    """The body is not a JSON object the scanner can walk, or a data URL it took out is not
    valid base64."""
