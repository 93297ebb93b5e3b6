"""Cursor pagination across pages, with absolute next/previous URLs the client follows verbatim."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem, create
from tests.fixtures.processes import Launcher


def test_pages_forward_and_back(launcher: Launcher, stack: Stack, token: str) -> None:
    api, url = launcher.api(env={"CONDUIT_API_PAGE_SIZE": "2"})
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=url, headers=headers) as client:
            path = f"/v1/deployments/{ECHO}/predictions"
            ids = [create(client, path, input={"prompt": str(i)})["id"] for i in range(5)]
            newest_first = ids[::-1]

            seen: list[str] = []
            pages = []
            page = client.get("/v1/predictions").json()
            while True:
                pages.append(page)
                seen += [p["id"] for p in page["results"]]
                if page["next"] is None:
                    break
                assert page["next"].startswith(url)
                page = client.get(page["next"]).json()
            assert seen == newest_first
            assert [len(p["results"]) for p in pages] == [2, 2, 1]
            assert pages[0]["previous"] is None

            back = client.get(pages[2]["previous"]).json()
            assert [p["id"] for p in back["results"]] == newest_first[2:4]
            first = client.get(back["previous"]).json()
            assert [p["id"] for p in first["results"]] == newest_first[:2]
            assert first["previous"] is None

            bad = client.get("/v1/predictions", params={"cursor": "not-a-cursor"})
            assert bad.status_code == 400
    finally:
        api.stop()


def test_filters_are_honoured_on_every_page(launcher: Launcher, stack: Stack, token: str) -> None:
    api, url = launcher.api(env={"CONDUIT_API_PAGE_SIZE": "2"})
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=url, headers=headers) as client:
            path = f"/v1/deployments/{ECHO}/predictions"
            made = [create(client, path, input={"prompt": str(i)}) for i in range(6)]
            oldest, newest = made[0], made[-1]

            def listed(**params: str) -> list[str]:
                ids: list[str] = []
                page = client.get("/v1/predictions", params=params).json()
                while True:
                    ids += [p["id"] for p in page["results"]]
                    if page["next"] is None:
                        return ids
                    page = client.get(page["next"]).json()

            after_oldest = listed(created_after=oldest["created_at"])
            assert after_oldest == [p["id"] for p in made[:0:-1]]  # five, over three pages
            between = listed(
                created_after=oldest["created_at"], created_before=newest["created_at"]
            )
            assert between == [p["id"] for p in made[-2:0:-1]]
            assert listed(created_before=made[1]["created_at"]) == [oldest["id"]]
            assert listed(source="api") == [p["id"] for p in reversed(made)]
            assert listed(source="sync") == []

            future = client.get("/v1/predictions", params={"created_after": "2099-01-01T00:00Z"})
            assert future.status_code == 200
            assert future.json() == {"next": None, "previous": None, "results": []}
            # A date-time without an offset is UTC.
            naive = listed(created_after=oldest["created_at"].removesuffix("Z")[:26])
            assert naive == after_oldest
    finally:
        api.stop()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("created_after", "yesterday"),
        ("created_before", "2024-13-01"),
        ("created_after", "2024-01-01T00:00:00 00:00"),  # an unencoded "+"
        ("source", "email"),
    ],
)
def test_a_malformed_filter_is_400_naming_it(client: httpx.Client, name: str, value: str) -> None:
    create(client, f"/v1/deployments/{ECHO}/predictions", input={"prompt": "x"})
    problem = assert_problem(client.get("/v1/predictions", params={name: value}), 400)
    assert problem["errors"] == [{"field": name, "message": problem["errors"][0]["message"]}]
    assert name in problem["detail"]


def test_the_account_is_the_tokens(stack: Stack, admin: Admin) -> None:
    name = f"acct-{uuid.uuid4().hex[:10]}"
    token = admin.create_account(name)
    account = httpx.get(f"{stack.api_url}/v1/account", headers={"Authorization": f"Bearer {token}"})
    assert account.status_code == 200, account.text
    assert account.json() == {
        "type": "organization",
        "username": name,
        "name": name,
        "github_url": None,
    }
    assert_problem(httpx.get(f"{stack.api_url}/v1/account"), 401)
