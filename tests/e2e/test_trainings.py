"""Trainings with the official ``replicate`` Python client (1.0.7), unmodified, on a stock Cog
trainer (coglet ``--x-mode train``, ``tests/fixtures/cog_trainer``): the training's logs
streamed, its weights kept in the file store, and the destination's new version served by a
stock Cog model that loads those weights through ``COG_WEIGHTS`` and says what they taught it.
A trainer director killed mid-training costs a run, not the training."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import replicate
from replicate.exceptions import ReplicateError

from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.cog_server import FIXTURES, cog_server
from tests.fixtures.fleet_entries import registered
from tests.fixtures.processes import Launcher
from tests.fixtures.receiver import webhook_receiver
from tests.fixtures.sse import events
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.e2e

TRAINER = FIXTURES / "cog_trainer"


@dataclass(frozen=True)
class Team:
    owner: str
    official: replicate.Client
    http: httpx.Client
    base_version: str


@pytest.fixture
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cog-train")


@pytest.fixture
def team(stack: Stack, admin: Admin, redis_url: str, logdir: Path) -> Iterator[Team]:
    """An account with a base model (its version registered from a stock Cog server of the
    trainer fixture), a deployment of it and a destination model."""
    owner = f"train-{uuid.uuid4().hex[:8]}"
    token = admin.create_account(owner)
    official = replicate.Client(api_token=token, base_url=stack.api_url)
    headers = {"Authorization": f"Bearer {token}"}
    with (
        httpx.Client(base_url=stack.api_url, headers=headers, timeout=30) as http,
        registered(redis_url, "cpu"),
    ):
        official.models.create(owner=owner, name="words", visibility="private", hardware="cpu")
        official.models.create(owner=owner, name="tuned", visibility="private", hardware="cpu")
        with cog_server(TRAINER, logdir) as predictor:
            base = admin.create_model(f"{owner}/words", predictor)
        official.deployments.create(
            name="words",
            model=f"{owner}/words",
            version=base,
            hardware="cpu",
            min_instances=1,
            max_instances=1,
        )
        yield Team(owner, official, http, base)
    official._client.close()


def _create(
    team: Team, words: str, steps: int = 3, delay: float = 0.0, **extra: Any
) -> replicate.training.Training:
    return team.official.trainings.create(
        model=f"{team.owner}/words",
        version=team.base_version,
        input={"words": words, "steps": steps, "delay": delay},
        destination=f"{team.owner}/tuned",
        **extra,
    )


def _finished(team: Team, training_id: str, timeout: float = 90) -> replicate.training.Training:
    def done() -> replicate.training.Training | None:
        training = team.official.trainings.get(training_id)
        return training if training.status in {"succeeded", "failed", "canceled"} else None

    return wait_for(done, f"training {training_id} to end", timeout=timeout)


@pytest.fixture
def reader_url(launcher: Launcher) -> Iterator[str]:
    """An api replica of its own that caches the catalogue for minutes."""
    with launcher.own_api({"CONDUIT_API_CACHE_TTL": "300"}) as url:
        yield url


def test_a_training_makes_a_version_that_loads_its_weights(
    team: Team, launcher: Launcher, logdir: Path, stack: Stack, reader_url: str
) -> None:
    owner = team.owner
    # Another replica, caching the catalogue for minutes, has read the destination already.
    tuned = f"{reader_url}/v1/models/{owner}/tuned"
    auth = team.http.headers
    assert httpx.get(tuned, headers=auth).json()["latest_version"] is None
    with cog_server(TRAINER, logdir, train=True) as trainer, webhook_receiver() as hooks:
        launcher.director(f"{owner}/words", trainer, job_kind="training")
        training = _create(
            team,
            "bonjour",
            steps=4,
            delay=0.05,
            webhook=f"{hooks.url}/trained",
            webhook_events_filter=["completed"],
        )
        assert training.status == "starting"
        assert (training.model, training.version) == (f"{owner}/words", team.base_version)
        assert training.destination == f"{owner}/tuned"
        assert training.urls is not None
        assert training.urls["get"].endswith(f"/v1/trainings/{training.id}")

        # Its logs, followed as they come.
        with team.http.stream("GET", training.urls["stream"]) as response:
            seen = list(events(response, deadline=time.monotonic() + 90))
        logs = [e.data for e in seen if e.event == "logs"]  # one line an event
        assert [line for line in logs if line.startswith("step")] == [f"step {i}" for i in range(4)]
        assert seen[-1].event == "done"
        done = _finished(team, training.id)
        [delivery] = wait_for(lambda: hooks.to("/trained"), "the completed webhook")
    hooked = delivery.json()  # a training's shape, like its GET
    assert (hooked["id"], hooked["status"], hooked["destination"]) == (
        training.id,
        "succeeded",
        f"{owner}/tuned",
    )
    assert hooked["output"] == done.output
    assert hooked["urls"]["get"].endswith(f"/v1/trainings/{training.id}")

    assert done.status == "succeeded", done.error
    assert set(done.output) == {"version", "weights"}
    destination, _, new_version = done.output["version"].partition(":")
    assert destination == f"{owner}/tuned"
    weights = done.output["weights"]
    assert httpx.get(weights).text == "bonjour"  # kept in the file store, served by the api
    assert [t.id for t in team.official.trainings.list().results][:1] == [training.id]

    # Every replica sees the new version at once: the director announced it over Redis.
    found = team.official.models.get(f"{owner}/tuned").latest_version
    assert found is not None and found.id == new_version
    assert httpx.get(tuned, headers=auth).json()["latest_version"]["id"] == new_version
    with pytest.raises(ReplicateError) as not_a_prediction:
        team.official.predictions.get(training.id)
    assert not_a_prediction.value.status == 404

    # The operator starts the new version's runner with the weights, as Cog expects them.
    with cog_server(TRAINER, logdir, env={"COG_WEIGHTS": weights}) as served:
        team.official.deployments.create(
            name="tuned",
            model=f"{owner}/tuned",
            version=new_version,
            hardware="cpu",
            min_instances=1,
            max_instances=1,
        )
        launcher.director(f"{owner}/tuned", served)
        output = team.official.run(f"{owner}/tuned:{new_version}", input={"prompt": "salut"})
    assert output == "bonjour: salut"


def test_training_input_is_checked_and_the_destination_must_be_the_callers(
    team: Team, admin: Admin, stack: Stack
) -> None:
    path = f"/v1/models/{team.owner}/words/versions/{team.base_version}/trainings"
    missing = team.http.post(path, json={"destination": f"{team.owner}/tuned", "input": {}})
    assert missing.status_code == 422
    assert [e["field"] for e in missing.json()["errors"]] == ["input.words"]
    nowhere = team.http.post(
        path, json={"destination": f"{team.owner}/nothing", "input": {"words": "x"}}
    )
    assert nowhere.status_code == 404
    assert nowhere.json()["detail"] == "The specified training destination does not exist"
    foreign = team.http.post(path, json={"destination": "conduit/echo", "input": {"words": "x"}})
    assert foreign.status_code == 403
    # A version whose runner does not train has no TrainingInput.
    echo = f"/v1/models/conduit/echo/versions/{stack.version}/trainings"
    untrainable = team.http.post(
        echo, json={"destination": f"{team.owner}/tuned", "input": {"words": "x"}}
    )
    assert untrainable.status_code == 422
    assert untrainable.json()["errors"][0]["field"] == "version"


def test_a_queued_training_is_canceled(team: Team) -> None:
    training = _create(team, "never")  # no trainer runs: it waits
    team.official.trainings.cancel(training.id)
    assert team.official.trainings.get(training.id).status == "canceled"


def test_a_trainer_director_killed_mid_training_costs_a_run(
    team: Team, launcher: Launcher, logdir: Path, database_url: str
) -> None:
    with cog_server(TRAINER, logdir, train=True) as trainer:
        lease = {"job_kind": "training", "visibility_timeout": "3"}
        first = launcher.director(f"{team.owner}/words", trainer, **lease)
        # 5 s: seen processing (written after 1 s) well before its end.
        training = _create(team, "encore", steps=50, delay=0.1)

        def running() -> bool:
            return team.official.trainings.get(training.id).status == "processing"

        wait_for(running, "the training running")
        first.kill()
        # Another trainer director takes it over once the dead one's lease lapses.
        launcher.director(f"{team.owner}/words", trainer, **lease)
        done = _finished(team, training.id, timeout=120)
    assert done.status == "succeeded", done.error
    assert httpx.get(done.output["weights"]).text == "encore"
    with psycopg.connect(database_url) as db:
        runs, attempt = db.execute(
            "SELECT runs, attempt FROM predictions WHERE id = %s", (training.id,)
        ).fetchone()
        versions = db.execute(
            "SELECT count(*) FROM versions WHERE training_id = %s", (training.id,)
        ).fetchone()
    assert runs == 2 and attempt == 2  # one run lost with its director, one that ended
    assert versions == (1,)  # one training, one version
