"""Celery 5 on the Redis broker: a no-op task that counts itself, and a start-stamping task.

Worker: ``python -m celery -A bench.peers.celery_app worker --pool solo`` (see
:data:`bench.peers.WORKERS`). No result backend: completion is counted in Redis.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from bench.peers import DONE_KEY, STARTS_KEY

app = Celery("bench", broker=os.environ["REDIS_URL"])
app.conf.update(
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
counter = redis.Redis.from_url(os.environ["REDIS_URL"])


@app.task(name="bench.noop")
def noop() -> None:
    counter.incr(DONE_KEY)


@app.task(name="bench.stamp")
def stamp() -> None:
    counter.rpush(STARTS_KEY, repr(time.time()))


def enqueue_one() -> None:
    noop.delay()
