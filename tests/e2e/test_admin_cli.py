"""``conduit admin`` run as a subprocess, the way an operator runs it."""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin, run_admin_cli
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for

HEX64 = re.compile(r"^[0-9a-f]{64}$")


_admin = run_admin_cli


def test_create_account_prints_a_token_that_authenticates(
    stack: Stack, database_url: str, redis_url: str
) -> None:
    ran = _admin(database_url, redis_url, "create-account", f"cli-{uuid.uuid4().hex[:8]}")
    assert ran.returncode == 0, ran.stderr
    token = ran.stdout.strip()
    assert token and "\n" not in token

    ok = httpx.get(f"{stack.api_url}/v1/predictions", headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200, ok.text
    wrong = httpx.get(
        f"{stack.api_url}/v1/predictions", headers={"Authorization": f"Bearer {token}x"}
    )
    assert wrong.status_code == 401


def test_create_model_prints_its_version_and_deployments_check_it(
    stack: Stack, client: httpx.Client, database_url: str, redis_url: str
) -> None:
    name = f"cli-{uuid.uuid4().hex[:8]}/echo"
    ran = _admin(database_url, redis_url, "create-model", name, "--runner-url", stack.runner_url)
    assert ran.returncode == 0, ran.stderr
    version = ran.stdout.strip()
    assert HEX64.match(version), ran.stdout
    assert version != stack.version
    model = client.get(f"/v1/models/{name}")
    assert model.status_code == 200, model.text
    assert model.json()["latest_version"]["id"] == version

    foreign = _admin(
        database_url, redis_url, "create-deployment", name, "--model", name,
        "--version", stack.version,
    )  # fmt: skip
    assert foreign.returncode != 0
    assert f"belongs to {ECHO}, not to {name}" in foreign.stderr
    assert client.get(f"/v1/deployments/{name}").status_code == 404

    own = _admin(database_url, redis_url, "create-deployment", name, "--model", name)
    assert own.returncode == 0, own.stderr
    assert own.stdout.strip() == f"{name} release 1: {version}"


@pytest.fixture(scope="module")
def fresh_api(launcher: Launcher) -> Iterator[str]:
    """An api that caches the catalog for a tenth of a second: CLI changes show at once."""
    api, url = launcher.api(env={"CONDUIT_API_CACHE_TTL": "0.1"})
    yield url
    api.stop()


def _ok(ran: subprocess.CompletedProcess[str]) -> str:
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()


def _client(api_url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"})


def test_create_model_makes_its_owner_an_account_that_create_account_reuses(
    stack: Stack, database_url: str, redis_url: str, fresh_api: str
) -> None:
    owner = f"cli-owner-{uuid.uuid4().hex[:8]}"
    name = f"{owner}/echo"
    ran = _admin(
        database_url, redis_url, "create-model", name, "--runner-url", stack.runner_url,
        "--visibility", "private",
    )  # fmt: skip
    assert HEX64.match(_ok(ran))
    assert f"created account {owner}" in ran.stderr
    again = _admin(database_url, redis_url, "create-model", name, "--runner-url", stack.runner_url)
    assert _ok(again) == ran.stdout.strip()
    assert "created account" not in again.stderr

    token = _ok(_admin(database_url, redis_url, "create-account", owner))
    stranger = _ok(_admin(database_url, redis_url, "create-account", f"{owner}-x"))
    with _client(fresh_api, token) as owning, _client(fresh_api, stranger) as other:
        # Re-registering without --visibility kept it private; the token is the owner's.
        model = owning.get(f"/v1/models/{name}")
        assert model.status_code == 200, model.text
        assert (model.json()["owner"], model.json()["visibility"]) == (owner, "private")
        assert other.get(f"/v1/models/{name}").status_code == 404


def test_deployments_are_private_and_shared_by_grants(
    stack: Stack, database_url: str, redis_url: str, fresh_api: str
) -> None:
    owner = f"cli-team-{uuid.uuid4().hex[:8]}"
    accounts = [f"{owner}-{i}" for i in range(3)]
    tokens = [_ok(_admin(database_url, redis_url, "create-account", a)) for a in accounts]
    name = f"{owner}/shared"
    ran = _admin(
        database_url, redis_url, "create-deployment", name, "--model", ECHO,
        "--grant", f"{accounts[0]},{accounts[1]}",
    )  # fmt: skip
    assert _ok(ran) == f"{name} release 1: {stack.version}"
    path = f"/v1/deployments/{name}"

    def status(token: str) -> int:
        with _client(fresh_api, token) as client:
            return client.get(path).status_code

    assert [status(t) for t in tokens] == [200, 200, 404]

    granted = _admin(database_url, redis_url, "grant", accounts[2], "--deployment", name)
    assert _ok(granted) == f"{accounts[2]} granted deployment {name}"
    again = _admin(database_url, redis_url, "grant", accounts[2], "--deployment", name)
    assert _ok(again) == f"{accounts[2]} already granted deployment {name}"
    wait_for(lambda: status(tokens[2]) == 200, "the grant seen", 10)

    revoked = _admin(
        database_url, redis_url, "revoke", f"{accounts[0]},{accounts[2]}", "--deployment", name
    )
    assert _ok(revoked).splitlines() == [
        f"{accounts[0]} revoked from deployment {name}",
        f"{accounts[2]} revoked from deployment {name}",
    ]
    wait_for(lambda: [status(t) for t in tokens] == [404, 200, 404], "the revokes seen", 10)

    # A new release keeps visibility and grants.
    _ok(_admin(database_url, redis_url, "create-deployment", name, "--model", ECHO))
    public = _admin(database_url, redis_url, "set-visibility", "--deployment", name, "public")
    assert _ok(public) == f"deployment {name} is public"
    wait_for(lambda: [status(t) for t in tokens] == [200, 200, 200], "made public", 10)


def test_entitle_priority_sets_and_withdraws_high(database_url: str, redis_url: str) -> None:
    account = f"cli-urgent-{uuid.uuid4().hex[:8]}"
    _ok(_admin(database_url, redis_url, "create-account", account))
    name = f"{account}/d"
    _ok(_admin(database_url, redis_url, "create-deployment", name, "--model", ECHO))

    said = _ok(_admin(database_url, redis_url, "entitle-priority", account))
    assert said == f"account {account}: X-Priority: high is honoured"
    said = _ok(_admin(database_url, redis_url, "entitle-priority", "--deployment", name))
    assert said == f"deployment {name}: X-Priority: high is honoured"
    assert _entitled(database_url, account, name) == (True, True)
    _ok(_admin(database_url, redis_url, "entitle-priority", account, "--withdraw"))
    assert _entitled(database_url, account, name) == (False, True)
    _ok(_admin(database_url, redis_url, "create-deployment", name, "--model", ECHO))
    assert _entitled(database_url, account, name) == (False, True)  # a release keeps it
    _ok(
        _admin(
            database_url,
            redis_url,
            "create-deployment",
            name,
            "--model",
            ECHO,
            "--no-allow-high-priority",
        )  # fmt: skip
    )
    assert _entitled(database_url, account, name) == (False, False)


def _entitled(database_url: str, account: str, deployment: str) -> tuple[bool, bool]:
    owner, name = deployment.split("/")
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT a.may_use_high_priority, d.allow_high_priority FROM accounts a, deployments d "
            "WHERE a.name = %s AND d.owner = %s AND d.name = %s",
            (account, owner, name),
        ).fetchone()
    assert row is not None
    return bool(row[0]), bool(row[1])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("grant", "nobody-{u}", "--deployment", ECHO), "account nobody-{u} does not exist"),
        (("grant", "{u}", "--model", "nobody-{u}/m"), "model nobody-{u}/m does not exist"),
        (("revoke", "{u}", "--deployment", "nobody/{u}"), "deployment nobody/{u} does not exist"),
        (("set-visibility", "--model", "nobody/{u}", "public"), "model nobody/{u} does not exist"),
        (("entitle-priority", "nobody-{u}"), "account nobody-{u} does not exist"),
        (("entitle-priority",), "name an ACCOUNT or a --deployment"),
        (
            ("create-deployment", "{u}/d", "--model", ECHO, "--grant", "nobody-{u}"),
            "account nobody-{u} does not exist",
        ),
        (("grant", "{u}"), "one of the arguments --model --deployment is required"),
        (("set-visibility", "--model", ECHO, "secret"), "invalid choice: 'secret'"),
    ],
)
def test_mistakes_are_refused_and_change_nothing(
    database_url: str, redis_url: str, admin: Admin, args: tuple[str, ...], message: str
) -> None:
    u = f"cli-{uuid.uuid4().hex[:8]}"
    admin.create_account(u)
    ran = _admin(database_url, redis_url, *(a.format(u=u) for a in args))
    assert ran.returncode != 0
    assert message.format(u=u) in ran.stderr
    with psycopg.connect(database_url) as conn:
        grants = conn.execute(
            "SELECT count(*) FROM grants g JOIN accounts a ON a.id = g.account_id "
            "WHERE a.name = %s",
            (u,),
        ).fetchone()
        deployments = conn.execute("SELECT count(*) FROM deployments WHERE owner = %s", (u,))
        assert (grants, deployments.fetchone()) == ((0,), (0,))
