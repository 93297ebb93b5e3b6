"""Blocks: deployments and model versions published for the inference gateway. An account uses
a block exactly as it may use what the block names (a private deployment's block is invisible
to another account, 404 like one that does not exist, until it is granted); only the owner of
a deployment publishes it, and only a block's publisher deletes it. Through the REST api, the
``conduit admin`` commands, and ``blocks.blocks.resolve`` against Postgres."""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from blocks import blocks
from blocks.versions import find_block_version
from catalog import lookups, writes
from catalog.cache import Catalog
from catalog.records import AccountInfo, Grants, Visibility
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem
from tests.fixtures.processes import Launcher, base_env
from tests.fixtures.waiting import wait_for
from tracker.db import make_engine

T = TypeVar("T")
SCHEMA = {"components": {"schemas": {"Input": {"type": "object", "properties": {}}}}}
#: Small pages, so listing walks several of them.
PAGE_SIZE = 2
#: The api of this module caches the catalog and grants this long (seconds).
CACHE_TTL = 0.1
SEARCHED = {"component": {"metadata": {"algorithmType": "detector", "model": "yolo"}}}


def _suffix() -> str:
    return uuid.uuid4().hex[:8]


def _in_database(database_url: str, work: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    async def main() -> T:
        engine = make_engine(database_url, pool_size=1)
        try:
            return await work(engine)
        finally:
            await engine.dispose()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


async def _model(engine: AsyncEngine, owner: str, name: str, visibility: Visibility) -> str:
    """A model of ``owner`` (its account made if missing) with one version; the version."""
    return await writes.create_version(
        engine, owner, name, SCHEMA, None, shards=2, visibility=visibility
    )


@dataclass(frozen=True)
class World:
    api_url: str
    owner: str  # owns everything below
    other: str  # owns nothing
    operator: str  # an admin account
    deployment: str  # private deployment of owner
    public_deployment: str
    version: str  # the version of owner's private model
    tokens: dict[str, str]

    def client(self, account: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[account]}"}
        return httpx.Client(base_url=self.api_url, headers=headers, timeout=30)


def _cli(database_url: str, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conduit", "admin", *args],
        env=base_env(database_url, redis_url),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def world(launcher: Launcher, admin: Admin, database_url: str, redis_url: str) -> Iterator[World]:
    suffix = _suffix()
    owner, other, operator = (f"blk-{role}-{suffix}" for role in ("owner", "other", "op"))
    tokens = {name: admin.create_account(name) for name in (owner, other)}
    made = _cli(database_url, redis_url, "create-account", operator, "--admin")
    assert made.returncode == 0, made.stderr
    tokens[operator] = made.stdout.strip()
    model = f"{owner}/secret"
    version = _in_database(
        database_url, lambda engine: _model(engine, owner, "secret", Visibility.PRIVATE)
    )
    deployment = f"{owner}/secret-run"
    admin.create_deployment(deployment, model, shards=2)  # private: the default
    public_deployment = f"{owner}/open-run"
    admin.create_deployment(public_deployment, model, shards=2, visibility="public")
    env = {"CONDUIT_API_CACHE_TTL": str(CACHE_TTL), "CONDUIT_API_PAGE_SIZE": str(PAGE_SIZE)}
    api, api_url = launcher.api(env=env)
    yield World(api_url, owner, other, operator, deployment, public_deployment, version, tokens)
    api.stop()


def _create(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/blocks", json=body)
    assert response.status_code == 201, response.text
    block: dict[str, Any] = response.json()
    assert response.headers["location"] == block["urls"]["get"]
    return block


def _listed(client: httpx.Client) -> list[str]:
    """Every block id of the paginated list, following ``next`` to the end."""
    ids: list[str] = []
    url: str | None = "/v1/blocks"
    while url is not None:
        response = client.get(url)
        assert response.status_code == 200, response.text
        page: dict[str, Any] = response.json()
        assert len(page["results"]) <= PAGE_SIZE
        ids.extend(item["id"] for item in page["results"])
        url = page["next"]
    return ids


def _same_as_absent(present: httpx.Response, absent: httpx.Response, hidden: str) -> None:
    """``present`` (about a block the caller may not see) is the answer a block id that does
    not exist got, byte for byte once the ids are swapped."""
    assert present.status_code == absent.status_code == 404, (present.text, absent.text)
    assert present.headers["content-type"] == absent.headers["content-type"]
    missing = "blk-00000000"
    assert present.content.replace(hidden.encode(), missing.encode()) == absent.content


def test_owner_creates_reads_lists_and_deletes_a_block(world: World) -> None:
    with world.client(world.owner) as client:
        block = _create(client, deployment=world.deployment, metadata=SEARCHED, synchronous=True)
        assert block["id"].startswith("blk-") and len(block["id"]) == 12
        assert block["id"][4:].isalnum() and block["id"][4:] == block["id"][4:].lower()
        assert {k: v for k, v in block.items() if k not in ("id", "created_at", "urls")} == {
            "owner": world.owner,
            "deployment": world.deployment,
            "version": None,
            "model": f"{world.owner}/secret",
            "metadata": SEARCHED,
            "synchronous": True,
        }
        assert block["urls"]["get"] == f"{world.api_url}/v1/blocks/{block['id']}"
        assert block["created_at"].endswith("Z")
        got = client.get(f"/v1/blocks/{block['id']}")
        assert got.status_code == 200 and got.json() == block

        by_version = _create(client, version=world.version)
        assert by_version["deployment"] is None and by_version["version"] == world.version
        assert by_version["metadata"] == {} and by_version["synchronous"] is False
        third = _create(client, deployment=world.public_deployment)

        listed = _listed(client)  # newest first, over several pages
        mine = [item for item in listed if item in (block["id"], by_version["id"], third["id"])]
        assert mine == [third["id"], by_version["id"], block["id"]]

        for created in (block, by_version, third):
            deleted = client.delete(f"/v1/blocks/{created['id']}")
            assert deleted.status_code == 204, deleted.text
            assert_problem(client.get(f"/v1/blocks/{created['id']}"), 404)
        assert_problem(client.delete(f"/v1/blocks/{block['id']}"), 404)


def test_a_private_deployments_block_is_hidden_until_granted(world: World, admin: Admin) -> None:
    with world.client(world.owner) as owner:
        private = _create(owner, deployment=world.deployment)
        public = _create(owner, deployment=world.public_deployment)
        own_version = _create(owner, version=world.version)
    block = private["id"]
    with world.client(world.other) as other:
        _same_as_absent(
            other.get(f"/v1/blocks/{block}"), other.get("/v1/blocks/blk-00000000"), block
        )
        _same_as_absent(
            other.delete(f"/v1/blocks/{block}"), other.delete("/v1/blocks/blk-00000000"), block
        )
        # The model is private too: a block of its version is hidden as well.
        assert_problem(other.get(f"/v1/blocks/{own_version['id']}"), 404)
        assert other.get(f"/v1/blocks/{public['id']}").json() == public
        listed = _listed(other)
        assert public["id"] in listed
        assert block not in listed and own_version["id"] not in listed
        # Publishing another's private deployment: as if it did not exist.
        refused = assert_problem(
            other.post("/v1/blocks", json={"deployment": world.deployment}), 422
        )
        assert [e["field"] for e in refused["errors"]] == ["deployment"]

        admin.grant(world.other, "deployment", world.deployment)
        granted = wait_for(
            lambda: (r := other.get(f"/v1/blocks/{block}")).status_code == 200 and r,
            "the granted deployment's block visible",
        )
        assert granted.json() == private
        assert block in _listed(other)
        # Usable, not its own: it may neither delete the block nor publish the deployment.
        assert_problem(other.delete(f"/v1/blocks/{block}"), 403)
        not_owner = assert_problem(
            other.post("/v1/blocks", json={"deployment": world.deployment}), 403
        )
        assert [e["field"] for e in not_owner["errors"]] == ["deployment"]
        assert own_version["id"] not in _listed(other)  # a deployment grant is not the model's

        admin.revoke(world.other, "deployment", world.deployment)
        wait_for(
            lambda: other.get(f"/v1/blocks/{block}").status_code == 404,
            "the revoked deployment's block hidden again",
        )
    with world.client(world.owner) as owner:
        assert owner.get(f"/v1/blocks/{block}").json() == private  # the block is still there


def test_an_admin_account_publishes_any_deployment_as_a_block_of_its_owner(
    world: World, database_url: str, redis_url: str
) -> None:
    """A block belongs to the owner of what it names whichever way it is published: an admin
    account over REST and ``conduit admin create-block`` give the same owner."""
    made = _cli(database_url, redis_url, "create-block", world.deployment)
    assert made.returncode == 0, made.stderr
    by_cli = made.stdout.strip()
    with world.client(world.operator) as operator:
        block = _create(operator, deployment=world.deployment)
        by_version = _create(operator, version=world.version)
        assert block["owner"] == by_version["owner"] == world.owner
        assert operator.get(f"/v1/blocks/{by_cli}").json()["owner"] == world.owner
        listed = _listed(operator)  # an admin reads every block
        assert block["id"] in listed and by_cli in listed
    with world.client(world.owner) as owner:
        assert owner.get(f"/v1/blocks/{block['id']}").json() == block
        assert block["id"] in _listed(owner)
        deleted = owner.delete(f"/v1/blocks/{block['id']}")  # its own
        assert deleted.status_code == 204, deleted.text
    with world.client(world.other) as other:  # neither its owner nor an admin
        assert_problem(other.delete(f"/v1/blocks/{by_version['id']}"), 404)
    with world.client(world.operator) as operator:  # an admin deletes anyone's
        for made_id in (by_cli, by_version["id"]):
            deleted = operator.delete(f"/v1/blocks/{made_id}")
            assert deleted.status_code == 204, deleted.text


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"deployment": "nobody/nothing"}, ["deployment"]),
        ({"deployment": "no-slash"}, ["deployment"]),
        ({"version": "0" * 64}, ["version"]),
        ({"metadata": {"a": 1}}, ["deployment"]),
        ({"deployment": "a/b", "version": "0" * 64}, ["deployment", "version"]),
        ({"deployment": "DEPLOYMENT", "metadata": [1, 2]}, ["metadata"]),
        ({"deployment": "DEPLOYMENT", "metadata": "{}"}, ["metadata"]),
        ({"deployment": "DEPLOYMENT", "metadata": {"k": "a\u0000b"}}, ["metadata"]),
        ({"deployment": "DEPLOYMENT", "synchronous": "sometimes"}, ["synchronous"]),
    ],
)
def test_a_bad_create_names_the_field(
    world: World, body: dict[str, Any], fields: list[str]
) -> None:
    if body.get("deployment") == "DEPLOYMENT":
        body = {**body, "deployment": world.deployment}
    with world.client(world.owner) as client:
        problem = assert_problem(client.post("/v1/blocks", json=body), 422)
    assert [e["field"] for e in problem["errors"]] == fields


def test_admin_cli_creates_lists_and_deletes_blocks(
    world: World, admin: Admin, database_url: str, redis_url: str
) -> None:
    metadata = '{"component": {"metadata": {"algorithmType": "tracker"}}}'
    made = _cli(
        database_url, redis_url, "create-block", world.deployment,
        "--metadata", metadata, "--synchronous",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    block = made.stdout.strip()
    assert blocks.BLOCK_ID.fullmatch(block), made.stdout
    by_version = _cli(database_url, redis_url, "create-block", "--version", world.version)
    assert by_version.returncode == 0, by_version.stderr
    from_fixture = admin.create_block(world.public_deployment, {"model": "yolo"})

    with world.client(world.owner) as owner:  # the deployment's owner owns the block
        got = owner.get(f"/v1/blocks/{block}").json()
        assert (got["owner"], got["deployment"], got["synchronous"]) == (
            world.owner,
            world.deployment,
            True,
        )
        assert got["metadata"] == {"component": {"metadata": {"algorithmType": "tracker"}}}
        version_block = owner.get(f"/v1/blocks/{by_version.stdout.strip()}").json()
        assert version_block["version"] == world.version
        assert owner.get(f"/v1/blocks/{from_fixture}").json()["metadata"] == {"model": "yolo"}

    listed = _cli(database_url, redis_url, "list-blocks")
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert world.deployment in lines[block] and "yes" in lines[block]
    assert f"version {world.version}" in lines[by_version.stdout.strip()]

    for bad, said in (
        (("create-block", world.deployment, "--metadata", "[1]"), "JSON object"),
        (("create-block", world.deployment, "--metadata", "{"), "must be JSON"),
        (("create-block", "nobody/nothing"), "does not exist"),
        (("create-block",), "name a deployment or a --version"),
        (("create-block", world.deployment, "--version", world.version), "not both"),
    ):
        refused = _cli(database_url, redis_url, *bad)
        assert refused.returncode != 0 and said in refused.stderr, (bad, refused.stderr)

    deleted = _cli(database_url, redis_url, "delete-block", block)
    assert deleted.returncode == 0 and deleted.stdout.strip() == f"deleted block {block}"
    again = _cli(database_url, redis_url, "delete-block", block)
    assert again.returncode != 0 and f"block {block} does not exist" in again.stderr
    with world.client(world.owner) as owner:
        assert_problem(owner.get(f"/v1/blocks/{block}"), 404)


async def _account(engine: AsyncEngine, name: str) -> AccountInfo:
    account, _ = await writes.create_account(engine, name)
    return account


async def test_resolve_answers_only_what_the_account_may_use(engine: AsyncEngine) -> None:
    suffix = _suffix()
    owner = await _account(engine, f"res-owner-{suffix}")
    other = await _account(engine, f"res-other-{suffix}")
    version = await _model(engine, owner.name, "m", Visibility.PRIVATE)
    private = await writes.create_deployment(
        engine, owner.name, "private", owner.name, "m", None, shards=2, prediction_timeout=60
    )
    public = await writes.create_deployment(
        engine, owner.name, "public", owner.name, "m", None, shards=2, prediction_timeout=60,
        visibility=Visibility.PUBLIC,
    )  # fmt: skip
    on_private = await blocks.create(engine, deployment_id=private.id, metadata=SEARCHED)
    on_public = await blocks.create(engine, deployment_id=public.id, synchronous=True)
    on_version = await blocks.create(engine, version_id=version)

    assert on_private.deployment == f"{owner.name}/private"
    assert on_private.model == f"{owner.name}/m" and on_private.metadata == SEARCHED
    assert on_version.version_id == version and on_version.deployment is None
    for block in (on_private, on_public, on_version):
        assert await blocks.resolve(engine, owner, block.id) == block
    assert await blocks.resolve(engine, other, on_public.id) == on_public
    assert await blocks.resolve(engine, other, on_private.id) is None
    assert await blocks.resolve(engine, other, on_version.id) is None
    assert await blocks.resolve(engine, other, "blk-00000000") is None
    assert await blocks.resolve(engine, other, "not a block id") is None

    await writes.grant(engine, other.name, "deployment", owner.name, "private")
    assert await blocks.resolve(engine, other, on_private.id) == on_private
    assert await blocks.resolve(engine, other, on_version.id) is None  # the model is not granted
    await writes.grant(engine, other.name, "model", owner.name, "m")
    assert await blocks.resolve(engine, other, on_version.id) == on_version
    # A process's own view of the grants (a cache) is the one that counts.
    no_grants = await blocks.resolve(engine, other, on_private.id, grants=lambda _: _no_grants())
    assert no_grants is None

    await writes.revoke(engine, other.name, "deployment", owner.name, "private")
    await writes.set_visibility(engine, "model", owner.name, "m", Visibility.PUBLIC)
    assert await blocks.resolve(engine, other, on_private.id) is None
    assert await blocks.resolve(engine, other, on_version.id) == on_version

    listed = [b.id for b in await blocks.list_blocks(engine, other)]
    assert on_public.id in listed and on_version.id in listed and on_private.id not in listed
    assert await blocks.find(engine, owner, on_private.id) == on_private

    assert not await blocks.delete_block(engine, on_private.id, other.id)
    assert await blocks.delete_block(engine, on_private.id, owner.id)
    assert await blocks.get(engine, on_private.id) is None
    with pytest.raises(ValueError):
        await blocks.create(engine, deployment_id=public.id, version_id=version)


async def test_a_withdrawn_deployments_block_resolves_to_nothing(engine: AsyncEngine) -> None:
    """A block of another account's deployment of a public model: once the model's owner makes
    the model private, the block runs nothing (the gateway's ``NOT_FOUND``), until the model is
    granted to the deployment's owner."""
    suffix = _suffix()
    lender = await _account(engine, f"wd-lender-{suffix}")
    borrower = await _account(engine, f"wd-borrower-{suffix}")
    version = await _model(engine, lender.name, "m", Visibility.PUBLIC)
    borrowed = await writes.create_deployment(
        engine, borrower.name, "b", lender.name, "m", None, shards=2, prediction_timeout=60
    )
    block = await blocks.create(engine, deployment_id=borrowed.id)

    def fresh() -> Catalog:
        return Catalog(engine, 60)

    found = await find_block_version(fresh(), borrower, block.id)
    assert found is not None and found.version.id == version
    await writes.set_visibility(engine, "model", lender.name, "m", Visibility.PRIVATE)
    assert await find_block_version(fresh(), borrower, block.id) is None
    assert await find_block_version(fresh(), lender, block.id) is None  # not its block
    await writes.grant(engine, borrower.name, "model", lender.name, "m")
    assert await find_block_version(fresh(), borrower, block.id) is not None


async def _no_grants() -> Grants:
    return Grants()


async def test_a_block_goes_with_its_deployment_and_the_database_holds_one_target(
    engine: AsyncEngine,
) -> None:
    from sqlalchemy import delete, insert
    from sqlalchemy.exc import IntegrityError

    from tracker.block_tables import Block
    from tracker.tables import Deployment

    owner = await _account(engine, f"res-gone-{_suffix()}")
    version = await _model(engine, owner.name, "m", Visibility.PUBLIC)
    deployment = await writes.create_deployment(
        engine, owner.name, "d", owner.name, "m", None, shards=2, prediction_timeout=60
    )
    block = await blocks.create(engine, deployment_id=deployment.id)
    with pytest.raises(IntegrityError, match="ck_blocks_deployment_or_version"):
        async with engine.begin() as conn:
            await conn.execute(
                insert(Block).values(
                    id="blk-zzzzzzzz",
                    account_id=owner.id,
                    deployment_id=deployment.id,
                    version_id=version,
                )
            )
    async with engine.begin() as conn:
        await conn.execute(delete(Deployment).where(Deployment.id == deployment.id))
    assert await blocks.get(engine, block.id) is None
    assert await lookups.get_deployment(engine, owner.name, "d") is None
