"""Where a director's entries come from: new reads, its own failed entries offered again,
entries taken over from dead directors.

New entries are read from the shards in turn, round robin, in one round trip, then with one
blocking read of all. A director serving several deployments reads them in the order ``order``
gives (``director.read_order``: loaded models first, with an aging bound), each deployment's
shards round robin within its place.

An entry that failed here (or waits for a twin running here) goes on the retry set and is
offered again (counting a delivery) after ``retry_interval``; an entry running here is never
re-read (a re-read counts a delivery, and a long healthy run would drift toward the
dead-letter stream). At start and after backend trouble every entry pending for this director
that it does not hold is offered again (the sweep).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from director.attempts import Attempts
from director.leases import Heartbeats
from director.queue import Entry, Queue
from director.reclaim import Reclaimer, Retries

log = logging.getLogger(__name__)


class Intake:
    def __init__(
        self,
        queue: Queue,
        reclaimer: Reclaimer,
        attempts: Attempts,
        heartbeats: Heartbeats,
        groups: list[list[str]],
        draining: list[str],
        *,
        retry_interval: float,
        block_ms: int,
    ) -> None:
        self.queue = queue
        self.reclaimer = reclaimer
        self.consumer = reclaimer.consumer
        self.attempts = attempts
        self.heartbeats = heartbeats
        #: Each deployment's current streams, in the order the deployments were given.
        self._groups = groups
        #: Streams not read for now: a deployment's own, while it runs another version than
        #: this director's runner (``director.release_watch``).
        self.aside: set[str] = set()
        self._regroup()
        self.draining = draining
        self.retry_interval = retry_interval
        self.block_ms = block_ms
        self.retries = Retries()
        #: Offer every entry pending for this consumer again: at start, after backend trouble.
        self.sweep_due = True
        self._rotation = 0
        #: With several deployments: their indexes in ``groups``, in the order to read them.
        self.order: Callable[[], list[int]] | None = None
        self._rotations = [0] * len(groups)

    def _regroup(self) -> None:
        """``groups``: each deployment's current streams read now; ``current``: all of them.
        Kept, not derived on each read: the read loop asks for them every turn."""
        self.groups = [[s for s in group if s not in self.aside] for group in self._groups]
        self.current = [stream for group in self.groups for stream in group]

    @property
    def streams(self) -> list[str]:
        """What is read: current streams not set aside, and those being drained."""
        return self.current + self.draining

    @property
    def all_streams(self) -> list[str]:
        """Every stream this director's entries may be in, set aside or not."""
        return [s for group in self._groups for s in group] + self.draining

    def stand_aside(self, streams: Sequence[str]) -> bool:
        """Stop reading ``streams`` (entries already held still run); True when that is new."""
        new = set(streams) - self.aside
        if new:
            self.aside |= new
            self._regroup()
        return bool(new)

    async def rejoin(self, streams: Sequence[str]) -> bool:
        """Read ``streams`` again; True when they were set aside."""
        back = set(streams) & self.aside
        if back:
            await self.queue.ensure_groups(sorted(back))
            self.aside -= back
            self._regroup()
        return bool(back)

    def is_draining(self, stream: str) -> bool:
        return stream in self.draining

    def retire(self, stream: str) -> None:
        self.draining.remove(stream)
        log.info("stream %s drained; no longer read", stream)

    def offer(self, entries: Sequence[Entry]) -> None:
        """Take entries in; one for a prediction handled here waits until that run is over."""
        for entry in entries:
            if self.attempts.holds(entry):
                self.retry_later(entry)
            else:
                self.attempts.add(entry, self.heartbeats.lease(entry.prediction_id))

    def retry_later(self, entry: Entry) -> None:
        if self.attempts.get(entry.key) is None:
            later = asyncio.get_running_loop().time() + self.retry_interval
            self.retries.add(entry.stream, entry.id, later, entry.prediction_id)

    async def fill(self, free: int, *, offer_own: bool) -> None:
        """Bring in up to ``free`` entries: this director's own due retries first (unless
        ``offer_own`` is False: a runner that is away leaves them to others), then new ones."""
        if offer_own:
            if self.sweep_due:
                await self._sweep()
                self.sweep_due = False
            await self._offer_retries(free - self.attempts.waiting)
        if not self.attempts.waiting:
            await self._read_new(free)

    async def _sweep(self) -> None:
        """Put every entry pending for this consumer that is not held here on the retry set,
        due now: at start nothing runs, after an outage some may."""
        for stream in self.streams:
            for entry_id in await self.queue.delivery_counts(stream, self.consumer):
                key = (stream, entry_id)
                if key not in self.retries and self.attempts.get(key) is None:
                    self.retries.add(stream, entry_id, 0.0)

    async def _offer_retries(self, room: int) -> None:
        """Re-deliver (counting a delivery) due entries of the retry set, up to ``room``."""
        if room <= 0 or not self.retries:
            return
        now = asyncio.get_running_loop().time()
        by_stream: dict[str, list[str]] = {}
        for stream, entry_id, prediction_id in self.retries.due(now):
            if self.attempts.get((stream, entry_id)) is not None:
                self.retries.discard(stream, entry_id)  # running or about to: never re-deliver
            elif prediction_id is not None and self.attempts.for_prediction(prediction_id):
                self.retries.add(stream, entry_id, now + self.retry_interval, prediction_id)
            elif room > 0:
                by_stream.setdefault(stream, []).append(entry_id)
                room -= 1
        for stream, ids in by_stream.items():
            entries = await self.reclaimer.reoffer(stream, ids)
            for entry_id in ids:
                self.retries.discard(stream, entry_id)
            self.offer(entries)

    async def _read_new(self, free: int) -> None:
        if self.order is not None and len(self.groups) > 1:
            await self._read_in_order(free, self.order())
            return
        streams = self.streams
        start = self._rotation % len(streams)
        ordered = streams[start:] + streams[:start]
        got, passed = await self.queue.read_in_turn(ordered, self.consumer, free)
        if got:
            # Round robin over the shards that have work: the next read starts after the last
            # one that gave some, so a flooded shard is served once per turn.
            self._rotation = start + passed
        else:
            got = await self.queue.read(ordered, self.consumer, count=1, block_ms=self.block_ms)
        self.offer(got)

    async def _read_in_order(self, free: int, order: list[int]) -> None:
        """Read the deployments in ``order``, each one's shards from its own rotation; the
        streams being drained come last."""
        runs: list[tuple[int, int, list[str]]] = []
        for index in order:
            group = self.groups[index]
            start = self._rotations[index] % len(group)
            runs.append((index, start, group[start:] + group[:start]))
        ordered = [stream for _, _, run in runs for stream in run] + self.draining
        got, _ = await self.queue.read_in_turn(ordered, self.consumer, free)
        if got:
            # Each deployment that gave entries starts its next turn after its last shard
            # that gave some.
            gave = {entry.stream for entry in got}
            for index, start, run in runs:
                last = max((i for i, stream in enumerate(run) if stream in gave), default=None)
                if last is not None:
                    self._rotations[index] = start + last + 1
        else:
            got = await self.queue.read(ordered, self.consumer, count=1, block_ms=self.block_ms)
        self.offer(got)
