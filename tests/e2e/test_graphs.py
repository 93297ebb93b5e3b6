"""Named graphs through the REST api: register (every fault answered at once, each naming its
field, a step's output that cannot fit the next step's input among them), list, get, delete,
and the ``explain`` dry run with where each step would run. Against a real api process, the
session's echo deployment (served by a runner) and a deployment no runner serves."""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from catalog import writes
from catalog.records import Visibility
from tests.conftest import ECHO, Stack
from tests.fixtures.admin import Admin
from tests.fixtures.api import assert_problem
from tests.fixtures.processes import Launcher
from tests.fixtures.waiting import wait_for
from tracker.db import make_engine

T = TypeVar("T")
#: Small pages, so listing walks several of them.
PAGE_SIZE = 2
#: A translator's schema: ``text`` required, ``lang`` one of Cog's choices; a string out.
TRANSLATOR = {
    "components": {
        "schemas": {
            "Input": {
                "title": "Input",
                "type": "object",
                "properties": {
                    "text": {"title": "Text", "type": "string", "x-order": 0},
                    "lang": {
                        "allOf": [{"$ref": "#/components/schemas/lang"}],
                        "default": "fr",
                        "x-order": 1,
                    },
                },
                "required": ["text"],
            },
            "lang": {"title": "lang", "enum": ["fr", "de"], "type": "string"},
            "Output": {"title": "Output", "type": "string"},
        }
    }
}


def _in_database(database_url: str, work: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    async def main() -> T:
        engine = make_engine(database_url, pool_size=1)
        try:
            return await work(engine)
        finally:
            await engine.dispose()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


async def _translator(engine: AsyncEngine, owner: str, visibility: Visibility) -> str:
    return await writes.create_version(
        engine, owner, "translator", TRANSLATOR, None, shards=1, visibility=visibility
    )


@dataclass(frozen=True)
class World:
    api_url: str
    owner: str
    other: str
    #: The echo deployment's block (public, served by the session's runner).
    echo: str
    #: The owner's translator deployment's block (no runner serves it).
    translator: str
    #: A block of the other account's private deployment: the owner may not use it.
    hidden: str
    tokens: dict[str, str]

    def client(self, account: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[account]}"}
        return httpx.Client(base_url=self.api_url, headers=headers, timeout=30)


@pytest.fixture(scope="module")
def world(stack: Stack, launcher: Launcher, admin: Admin, database_url: str) -> Iterator[World]:
    suffix = uuid.uuid4().hex[:8]
    owner, other = f"gph-owner-{suffix}", f"gph-other-{suffix}"
    tokens = {name: admin.create_account(name) for name in (owner, other)}
    echo = admin.create_block(ECHO)
    _in_database(database_url, lambda engine: _translator(engine, owner, Visibility.PUBLIC))
    _in_database(database_url, lambda engine: _translator(engine, other, Visibility.PRIVATE))
    for account in (owner, other):
        admin.create_deployment(f"{account}/translate", f"{account}/translator", shards=1)
    translator = admin.create_block(f"{owner}/translate")
    hidden = admin.create_block(f"{other}/translate")
    proc, api_url = launcher.api(env={"CONDUIT_API_PAGE_SIZE": str(PAGE_SIZE)})
    yield World(api_url, owner, other, echo, translator, hidden, tokens)
    proc.stop()


def _spec(world: World, name: str, **changes: Any) -> dict[str, Any]:
    """Echo, then translate the echo's first line, unless told otherwise."""
    spec: dict[str, Any] = {
        "name": name,
        "steps": [
            {"id": "shout", "block": world.echo, "input": {"prompt": "input.text", "n": "`2`"}},
            {
                "id": "translate",
                "block": world.translator,
                "input": {"text": "steps.shout.output[0]", "lang": "input.lang || 'de'"},
                "when": "input.translate",
                "timeout": 30,
            },
        ],
        "output": "steps.translate.output || steps.shout.output",
    }
    spec.update(changes)
    return spec


def _register(client: httpx.Client, spec: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/graphs", json=spec)
    assert response.status_code == 201, response.text
    graph: dict[str, Any] = response.json()
    assert response.headers["location"] == graph["urls"]["get"]
    return graph


def _listed(client: httpx.Client) -> list[str]:
    ids: list[str] = []
    url: str | None = "/v1/graphs"
    while url is not None:
        response = client.get(url)
        assert response.status_code == 200, response.text
        page: dict[str, Any] = response.json()
        assert len(page["results"]) <= PAGE_SIZE
        ids.extend(item["id"] for item in page["results"])
        url = page["next"]
    return ids


def _refused(client: httpx.Client, spec: dict[str, Any]) -> list[tuple[str, str]]:
    problem = assert_problem(client.post("/v1/graphs", json=spec), 422)
    return [(e["field"], e["message"]) for e in problem["errors"]]


def test_a_graph_is_registered_read_listed_and_deleted(world: World) -> None:
    with world.client(world.owner) as client:
        spec = _spec(world, f"first-{uuid.uuid4().hex[:6]}")
        graph = _register(client, spec)
        graph_id = graph["id"]
        assert graph_id.startswith("gph-") and len(graph_id) == 12
        assert graph_id[4:].isalnum() and graph_id[4:] == graph_id[4:].lower()
        assert graph["name"] == spec["name"] and graph["spec"] == spec
        assert graph["urls"] == {
            "get": f"{world.api_url}/v1/graphs/{graph_id}",
            "explain": f"{world.api_url}/v1/graphs/{graph_id}/explain",
        }
        assert graph["created_at"].endswith("Z")
        assert client.get(f"/v1/graphs/{graph_id}").json() == graph

        more = [_register(client, _spec(world, f"more-{i}-{graph_id}"))["id"] for i in range(2)]
        mine = {graph_id, *more}
        listed = [item for item in _listed(client) if item in mine]
        assert listed == [*more[::-1], graph_id]  # newest first, over pages of two

        for made in (graph_id, *more):
            deleted = client.delete(f"/v1/graphs/{made}")
            assert deleted.status_code == 204, deleted.text
            assert_problem(client.get(f"/v1/graphs/{made}"), 404)
        assert_problem(client.delete(f"/v1/graphs/{graph_id}"), 404)
        assert not mine & set(_listed(client))


def test_a_name_is_the_accounts_own_and_another_account_never_sees_the_graph(
    world: World,
) -> None:
    name = f"shared-{uuid.uuid4().hex[:6]}"
    with world.client(world.owner) as owner:
        graph = _register(owner, _spec(world, name))
        taken = assert_problem(owner.post("/v1/graphs", json=_spec(world, name)), 409)
        assert [e["field"] for e in taken["errors"]] == ["name"]
    with world.client(world.other) as other:
        # The other account may use the echo block: a graph of the same name is its own.
        echo_only = {"name": name, "steps": [_spec(world, name)["steps"][0]]}
        assert _register(other, echo_only)["id"] != graph["id"]
        for method, path in (
            ("GET", "/v1/graphs/{}"),
            ("DELETE", "/v1/graphs/{}"),
            ("POST", "/v1/graphs/{}/explain"),
        ):
            present = other.request(method, path.format(graph["id"]))
            absent = other.request(method, path.format("gph-00000000"))
            assert present.status_code == absent.status_code == 404, present.text
            assert (
                present.json()["detail"].replace(graph["id"], "gph-00000000")
                == (absent.json()["detail"])
            )
        assert graph["id"] not in _listed(other)
    with world.client(world.owner) as owner:
        assert owner.get(f"/v1/graphs/{graph['id']}").status_code == 200


def test_an_output_that_cannot_fit_the_next_input_is_refused_at_registration(
    world: World,
) -> None:
    spec = _spec(world, "mismatch")
    spec["steps"][1]["input"]["text"] = "steps.shout.output"  # a list of strings
    with world.client(world.owner) as client:
        assert _refused(client, spec) == [
            (
                "steps[1].input.text",
                f"steps.shout.output is an array (block {world.echo}'s Output schema), but "
                "text takes a string",
            )
        ]


def test_every_fault_is_answered_at_once_naming_its_field(world: World) -> None:
    spec = {
        "name": "faults",
        "steps": [
            {"id": "shout", "block": world.echo, "input": {"prompt": "steps.shout.output"}},
            {"id": "translate", "block": world.translator, "input": {"lang": "'es'"}},
            {"id": "ghost", "block": "blk-zzzzzzzz"},
            {"id": "secret", "block": world.hidden},
            {"id": "loud", "block": world.echo, "input": {"volume": "`11`", "n": "input.n ||"}},
        ],
        "output": "steps.nothing.output",
    }
    with world.client(world.owner) as client:
        refusals = _refused(client, spec)
    fields = [field for field, _ in refusals]
    assert fields == [
        "steps[0].input.prompt",
        "steps[1].input.lang",
        "steps[1].input.text",
        "steps[2].block",
        "steps[3].block",
        "steps[4].input.n",
        "steps[4].input.volume",
        "output",
    ], refusals
    messages = dict(zip(fields, (message for _, message in refusals), strict=True))
    assert "its own output" in messages["steps[0].input.prompt"]
    assert "'es' is not one of ['fr', 'de']" in messages["steps[1].input.lang"]
    assert "requires text" in messages["steps[1].input.text"]
    # A block the account may not use is refused as one that does not exist.
    assert messages["steps[2].block"].replace("blk-zzzzzzzz", "<id>") == messages[
        "steps[3].block"
    ].replace(world.hidden, "<id>")
    assert "not valid JMESPath" in messages["steps[4].input.n"]
    assert "takes no input 'volume'" in messages["steps[4].input.volume"]
    assert "steps.nothing" in messages["output"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([1, 2], "body"),
        ({"name": "cycle", "steps": "no"}, "steps"),
        ({"name": "nul", "steps": [{"id": "a", "block": "blk-a\u0000"}]}, "spec.steps.0.block"),
    ],
)
def test_a_body_of_the_wrong_shape_is_refused(world: World, body: Any, field: str) -> None:
    with world.client(world.owner) as client:
        problem = assert_problem(client.post("/v1/graphs", json=body), 422)
    assert field in [e["field"] for e in problem["errors"]]


def test_explain_shows_the_plan_and_where_each_step_would_run(world: World) -> None:
    with world.client(world.owner) as client:
        graph = _register(client, _spec(world, f"explained-{uuid.uuid4().hex[:6]}"))
        url = f"/v1/graphs/{graph['id']}/explain"

        def served() -> dict[str, Any] | None:
            response = client.post(url)
            assert response.status_code == 200, response.text
            plan: dict[str, Any] = response.json()
            return plan if plan["steps"][0]["served"] is True else None

        plan = wait_for(served, "the api's fleet view listing the echo runner")
    assert plan["id"] == graph["id"] and plan["name"] == graph["name"]
    assert plan["output"] == "steps.translate.output || steps.shout.output"
    assert plan["return_steps"] is False
    shout, translate = plan["steps"]
    assert shout["block"] == world.echo and shout["deployment"] == ECHO
    assert shout["needs"] == [] and shout["input"] == {"prompt": "input.text", "n": "`2`"}
    assert translate == {
        "id": "translate",
        "block": world.translator,
        "model": f"{world.owner}/translator",
        "deployment": f"{world.owner}/translate",
        "version": translate["version"],
        "synchronous": False,
        "served": False,  # no runner serves it
        "needs": ["shout"],
        "input": {"text": "steps.shout.output[0]", "lang": "input.lang || 'de'"},
        "when": "input.translate",
        "timeout": 30.0,
    }


def test_explain_checks_the_graph_again_against_the_blocks_of_the_day(
    world: World, admin: Admin
) -> None:
    with world.client(world.owner) as client:
        block = admin.create_block(f"{world.owner}/translate")
        spec = {"name": f"gone-{uuid.uuid4().hex[:6]}", "steps": [
            {"id": "t", "block": block, "input": {"text": "input.text"}}
        ]}  # fmt: skip
        graph = _register(client, spec)
        assert client.delete(f"/v1/blocks/{block}").status_code == 204
        problem = assert_problem(client.post(f"/v1/graphs/{graph['id']}/explain"), 422)
        assert problem["errors"] == [
            {"field": "steps[0].block", "message": f"unknown block {block}"}
        ]
