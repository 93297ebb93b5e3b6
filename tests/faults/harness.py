"""Fault drills: a stack with fast failure detection, a load generator that records every client
call, a record of every runner invocation, and the checks every drill ends with.

The checks: lost = 0 (every 201 reaches a terminal state), exactly one ``done`` event per
prediction, and every duplicate runner invocation explained (a deliberate re-run, counted by the
prediction's ``runs``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import redis

from conduit.runtime import migrate
from tests.faults.report import RESULTS, Outcome
from tests.fixtures.admin import Admin
from tests.fixtures.faulty import REGISTRATION as FAULTY_MODEL
from tests.fixtures.processes import Launcher, Proc, base_env
from tests.fixtures.waiting import wait_for
from tracker.keys import events_key

TERMINAL = ("succeeded", "failed", "canceled", "aborted")

#: Director settings for drills: failures are noticed in about a second, not a minute.
FAST_DIRECTOR = {
    "visibility_timeout": "3",
    "heartbeat_interval": "0.5",
    "claim_interval": "0.5",
    "retry_interval": "1",
    "reconcile_interval": "1",
    "reconcile_after": "2",
    "runner_check_interval": "0.5",
    "cancel_grace": "2",
    "shutdown_grace": "5",
}


@dataclass
class Submitted:
    id: str
    token: str
    deployment: str
    at: float


@dataclass
class Drill:
    """One drill's stack and records."""

    launcher: Launcher
    admin: Admin
    database_url: str
    redis_url: str
    record: Path
    api_url: str = ""
    submitted: list[Submitted] = field(default_factory=list)
    refused: Counter[int] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The drill's accounts and deployments (owned by ``drill``): each account is granted
    #: each deployment, whichever was made first.
    account_names: list[str] = field(default_factory=list)
    deployments: list[str] = field(default_factory=list)

    def accounts(self, n: int) -> list[str]:
        """Tokens of ``n`` new accounts, each granted the drill's deployments."""
        names = [f"drill-{uuid.uuid4().hex[:8]}" for _ in range(n)]
        tokens = [self.admin.create_account(name) for name in names]
        for deployment in self.deployments:
            self.admin.grant(",".join(names), "deployment", deployment)
        self.account_names.extend(names)
        return tokens

    def deployment(self, prefix: str, **options: Any) -> str:
        name = f"drill/{prefix}-{uuid.uuid4().hex[:6]}"
        self.deploy(name, **options)
        return name

    def deploy(self, name: str, **options: Any) -> None:
        """Deployment ``name`` of the faulty model (private), granted the drill's accounts."""
        grants = ",".join(self.account_names)
        self.admin.create_deployment(name, "drill/faulty", grants=grants, **options)
        self.deployments.append(name)

    def director(self, deployment: str, runner_url: str, concurrency: int = 4, **env: str) -> Proc:
        settings = {**FAST_DIRECTOR, **env}
        return self.launcher.director(deployment, runner_url, concurrency, None, **settings)

    def submit(
        self,
        token: str,
        deployment: str,
        input: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> str | None:
        """One create, recorded: the id on 201, None otherwise (the client saw a refusal)."""
        try:
            response = httpx.post(
                f"{self.api_url}/v1/deployments/{deployment}/predictions",
                json={"input": input},
                headers={"Authorization": f"Bearer {token}", **(headers or {})},
                timeout=10,
            )
        except httpx.HTTPError:
            with self.lock:
                self.refuse(0, None)
            return None
        if response.status_code != 201:
            with self.lock:
                self.refuse(response.status_code, response)
            return None
        prediction_id: str = response.json()["id"]
        with self.lock:
            self.submitted.append(Submitted(prediction_id, token, deployment, time.monotonic()))
        return prediction_id

    def refuse(self, status: int, response: httpx.Response | None) -> None:
        """Record a create that was not a 201 (``status`` 0: no answer); under ``lock``."""
        self.refused[status] += 1

    def load(
        self,
        jobs: Iterable[tuple[str, str, dict[str, Any]]],
        workers: int = 8,
        pace: Callable[[], None] | None = None,
    ) -> None:
        """Submit (token, deployment, input) jobs from a thread pool."""
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            futures = []
            for token, deployment, input in jobs:
                futures.append(pool.submit(self.submit, token, deployment, input))
                if pace is not None:
                    pace()
            for future in futures:
                future.result()

    def statuses(self, ids: list[str] | None = None) -> dict[str, tuple[str, int, str | None]]:
        """id -> (status, claims, error); claims = the fenced attempts made on it."""
        ids = ids if ids is not None else [s.id for s in self.submitted]
        with psycopg.connect(self.database_url) as conn:
            rows = conn.execute(
                "SELECT id, status, attempt, error FROM predictions WHERE id = ANY(%s)", (ids,)
            ).fetchall()
        return {row[0]: (row[1], row[2], row[3]) for row in rows}

    def status(self, prediction_id: str) -> str:
        return self.statuses([prediction_id])[prediction_id][0]

    def settle(self, timeout: float = 120) -> dict[str, tuple[str, int, str | None]]:
        def all_terminal() -> tuple[dict[str, tuple[str, int, str | None]]] | None:
            states = self.statuses()
            done = all(states.get(s.id, ("",))[0] in TERMINAL for s in self.submitted)
            return (states,) if done else None  # a tuple: truthy even with nothing submitted

        return wait_for(all_terminal, "every accepted prediction terminal", timeout, 0.25)[0]

    def completion_times(self, ids: list[str]) -> list[float]:
        """Seconds from create to terminal state, sorted, for the given predictions."""
        with psycopg.connect(self.database_url) as conn:
            rows = conn.execute(
                "SELECT extract(epoch from completed_at - created_at) FROM predictions "
                "WHERE id = ANY(%s)",
                (ids,),
            ).fetchall()
        return sorted(float(r[0]) for r in rows)

    def invocations(self) -> Counter[str]:
        if not self.record.exists():
            return Counter()
        return Counter(line for line in self.record.read_text().splitlines() if line)

    def redis_client(self) -> AbstractContextManager[Any]:
        """A plain (synchronous) client of the drill's Redis, for its event streams."""
        return redis.Redis.from_url(self.redis_url)

    #: Whether event streams are keyed as on a cluster (``events_key(id, clustered=True)``).
    clustered = False

    def done_events(self, ids: list[str]) -> Counter[str]:
        counts: Counter[str] = Counter()
        with self.redis_client() as r:
            for prediction_id in ids:
                entries = r.xrange(events_key(prediction_id, clustered=self.clustered))
                counts[prediction_id] = sum(1 for _, f in entries if f.get(b"type") == b"done")
        return counts


D = TypeVar("D", bound=Drill)


@contextlib.contextmanager
def drill_stack(kind: type[D], database_url: str, redis_url: str, tmp_path: Path) -> Iterator[D]:
    """A drill's stack on ``database_url`` (migrated here) and ``redis_url``: the faulty
    model's runners record each invocation, an api is up; every process is killed at the end."""
    migrate(database_url)
    record = tmp_path / "invocations.txt"
    env = base_env(database_url, redis_url)
    env["CONDUIT_FAULTY_RECORD"] = str(record)
    env["CONDUIT_RUNNER_MODELS"] = FAULTY_MODEL
    launcher = Launcher(env, tmp_path)
    drill = kind(launcher, Admin(database_url), database_url, redis_url, record)
    try:
        _, drill.api_url = launcher.api()
        launcher.env["CONDUIT_PUBLIC_URL"] = drill.api_url
        yield drill
    finally:
        launcher.kill_all()  # a drill's processes owe nothing to anyone at the end
        if os.environ.get("CONDUIT_DRILL_LOGS"):
            print(f"drill logs: {tmp_path}")


def verify(
    drill: Drill,
    scenario: str,
    started: float,
    timeout: float = 120,
    check_done_events: bool = True,
    note: str = "",
) -> Outcome:
    """The checks every drill ends with; records its figures for the summary table."""
    states = drill.settle(timeout)
    ids = [s.id for s in drill.submitted]
    terminal = sum(1 for i in ids if states[i][0] in TERMINAL)
    invoked = drill.invocations()
    duplicates = {i: n for i, n in invoked.items() if i in states and n > 1}
    # A duplicate run is explained when every invocation had a fenced claim of its own: the
    # prediction was claimed again after a fault (a killed director, a crashed runner) and run
    # again, on purpose (max_attempts) or because the first run never reported its start.
    # A second invocation under a single claim would be a real double run.
    explained = sum(1 for i, n in duplicates.items() if n <= states[i][1])
    outcome = Outcome(
        scenario,
        submitted=len(ids),
        terminal=terminal,
        lost=len(ids) - terminal,
        duplicates=len(duplicates),
        explained=explained,
        seconds=round(time.monotonic() - started, 1),
        statuses=Counter(states[i][0] for i in ids),
        note=note,
    )
    RESULTS.append(outcome)
    assert outcome.lost == 0, outcome
    assert outcome.duplicates == outcome.explained, (outcome, duplicates)
    if check_done_events:
        done = drill.done_events(ids)
        wrong = {i: n for i, n in done.items() if n != 1}
        assert not wrong, f"predictions without exactly one done event: {wrong}"
    return outcome
