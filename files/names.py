"""What a stored file is called: its id, and the name and content type a client or runner gave,
made safe to store, to put in a URL path and to send back as a header."""

from __future__ import annotations

import base64
import os
import re
import unicodedata

#: Longest name kept (characters); longer ones keep their end (the extension).
MAX_NAME = 255
#: ``type/subtype`` and parameters: printable ASCII, spaces and tabs only (it is sent back as a
#: response header, where CR or LF cannot go).
_CONTENT_TYPE = re.compile(r"[\w.+-]+/[\w.+-]+([ \t]*;[ -~\t]*)?", re.ASCII)


def new_file_id() -> str:
    """``f`` and 25 lowercase base32 characters (125 random bits): as long as a prediction id."""
    return "f" + base64.b32encode(os.urandom(16)).decode().lower()[:25]


def clean_name(name: str) -> str:
    """A client's or runner's file name made safe to store and to put in a URL path: its last
    path segment, without control characters, at most ``MAX_NAME`` characters."""
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C").strip()
    if name in ("", ".", ".."):
        return "file"
    return name[-MAX_NAME:]


def content_type_problem(value: str) -> str | None:
    """Why a content type a client gave is refused, or None: a control character (CR, LF...)
    cannot go into the header the file is served with. Anything else unusual is kept as
    ``application/octet-stream`` (:func:`clean_content_type`)."""
    if any((ch < " " and ch != "\t") or ch == "\x7f" for ch in value):
        return "must not contain control characters (CR, LF, ...)"
    return None


def clean_content_type(value: str | None) -> str:
    value = (value or "").strip()
    if len(value) > 255 or not _CONTENT_TYPE.fullmatch(value):
        return "application/octet-stream"
    return value
