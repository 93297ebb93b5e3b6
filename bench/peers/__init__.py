"""Peer task queues that the benchmarks compare Conduit against, each with a no-op task.

Every peer's task ends with ``INCR bench:done`` on the stack's Redis (:data:`DONE_KEY`), so
the benchmark knows when all N are done by the same signal for every peer. Workers run as
subprocesses through each library's own CLI (:data:`WORKERS`); enqueueing happens in a
separate process too (``python -m bench.peers.enqueue``). The modules read ``REDIS_URL``
at import, as the workers need their broker configured when the CLI imports them.
"""

from __future__ import annotations

#: INCRed by every peer's no-op task when it runs.
DONE_KEY = "bench:done"
#: RPUSHed with the task's start time (``time.time()``) by the start-latency task.
STARTS_KEY = "bench:starts"

#: ``python -m <argv>`` that starts each peer's worker.
WORKERS: dict[str, list[str]] = {
    # --without-*: no cluster chatter, as a lone benchmark worker needs none.
    "celery": [
        "celery",
        "-A",
        "bench.peers.celery_app",
        "worker",
        "--pool",
        "solo",
        "--loglevel",
        "WARNING",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ],
    "dramatiq": ["dramatiq", "bench.peers.dramatiq_app", "--processes", "1", "--threads", "8"],
    "taskiq": ["taskiq", "worker", "bench.peers.taskiq_app:broker", "--workers", "1"],
    "arq": ["arq", "bench.peers.arq_app.WorkerSettings"],
}
