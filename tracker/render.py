"""The public prediction object, shaped as Replicate's API returns it.

One renderer for every place a prediction leaves Conduit (GET, create, cancel, list, and the
bodies of webhooks), so they can never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any


def iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.isoformat().replace("+00:00", "Z")


def prediction_urls(base_url: str, id: str) -> dict[str, str]:
    root = f"{base_url}/v1/predictions/{id}"
    return {"get": root, "cancel": f"{root}/cancel", "stream": f"{root}/stream"}


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
