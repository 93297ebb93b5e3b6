"""Where one attempt publishes besides Postgres: its event stream, the client's intermediate
webhooks and the dispatcher of its ``completed`` one, all behind the attempt's fence."""

from __future__ import annotations

from dataclasses import dataclass

from tracker.deliveries import Dispatcher
from tracker.events import EventLog
from tracker.fence import Fence
from tracker.intermediate import IntermediateSender
from tracker.render import PredictionLinks


@dataclass
class Publishing:
    """Where an attempt's changes go besides Postgres, and the fence they all pass: built once
    per attempt, so the events and the intermediate webhooks ask the same lease."""

    events: EventLog
    links: PredictionLinks
    fence: Fence
    dispatcher: Dispatcher | None = None
    webhooks: IntermediateSender | None = None
