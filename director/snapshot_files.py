"""Output files inside a runner's webhook body, taken out while the body streams in (sans-IO).

Stock Cog without an upload URL sends each output file as a data URL in its webhook
(``data:<mime>[;params];base64,<payload>``): a 40 MB image is a 53 MB JSON string. The
:class:`SnapshotScanner` is fed the body's bytes as they arrive and says what to do with them:
:class:`Text` is the reduced body, to be parsed as the snapshot; :class:`FileStart`,
:class:`FileBytes` and :class:`FileEnd` frame one output file's decoded bytes, which the caller
streams into the store and replaces by a JSON string of its URL. No data URL is ever held
whole: only what is needed to decide (the header, and at most ``inline_max`` decoded bytes).

What the scanner changes: the top-level ``input`` value (the runner's echo of the input) becomes
``null``; inside the top-level ``output`` value, each JSON string that is a base64 data URL of
more than ``inline_max`` decoded bytes becomes a file (its payload's JSON escapes read: ``\\/``,
and ``\\n`` or ``\\r`` wrapping its lines, are base64's). Everything else passes byte for byte.
It checks only the structure it walks (one top-level object, brackets that match, nothing after
it, no truncation) and raises :class:`ScanError` when that is wrong; the reduced body's parse
reports the rest. The events are :mod:`director.snapshot_events`'s; a data URL's payload is read
and decoded by :mod:`director.data_url_payload`.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable

from director.data_url_payload import Base64Payload
from director.snapshot_events import Event, FileBytes, FileEnd, FileStart, ScanError, Text
from files.data_urls import file_name  # the names a parsed output's files get

#: Longest ``data:<mime>[;params];base64,`` header looked at; a longer one is kept as text.
MAX_HEADER = 256
#: Keys longer than this (in raw bytes) are neither ``input`` nor ``output``.
_MAX_KEY = 64


class _Mode(enum.Enum):
    BEFORE = "before"  # the top-level object's "{"
    KEY = "key"  # a top-level key, or the object's "}"
    IN_KEY = "in key"
    COLON = "colon"
    VALUE = "value"  # a top-level value, outside any string
    IN_STRING = "in string"
    HEADER = "header"  # an output string that may be a data URL: its first bytes
    PAYLOAD = "payload"  # a base64 data URL's payload, held until it passes inline_max
    FILE = "file"  # a base64 data URL's payload, streamed out as a file
    AFTER = "after"


_WHITESPACE = re.compile(rb"[ \t\r\n]*")
#: The body of a JSON string up to its closing quote (or the chunk's end); escapes included.
_STRING_BODY = re.compile(rb'(?:[^"\\]+|\\.)*', re.DOTALL)
_STRUCTURE = re.compile(rb'["{}\[\],]')
_HEADER = re.compile(rb"data:([^;,]*)((?:;[^;,]*)*);base64,", re.IGNORECASE)
_DATA = b"data:"
_CLOSE = {ord("}"): ord("{"), ord("]"): ord("[")}


class SnapshotScanner(Base64Payload):
    """Feed it a snapshot body's bytes (:meth:`feed`, then :meth:`close`); it returns events.

    ``inline_max``: the most decoded bytes a data URL may have and stay inline; None keeps
    every data URL inline (only ``input`` is dropped).
    """

    def __init__(self, inline_max: int | None) -> None:
        self.inline_max = inline_max
        self.files = 0
        self._mode = _Mode.BEFORE
        self._events: list[Event] = []
        self._text = bytearray()
        self._stack = bytearray()  # open brackets inside the current top-level value
        self._key = bytearray()
        self._key_long = False
        self._role = ""  # "input", "output" or "" for the current top-level value
        self._held = bytearray()  # raw bytes of an output string while it may still be a file
        self._payload = bytearray()  # base64 characters not yet decoded
        self._escape = False  # a string's (or a payload's) backslash ended the last chunk
        self._padded = False
        self._content_type = ""
        #: Payload characters held at most before a data URL becomes a file.
        self._hold_max = 0 if inline_max is None else (inline_max + 2) // 3 * 4 + 8

    def feed(self, chunk: bytes) -> list[Event]:
        pos = 0
        while pos < len(chunk):
            pos = self._step(chunk, pos)
        return self._drain()

    def close(self) -> list[Event]:
        if self._mode is not _Mode.AFTER:
            raise ScanError("the snapshot ended before its JSON object did")
        return self._drain()

    def _drain(self) -> list[Event]:
        self._flush()
        events, self._events = self._events, []
        return events

    def _flush(self) -> None:
        if self._text:
            self._events.append(Text(bytes(self._text)))
            self._text.clear()

    def _event(self, event: Event) -> None:
        self._flush()
        self._events.append(event)

    def _step(self, chunk: bytes, pos: int) -> int:
        mode = self._mode
        if mode is _Mode.IN_STRING:
            return self._string(chunk, pos, self._emit_value)
        if mode is _Mode.VALUE:
            return self._value(chunk, pos)
        if mode is _Mode.IN_KEY:
            return self._string(chunk, pos, self._emit_key)
        if mode is _Mode.HEADER:
            return self._header(chunk, pos)
        if mode is _Mode.PAYLOAD:
            return self._buffered(chunk, pos)
        if mode is _Mode.FILE:
            return self._streamed(chunk, pos)
        return self._punctuation(chunk, pos)

    def _punctuation(self, chunk: bytes, pos: int) -> int:
        """Between the top-level object's keys and values: whitespace and one sign."""
        mode = self._mode
        end = _WHITESPACE.match(chunk, pos).end()  # type: ignore[union-attr]
        self._text += chunk[pos:end]
        if end == len(chunk):
            return end
        char = chunk[end : end + 1]
        self._text += char
        if mode is _Mode.BEFORE and char == b"{":
            self._mode = _Mode.KEY
        elif mode is _Mode.KEY and char == b'"':
            self._key.clear()
            self._key_long = False
            self._mode = _Mode.IN_KEY
        elif mode is _Mode.KEY and char == b"}":
            self._mode = _Mode.AFTER
        elif mode is _Mode.COLON and char == b":":
            self._mode = _Mode.VALUE
            self._stack.clear()
            if self._role == "input":
                self._text += b"null"
        elif mode is _Mode.BEFORE:
            raise ScanError("a snapshot is a JSON object")
        else:
            raise ScanError(f"unexpected {char!r} in the snapshot's JSON")
        return end + 1

    def _emit_value(self, data: bytes) -> None:
        if self._role != "input":
            self._text += data

    def _emit_key(self, data: bytes) -> None:
        self._text += data
        if not self._key_long:
            self._key += data
            self._key_long = len(self._key) > _MAX_KEY

    def _string(self, chunk: bytes, pos: int, emit: Callable[[bytes], None]) -> int:
        """Inside a JSON string: up to its closing quote, escapes understood."""
        start = pos
        if self._escape:  # the byte escaped by the last chunk's backslash
            self._escape = False
            pos += 1
        end = _STRING_BODY.match(chunk, pos).end()  # type: ignore[union-attr]
        if end == len(chunk):
            emit(chunk[start:end])
            return end
        if chunk[end : end + 1] == b"\\":  # a backslash ends the chunk
            self._escape = True
            emit(chunk[start : end + 1])
            return end + 1
        emit(chunk[start : end + 1])  # with the closing quote
        if self._mode is _Mode.IN_KEY:
            self._role = self._key_role()
            self._mode = _Mode.COLON
        else:
            self._mode = _Mode.VALUE
        return end + 1

    def _key_role(self) -> str:
        if self._key_long:
            return ""
        try:
            key = json.loads(b'"' + bytes(self._key))
        except ValueError as error:
            raise ScanError(f"unreadable key in the snapshot's JSON: {error}") from error
        return key if key in ("input", "output") else ""

    def _value(self, chunk: bytes, pos: int) -> int:
        """A top-level value outside its strings: brackets, strings and where it ends."""
        found = _STRUCTURE.search(chunk, pos)
        end = len(chunk) if found is None else found.start()
        self._emit_value(chunk[pos:end])
        if found is None:
            return end
        char = chunk[end]
        stack = self._stack
        if char == ord('"'):
            if self._role == "output" and self.inline_max is not None:
                self._held[:] = b'"'
                self._mode = _Mode.HEADER
            else:
                self._emit_value(b'"')
                self._mode = _Mode.IN_STRING
            return end + 1
        if char in (ord("{"), ord("[")):
            stack.append(char)
        elif char in _CLOSE and stack:
            if stack.pop() != _CLOSE[char]:
                raise ScanError(f"unmatched {chr(char)!r} in the snapshot's JSON")
        elif char == ord(",") and stack:
            pass
        elif char == ord(",") or char == ord("}"):  # the value ends at the top level
            self._role = ""
            self._text.append(char)
            self._mode = _Mode.KEY if char == ord(",") else _Mode.AFTER
            return end + 1
        else:
            raise ScanError(f"unmatched {chr(char)!r} in the snapshot's JSON")
        self._emit_value(chunk[end : end + 1])
        return end + 1

    def _inline(self) -> None:
        """What is held is an ordinary string after all: pass it on, read on as one."""
        self._text += self._held
        self._held.clear()
        self._payload.clear()
        self._mode = _Mode.IN_STRING

    def _header(self, chunk: bytes, pos: int) -> int:
        """The first bytes of an output string: is it a base64 data URL?"""
        held = self._held
        end = min(len(chunk), pos + MAX_HEADER + 1 - len(held))
        stop = chunk.find(b",", pos, end)
        end = end if stop < 0 else stop + 1
        quote = chunk.find(b'"', pos, end)
        slash = chunk.find(b"\\", pos, end)
        if quote >= 0 or slash >= 0:  # the string ends, or escapes, within its header
            self._inline()
            return pos
        held += chunk[pos:end]
        head = bytes(held[1 : 1 + len(_DATA)]).lower()
        if not _DATA.startswith(head):
            self._inline()
            return end
        if held.endswith(b","):
            match = _HEADER.fullmatch(held, 1)
            if match is None:
                self._inline()
                return end
            self._content_type = match.group(1).decode("ascii", "replace").strip().lower()
            self._mode = _Mode.PAYLOAD
        elif len(held) > MAX_HEADER:
            self._inline()
        return end

    def _buffered(self, chunk: bytes, pos: int) -> int:
        """A data URL's payload, held while it may still stay inline."""
        run = self._payload_run(chunk, pos)
        if run is None:  # an escape base64 does not hold: an ordinary string
            self._inline()
            return pos
        end, data = run
        self._payload += data
        if len(self._payload) > self._hold_max:  # past what may stay inline: a file
            self._begin_file()
            return end
        self._held += chunk[pos:end]
        if end == len(chunk):
            return end
        if chunk[end : end + 1] != b'"':  # not base64 after all: an ordinary string
            self._inline()
            return end
        try:
            decoded = self._decode(final=True)
        except ScanError:  # a small one that is not valid base64 stays as it is
            self._padded = False
            self._inline()
            return end
        if self.inline_max is None or len(decoded) <= self.inline_max:
            self._text += self._held
            self._text += b'"'
        else:
            self._start_event()
            self._event(FileBytes(decoded))
            self._event(FileEnd())
        self._end_string()
        return end + 1

    def _begin_file(self) -> None:
        self._start_event()
        self._held.clear()
        self._file_bytes(final=False)
        self._mode = _Mode.FILE

    def _file_bytes(self, final: bool) -> None:
        if data := self._decode(final):
            self._event(FileBytes(data))

    def _start_event(self) -> None:
        self.files += 1
        content_type = self._content_type or "application/octet-stream"
        self._event(FileStart(content_type, file_name(self.files, content_type)))

    def _streamed(self, chunk: bytes, pos: int) -> int:
        if (run := self._payload_run(chunk, pos)) is None:
            raise ScanError(f"output file {self.files} is not valid base64")
        end, data = run
        self._payload += data
        if end == len(chunk):
            self._file_bytes(final=False)
            return end
        if chunk[end : end + 1] != b'"':
            raise ScanError(f"output file {self.files} is not valid base64")
        self._file_bytes(final=True)
        self._event(FileEnd())
        self._end_string()
        return end + 1

    def _end_string(self) -> None:
        self._held.clear()
        self._payload.clear()
        self._padded = False
        self._mode = _Mode.VALUE
