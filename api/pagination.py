"""Opaque cursors for the newest-first prediction list (keyset on created_at, id)."""

from __future__ import annotations

import base64
from datetime import datetime

import orjson

from api.errors import InvalidRequest
from tracker.keyset import PageKey


def encode_cursor(key: PageKey, direction: str) -> str:
    raw = orjson.dumps({"p": key.created_at.isoformat(), "i": key.id, "d": direction})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[PageKey, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = orjson.loads(raw)
        key = PageKey(datetime.fromisoformat(data["p"]), str(data["i"]))
        direction = data["d"]
    except (ValueError, KeyError, TypeError) as error:
        raise InvalidRequest("The cursor is not valid.") from error
    if direction not in ("next", "previous"):
        raise InvalidRequest("The cursor is not valid.")
    return key, direction
