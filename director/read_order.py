"""The order in which a director serving several deployments on one pool host reads their
streams: :func:`director.preference.read_order` over what it last learned, each deployment's
own shards in round-robin order within its place.

Its inputs are refreshed in the background, about once a second, never on the read path: which
models are loaded (the pool's capabilities, ``director.pool_slots``) and what waits unread in
each deployment's streams (``Queue.backlog``: one script call per slot; length less pending,
and the oldest unread entry's id, whose timestamp tells how long it has waited). XINFO and
XPENDING round trips per stream on every read would cost more than the reads; the director's
queue stats (``Queue.stats``) say how many entries wait but not since when. Between refreshes
the oldest wait keeps growing on the loop's clock, so a deployment passes the aging bound on
time; what the snapshot does not know yet (entries read or added since) is at most one refresh
late. With a single deployment none of this runs: its reads are as they were.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from director.metrics import DirectorMetrics
from director.pool_slots import PoolSlots
from director.preference import Waiting, read_order
from director.queue import Queue

#: Seconds between refreshes of the loaded models and the backlog.
REFRESH_INTERVAL = 1.0


class ReadOrder:
    def __init__(
        self,
        queue: Queue,
        groups: Sequence[Sequence[str]],
        deployments: Sequence[str],
        models: Sequence[str | None],
        slots: PoolSlots | None,
        aging_bound: float,
        metrics: DirectorMetrics,
    ) -> None:
        """``groups[i]``: deployment ``deployments[i]``'s current streams; ``models[i]``: its
        model on the pool host."""
        self.queue = queue
        self.groups = [list(group) for group in groups]
        self.deployments = list(deployments)
        self.models = list(models)
        self.slots = slots
        self.aging_bound = aging_bound
        self.metrics = metrics
        #: Per deployment: (entries waiting, ms its oldest had waited), at ``_seen_at``.
        self._backlog: list[tuple[int, int | None]] = [(0, None)] * len(self.groups)
        self._seen_at = 0.0

    async def refresh(self) -> None:
        """Learn the loaded models and the backlog (concurrently)."""
        polls = [self.slots.poll()] if self.slots is not None else []
        await asyncio.gather(self._read_backlog(), *polls)
        for name, ready in zip(self.deployments, self.ready(), strict=True):
            self.metrics.model_ready.labels(name).set(1 if ready else 0)

    async def _read_backlog(self) -> None:
        streams = [stream for group in self.groups for stream in group]
        seen = await self.queue.backlog(streams)
        self._seen_at = asyncio.get_running_loop().time()
        by_stream = {b.stream: b for b in seen}
        backlog: list[tuple[int, int | None]] = []
        for name, group in zip(self.deployments, self.groups, strict=True):
            found = [by_stream[stream] for stream in group]
            waits = [b.oldest_wait_ms for b in found if b.oldest_wait_ms is not None]
            backlog.append((sum(b.waiting for b in found), max(waits, default=None)))
            self.metrics.oldest_wait.labels(name).set(max(waits, default=0) / 1000)
        self._backlog = backlog

    def ready(self) -> list[bool]:
        loaded = self.slots.ready if self.slots is not None else frozenset()
        return [model is not None and model in loaded for model in self.models]

    def waiting(self) -> list[Waiting]:
        """What is known of each deployment's queue now."""
        since = asyncio.get_running_loop().time() - self._seen_at
        return [
            Waiting(ready, None if oldest is None else oldest / 1000 + since, count)
            for ready, (count, oldest) in zip(self.ready(), self._backlog, strict=True)
        ]

    def order(self) -> list[int]:
        """The indexes of the deployments, in the order to read them."""
        return read_order(self.waiting(), self.aging_bound)
