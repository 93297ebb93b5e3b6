"""The operator page in a real browser: Debian's Chromium driven by Playwright, pinned to UTC
and one viewport, a trace kept for each failed test (under the test's tmp path)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.browser import CHROMIUM_ARGS, Console, chromium_path, sign_in

ROOT = Path(__file__).resolve().parents[2]
#: Names the folder the screenshots are written to (``docs/images`` remakes the docs' own,
#: relative to the repository); unset, they go to the test's tmp path, so that a test run
#: leaves the working tree as it found it.
SCREENSHOTS_ENV = "CONDUIT_OPS_SCREENSHOTS"


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    """One browser for this package's tests, gone before any other package's: Playwright's
    synchronous API holds an event loop of its own, which the asyncio tests elsewhere must not
    find running."""
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium (apt-get install chromium, or set CONDUIT_TEST_CHROMIUM)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=path, args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        launched.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.failed_call = report.failed  # type: ignore[attr-defined]


@pytest.fixture
def console() -> Console:
    return Console()


@pytest.fixture
def page(
    browser: Browser, console: Console, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Page]:
    context = browser.new_context(
        timezone_id="UTC", locale="en-US", viewport={"width": 1400, "height": 900}
    )
    context.tracing.start(screenshots=True, snapshots=True)
    opened = context.new_page()
    opened.set_default_timeout(30_000)
    console.watch(opened)
    yield opened
    if getattr(request.node, "failed_call", False):
        trace = tmp_path / "trace.zip"
        context.tracing.stop(path=str(trace))
        print(f"Playwright trace: {trace} (playwright show-trace {trace})")
    else:
        context.tracing.stop()
    context.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where this test's screenshots go (``CONDUIT_OPS_SCREENSHOTS``, else its tmp path)."""
    named = os.environ.get(SCREENSHOTS_ENV)
    folder = ROOT / named if named else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def operator(admin: Admin) -> str:
    """The token of an admin account: it signs in to /ops."""
    return admin.create_account(f"ops-{uuid.uuid4().hex[:8]}", admin_flag=True)


@pytest.fixture
def ops_page(page: Page, stack: Stack, operator: str) -> Page:
    """A page signed in to /ops as an admin."""
    sign_in(page, stack.api_url, operator)
    return page
