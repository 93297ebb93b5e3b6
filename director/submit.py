"""Submitting a validated prediction: store it, then queue it.

The order is what makes an accepted prediction never lost: the row is committed first, and
only then is its id appended to its target's stream. A Redis failure after the commit is
logged, not raised: the prediction is stored, so the caller answers it as stored (a failure
would make a client retry into a second prediction), and the reconciler
(``director.reconciler``) queues it once Redis answers again, as it does for a process that
died between the commit and the append.

Every front door that creates predictions (the HTTP api, the gateway) goes through here, so
that they store and queue alike. The row is written by the inserter the caller hands in (its
group commit of ``tracker.store.insert_predictions``): no director module writes prediction
rows itself, so this one knows a new prediction only by its id and its account.
"""

from __future__ import annotations

import logging
from typing import Protocol, TypeVar

from redis.exceptions import RedisError
from sqlalchemy.engine import RowMapping

from director.queue import Queue
from tracker.group_commit import Batcher
from tracker.keys import Target

log = logging.getLogger(__name__)


class Submitted(Protocol):
    """What queueing needs of a new prediction (``tracker.store.NewPrediction``)."""

    @property
    def id(self) -> str: ...

    @property
    def account_id(self) -> int: ...


N = TypeVar("N", bound=Submitted)


async def submit(
    inserter: Batcher[N, RowMapping], queue: Queue, new: N, target: Target
) -> RowMapping:
    """Commit ``new`` through ``inserter``, then queue it on ``target``; the stored row."""
    row = await inserter.submit(new)
    await enqueue_stored(queue, new, target)
    return row


async def enqueue_stored(queue: Queue, new: Submitted, target: Target) -> None:
    """Queue ``new``, already committed, on the stream of ``target`` its account is sharded to.
    A Redis failure is logged and left to the reconciler."""
    try:
        await queue.enqueue(target.streams_for(new.account_id), new.id, new.account_id)
    except (RedisError, OSError) as error:
        log.warning("prediction %s stored, queued once Redis answers: %r", new.id, error)
