"""Cursor pagination across pages, with absolute next/previous URLs the client follows verbatim."""

from __future__ import annotations

import httpx

from tests.conftest import ECHO, Stack
from tests.fixtures.api import create
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
