"""One record per queue entry a director holds, in one registry.

An ``Attempt`` is born when an entry is read (``WAITING`` for a worker slot), runs
(``RUNNING``: claim, drive the runner, record) and leaves the registry when its worker ends.
Everything that asks "is this entry, or this prediction, handled here?" asks the registry: the
read loop (a redelivery of what runs here waits its turn), the heartbeat (which entries to
renew), the receiver (whose snapshot is this) and the cancel listener.

Each record carries its own ``secret``, drawn when it is born: the receiver takes a runner's
snapshot for it only on a URL holding that secret (``director.receiver``). A record is never
re-used: an entry read again, by this process or after a restart, or taken over by another
director, is a new record with a new secret, and the URL handed out for the old one feeds
nothing (an attach hands the runner the new URL).
"""

from __future__ import annotations

import asyncio
import collections
import enum
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from director.leases import Lease
from director.queue import Entry
from protocol.documents import PredictionResponse

#: Why no snapshot came: a cancel, the limit, nothing within the wait, output not kept.
Interruption = Literal["cancel", "limit", "quiet", "unkept"]


class Stage(enum.Enum):
    WAITING = "waiting"  # read; waits for a worker slot
    RUNNING = "running"  # a worker claims, runs and records it


#: Bytes of randomness in an attempt's webhook secret (256 bits; at least 128 are needed).
SECRET_BYTES = 32


def new_secret() -> str:
    """A URL-safe secret for one attempt's webhook path."""
    return secrets.token_urlsafe(SECRET_BYTES)


@dataclass(eq=False)
class Attempt:
    entry: Entry
    lease: Lease
    stage: Stage = Stage.WAITING
    task: asyncio.Task[None] | None = None
    #: The runner's snapshots, from its webhooks (the receiver) or its snapshot stream.
    snapshots: asyncio.Queue[PredictionResponse] = field(default_factory=asyncio.Queue)
    #: Set by a cancel published for the prediction (or found flagged in Postgres).
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    #: The path segment that proves a webhook comes from the runner this attempt handed its
    #: URL to (compared in constant time by the receiver); never logged.
    secret: str = field(default_factory=new_secret, repr=False)
    #: The prediction's account, once claimed: whose output files the receiver stores.
    account_id: int | None = None
    #: Why the runner's output cannot be kept (a file the store refused, a snapshot past
    #: its limit): set once, and the attempt fails the prediction with it at once.
    unkept: str | None = None
    output_lost: asyncio.Event = field(default_factory=asyncio.Event)
    #: The output files stored from this attempt's webhooks, by the digest of their type and
    #: bytes: a file sent again (each snapshot carries the whole output so far) keeps its URL.
    kept_files: dict[str, str] = field(default_factory=dict, repr=False)

    def cannot_keep(self, reason: str) -> None:
        """The runner's output cannot be kept: fail the prediction now, free the slot."""
        if self.unkept is None:
            self.unkept = reason
            self.output_lost.set()

    @property
    def prediction_id(self) -> str:
        return self.entry.prediction_id

    async def next_news(
        self, seconds: float, watch_cancel: bool
    ) -> PredictionResponse | Interruption:
        """The next runner snapshot, or why none came: "cancel", "unkept", or "quiet"
        (nothing within ``seconds``; the caller decides whether that means its limit
        passed; "limit" when it had none left)."""
        if self.unkept is not None or not self.snapshots.empty():
            return "unkept" if self.unkept else self.snapshots.get_nowait()
        if watch_cancel and self.cancel.is_set():
            return "cancel"
        getter = asyncio.ensure_future(self.snapshots.get())
        lost = asyncio.ensure_future(self.output_lost.wait())
        waiters: set[asyncio.Future[Any]] = {getter, lost}
        canceller = None
        if watch_cancel:
            canceller = asyncio.ensure_future(self.cancel.wait())
            waiters.add(canceller)
        done, _ = await asyncio.wait(
            waiters, timeout=max(seconds, 0.0), return_when=asyncio.FIRST_COMPLETED
        )
        if canceller is not None:
            canceller.cancel()
        lost.cancel()
        if getter in done:
            return getter.result()
        getter.cancel()
        if lost in done:
            return "unkept"
        if canceller is not None and canceller in done:
            return "cancel"
        return "quiet" if seconds > 0 else "limit"


class Attempts:
    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._by_entry: dict[tuple[str, str], Attempt] = {}
        self._by_prediction: dict[str, Attempt] = {}
        self._waiting: collections.deque[Attempt] = collections.deque()

    def __len__(self) -> int:
        return len(self._by_entry)

    def __iter__(self) -> Iterator[Attempt]:
        return iter(list(self._by_entry.values()))

    def holds(self, entry: Entry) -> bool:
        """This entry, or another for the same prediction, is waiting or running here."""
        return entry.key in self._by_entry or entry.prediction_id in self._by_prediction

    def get(self, key: tuple[str, str]) -> Attempt | None:
        return self._by_entry.get(key)

    def for_prediction(self, prediction_id: str) -> Attempt | None:
        return self._by_prediction.get(prediction_id)

    def add(self, entry: Entry, lease: Lease) -> Attempt:
        attempt = Attempt(entry, lease)
        self._by_entry[entry.key] = attempt
        self._by_prediction[entry.prediction_id] = attempt
        self._waiting.append(attempt)
        return attempt

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def running(self) -> list[Attempt]:
        return [a for a in self._by_entry.values() if a.stage is Stage.RUNNING]

    def idle_workers(self) -> int:
        return self.concurrency - (len(self._by_entry) - len(self._waiting))

    def free(self) -> int:
        """Entries this director may still take on (waiting ones count as taken)."""
        return self.concurrency - len(self._by_entry)

    def next_to_run(self) -> Attempt | None:
        """The oldest waiting attempt, when a worker slot is free."""
        if not self._waiting or len(self._by_entry) - len(self._waiting) >= self.concurrency:
            return None
        attempt = self._waiting.popleft()
        attempt.stage = Stage.RUNNING
        return attempt

    def remove(self, attempt: Attempt) -> None:
        if self._by_entry.get(attempt.entry.key) is attempt:
            del self._by_entry[attempt.entry.key]
        if self._by_prediction.get(attempt.prediction_id) is attempt:
            del self._by_prediction[attempt.prediction_id]
