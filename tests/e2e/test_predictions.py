"""Create → queue → director → runner → recorded, through real processes."""

from __future__ import annotations

import httpx

from tests.conftest import ECHO, Stack
from tests.fixtures.api import create, wait_status

DEPLOYMENT_PATH = f"/v1/deployments/{ECHO}/predictions"


def test_deployment_prediction_succeeds_with_full_output(client: httpx.Client) -> None:
    created = create(client, DEPLOYMENT_PATH, input={"prompt": "hi", "n": 3})
    assert created["status"] == "starting"
    assert created["urls"]["get"].endswith(f"/v1/predictions/{created['id']}")
    assert created["deployment"] == ECHO

    done = wait_status(client, created["id"])
    assert done["status"] == "succeeded", done
    assert done["output"] == ["hi-0", "hi-1", "hi-2"]
    assert done["logs"].count("\n") == 3
    assert done["error"] is None
    assert done["started_at"] and done["completed_at"]
    assert done["metrics"]["predict_time"] >= 0
    assert done["metrics"]["total_time"] >= done["metrics"]["predict_time"]


def test_iterator_output_keeps_order(client: httpx.Client) -> None:
    created = create(client, DEPLOYMENT_PATH, input={"prompt": "t", "n": 40, "delay": 0.005})
    done = wait_status(client, created["id"])
    assert done["output"] == [f"t-{i}" for i in range(40)]


def test_version_and_model_forms_run(client: httpx.Client, stack: Stack) -> None:
    by_version = create(client, "/v1/predictions", version=stack.version, input={"prompt": "v"})
    qualified = create(
        client, "/v1/predictions", version=f"{ECHO}:{stack.version}", input={"prompt": "q"}
    )
    by_model = create(client, f"/v1/models/{ECHO}/predictions", input={"prompt": "m"})
    for created, prompt in ((by_version, "v"), (qualified, "q"), (by_model, "m")):
        assert created["version"] == stack.version
        assert created["model"] == ECHO
        done = wait_status(client, created["id"])
        assert done["status"] == "succeeded"
        assert done["output"] == [f"{prompt}-0"]


def test_failing_model_records_error_and_logs(client: httpx.Client) -> None:
    created = create(client, DEPLOYMENT_PATH, input={"prompt": "f", "n": 2, "fail": True})
    done = wait_status(client, created["id"])
    assert done["status"] == "failed"
    assert "failed as requested" in done["error"]
    assert done["output"] == ["f-0", "f-1"]
    assert done["logs"].count("\n") == 2


def test_list_is_newest_first_and_paginates(client: httpx.Client) -> None:
    ids = [create(client, DEPLOYMENT_PATH, input={"prompt": str(i)})["id"] for i in range(3)]
    page = client.get("/v1/predictions").json()
    assert [p["id"] for p in page["results"]] == ids[::-1]
    assert page["next"] is None and page["previous"] is None


def test_get_unknown_prediction_is_404(client: httpx.Client) -> None:
    response = client.get("/v1/predictions/doesnotexist")
    assert response.status_code == 404
