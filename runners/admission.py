"""What a prediction request asks of the runner (:class:`RequestOptions`, read from its
headers) and what admitting it gives back (:class:`Admitted`): the two ends of
:meth:`runners.service.RunnerService.submit`.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.values import Priority
from runners.cache import CacheMode
from runners.errors import RateLimit
from runners.prediction import Prediction
from runners.streaming import SnapshotStream


@dataclass(frozen=True)
class RequestOptions:
    """What a prediction request's headers ask of the runner."""

    tenant: str = "default"
    priority: Priority = Priority.NORMAL
    cache_mode: CacheMode = CacheMode.DEFAULT
    cache_tag: str | None = None
    #: Snapshots go down the response (``Accept: application/x-ndjson``), see
    #: :mod:`runners.streaming`; the webhook is the fallback.
    stream: bool = False


@dataclass(frozen=True)
class Admitted:
    prediction: Prediction
    rate: RateLimit | None
    #: The snapshot stream for the response to pump, when the request asked for one.
    stream: SnapshotStream | None = None
