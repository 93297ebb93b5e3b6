"""/ops is closed until an operator account exists; past that, a session cookie (never the
token in a URL), CSRF tokens on every POST, a read-only role, and the security headers."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest
from playwright.sync_api import Page

from conduit.runtime import migrate
from conduit.services import ServiceUrls
from tests.conftest import Stack
from tests.fixtures.admin import Admin
from tests.fixtures.browser import sign_in
from tests.fixtures.processes import Launcher
from tests.fixtures.servers import create_database
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.e2e

CSP = "default-src 'self'; script-src 'self'; object-src 'none'"
OPS_PATHS = ["/ops", "/ops/login", "/ops/predictions", "/ops/static/htmx-2.0.11.min.js"]


def test_closed_until_an_operator_account_exists(launcher: Launcher, services: ServiceUrls) -> None:
    fresh = create_database(services.database_url, _db_name())
    migrate(fresh)
    admin = Admin(fresh)
    customer = admin.create_account("customer")  # a token, but no operator's
    with (
        launcher.own_api(env={"DATABASE_URL": fresh}) as api_url,
        httpx.Client(base_url=api_url) as http,
    ):
        unknown = http.get("/no-such-path")
        for path in OPS_PATHS:
            answer = http.get(path, headers={"Authorization": f"Bearer {customer}"})
            assert answer.status_code == 404, path
            assert answer.json()["detail"] == unknown.json()["detail"]
        refused = http.post("/ops/login", data={"token": customer})
        assert refused.status_code == 404
        admin.create_account("root", admin_flag=True)
        wait_for(lambda: http.get("/ops/login").status_code == 200, "the sign-in page opens")
        # Still nothing but the sign-in page without a session:
        assert http.get("/ops").status_code == 303
        assert http.get("/ops").headers["location"] == "/ops/login?next=/ops"


def _db_name() -> str:
    return f"conduit_ops_{uuid.uuid4().hex[:10]}"


def test_sign_in_keeps_a_session_cookie_not_the_token(
    page: Page, stack: Stack, operator: str, console: object
) -> None:
    seen_urls: list[str] = []
    page.on("request", lambda request: seen_urls.append(request.url))
    sign_in(page, stack.api_url, operator)
    assert page.locator("h1").first.inner_text() == "Queues"
    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies["conduit_ops"]
    assert session["httpOnly"] and session["sameSite"] == "Strict" and session["path"] == "/ops"
    assert operator not in session["value"]
    assert not any(operator in url for url in seen_urls)
    answer = page.request.get(f"{stack.api_url}/ops")
    assert CSP in answer.headers["content-security-policy"]
    assert answer.headers["x-frame-options"] == "DENY"
    assert console.errors == []  # type: ignore[attr-defined]
    # Signing out ends the session on the server, not only in this browser.
    value = session["value"]
    page.click("button:has-text('sign out')")
    page.wait_for_url(re.compile(r".*/ops/login.*"))
    with httpx.Client(base_url=stack.api_url, cookies={"conduit_ops": value}) as http:
        assert http.get("/ops").status_code == 303


def test_a_wrong_or_customer_token_does_not_sign_in(page: Page, stack: Stack, token: str) -> None:
    page.goto(f"{stack.api_url}/ops/login")
    page.fill("input[name=token]", token)
    page.click("button:has-text('Sign in')")
    assert "not an operator" in page.locator("[role=alert]").inner_text()
    assert "conduit_ops" not in {c["name"] for c in page.context.cookies()}


def test_every_post_needs_the_csrf_token(
    ops_page: Page, stack: Stack, client: httpx.Client
) -> None:
    created = client.post(
        "/v1/deployments/conduit/echo/predictions", json={"input": {"prompt": "x"}}
    ).json()
    session = {c["name"]: c["value"] for c in ops_page.context.cookies()}["conduit_ops"]
    with httpx.Client(base_url=stack.api_url, cookies={"conduit_ops": session}) as http:
        forged = http.post(f"/ops/predictions/{created['id']}/cancel", data={"csrf": "guess"})
        assert forged.status_code == 403
        missing = http.post(f"/ops/predictions/{created['id']}/cancel")
        assert missing.status_code == 403
        foreign = http.post(
            f"/ops/predictions/{created['id']}/cancel",
            data={"csrf": "x"},
            headers={"Origin": "https://evil.example"},
        )
        assert foreign.status_code == 403
    audit = ops_page.request.get(f"{stack.api_url}/ops/actions").text()
    assert created["id"] not in audit


def test_a_viewer_sees_but_does_not_act(
    page: Page, stack: Stack, admin: Admin, client: httpx.Client
) -> None:
    name = f"viewer-{uuid.uuid4().hex[:8]}"
    viewer = admin.create_account(name)
    admin.set_ops_role(name, "viewer")
    created = client.post(
        "/v1/deployments/conduit/echo/predictions", json={"input": {"prompt": "v"}}
    ).json()
    sign_in(page, stack.api_url, viewer, f"/ops/predictions/{created['id']}")
    assert page.locator("#retry, #cancel").count() == 0
    csrf = page.evaluate("document.body.getAttribute('hx-headers')")
    token = re.search(r'"X-CSRF-Token": "([^"]+)"', csrf)
    assert token is not None
    refused = page.request.post(
        f"{stack.api_url}/ops/predictions/{created['id']}/cancel",
        form={"csrf": token.group(1)},
    )
    assert refused.status == 403
