"""A director tells a model pool host how long each prediction has left (``X-Conduit-Deadline``),
and a pool that cannot load and run the model in that time ends the prediction with its reason:
at once when the model's known load time is longer (``deadline_unmeetable``), and when the time
runs out during a load (``deadline_exceeded``), not after the director's start call gives up."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.ports import free_port
from tests.fixtures.admin import Admin
from tests.fixtures.api import create, wait_status
from tests.fixtures.pool_host import MIB, answers, slots
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for


@pytest.fixture
def pool(launcher: Launcher, tmp_path: Path) -> Iterator[str]:
    """Two slots: ``measured`` is known to take ten minutes to load (its first estimate),
    ``stuck`` loads until a file that only appears at teardown exists."""
    gate = tmp_path / "loaded"
    models = [
        {
            "name": "measured",
            "backend": {"conduit": "echo"},
            "size": 10 * MIB,
            "load_seconds": 600,
        },
        {
            "name": "stuck",
            "backend": {
                "conduit": "tests.fixtures.pool_models:GatedLoad",
                "args": {"gate": str(gate)},
            },
            "size": 10 * MIB,
        },
    ]
    path = tmp_path / "pool.yaml"
    path.write_text(json.dumps({"budget": "100MiB", "min_resident": 0, "models": models}))
    port = free_port()
    proc = launcher.spawn("pool", "runner", "pool", "--config", str(path), "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers(proc, url), "pool answering")
    yield url
    gate.touch()
    proc.stop()


def _run_on_slot(
    launcher: Launcher, admin: Admin, client: httpx.Client, slot_url: str, timeout: float
) -> dict[str, object]:
    """One prediction on a deployment with ``timeout`` whose director runs it on ``slot_url``;
    its terminal state."""
    name = f"test/deadline-{uuid.uuid4().hex[:8]}"
    admin.create_model(name, slot_url)
    admin.create_deployment(name, name, shards=2, prediction_timeout=timeout, visibility="public")
    director = launcher.director(name, slot_url, concurrency=1)
    try:
        created = create(client, f"/v1/deployments/{name}/predictions", input={"prompt": "x"})
        return wait_status(client, str(created["id"]), timeout=60)
    finally:
        director.stop()


def test_a_model_slower_to_load_than_the_timeout_fails_at_once(
    launcher: Launcher, admin: Admin, client: httpx.Client, pool: str
) -> None:
    done = _run_on_slot(launcher, admin, client, f"{pool}/models/measured", timeout=30)
    assert done["status"] == "failed", done
    assert "deadline_unmeetable" in str(done["error"]), done
    assert "timeout of 30s" in str(done["error"])
    assert done["started_at"] is None
    # Refused before any load: the slot was never loaded for it.
    assert slots(pool)["measured"]["state"] == "idle"


def test_a_load_outlasting_the_timeout_ends_with_the_pools_deadline(
    launcher: Launcher, admin: Admin, client: httpx.Client, pool: str
) -> None:
    done = _run_on_slot(launcher, admin, client, f"{pool}/models/stuck", timeout=2)
    assert done["status"] == "failed", done
    # The pool answered at the deadline; without it the start would wait for the load until
    # the director's own start call gave up, and the runner would read as unreachable.
    assert "deadline_exceeded" in str(done["error"]), done
    assert "unreachable" not in str(done["error"])
    assert slots(pool)["stuck"]["state"] == "loading"
