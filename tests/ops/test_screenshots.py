"""The docs' screenshots of ``/ops``, made from a small demo stack of its own (a fresh database,
its own Redis and api, a few deployments as a team would have them), not from the hundreds the
other tests leave behind. Written where ``CONDUIT_OPS_SCREENSHOTS`` says
(``CONDUIT_OPS_SCREENSHOTS=docs/images`` remakes the docs' own), else to the test's tmp path."""

from __future__ import annotations

import struct
import uuid
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page

from conduit.runtime import migrate
from conduit.services import ServiceUrls
from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import wait_status
from tests.fixtures.browser import sign_in
from tests.fixtures.processes import Launcher
from tests.fixtures.servers import RedisServer, create_database
from tests.ops.seeding import Idle, seed_failed

pytestmark = pytest.mark.e2e

#: The demo: deployments of acme's (name, shards).
DEMO = (("sdxl", 8), ("whisper", 4), ("llama-70b", 4))


def _height(png: Path) -> int:
    """A PNG's height in pixels (from its IHDR chunk)."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", png
    return int(struct.unpack(">I", data[20:24])[0])


def test_the_screenshots_show_a_small_demo_stack(
    page: Page, launcher: Launcher, services: ServiceUrls, stack: Stack, tmp_path: Path, shots: Path
) -> None:
    database = create_database(services.database_url, f"conduit_demo_{uuid.uuid4().hex[:10]}")
    migrate(database)
    demo = Admin(database)
    operator = demo.create_account("operator", admin_flag=True)
    acme = demo.create_account("acme")
    versions = {}
    for name, shards in DEMO:
        versions[name] = demo.create_model(f"acme/{name}", stack.runner_url)
        demo.create_deployment(f"acme/{name}", f"acme/{name}", shards=shards)
    with RedisServer(tmp_path / "redis") as server:
        env = {"DATABASE_URL": database, "REDIS_URL": server.url}
        with (
            launcher.own_api(env=env) as api_url,
            httpx.Client(
                base_url=api_url, headers={"Authorization": f"Bearer {acme}"}, timeout=30
            ) as http,
        ):
            director = launcher.director("acme/whisper", stack.runner_url, env=env)
            try:
                for i in range(6):  # whisper is served: its predictions finish
                    made = http.post(
                        "/v1/deployments/acme/whisper/predictions",
                        json={"input": {"prompt": f"clip {i}"}},
                    )
                    assert made.status_code == 201, made.text
                    assert wait_status(http, made.json()["id"])["status"] == "succeeded"
            finally:
                director.stop()
            waiting = []
            for i in range(9):  # no director serves sdxl: a backlog, on both of its queues
                made = http.post(
                    "/v1/deployments/acme/sdxl/predictions",
                    json={"input": {"prompt": f"a lighthouse at dusk, take {i}"}},
                )
                waiting.append(made.json()["id"])
            for i in range(4):
                made = http.post(
                    "/v1/predictions",
                    json={"version": versions["sdxl"], "input": {"prompt": f"a fox {i}"}},
                )
                assert made.status_code == 201, made.text
            seed_failed(database, Idle("acme/llama-70b", 4), "acme", 3, "CUDA out of memory")
            sign_in(page, api_url, operator)
            assert page.locator("table.queues tbody tr[data-kind=dp]").count() == len(DEMO)
            assert page.locator('tr[data-target="dp-acme/sdxl"] td.waiting').inner_text() == "13"
            page.set_viewport_size({"width": 1400, "height": 400})  # the page's own height
            page.screenshot(path=str(shots / "ops-overview.png"), full_page=True)
            page.goto(f"{api_url}/ops/predictions/{waiting[-1]}")
            page.locator("#verdict").wait_for()
            page.locator("#why").screenshot(path=str(shots / "ops-why-waiting.png"))
    # A page a reader takes in at once, not a scroll of test fixtures.
    assert _height(shots / "ops-overview.png") <= 900
    assert _height(shots / "ops-why-waiting.png") > 0
