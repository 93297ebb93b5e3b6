"""A model's owner withdraws it from other accounts' deployments: once the owner makes a public
model private, another account's deployment of it takes no predictions (404, saying why), says
so in its ``GET``, and its director stops reading its queues; the owner's version delete is not
held by another account's deployment, which is then withdrawn too."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create, wait_status
from tests.fixtures.fleet_entries import registered
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def cpu(redis_url: str) -> Iterator[str]:
    """A hardware class the fleet has while the test runs."""
    with registered(redis_url, "cpu"):
        yield "cpu"


def _client(stack: Stack, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def test_the_owners_withdrawal_wins_over_another_accounts_deployment(
    stack: Stack, admin: Admin, launcher: Launcher, cpu: str
) -> None:
    suffix = uuid.uuid4().hex[:8]
    owner, borrower = f"lender-{suffix}", f"borrower-{suffix}"
    tokens = {name: admin.create_account(name) for name in (owner, borrower)}
    model = f"{owner}/shared"
    with _client(stack, tokens[owner]) as mine, _client(stack, tokens[borrower]) as theirs:
        made = mine.post(
            "/v1/models",
            json={"owner": owner, "name": "shared", "visibility": "public", "hardware": cpu},
        )
        assert made.status_code == 201, made.text
        version = admin.create_model(model, stack.runner_url)
        schema = mine.get(f"/v1/models/{model}/versions/{version}").json()["openapi_schema"]
        second = admin.register_version(model, schema, "rebuilt")
        for name, runs in (("borrowed", version), ("pinned", second)):
            deployed = theirs.post(
                "/v1/deployments",
                json={"name": name, "model": model, "version": runs, "hardware": cpu},
            )
            assert deployed.status_code == 201, deployed.text
            assert deployed.json()["withdrawn"] is None
        director = launcher.director(
            f"{borrower}/borrowed", stack.runner_url, release_check_interval="0.2"
        )
        try:
            path = f"/v1/deployments/{borrower}/borrowed/predictions"
            ran = create(theirs, path, input={"prompt": "before"})
            assert wait_status(theirs, ran["id"])["status"] == "succeeded"

            hidden = mine.patch(f"/v1/models/{model}", json={"visibility": "private"})
            assert hidden.status_code == 200, hidden.text
            refused = wait_for(
                lambda: (r := theirs.post(path, json={"input": {}})).status_code != 201 and r,
                "the borrower's deployment refusing predictions",
            )
            assert_problem(refused, 404)
            assert "withdrew" in refused.json()["detail"]
            shown = theirs.get(f"/v1/deployments/{borrower}/borrowed")
            assert shown.status_code == 200, shown.text
            assert "withdrew" in shown.json()["withdrawn"]
            wait_for(
                lambda: "withdrawn by its model's owner" in director.log(),
                "the director setting the deployment's queues aside",
            )
            # The owner's version is no longer served by the borrower's deployment.
            wait_for(
                lambda: (
                    mine.post("/v1/predictions", json={"version": version, "input": {}}).status_code
                    == 422
                ),
                "the owner's version no longer deployed",
            )

            # The borrower's deployment of the second version does not hold it.
            deleted = mine.delete(f"/v1/models/{model}/versions/{second}")
            assert deleted.status_code == 204, deleted.text
            pinned = theirs.get(f"/v1/deployments/{borrower}/pinned")
            assert pinned.status_code == 200 and pinned.json()["withdrawn"] is not None
            gone = theirs.post(f"/v1/deployments/{borrower}/pinned/predictions", json={"input": {}})
            assert_problem(gone, 404)

            # Public again: the borrower's deployment runs again.
            back = mine.patch(f"/v1/models/{model}", json={"visibility": "public"})
            assert back.status_code == 200, back.text
            again = wait_for(
                lambda: (
                    (r := theirs.post(path, json={"input": {"prompt": "after"}})).status_code == 201
                    and r.json()
                ),
                "the borrower's deployment taking predictions again",
            )
            # The director reads the deployment back in on its next release check.
            assert wait_status(theirs, again["id"], timeout=90)["status"] == "succeeded"
        finally:
            director.stop()
