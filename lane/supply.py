"""What the lane may dispatch to: each deployment's ready runners from the fleet view
(:class:`tracker.fleet.FleetView`), cut to this replica's slice of their permits
(:mod:`lane.slices`), handed to the core as ``RunnersChanged``.

A lane is named by a deployment (``owner/name``). A model's ``/run`` goes to the lane of a
deployment whose runners serve the model's version (:meth:`LaneSupply.lane_for_version`), so a
runner's permits are only ever counted in one lane.

``RunnersChanged`` is sent for a deployment when its runners or its slice change (the fleet
view's ``on_change``, the membership's), and for every deployment every ``refresh`` seconds
anyway: that clears runners the core marked full after a refusal ("until the next refresh").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from core.periodic import Periodic
from lane.events import RunnerSlot
from lane.shell import LaneShell
from lane.slices import member_index, slice_runners
from tracker.fleet import FleetEntry

log = logging.getLogger(__name__)


class LaneSupply:
    def __init__(
        self,
        shell: LaneShell,
        entries: Callable[[], Mapping[str, FleetEntry]],
        me: str,
        refresh: float = 5.0,
        interval: float = 1.0,
    ) -> None:
        """``entries``: the fleet view's entries as they are now (read, never copied)."""
        self.shell = shell
        self.entries = entries
        self.me = me
        self.members: tuple[str, ...] = (me,)
        self.refresh = refresh
        self.interval = interval
        self._sent: dict[str, tuple[RunnerSlot, ...]] = {}
        self._runners: dict[str, FleetEntry] = {}
        self._by_version: dict[str, str] = {}
        self._synced_at = float("-inf")
        # Nothing in a round is transient: whatever it raises is logged with its traceback.
        self._rounds = Periodic(
            "lane-supply", interval, self._round, "lane: runners sync", log, transient=()
        )

    def runner(self, runner_id: str) -> FleetEntry | None:
        """A runner the lane knows (also one that left since it was dispatched to)."""
        return self._runners.get(runner_id)

    def lane_for_version(self, version_id: str) -> str | None:
        """The lane (a deployment) whose runners serve ``version_id``; None when none does."""
        return self._by_version.get(version_id)

    def members_changed(self, members: tuple[str, ...]) -> None:
        self.members = members
        self.sync(force=True)

    def fleet_changed(self, _: object = None) -> None:
        self.sync()

    def sync(self, force: bool = False) -> None:
        """Send ``RunnersChanged`` for each deployment whose slots changed (all with
        ``force``), and an empty list for each that lost its last ready runner."""
        index, count = member_index(self.members, self.me)
        groups: dict[str, list[FleetEntry]] = {}
        for entry in sorted(self.entries().values(), key=lambda e: e.id):
            if entry.ready:
                groups.setdefault(entry.deployment, []).append(entry)
                self._runners[entry.id] = entry
        by_version: dict[str, str] = {}
        for deployment in sorted(groups):
            for entry in groups[deployment]:
                by_version.setdefault(entry.version_id, deployment)
        self._by_version = by_version
        slots = {
            deployment: slice_runners(((e.id, e.concurrency) for e in group), index, count)
            for deployment, group in groups.items()
        }
        for deployment in self._sent.keys() - slots.keys():
            slots[deployment] = ()
        for deployment, runners in slots.items():
            if force or self._sent.get(deployment) != runners:
                self.shell.runners_changed(deployment, runners)
        self._sent = {name: runners for name, runners in slots.items() if runners}
        if force:
            self._synced_at = time.monotonic()
        self._forget_runners()

    def _forget_runners(self) -> None:
        """Keep runners that left for as long as requests may still be on them (a few
        refreshes is plenty: an attempt holds its runner's entry from its dispatch)."""
        if len(self._runners) > 4 * max(1, sum(len(s) for s in self._sent.values())):
            listed = {slot.runner_id for slots in self._sent.values() for slot in slots}
            self._runners = {k: v for k, v in self._runners.items() if k in listed}

    async def start(self) -> None:
        self.sync(force=True)
        self._rounds.start()

    async def stop(self) -> None:
        await self._rounds.stop()

    async def _round(self) -> None:
        self.sync(force=time.monotonic() - self._synced_at >= self.refresh)
