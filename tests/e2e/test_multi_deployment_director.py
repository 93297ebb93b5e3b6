"""One director serving two deployments on the slots of a real pool host (``conduit runner
pool``), one concurrency budget: predictions of both complete; with model a loaded and b not,
a's entries are read first while b's oldest is younger than the aging bound, and b's once it
has waited past it, although a's keep waiting."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.ports import free_port
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, fetch, wait_status
from tests.fixtures.pool_host import MIB, answers, slots
from tests.fixtures.processes import Launcher, Proc
from tests.fixtures.waiting import wait_for

GATED = "tests.fixtures.pool_models:GatedEcho"
#: Seconds b's entries may wait while a's are read first.
AGING_BOUND = 3.0


@pytest.fixture
def pool(launcher: Launcher, tmp_path: Path) -> Iterator[str]:
    models = [
        {"name": name, "backend": {"conduit": GATED}, "size": 10 * MIB} for name in ("a", "b")
    ]
    path = tmp_path / "pool.yaml"
    path.write_text(json.dumps({"budget": "100MiB", "min_resident": 0, "models": models}))
    port = free_port()
    proc = launcher.spawn("pool", "runner", "pool", "--config", str(path), "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers(proc, url), "pool answering")
    yield url
    proc.stop()


@pytest.fixture
def deployments(admin: Admin, pool: str) -> tuple[str, str]:
    """Deployments on models a and b of the pool."""
    names = []
    for model in ("a", "b"):
        name = f"test/multi-{model}-{uuid.uuid4().hex[:8]}"
        admin.create_model(name, f"{pool}/models/{model}")
        admin.create_deployment(name, name, shards=2, visibility="public")
        names.append(name)
    return names[0], names[1]


def _director(launcher: Launcher, pool: str, deployments: tuple[str, str]) -> tuple[Proc, str]:
    """A director of both deployments, concurrency 1; its metrics URL."""
    port = free_port()
    a, b = deployments
    proc = launcher.spawn(
        "director-multi",
        "director",
        "--pool-url",
        pool,
        "--deployment",
        f"{a}=a",
        "--deployment",
        f"{b}=b",
        "--concurrency",
        "1",
        env={
            "CONDUIT_DIRECTOR_AGING_BOUND": str(AGING_BOUND),
            "CONDUIT_DIRECTOR_RECEIVER_PORT": str(port),
            "CONDUIT_DIRECTOR_RETRY_INTERVAL": "1",
        },
    )
    return proc, f"http://127.0.0.1:{port}/metrics"


def _metric(url: str, name: str, deployment: str) -> float | None:
    try:
        text = httpx.get(url, timeout=2).text
    except httpx.HTTPError:
        return None
    prefix = f'{name}{{deployment="{deployment}"}} '
    line = next((line for line in text.splitlines() if line.startswith(prefix)), None)
    return None if line is None else float(line[len(prefix) :])


def _predict(client: httpx.Client, deployment: str, prompt: str, gate: Path | None = None) -> str:
    inputs: dict[str, Any] = {"prompt": prompt, "n": 1, "gate": str(gate) if gate else ""}
    created = create(client, f"/v1/deployments/{deployment}/predictions", input=inputs)
    return str(created["id"])


def _at(prediction: dict[str, Any], field: str) -> datetime:
    return datetime.fromisoformat(str(prediction[field]).replace("Z", "+00:00"))


def test_one_director_runs_predictions_of_both_deployments(
    launcher: Launcher, client: httpx.Client, pool: str, deployments: tuple[str, str]
) -> None:
    director, _ = _director(launcher, pool, deployments)
    try:
        ids = [_predict(client, name, f"p{i}") for i, name in enumerate(deployments)]
        for i, prediction_id in enumerate(ids):
            done = wait_status(client, prediction_id, timeout=60)
            assert done["status"] == "succeeded", done
            assert done["output"] == [f"p{i}-gated"]
        assert {slots(pool)[m]["state"] for m in ("a", "b")} == {"ready"}
    finally:
        director.stop()
    assert director.popen is not None and director.popen.returncode == 0, director.log()[-3000:]


def test_a_loaded_model_is_read_first_until_the_other_waits_past_the_aging_bound(
    launcher: Launcher,
    client: httpx.Client,
    pool: str,
    deployments: tuple[str, str],
    tmp_path: Path,
) -> None:
    a, b = deployments
    gates = [tmp_path / f"gate-{i}" for i in range(3)]
    director, metrics = _director(launcher, pool, deployments)
    try:
        # a1 holds the director's only worker; its model a is loaded by now.
        a1 = _predict(client, a, "a1", gates[0])
        wait_status(client, a1, {"processing"}, timeout=60)
        wait_for(lambda: _metric(metrics, "conduit_director_model_ready", a) == 1, "a ready")
        assert _metric(metrics, "conduit_director_model_ready", b) == 0
        assert slots(pool)["b"]["state"] != "ready"

        # b1 waits first, then a2 and a3. While b1 is younger than the bound, a2 goes first.
        b1 = _predict(client, b, "b1")
        a2 = _predict(client, a, "a2", gates[1])
        a3 = _predict(client, a, "a3", gates[2])
        gates[0].touch()
        wait_status(client, a2, {"processing"}, timeout=60)
        assert fetch(client, b1)["status"] == "starting"

        # Once b1 has waited past the bound it goes before a3, whose model is loaded.
        created = _at(fetch(client, b1), "created_at")
        wait_for(
            lambda: (
                (_metric(metrics, "conduit_director_oldest_wait_seconds", b) or 0) > AGING_BOUND
            ),
            "b1 past the aging bound",
        )
        gates[1].touch()
        # a3 holds the only worker until its gate opens: b1 ends first only if it went first.
        done = wait_status(client, b1, timeout=60)
        assert done["status"] == "succeeded", done
        assert (_at(done, "started_at") - created).total_seconds() >= AGING_BOUND

        gates[2].touch()
        ended = [wait_status(client, p, timeout=60) for p in (a1, a2, a3)]
        assert [p["status"] for p in ended] == ["succeeded"] * 3
        assert _at(ended[1], "started_at") < _at(done, "started_at") < _at(ended[2], "started_at")
    finally:
        for gate in gates:
            gate.touch()
        director.stop()
