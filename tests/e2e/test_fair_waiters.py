"""One account, or one leaked stream URL, cannot take every waiter place of an api: each
account and each prediction has a share, and another account's SSE and ``Prefer: wait``
still work while one holds all of its own."""

from __future__ import annotations

import contextlib
import uuid

import httpx

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import create
from tests.fixtures.processes import Launcher
from tests.fixtures.sse import read_stream

MAX_WAITERS = 8  # shares: 4 per account, 2 per prediction
PATH = f"/v1/deployments/{ECHO}/predictions"


async def _open(
    streams: contextlib.AsyncExitStack, http: httpx.AsyncClient, url: str, **headers: str
) -> int:
    """Open an event stream and keep it open (until ``streams`` closes); its status."""
    response = await streams.enter_async_context(
        http.stream("GET", url, headers={"Accept": "text/event-stream", **headers})
    )
    return response.status_code


async def test_one_account_filling_its_share_leaves_others_waiting(
    stack: Stack, launcher: Launcher, admin: Admin, token: str
) -> None:
    idle = f"test/idle-{uuid.uuid4().hex[:8]}"
    admin.create_deployment(idle, ECHO, visibility="public")  # no director: stays queued
    with launcher.own_api({"CONDUIT_API_MAX_WAITERS": str(MAX_WAITERS)}) as api_url:
        other = admin.create_account(f"other-{uuid.uuid4().hex[:8]}")
        heavy = {"Authorization": f"Bearer {token}"}
        light = {"Authorization": f"Bearer {other}"}
        with httpx.Client(base_url=api_url, headers=heavy, timeout=30) as sync:
            queued = [
                create(sync, f"/v1/deployments/{idle}/predictions", input={}) for _ in range(6)
            ]
        limits = httpx.Limits(max_connections=MAX_WAITERS * 2)
        async with (
            httpx.AsyncClient(base_url=api_url, timeout=30, limits=limits) as http,
            contextlib.AsyncExitStack() as streams,
        ):
            # A leaked stream URL, opened again and again without any token...
            leaked = queued[0]["urls"]["stream"]
            through_link = [await _open(streams, http, leaked) for _ in range(3)]
            # ...then the account itself, on its other predictions, for every place there is.
            paths = [f"/v1/predictions/{p['id']}/stream" for p in queued[1:]]
            own = [await _open(streams, http, path, **heavy) for path in paths]

            with httpx.Client(base_url=api_url, headers=light, timeout=60) as client:
                waited = client.post(
                    PATH, json={"input": {"prompt": "w", "n": 1}}, headers={"Prefer": "wait=30"}
                )
                assert waited.status_code == 201, waited.text
                assert waited.headers.get("preference-applied") == "wait=30"
                assert waited.json()["status"] == "succeeded"
                streamed = read_stream(client, waited.json()["id"])
                assert [e.data for e in streamed if e.event == "output"] == ["w-0"]
            # The account had its share, the link its prediction's share of that.
            assert through_link == [200, 200, 503]
            assert own == [200, 200, 503, 503, 503]
