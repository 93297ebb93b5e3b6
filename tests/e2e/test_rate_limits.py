"""The per-account rate of creates, shared by two api processes on one Redis, on every create
route (``/run`` included): past it 429 ``rate_limited`` with ``Retry-After``, nothing stored,
and other accounts untouched."""

from __future__ import annotations

import uuid

import httpx

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem
from tests.fixtures.processes import Launcher

LIMIT = {"CONDUIT_API_CREATE_RATE_LIMIT": "4/min"}  # one every 15 s, four at once


def _creates(stack: Stack) -> list[tuple[str, dict[str, object]]]:
    """Every create route, with a body it accepts."""
    body = {"input": {"prompt": "r", "n": 1}}
    return [
        ("/v1/predictions", {**body, "version": stack.version}),
        (f"/v1/models/{ECHO}/predictions", body),
        (f"/v1/deployments/{ECHO}/predictions", body),
        (f"/v1/models/{ECHO}/run", body),
        (f"/v1/deployments/{ECHO}/run", body),
    ]


def test_the_rate_is_one_across_replicas_and_routes(
    stack: Stack, launcher: Launcher, admin: Admin, token: str
) -> None:
    with launcher.own_api(LIMIT) as first_url, launcher.own_api(LIMIT) as second_url:
        headers = {"Authorization": f"Bearer {token}"}
        with (
            httpx.Client(base_url=first_url, headers=headers, timeout=30) as first,
            httpx.Client(base_url=second_url, headers=headers, timeout=30) as second,
        ):
            creates = _creates(stack)
            admitted = [
                *creates[:3],
                creates[2],
            ]  # no runner serves a /run here: 429 out_of_capacity
            for client, (path, body) in zip([first, second, first, second], admitted, strict=True):
                assert client.post(path, json=body).status_code == 201
            for n, (path, body) in enumerate(creates):
                refused = (first, second)[n % 2].post(path, json=body)
                problem = assert_problem(refused, 429)
                assert problem["code"] == "rate_limited", problem
                assert 1 <= int(refused.headers["Retry-After"]) <= 15
            assert (
                len(first.get("/v1/predictions").json()["results"]) == 4
            )  # refusals stored nothing

        other = admin.create_account(f"other-{uuid.uuid4().hex[:8]}")
        with httpx.Client(
            base_url=second_url, headers={"Authorization": f"Bearer {other}"}, timeout=30
        ) as client:
            path, body = creates[2]
            assert client.post(path, json=body).status_code == 201
