"""Dramatiq on its Redis broker: a no-op actor that counts itself.

Worker: ``python -m dramatiq bench.peers.dramatiq_app --processes 1 --threads 8``.
"""

from __future__ import annotations

import os

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from bench.peers import DONE_KEY

broker = RedisBroker(url=os.environ["REDIS_URL"])
dramatiq.set_broker(broker)
counter = redis.Redis.from_url(os.environ["REDIS_URL"])


@dramatiq.actor(max_retries=0)
def noop() -> None:
    counter.incr(DONE_KEY)


def enqueue_one() -> None:
    noop.send()
