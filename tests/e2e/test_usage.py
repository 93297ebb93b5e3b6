"""Usage: one record per finished prediction, matching its metrics; tenant forwarded."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ECHO
from tests.fixtures.api import create, wait_status

PATH = f"/v1/deployments/{ECHO}/predictions"


def test_usage_matches_the_predictions_metrics(client: httpx.Client) -> None:
    done = [
        wait_status(client, create(client, PATH, input={"n": 2, "delay": d})["id"])
        for d in (0.05, 0.1, 0.15)
    ]
    usage = client.get("/v1/usage").json()
    assert usage["predictions"] == 3
    expected = sum(p["metrics"]["predict_time"] for p in done)
    assert usage["predict_time"] == pytest.approx(expected, abs=1e-3)
    assert usage["billable_seconds"] == pytest.approx(expected, abs=1e-3)
    assert [row["deployable"] for row in usage["by_deployable"]] == [ECHO]

    later = client.get("/v1/usage", params={"start": "2999-01-01T00:00:00Z"}).json()
    assert later["predictions"] == 0 and later["billable_seconds"] == 0


def test_usage_starts_empty_per_account_and_checks_dates(client: httpx.Client) -> None:
    assert client.get("/v1/usage").json()["predictions"] == 0  # a fresh account
    response = client.get("/v1/usage", params={"start": "not-a-date"})
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
