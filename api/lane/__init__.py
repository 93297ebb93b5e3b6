"""The synchronous lane's scheduler core, sans IO.

:class:`~api.lane.core.LaneCore` owns every deployment's permits, bounded fair queue, retry
budget and runner health. It is fed events (:mod:`api.lane.events`) carrying the clock's value
and answers with effects for the IO shell to carry out; it never sleeps, reads a clock, opens a
socket or talks to Redis, so every rule is tested by feeding it events.

Around it, the IO shell of one api process: :mod:`~api.lane.shell` (the core in the event
loop, its timer, each request's answer), :mod:`~api.lane.supply` (runners from the fleet view,
cut to this replica's slice), :mod:`~api.lane.membership` (the replicas, in Redis),
:mod:`~api.lane.runner_call` (one call to a runner), :mod:`~api.lane.stream_events`,
:mod:`~api.lane.record` (the run's record, afterwards), :mod:`~api.lane.metrics`, all put
together in :mod:`~api.lane.service`; the routes are ``api.routes.run``.
"""

from api.lane.core import LaneConfig, LaneCore, LaneCounters
from api.lane.events import (
    ArmTimer,
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
    Tick,
    band_of,
)
from api.lane.slices import member_index, slice_permits, slice_runners

__all__ = [
    "ArmTimer",
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
    "Tick",
    "band_of",
    "member_index",
    "slice_permits",
    "slice_runners",
]
