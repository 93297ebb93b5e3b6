"""Drill 10: a Hypothesis state machine drives the public API through creates (with and without
``Idempotency-Key``), gets, lists, cancels and other accounts' look-ups, while directors are
SIGKILLed and Redis is SIGKILLed and restarted, and checks after every step that what the API
shows equals a model of it.

The model holds, per account, the predictions it made (id, input, order of creation) and, per
prediction, the terminal outcomes still possible. Timing is not deterministic, so an outcome is
a set that the steps widen: a SIGKILLed director makes ``failed`` (interrupted, dead-lettered)
possible for whatever it may have claimed; a cancel makes ``canceled`` possible, or certain when
no director has had the chance to claim the prediction. A Redis restart widens nothing: its AOF
keeps everything, so every prediction must end as if nothing happened; a create during it is
answered 201 as stored (queued once Redis is back) or 503 with nothing stored. What must hold
at every step: an observed status never goes backwards and a terminal one never changes; a
terminal one is one the model allows; ``succeeded`` carries exactly the model's output;
idempotent replays give back the same id; the list is the account's predictions, newest first,
across pages; another account's prediction is a 404 indistinguishable from an unknown id.

One stack per test (starting processes per example would take minutes); each example gets fresh
accounts, so every example's list starts empty.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

import httpx
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from core.ids import new_prediction_id
from tests.faults.conftest import DrillServers, register_faulty
from tests.faults.harness import TERMINAL, Drill, Submitted, verify
from tests.fixtures.processes import Proc
from tests.fixtures.sizing import sized
from tests.fixtures.waiting import wait_for

RANK = {"starting": 0, "processing": 1, **{status: 2 for status in TERMINAL}}
#: What a SIGKILLed director may do to a prediction it claimed.
FAULT_OUTCOMES = {"failed:interrupted", "failed:dead-letter"}
KEYS = ("k0", "k1", "k2")
picks = st.integers(0, 2**16)
PAGE_SIZE = 3

inputs = st.fixed_dictionaries(
    {
        "prompt": st.sampled_from(["a", "b"]),
        "n": st.integers(1, 3),
        "delay": st.sampled_from([0.0, 0.1, 0.3]),
    },
    optional={"fail": st.booleans(), "ignore_cancel": st.booleans()},
)


def outcome(status: str, error: str | None) -> str:
    """A terminal state as the model names it: ``failed`` split by why."""
    if status != "failed":
        return status
    for needle, name in (
        ("echo failed as requested", "failed:model"),
        ("interrupted", "failed:interrupted"),
        ("dead-letter", "failed:dead-letter"),
    ):
        if needle in (error or ""):
            return name
    return f"failed:{error}"


def _check_times(body: dict[str, Any]) -> None:
    """created <= started <= completed; completed exactly when terminal; started once running."""
    status = body["status"]
    created, started, completed = (
        body[k] and datetime.fromisoformat(body[k])
        for k in ("created_at", "started_at", "completed_at")
    )
    assert created is not None, body
    assert (completed is not None) == (status in TERMINAL), body
    if status in ("processing", "succeeded"):
        assert started is not None, body
    if started is not None:
        assert created <= started, body
    if completed is not None:
        assert (started or created) <= completed, body


@dataclass
class Stack:
    drill: Drill
    servers: DrillServers
    deployment: str
    runner: Proc
    runner_url: str
    apis: list[str]  # every api; the last one pages by PAGE_SIZE
    director: Proc | None = None
    director_up: bool = False  # started and not killed since: it must be alive
    counts: Counter[str] = field(default_factory=Counter)  # for the summary line

    def start_director(self) -> None:
        if self.director is None:
            self.director = self.drill.director(self.deployment, self.runner_url, concurrency=4)
        else:
            self.director.start()  # same arguments, so the same consumer: it re-reads its own
        self.director_up = True

    def kill_director(self) -> None:
        assert self.director is not None
        self.director.kill()
        self.director_up = False


@dataclass
class Pred:
    id: str
    account: int
    input: dict[str, Any]
    allowed: set[str]
    may_be_claimed: bool  # a director has been alive since it was created
    rank: int = 0  # the furthest status observed
    final: str | None = None  # the terminal outcome, once observed
    cancel_requested: bool = False

    @property
    def expected_output(self) -> list[str]:
        return [f"{self.input['prompt']}-{i}" for i in range(self.input["n"])]


@dataclass
class Binding:
    """An ``Idempotency-Key`` in use: the body it was first used with and what it made."""

    body: dict[str, Any]
    id: str


@dataclass
class Account:
    token: str
    order: list[str] = field(default_factory=list)  # prediction ids, oldest first
    keys: dict[str, Binding] = field(default_factory=dict)


class ApiModel(RuleBasedStateMachine):
    stack: ClassVar[Stack]

    def __init__(self) -> None:
        super().__init__()
        self.accounts = [Account(t) for t in self.stack.drill.accounts(3)]
        self.stack.counts["examples"] += 1
        self.preds: dict[str, Pred] = {}
        self.http = httpx.Client(timeout=15)
        self.turn = 0

    # -- plumbing ---------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        self.turn += 1
        apis = self.stack.apis
        return apis[self.turn % len(apis)] + path

    def _send(
        self, method: str, path: str, account: int, url: str | None = None, **kw: Any
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.accounts[account].token}"}
        headers.update(kw.pop("headers", {}))
        return self.http.request(method, url or self._url(path), headers=headers, **kw)

    def _answered(
        self, method: str, path: str, account: int, url: str | None = None, **kw: Any
    ) -> httpx.Response:
        """Retry a safe request through 503s (Redis restarting), as a client would."""

        def attempt() -> httpx.Response | None:
            response = self._send(method, path, account, url, **kw)
            return None if response.status_code == 503 else response

        return wait_for(attempt, f"{method} {path} answered", timeout=20, interval=0.2)

    def _observe(self, body: dict[str, Any]) -> None:
        pred = self.preds[body["id"]]
        status = body["status"]
        assert body["input"] == pred.input, body
        assert RANK[status] >= pred.rank, f"{pred.id} went back to {status} from rank {pred.rank}"
        pred.rank = RANK[status]
        _check_times(body)
        if status not in TERMINAL:
            assert pred.final is None, f"{pred.id} was {pred.final}, now {status}"
            return
        seen = outcome(status, body["error"])
        if pred.final is not None:
            assert seen == pred.final, f"{pred.id} was {pred.final}, now {seen}"
            return
        assert seen in pred.allowed, f"{pred.id} ended {seen}; model allows {pred.allowed}"
        if seen in ("succeeded", "failed:model"):  # the model yields all n, then may raise
            assert body["output"] == pred.expected_output, body
        if seen in ("succeeded", "canceled"):
            assert body["error"] is None, body
        pred.final = seen

    def _unfinished(self) -> list[Pred]:
        return [p for p in self.preds.values() if p.final is None]

    def _record(self, account: int, response: httpx.Response, input: dict[str, Any]) -> str:
        body = response.json()
        pid: str = body["id"]
        assert response.headers["location"] == body["urls"]["get"], response.headers
        assert pid not in self.preds, f"a new prediction reused {pid}"
        allowed = {"failed:model" if input.get("fail") else "succeeded"}
        self.preds[pid] = Pred(pid, account, input, allowed, self.stack.director_up)
        self.accounts[account].order.append(pid)
        deployment = self.stack.deployment
        token = self.accounts[account].token
        self.stack.drill.submitted.append(Submitted(pid, token, deployment, time.monotonic()))
        self._observe(body)
        return pid

    def _create(
        self, account: int, input: dict[str, Any], key: str | None, url: str | None = None
    ) -> httpx.Response:
        headers = {"Idempotency-Key": key} if key else {}
        path = f"/v1/deployments/{self.stack.deployment}/predictions"
        return self._send("POST", path, account, url, json={"input": input}, headers=headers)

    def _fault(self) -> None:
        for pred in self._unfinished():
            if pred.may_be_claimed:
                pred.allowed |= FAULT_OUTCOMES

    def _start_director(self) -> None:
        self.stack.start_director()
        for pred in self._unfinished():
            pred.may_be_claimed = True

    @initialize(director=st.booleans())
    def begin(self, director: bool) -> None:
        """Half the examples begin with no director: their creates stay queued and unclaimed
        until a ``director_step``, and a cancel must cancel them on the spot."""
        if director and not self.stack.director_up:
            self._start_director()
        elif not director and self.stack.director_up:
            self.stack.kill_director()  # idle: the last example's predictions all finished
        self.stack.counts["begun without a director"] += not director

    # -- creates ----------------------------------------------------------------------------

    @rule(account=st.integers(0, 2), input=inputs)
    def create(self, account: int, input: dict[str, Any]) -> None:
        response = self._create(account, input, None)
        if response.status_code == 503:  # nothing stored: the list will tell
            self.stack.counts["503"] += 1
            return
        assert response.status_code == 201, response.text
        assert "idempotent-replayed" not in response.headers
        self._record(account, response, input)

    @rule(account=st.integers(0, 2), key=st.sampled_from(KEYS), input=inputs)
    def create_with_key(self, account: int, key: str, input: dict[str, Any]) -> None:
        self._keyed(account, key, input)

    @rule(pick=picks, same=st.booleans())
    def reuse_key(self, pick: int, same: bool) -> None:
        used = [(i, k) for i, a in enumerate(self.accounts) for k in sorted(a.keys)]
        if not used:
            return
        account, key = used[pick % len(used)]
        input = dict(self.accounts[account].keys[key].body["input"])
        if not same:
            input["prompt"] += "-other"
        # Key order must not matter: the fingerprint is canonical JSON.
        self._keyed(account, key, dict(reversed(input.items())))

    def _keyed(self, account: int, key: str, input: dict[str, Any]) -> None:
        def attempt() -> httpx.Response | None:
            response = self._create(account, input, key)
            if response.status_code == 503:
                self.stack.counts["503"] += 1
                return None
            return response

        response = wait_for(attempt, "keyed create answered", timeout=20, interval=0.2)
        binding = self.accounts[account].keys.get(key)
        if binding is None:
            assert response.status_code == 201, response.text
            assert "idempotent-replayed" not in response.headers
            pid = self._record(account, response, input)
            self.accounts[account].keys[key] = Binding({"input": input}, pid)
        elif binding.body == {"input": input}:
            assert response.status_code == 201, response.text
            assert response.headers.get("idempotent-replayed") == "true"
            assert response.json()["id"] == binding.id
            self._observe(response.json())
        else:
            assert response.status_code == 422, response.text
            assert response.json()["errors"][0]["field"] == "Idempotency-Key"

    @rule(account=st.integers(0, 2), input=inputs)
    def concurrent_creates_with_one_key(self, account: int, input: dict[str, Any]) -> None:
        """Two creates racing with a fresh key: one prediction; the other replays or gets 409."""
        key = f"race-{new_prediction_id()[:8]}"
        barrier = threading.Barrier(2)
        url = self._url(f"/v1/deployments/{self.stack.deployment}/predictions")
        token = self.accounts[account].token

        def post() -> httpx.Response:
            barrier.wait(timeout=10)
            return httpx.post(
                url,
                json={"input": input},
                headers={"Authorization": f"Bearer {token}", "Idempotency-Key": key},
                timeout=15,
            )

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            responses = list(pool.map(lambda _: post(), range(2)))
        codes = [r.status_code for r in responses]
        assert set(codes) <= {201, 409, 503}, [r.text for r in responses]
        self.stack.counts["503"] += codes.count(503)
        made = [r for r in responses if r.status_code == 201]
        fresh = [r for r in made if "idempotent-replayed" not in r.headers]
        assert len(fresh) <= 1, [dict(r.headers) for r in made]
        if fresh:
            pid = self._record(account, fresh[0], input)
            self.accounts[account].keys[key] = Binding({"input": input}, pid)
        for response in made:
            if response in fresh:
                continue
            replayed = response.json()["id"]
            assert fresh and replayed == fresh[0].json()["id"], (
                f"201 replayed {replayed}, made by a racing create that was answered "
                f"{codes} and released its key: {response.text}"
            )
            self._observe(response.json())
        for response in responses:
            if response.status_code == 409:
                assert response.headers.get("retry-after"), response.headers
        self._keyed(account, key, input)  # a replay now, or the create the 503s did not make

    @rule(account=st.integers(0, 2), key=st.sampled_from([None, *KEYS]))
    def invalid_create(self, account: int, key: str | None) -> None:
        """Rejected input stores nothing, and does not use up an ``Idempotency-Key``."""
        response = self._create(account, {"n": 0}, key)
        assert response.status_code == 422, response.text
        if key not in self.accounts[account].keys:  # else a key reused: 422 for either reason
            assert [e["field"] for e in response.json()["errors"]] == ["input.n"], response.text

    # -- reads and cancels ------------------------------------------------------------------

    def _pick(self, pick: int, unfinished: bool = False) -> Pred | None:
        """The ``pick``-th prediction (of those not seen finished, if asked and any): draws keep
        one shape whatever the system answered, so Hypothesis can replay an example."""
        ids = sorted(p.id for p in self._unfinished()) if unfinished else []
        ids = ids or sorted(self.preds)
        return self.preds[ids[pick % len(ids)]] if ids else None

    @rule(pick=picks)
    def get(self, pick: int) -> None:
        pred = self._pick(pick)
        if pred is None:
            return
        response = self._answered("GET", f"/v1/predictions/{pred.id}", pred.account)
        assert response.status_code == 200, response.text
        self._observe(response.json())

    @rule(pick=picks, unfinished=st.booleans())
    def cancel(self, pick: int, unfinished: bool) -> None:
        pred = self._pick(pick, unfinished)
        if pred is None:
            return
        first = not pred.cancel_requested
        # Allowed before the request is sent: it may take effect before the answer comes.
        pred.allowed.add("canceled")
        pred.cancel_requested = True
        response = self._answered("POST", f"/v1/predictions/{pred.id}/cancel", pred.account)
        assert response.status_code == 200, response.text
        body = response.json()
        if pred.final is None and not pred.may_be_claimed:
            assert body["status"] == "canceled", f"queued and unclaimed, yet {body['status']}"
            self.stack.counts["unclaimed"] += 1
        if body["status"] == "canceled" and first and pred.final is None:
            # Canceled at once, so it was queued and unclaimed: never seen running.
            assert pred.rank == 0, f"{pred.id} was processing, yet canceled on the spot"
        self._observe(body)

    @rule(pick=picks, offset=st.integers(1, 2), action=st.sampled_from(["get", "cancel"]))
    def other_account(self, pick: int, offset: int, action: str) -> None:
        pred = self._pick(pick)
        if pred is None:
            return
        intruder = (pred.account + offset) % len(self.accounts)
        unknown = new_prediction_id()
        answers = []
        for pid in (pred.id, unknown):
            path = f"/v1/predictions/{pid}" + ("/cancel" if action == "cancel" else "")
            method = "POST" if action == "cancel" else "GET"
            response = self._answered(method, path, intruder)
            answers.append((response.status_code, response.headers["content-type"], response.text))
        theirs, nobodys = answers
        assert theirs[0] == 404, theirs
        assert theirs[:2] == nobodys[:2]
        assert json.loads(theirs[2].replace(pred.id, "<id>")) == json.loads(
            nobodys[2].replace(unknown, "<id>")
        )

    @rule(account=st.integers(0, 2))
    def list_predictions(self, account: int) -> None:
        self._check_list(account)

    def _check_list(self, account: int) -> None:
        pages: list[dict[str, Any]] = []
        url = self.stack.apis[-1] + "/v1/predictions"
        while url:
            response = self._answered("GET", "", account, url=url)
            assert response.status_code == 200, response.text
            pages.append(response.json())
            url = pages[-1]["next"]
        assert pages[0]["previous"] is None
        assert all(len(p["results"]) == PAGE_SIZE for p in pages[:-1])
        listed = [p for page in pages for p in page["results"]]
        self._adopt_ghosts(account, listed)
        assert [p["id"] for p in listed] == self.accounts[account].order[::-1]
        for body in listed:
            self._observe(body)
        if len(pages) > 1:
            back = self._answered("GET", "", account, url=pages[-1]["previous"]).json()
            assert [p["id"] for p in back["results"]] == [p["id"] for p in pages[-2]["results"]]

    def _adopt_ghosts(self, account: int, listed: list[dict[str, Any]]) -> None:
        """A create answered 503 stored nothing (what is stored is answered 201): nothing may
        appear in the list that the model did not make."""
        ghosts = [p for p in listed if p["id"] not in self.preds]
        assert not ghosts, f"unknown predictions listed: {ghosts}"

    @rule()
    def director_step(self) -> None:
        """Start a director if none runs; else wait until some unfinished prediction ends."""
        if not self.stack.director_up:
            self._start_director()
            return
        waiting = [p.id for p in self._unfinished()]
        if not waiting:
            return
        done = wait_for(
            lambda: [
                pid
                for pid, (status, *_) in self.stack.drill.statuses(waiting).items()
                if status in TERMINAL
            ],
            "some prediction to finish",
            timeout=20,
            interval=0.1,
        )
        for pid in done:
            pred = self.preds[pid]
            response = self._answered("GET", f"/v1/predictions/{pid}", pred.account)
            self._observe(response.json())

    @rule(restart=st.booleans())
    def director_kill(self, restart: bool) -> None:
        if not self.stack.director_up:
            return
        self.stack.kill_director()
        self.stack.counts["kills"] += 1
        self._fault()
        if restart:
            self._start_director()

    @rule()
    def redis_restart(self) -> None:
        # Not a fault in the model: with its AOF, a SIGKILLed Redis comes back with everything
        # (the page cache survives the process), so every prediction must finish as if nothing
        # happened. The api may answer 503 for a moment; the model knows what that may leave.
        self.stack.servers.redis.kill()
        self.stack.servers.redis.start()
        self.stack.counts["restarts"] += 1

    # -- invariants and the end -------------------------------------------------------------

    @invariant()
    def processes_alive(self) -> None:
        self.stack.runner.check_alive()
        if self.stack.director_up:
            assert self.stack.director is not None
            self.stack.director.check_alive()

    def teardown(self) -> None:
        try:
            self._settle()
        finally:
            self.http.close()

    def _settle(self) -> None:
        """Every prediction reaches a terminal state the model allows."""
        if not self.stack.director_up:
            self._start_director()
        ids = sorted(self.preds)
        wait_for(
            lambda: all(s[0] in TERMINAL for s in self.stack.drill.statuses(ids).values()),
            "every prediction terminal",
            timeout=60,
            interval=0.2,
        )
        for pid in ids:
            response = self._answered("GET", f"/v1/predictions/{pid}", self.preds[pid].account)
            self._observe(response.json())
            assert self.preds[pid].final is not None
        for account in range(len(self.accounts)):
            self._check_list(account)


@pytest.mark.timeout(180)
def test_api_equals_model(drill: Drill, servers: DrillServers) -> None:
    runner, runner_url = drill.launcher.runner("faulty", 4)
    register_faulty(drill, runner_url)
    _, paged = drill.launcher.api(env={"CONDUIT_API_PAGE_SIZE": str(PAGE_SIZE)})
    stack = Stack(
        drill,
        servers,
        drill.deployment("model", shards=2),
        runner,
        runner_url,
        [drill.api_url, paged],
    )
    started = time.monotonic()

    class Bound(ApiModel):
        pass

    Bound.stack = stack
    run_state_machine_as_test(
        Bound,
        settings=settings(
            max_examples=sized(8, 20),
            stateful_step_count=25,
            deadline=None,
            derandomize=True,
            database=None,
            phases=[Phase.generate],  # shrinking re-runs a real stack: too slow to be useful
            suppress_health_check=list(HealthCheck),
        ),
    )
    n = stack.counts
    verify(
        drill,
        "10 model-based: API equals model",
        started,
        check_done_events=False,
        note=f"{n['examples']} examples: {n['kills']} director kills, {n['restarts']} Redis "
        f"restarts, {n['unclaimed']} unclaimed cancels, {n['503']} creates answered 503",
    )
