"""The public prediction object, shaped as Replicate's API returns it.

One renderer for every place a prediction leaves Conduit (GET, create, cancel, list, and the
bodies of webhooks), so they can never disagree.

``urls.stream`` is a capability URL (``tracker.stream_urls``), signed with the process's
stream signer. Each process's composition root builds its :class:`PredictionLinks` (the public
base URL and that signer) and hands it to whatever renders. Each render signs anew, so a
prediction fetched again carries a fresh expiry. Without a signer (tools, tests of the
renderer) the URL is the plain one, which still works with the owner's bearer token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from tracker.stream_urls import StreamSigner


@dataclass(frozen=True)
class PredictionLinks:
    """Where a prediction's ``urls`` point: the public base URL, and the signer of
    ``urls.stream`` (None: the plain URL)."""

    base_url: str
    signer: StreamSigner | None = None


def iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.isoformat().replace("+00:00", "Z")


def prediction_urls(links: PredictionLinks, id: str) -> dict[str, str]:
    root = f"{links.base_url}/v1/predictions/{id}"
    stream = f"{root}/stream"
    capability = links.signer.query(id) if links.signer is not None else None
    if capability is not None:
        stream = f"{stream}?{capability}"
    return {"get": root, "cancel": f"{root}/cancel", "stream": stream}


def training_urls(links: PredictionLinks, id: str) -> dict[str, str]:
    """A training's: its own ``get`` and ``cancel``, and the stream it shares with predictions."""
    root = f"{links.base_url}/v1/trainings/{id}"
    return {**prediction_urls(links, id), "get": root, "cancel": f"{root}/cancel"}


def render_training(row: Mapping[Any, Any], links: PredictionLinks) -> dict[str, Any]:
    """Replicate's training object: the base model and version it trains from, the model its
    new version goes to (``destination``), and on success ``output.version`` and
    ``output.weights``; otherwise a prediction's fields, with its own ``urls``."""
    body = _common(row, links, {"destination": row["destination"]})
    body["urls"] = training_urls(links, row["id"])
    return body


def render_prediction(row: Mapping[Any, Any], links: PredictionLinks) -> dict[str, Any]:
    """A prediction, or a training (``kind``) as a training renders: one entry point for
    every body that leaves Conduit, webhooks included."""
    if row.get("kind") == "training":
        return render_training(row, links)
    extra: dict[str, Any] = {}
    if row["deployment"] is not None:
        extra["deployment"] = row["deployment"]
    if row["deadline"] is not None:
        extra["deadline"] = iso(row["deadline"])
    return _common(row, links, extra)


def _common(
    row: Mapping[Any, Any], links: PredictionLinks, extra: dict[str, Any]
) -> dict[str, Any]:
    """The fields a prediction and a training share, ``extra`` after them, then the webhook."""
    body: dict[str, Any] = {
        "id": row["id"],
        "model": row["model"],
        "version": row["version_id"],
        "input": row["input"],
        "output": row["output"],
        "logs": row["logs"] or "",
        "error": row["error"],
        "status": row["status"],
        "created_at": iso(row["created_at"]),
        "started_at": iso(row["started_at"]),
        "completed_at": iso(row["completed_at"]),
        "urls": prediction_urls(links, row["id"]),
        "metrics": dict(row["metrics"] or {}),
        "source": row["source"],
        "data_removed": row["data_removed"],
        **extra,
    }
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
