"""The public prediction object, shaped as Replicate's API returns it.

One renderer for every place a prediction leaves Conduit (GET, create, cancel, list, and the
bodies of webhooks), so they can never disagree.

``urls.stream`` is a capability URL (``tracker.capabilities``), signed with the process's
stream signer. The process's entry point installs it once (:func:`sign_stream_urls`) rather
than threading it beside the base URL through every caller: it is one per process, like the
key it holds. Each render signs anew, so a prediction fetched again carries a fresh expiry.
Without a signer (tools, tests of the renderer) the URL is the plain one, which still works
with the owner's bearer token.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import orjson

from tracker.capabilities import StreamSigner

_stream_signer: StreamSigner | None = None


def sign_stream_urls(signer: StreamSigner | None) -> None:
    """Sign ``urls.stream`` of every prediction this process renders from now on (None: stop)."""
    global _stream_signer
    _stream_signer = signer


def iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.isoformat().replace("+00:00", "Z")


def prediction_urls(base_url: str, id: str) -> dict[str, str]:
    root = f"{base_url}/v1/predictions/{id}"
    stream = f"{root}/stream"
    capability = _stream_signer.query(id) if _stream_signer is not None else None
    if capability is not None:
        stream = f"{stream}?{capability}"
    return {"get": root, "cancel": f"{root}/cancel", "stream": stream}


def render_prediction(row: Mapping[Any, Any], base_url: str) -> dict[str, Any]:
    status = row["status"]
    metrics = dict(row["metrics"] or {})
    body: dict[str, Any] = {
        "id": row["id"],
        "model": row["model"],
        "version": row["version_id"],
        "input": row["input"],
        "output": row["output"],
        "logs": row["logs"] or "",
        "error": row["error"],
        "status": status,
        "created_at": iso(row["created_at"]),
        "started_at": iso(row["started_at"]),
        "completed_at": iso(row["completed_at"]),
        "urls": prediction_urls(base_url, row["id"]),
        "metrics": metrics,
        "source": row["source"],
        "data_removed": row["data_removed"],
    }
    if row["deployment"] is not None:
        body["deployment"] = row["deployment"]
    if row["deadline"] is not None:
        body["deadline"] = iso(row["deadline"])
    if row["webhook"] is not None:
        body["webhook"] = row["webhook"]
        body["webhook_events_filter"] = row["webhook_events_filter"]
    return body


class Unstorable(Exception):
    """A runner's output that Postgres cannot store or Conduit cannot send, even escaped."""


def storable_text(text: str) -> str:
    """``text`` as Postgres can store it and every encoder can send it: a NUL character
    becomes the six characters ``\\u0000``, a lone surrogate a ``\\udXXX`` escape too."""
    if "\x00" in text:
        text = text.replace("\x00", "\\u0000")
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode()
    return text


def storable_json(value: Any) -> tuple[Any, int]:
    """A runner's output value as it can be stored and sent, and its size as JSON (bytes).

    Strings are made storable (:func:`storable_text`); NaN and Infinity become null (as in
    any JSON Conduit sends). Raises :class:`Unstorable` for what no escaping fixes: integers
    beyond 64 bits, nesting past orjson's 255 levels.
    """
    if isinstance(value, str):
        value = storable_text(value)
        return value, len(value.encode()) + 2
    try:
        try:
            encoded = orjson.dumps(value)
        except orjson.JSONEncodeError:
            encoded = orjson.dumps(_storable_strings(value))
        if b"\\u0000" in encoded:
            encoded = orjson.dumps(_storable_strings(value))
    except (orjson.JSONEncodeError, RecursionError) as error:
        raise Unstorable(f"the output cannot be stored as JSON: {error}") from error
    return orjson.loads(encoded), len(encoded)


def _storable_strings(value: Any) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, list | tuple):
        return [_storable_strings(item) for item in value]
    if isinstance(value, dict):
        return {
            storable_text(k) if isinstance(k, str) else k: _storable_strings(v)
            for k, v in value.items()
        }
    return value
