"""Timing headers on synchronous (``Prefer: wait``) create responses.

``X-Processing-Time`` is the wall-clock seconds this api spent on the request. With
``remote_time_forwarding`` on, a finished prediction's response also carries the runner's side:
``X-Remote-Processing-Time`` (seconds it spent loading its model, queued inside the runner and
running, summed over its runs) and ``X-Remote-Processing-Times`` (each run's, comma-separated).
Both are left out when the runner reported no times (or the prediction is not finished).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from protocol.timings import decimal_seconds as seconds
from tracker.states import Status
from tracker.usage import remote_times


def timing_headers(
    prediction: Mapping[str, Any], elapsed: float, forward_remote: bool
) -> dict[str, str]:
    headers = {"X-Processing-Time": seconds(elapsed)}
    if not forward_remote or not Status(prediction["status"]).is_terminal:
        return headers
    runs = remote_times(prediction.get("metrics") or {})
    if runs:
        headers["X-Remote-Processing-Time"] = seconds(sum(runs))
        headers["X-Remote-Processing-Times"] = ",".join(seconds(run) for run in runs)
    return headers
