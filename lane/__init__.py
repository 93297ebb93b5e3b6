"""The synchronous lane: ``/run`` calls straight to a runner, within permits, with nothing
durable in front of the model. It never imports ``api``: the api authenticates, resolves and
validates a request, hands the lane a plain :class:`~lane.request.RunRequest`, and maps the
lane's refusals (:mod:`lane.errors`) to problem+json itself. Its settings are its own
(:mod:`lane.settings`).

:class:`~lane.core.LaneCore`, the scheduler core, sans IO, owns every deployment's permits,
bounded fair queue, retry budget and runner health (its records: :mod:`lane.core_records`; the
moves its rules share: :mod:`lane.core_moves`). It is fed events (:mod:`lane.events`) carrying
the clock's value and answers with effects for the IO shell to carry out; it never sleeps, reads
a clock, opens a socket or talks to Redis, so every rule is tested by feeding it events.

Around it, the IO shell of one api process: :mod:`~lane.shell` (the core in the event
loop, its timer, each request's answer), :mod:`~lane.supply` (runners from the fleet view,
cut to this replica's slice), :mod:`~lane.membership` (the replicas, in Redis),
:mod:`~lane.serving` (one request through the lane), :mod:`~lane.departure` (its client
leaving), :mod:`~lane.runner_call` (one call to a runner, read by the one status table of
:mod:`protocol.answers`), :mod:`~lane.stream_events`, :mod:`~lane.run_recorder` (the run's
record, written afterwards), :mod:`~lane.background` (work a run leaves behind),
:mod:`~lane.metrics`, all put together in :mod:`~lane.service`.
"""

from lane.core import LaneCore
from lane.core_records import LaneConfig, LaneCounters
from lane.events import (
    Arrive,
    Cancel,
    Dispatch,
    Done,
    Effect,
    Event,
    Fail,
    Outcome,
    Reject,
    RejectReason,
    RunnersChanged,
    RunnerSlot,
    band_of,
)
from lane.slices import member_index, slice_permits, slice_runners

__all__ = [
    "Arrive",
    "Cancel",
    "Dispatch",
    "Done",
    "Effect",
    "Event",
    "Fail",
    "LaneConfig",
    "LaneCore",
    "LaneCounters",
    "Outcome",
    "Reject",
    "RejectReason",
    "RunnerSlot",
    "RunnersChanged",
    "band_of",
    "member_index",
    "slice_permits",
    "slice_runners",
]
